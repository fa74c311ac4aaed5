/*
 * test_cpu_graph_replay.c - the CPU backend checks every recorded command's device ranges
 * when a graph replays it. For each kind of command (pageable and retained host-to-device
 * copies, device-to-host, device-to-device and 2-D copies, memsets, kernel launches) one
 * graph is captured, the buffer on one side is freed, and the replay must fail naming the
 * call and the side, without touching the other buffers; a graph holding event records and
 * waits outlives its events. Replays before the free compute what eager calls compute.
 * mg_graph_count_nodes counts a graph's commands and kernel launches.
 */
#include <stdint.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "utils_test_support.h"

#define BYTES 256

typedef enum command { H2D, H2D_RETAINED, D2H, D2D, COPY_2D, MEMSET, LAUNCH, COMMANDS } command;

typedef struct scene {
    mg_backend *b;
    mg_stream *s;
    mg_kernel *vector_add;
    mg_devptr src, dst; /* BYTES each */
    uint8_t host_src[BYTES], host_dst[BYTES];
} scene;

/* Issues one command of kind `c` from src (device or host) to dst (device or host). */
static mg_status issue(scene *sc, command c) {
    switch (c) {
    case H2D:
        return mg_copy_h2d_async(sc->b, sc->dst, sc->host_src, BYTES, sc->s);
    case H2D_RETAINED:
        return mg_copy_h2d_async_retained(sc->b, sc->dst, sc->host_src, BYTES, sc->s);
    case D2H:
        return mg_copy_d2h_async(sc->b, sc->host_dst, sc->src, BYTES, sc->s);
    case D2D:
        return mg_copy_d2d_async(sc->b, sc->dst, sc->src, BYTES, sc->s);
    case COPY_2D:
        return mg_copy_2d_d2d_async(sc->b, sc->dst, 32, sc->src, 32, 16, BYTES / 32, sc->s);
    case MEMSET:
        return mg_memset_async(sc->b, sc->dst, 0x3c, BYTES, sc->s);
    case LAUNCH: {
        mg_launch l;
        mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){64, 1, 1}, 0);
        mg_launch_arg_ptr(&l, sc->src);
        mg_launch_arg_ptr(&l, sc->src);
        mg_launch_arg_ptr(&l, sc->dst);
        mg_launch_arg_u32(&l, BYTES / 4);
        return mg_launch_run(sc->b, sc->vector_add, sc->s, &l);
    }
    case COMMANDS:
        break;
    }
    return MG_ERR_INTERNAL;
}

/* What a replay of `c` names when the freed side is the destination (or the source). */
static const char *replay_failure(command c, bool free_destination) {
    switch (c) {
    case H2D:
        return "cpu copy_h2d_async dst";
    case H2D_RETAINED:
        return "cpu copy_h2d_async_retained dst";
    case D2H:
        return "cpu copy_d2h_async src";
    case D2D:
        return free_destination ? "cpu copy_d2d_async dst" : "cpu copy_d2d_async src";
    case COPY_2D:
        return free_destination ? "cpu copy_2d_d2d_async dst" : "cpu copy_2d_d2d_async src";
    case MEMSET:
        return "cpu memset_async dst";
    case LAUNCH:
        return free_destination ? "metrale:vector_add argument 2" : "metrale:vector_add argument 0";
    case COMMANDS:
        break;
    }
    return "?";
}

static bool uses_device_source(command c) {
    return c == D2H || c == D2D || c == COPY_2D || c == LAUNCH;
}

static bool uses_device_destination(command c) {
    return c != D2H;
}

static void fresh_buffers(scene *sc) {
    CHECK_OK(mg_alloc(sc->b, BYTES, &sc->src));
    CHECK_OK(mg_alloc(sc->b, BYTES, &sc->dst));
    uint8_t pattern[BYTES];
    for (int i = 0; i < BYTES; i++)
        pattern[i] = (uint8_t)(i * 7 + 1);
    CHECK_OK(mg_copy_h2d(sc->b, sc->src, pattern, BYTES));
    CHECK_OK(mg_memset(sc->b, sc->dst, 0, BYTES));
}

/* mg_graph_count_nodes: every command is a node, launches are its kernels. */
static void test_count_nodes(scene *sc) {
    fresh_buffers(sc);
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_begin_capture(sc->s));
    for (command c = 0; c < COMMANDS; c++)
        CHECK_OK(issue(sc, c));
    CHECK_OK(issue(sc, LAUNCH));
    CHECK_OK(mg_graph_end_capture(sc->s, &g));
    size_t kernels = 0, nodes = 0;
    CHECK_OK(mg_graph_count_nodes(g, &kernels, &nodes));
    CHECKF(kernels == 2 && nodes == COMMANDS + 1, "%zu kernels of %zu nodes, expected 2 of %d",
           kernels, nodes, COMMANDS + 1);
    CHECK_OK(mg_graph_count_nodes(g, NULL, NULL));
    CHECK_OK(mg_graph_destroy(g));
    mg_clear_error();
    CHECK(mg_graph_count_nodes(g, &kernels, &nodes) == MG_ERR_INVALID_ARGUMENT);
    CHECK(mg_graph_count_nodes(NULL, &kernels, &nodes) == MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_free(sc->b, sc->src));
    CHECK_OK(mg_free(sc->b, sc->dst));
}

/* The replay computes what the eager command computes. */
static void check_replay_matches_eager(scene *sc, command c) {
    fresh_buffers(sc);
    memset(sc->host_dst, 0, BYTES);
    CHECK_OK(issue(sc, c));
    uint8_t eager_dev[BYTES], eager_host[BYTES], replay_dev[BYTES];
    CHECK_OK(mg_copy_d2h(sc->b, eager_dev, sc->dst, BYTES));
    memcpy(eager_host, sc->host_dst, BYTES);
    CHECK_OK(mg_memset(sc->b, sc->dst, 0, BYTES));
    memset(sc->host_dst, 0, BYTES);
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_begin_capture(sc->s));
    CHECK_OK(issue(sc, c));
    CHECK_OK(mg_graph_end_capture(sc->s, &g));
    CHECK_OK(mg_graph_launch(g, sc->s));
    CHECK_OK(mg_copy_d2h(sc->b, replay_dev, sc->dst, BYTES));
    CHECKF(memcmp(eager_dev, replay_dev, BYTES) == 0 &&
               memcmp(eager_host, sc->host_dst, BYTES) == 0,
           "command %d: the replay differs from the eager call", (int)c);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_free(sc->b, sc->src));
    CHECK_OK(mg_free(sc->b, sc->dst));
}

static void check_replay_after_free(scene *sc, command c, bool free_destination) {
    fresh_buffers(sc);
    mg_devptr marker = 0; /* untouched by the failing replay */
    CHECK_OK(mg_alloc(sc->b, 16, &marker));
    CHECK_OK(mg_memset(sc->b, marker, 0x77, 16));
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_begin_capture(sc->s));
    CHECK_OK(mg_memset_async(sc->b, marker, 0x11, 8, sc->s));
    CHECK_OK(issue(sc, c));
    CHECK_OK(mg_memset_async(sc->b, marker + 8, 0x22, 8, sc->s));
    CHECK_OK(mg_graph_end_capture(sc->s, &g));
    CHECK_OK(mg_free(sc->b, free_destination ? sc->dst : sc->src));
    mg_clear_error();
    CHECK_STATUS(mg_graph_launch(g, sc->s), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE(replay_failure(c, free_destination));
    CHECK_MESSAGE("(graph node 2 of 3)");
    uint8_t m[16];
    CHECK_OK(mg_copy_d2h(sc->b, m, marker, 16));
    CHECK(m[0] == 0x11 && m[7] == 0x11 && m[8] == 0x77 && m[15] == 0x77); /* stopped there */
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_free(sc->b, free_destination ? sc->src : sc->dst));
    CHECK_OK(mg_free(sc->b, marker));
}

/* A graph that records and waits on events keeps working after the events are destroyed. */
static void test_events_outlived(scene *sc) {
    mg_event *recorded = NULL, *waited = NULL;
    mg_graph *g = NULL;
    fresh_buffers(sc);
    CHECK_OK(mg_event_create(sc->b, &recorded));
    CHECK_OK(mg_event_create(sc->b, &waited));
    CHECK_OK(mg_event_record(waited, NULL));
    CHECK_OK(mg_graph_begin_capture(sc->s));
    CHECK_OK(mg_stream_wait_event(sc->s, waited));
    CHECK_OK(mg_memset_async(sc->b, sc->dst, 9, BYTES, sc->s));
    CHECK_OK(mg_event_record(recorded, sc->s));
    CHECK_OK(mg_graph_end_capture(sc->s, &g));
    CHECK_OK(mg_event_destroy(recorded));
    CHECK_OK(mg_event_destroy(waited));
    size_t kernels = 99, nodes = 99;
    CHECK_OK(mg_graph_count_nodes(g, &kernels, &nodes));
    CHECKF(kernels == 0 && nodes == 3, "wait, memset, record counted as %zu kernels of %zu nodes",
           kernels, nodes);
    CHECK_OK(mg_graph_launch(g, sc->s));
    CHECK_OK(mg_graph_launch(g, sc->s));
    uint8_t out[BYTES];
    CHECK_OK(mg_copy_d2h(sc->b, out, sc->dst, BYTES));
    CHECK(out[0] == 9 && out[BYTES - 1] == 9);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_free(sc->b, sc->src));
    CHECK_OK(mg_free(sc->b, sc->dst));
}

int main(void) {
    scene sc = {0};
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 7, &sc.b));
    if (!sc.b)
        return test_finish();
    CHECK_OK(mg_stream_create(sc.b, &sc.s));
    CHECK_OK(mg_kernel_lookup(sc.b, "metrale", "vector_add", &sc.vector_add));
    for (int i = 0; i < BYTES; i++)
        sc.host_src[i] = (uint8_t)(255 - i);
    for (command c = 0; c < COMMANDS; c++) {
        check_replay_matches_eager(&sc, c);
        if (uses_device_destination(c))
            check_replay_after_free(&sc, c, true);
        if (uses_device_source(c))
            check_replay_after_free(&sc, c, false);
    }
    test_events_outlived(&sc);
    test_count_nodes(&sc);
    CHECK_OK(mg_kernel_release(sc.vector_add));
    CHECK_OK(mg_stream_destroy(sc.s));
    CHECK_OK(mg_backend_close(sc.b));
    return test_finish();
}
