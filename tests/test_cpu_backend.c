/* test_cpu_backend.c - what is specific to the CPU backend: its counters and out-of-memory
 * hooks (metrale/cpu.h), its eight independent devices, the kernel registry, and the exact
 * capture and replay semantics it defines (snapshots of pageable sources, replays that find
 * a freed buffer, events recorded into graphs). The backend-independent behaviour is in the
 * conformance suite (test_conformance). */
#include <unistd.h>

#include "metrale/cpu.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops.h"
#include "metrale/pinned.h"
#include "test_util.h"

/* Each public call reaches its backend method exactly once; lookups are memoised. */
static void test_counters(mg_backend *b) {
    mg_stream *s = NULL;
    mg_event *e1 = NULL, *e2 = NULL;
    mg_graph *g = NULL;
    mg_kernel *k = NULL, *k2 = NULL;
    mg_devptr d = 0, d2 = 0;
    void *h = NULL;
    uint8_t host[512];
    test_fill_random(host, sizeof host);

    mg_cpu_counters c0 = test_cpu_counters(b);
    CHECK_OK(mg_alloc(b, 512, &d));
    CHECK_OK(mg_alloc(b, 512, &d2));
    CHECK_OK(mg_copy_h2d(b, d, host, 512));
    CHECK_OK(mg_copy_d2h(b, host, d, 512));
    CHECK_OK(mg_copy_d2d(b, d2, d, 512));
    CHECK_OK(mg_memset(b, d, 1, 512));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_copy_h2d_async(b, d, host, 512, s));
    CHECK_OK(mg_copy_h2d_async_retained(b, d, host, 512, s));
    CHECK_OK(mg_copy_d2h_async(b, host, d, 512, s));
    CHECK_OK(mg_copy_d2d_async(b, d2, d, 512, s));
    CHECK_OK(mg_copy_2d_d2d_async(b, d2, 32, d, 32, 16, 16, s));
    CHECK_OK(mg_memset_async(b, d, 2, 512, s));
    CHECK_OK(mg_event_create(b, &e1));
    CHECK_OK(mg_event_create(b, &e2));
    CHECK_OK(mg_event_record(e1, s));
    CHECK_OK(mg_stream_wait_event(s, e1));
    CHECK_OK(mg_event_synchronize(e1));
    CHECK_OK(mg_event_query(e1));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k2));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){32, 1, 1}, 0);
    CHECK_OK(mg_launch_run(b, k, s, &l));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, d, 3, 512, s)); /* counted when recorded */
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_host_alloc(b, 100, &h));
    CHECK_OK(mg_host_free(b, h));
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_event_destroy(e1));
    CHECK_OK(mg_event_destroy(e2));
    CHECK_OK(mg_free(b, d));
    CHECK_OK(mg_free(b, d2));
    mg_cpu_counters c1 = test_cpu_counters(b);

#define DELTA(name) (c1.name - c0.name)
    CHECK(DELTA(alloc) == 2 && DELTA(free) == 2);
    CHECK(DELTA(copy_h2d) == 1 && DELTA(copy_d2h) == 1 && DELTA(copy_d2d) == 1);
    CHECK(DELTA(copy_h2d_async) == 2 && DELTA(copy_d2h_async) == 1 && DELTA(copy_d2d_async) == 1);
    CHECK(DELTA(copy_2d) == 1);
    CHECK(DELTA(memset) == 1 && DELTA(memset_async) == 2);
    CHECK(DELTA(stream_create) == 1 && DELTA(stream_destroy) == 0);
    CHECK(DELTA(stream_synchronize) == 1);
    CHECK(DELTA(event_create) == 2 && DELTA(event_record) == 1 && DELTA(event_wait) == 1);
    CHECK(DELTA(event_synchronize) == 1 && DELTA(event_query) == 1 && DELTA(event_destroy) == 2);
    CHECK(DELTA(graph_capture) == 1 && DELTA(graph_launch) == 2 && DELTA(graph_destroy) == 1);
    CHECK(DELTA(host_alloc) == 1 && DELTA(host_free) == 1);
    CHECK(DELTA(kernel_lookup) <= 1 && DELTA(launch) == 1);
    CHECK(k == k2);
    CHECK(DELTA(graph_begin_capture) == 1 && DELTA(graph_abort_capture) == 0);
#undef DELTA

    /* The queries and the capture calls counted one by one. */
    bool capturing = true;
    float ms = -1;
    mg_device_info info;
    uint64_t free_bytes = 0, total_bytes = 0;
    mg_devptr host_dev = 0;
    mg_cpu_counters c2 = test_cpu_counters(b);
#define DELTA(name) (c3.name - c2.name)
    CHECK_OK(mg_stream_is_capturing(s, &capturing));
    CHECK(!capturing);
    mg_cpu_counters c3 = test_cpu_counters(b);
    CHECK(DELTA(stream_is_capturing) == 1);
    CHECK_OK(mg_graph_begin_capture(s));
    c3 = test_cpu_counters(b);
    CHECK(DELTA(graph_begin_capture) == 1 && DELTA(graph_abort_capture) == 0);
    CHECK_OK(mg_graph_abort_capture(s));
    c3 = test_cpu_counters(b);
    CHECK(DELTA(graph_abort_capture) == 1 && DELTA(graph_capture) == 0);
    CHECK_OK(mg_event_create(b, &e1));
    CHECK_OK(mg_event_record(e1, s));
    CHECK_OK(mg_event_synchronize(e1));
    c2 = test_cpu_counters(b);
    CHECK_OK(mg_event_elapsed_ms(e1, e1, &ms));
    CHECK(ms == 0.0f);
    c3 = test_cpu_counters(b);
    CHECK(DELTA(event_elapsed) == 1);
    CHECK_OK(mg_event_destroy(e1));
    CHECK_OK(mg_host_alloc(b, 64, &h));
    c2 = test_cpu_counters(b);
    CHECK_OK(mg_host_device_pointer(b, h, &host_dev));
    c3 = test_cpu_counters(b);
    CHECK(DELTA(host_device_pointer) == 1);
    CHECK_OK(mg_host_free(b, h));
    c2 = test_cpu_counters(b);
    CHECK_OK(mg_device_get_info(b, &info));
    c3 = test_cpu_counters(b);
    CHECK(DELTA(device_info) == 1 && DELTA(memory_info) == 0);
    c2 = c3;
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total_bytes));
    c3 = test_cpu_counters(b);
    CHECK(DELTA(memory_info) == 1 && DELTA(device_info) == 0);
#undef DELTA
    mg_kernel_release(k);
    mg_kernel_release(k2);
    CHECK_OK(mg_stream_destroy(s));

    mg_cpu_counters out;
    CHECK_STATUS(mg_cpu_get_counters(NULL, &out), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL backend");
    CHECK_STATUS(mg_cpu_get_counters(b, NULL), MG_ERR_INVALID_ARGUMENT);
}

static void test_allocation_cap(mg_backend *b) {
    mg_devptr a = 0, c = 0;
    uint64_t free_bytes = 0, total_bytes = 0, live0, count0;
    CHECK_OK(mg_ledger_live(b, &live0, &count0));
    CHECK(count0 == 0);
    CHECK_OK(mg_cpu_set_allocation_cap(b, 1 << 20));
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total_bytes));
    CHECK(total_bytes == 1 << 20 && free_bytes <= 1 << 20);
    CHECK_OK(mg_alloc(b, 600000, &a));
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total_bytes));
    CHECK(free_bytes <= (1 << 20) - 600000);
    CHECK_STATUS(mg_alloc(b, 600001, &c), MG_ERR_OUT_OF_MEMORY);
    CHECK(c == 0);
    CHECK_MESSAGE("600001 bytes");
    CHECK_MESSAGE("cap of 1.0 MiB");
    CHECK_MESSAGE("test_cpu_backend.c"); /* the caller's site */
    uint64_t live, count;
    CHECK_OK(mg_ledger_live(b, &live, &count));
    CHECK(count == 1 && live == 600000); /* the failure left nothing behind */
    /* A cap lowered below what is live refuses even the smallest allocation. */
    CHECK_OK(mg_cpu_set_allocation_cap(b, 4096));
    CHECK_STATUS(mg_alloc(b, 1, &c), MG_ERR_OUT_OF_MEMORY);
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total_bytes));
    CHECK(free_bytes == 0 && total_bytes == 4096);
    CHECK_OK(mg_cpu_set_allocation_cap(b, 1 << 20));
    CHECK_OK(mg_free(b, a));
    a = 0;
    CHECK_OK(mg_alloc(b, 600001, &c)); /* fits again */
    CHECK_OK(mg_free(b, c));
    c = 0;
    /* Every byte counts in 256-byte steps: 4096 allocations of 256 fill 1 MiB exactly. */
    mg_devptr *many = calloc(4097, sizeof *many);
    size_t made = 0;
    while (made < 4097 && mg_alloc(b, 200, &many[made]) == MG_OK)
        made++;
    CHECK(made == 4096);
    CHECK_MESSAGE("out of memory");
    for (size_t i = 0; i < made; i++)
        CHECK_OK(mg_free(b, many[i]));
    free(many);
    CHECK_OK(mg_cpu_set_allocation_cap(b, 0));
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total_bytes));
    CHECK(total_bytes > (1 << 20));
}

static void test_fail_nth_allocation(mg_backend *b) {
    mg_devptr p[4] = {0};
    CHECK_OK(mg_cpu_fail_nth_allocation(b, 3));
    CHECK_OK(mg_alloc(b, 100, &p[0]));
    CHECK_OK(mg_alloc(b, 100, &p[1]));
    CHECK_STATUS(mg_alloc(b, 4242, &p[2]), MG_ERR_OUT_OF_MEMORY);
    CHECK_MESSAGE("injected");
    CHECK_MESSAGE("4242");
    CHECK(p[2] == 0);
    CHECK_OK(mg_alloc(b, 100, &p[3])); /* only the n-th fails */
    CHECK_OK(mg_cpu_fail_nth_allocation(b, 1));
    CHECK_OK(mg_cpu_fail_nth_allocation(b, 0)); /* disabled before it fired */
    CHECK_OK(mg_alloc(b, 100, &p[2]));
    for (int i = 0; i < 4; i++)
        CHECK_OK(mg_free(b, p[i]));
}

/* Eight devices, each its own backend with its own memory table. */
static void test_devices(void) {
    mg_backend *dev[8] = {0}, *extra = NULL;
    for (int i = 0; i < 8; i++)
        CHECK_OK(mg_backend_open(MG_BACKEND_CPU, i, &dev[i]));
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CPU, 8, &extra), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("out of range");
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CPU, 3, &extra), MG_ERR_BUSY);
    mg_devptr p = 0;
    uint8_t data[100] = {1, 2, 3};
    CHECK_OK(mg_alloc(dev[1], sizeof data, &p));
    CHECK_OK(mg_copy_h2d(dev[1], p, data, sizeof data));
    uint64_t live, count;
    CHECK_OK(mg_ledger_live(dev[2], &live, &count));
    CHECK(count == 0);
    /* Another device's memory is not this device's. */
    CHECK_STATUS(mg_copy_h2d(dev[2], p, data, sizeof data), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_free(dev[2], p), MG_ERR_INVALID_ARGUMENT);
    mg_device_info info;
    CHECK_OK(mg_device_get_info(dev[5], &info));
    CHECK(strstr(info.name, "CPU") != NULL);
    CHECK(info.cc_major == 0 && info.cc_minor == 0 && info.integrated);
    CHECK(info.multiprocessors == (int)sysconf(_SC_NPROCESSORS_ONLN));
    CHECK(strstr(info.driver, "metrale cpu 5") != NULL);
    for (int i = 0; i < 8; i++)
        CHECK_OK(mg_backend_close(dev[i])); /* dev[1] still holds p: close frees it */
    CHECK_STATUS(mg_cpu_get_counters(dev[0], &(mg_cpu_counters){0}), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("closed");
}

static void test_capabilities(mg_backend *b) {
    CHECK(mg_backend_supports(b, MG_CAP_MANAGED_MEMORY));
    CHECK(mg_backend_supports(b, MG_CAP_GRAPHS));
    CHECK(mg_backend_supports(b, MG_CAP_GRAPH_UPDATE));
    CHECK(!mg_backend_supports(b, MG_CAP_PINNED_HOST));
    CHECK(mg_backend_supports(b, MG_CAP_HOST_DEVICE_POINTER));
    CHECK(!mg_backend_supports(b, MG_CAP_MODULES));
    CHECK(mg_backend_supports(b, MG_CAP_EVENT_TIMING));
    CHECK(mg_op_supported(b, MG_OP_GEMM_BF16)); /* the reference GEMMs, src/ops/gemm */
    CHECK_STATUS(mg_module_load(b, "m", "x", "ptx", 3), MG_ERR_UNSUPPORTED);
}

/* host_alloc memory is plain heap memory, so it stays out of the process-wide pinned
 * registry (a CUDA backend in the same process would DMA from anything listed there); its
 * device address is its host address, and async copies from and to it work on streams. */
static void test_host_memory(mg_backend *b) {
    size_t before = mg_pinned_count();
    void *h = NULL;
    mg_devptr dp = 0, d = 0;
    CHECK_OK(mg_host_alloc(b, 1001, &h));
    CHECK(h && !mg_pinned_contains(h, 1));
    CHECK(mg_pinned_count() == before);
    CHECK_OK(mg_host_device_pointer(b, h, &dp));
    CHECK(dp == (mg_devptr)(uintptr_t)h);
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_alloc(b, 1001, &d));
    if (h && s && d) {
        test_fill_random(h, 1001);
        unsigned char expect[1001];
        memcpy(expect, h, sizeof expect);
        CHECK_OK(mg_copy_h2d_async(b, d, h, 1001, s));
        memset(h, 0xA5, 1001); /* poison: the round trip must bring the bytes back */
        CHECK_OK(mg_copy_d2h_async(b, h, d, 1001, s));
        CHECK_OK(mg_stream_synchronize(s));
        CHECK(memcmp(h, expect, sizeof expect) == 0);
    }
    CHECK_OK(mg_free(b, d));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_host_free(b, h));
    CHECK(mg_pinned_count() == before);
}

/* Capture semantics: a pageable (non-retained) source is snapshotted when recorded; a
 * retained one is read at every replay. */
static void test_capture_sources(mg_backend *b) {
    enum { N = 777 };
    uint8_t pageable[N], retained[N], want[N], got[N];
    mg_devptr d1 = 0, d2 = 0;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    CHECK_OK(mg_alloc(b, N, &d1));
    CHECK_OK(mg_alloc(b, N, &d2));
    CHECK_OK(mg_stream_create(b, &s));
    test_fill_random(pageable, N);
    memcpy(want, pageable, N);
    test_fill_random(retained, N);
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_copy_h2d_async(b, d1, pageable, N, s));
    CHECK_OK(mg_copy_h2d_async_retained(b, d2, retained, N, s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    for (int replay = 0; replay < 2; replay++) {
        test_fill_random(pageable, N); /* the caller reused it: the graph must not care */
        test_fill_random(retained, N); /* new input for this replay */
        CHECK_OK(mg_graph_launch(g, s));
        CHECK_OK(mg_stream_synchronize(s));
        CHECK_OK(mg_copy_d2h(b, got, d1, N));
        CHECK(memcmp(got, want, N) == 0);
        CHECK_OK(mg_copy_d2h(b, got, d2, N));
        CHECK(memcmp(got, retained, N) == 0);
    }
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_free(b, d1));
    CHECK_OK(mg_free(b, d2));
}

/* A replay that finds one of its buffers freed fails with a message; nothing is touched. */
static void test_replay_after_free(mg_backend *b) {
    mg_devptr keep = 0, gone = 0;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    uint8_t before[300], after[300];
    CHECK_OK(mg_alloc(b, 300, &keep));
    CHECK_OK(mg_alloc(b, 300, &gone));
    test_fill_random(before, sizeof before);
    CHECK_OK(mg_copy_h2d(b, keep, before, sizeof before));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, gone, 0, 300, s));
    CHECK_OK(mg_copy_d2d_async(b, keep, gone, 300, s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_free(b, gone));
    CHECK_STATUS(mg_graph_launch(g, s), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not inside any live allocation");
    CHECK_MESSAGE("graph node 1 of 2");
    CHECK_OK(mg_copy_d2h(b, after, keep, sizeof after));
    CHECK(memcmp(before, after, sizeof before) == 0);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_free(b, keep));
}

/* Events recorded into a capture get their time when the graph runs; destroying such an
 * event does not break the graph. Elapsed time is signed: end before start is negative. */
static void test_events_in_graphs(mg_backend *b) {
    mg_stream *s = NULL;
    mg_event *start = NULL, *end = NULL, *plain = NULL;
    mg_graph *g = NULL;
    mg_devptr d = 0;
    float ms = -1;
    CHECK_OK(mg_alloc(b, 1 << 16, &d));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_event_create(b, &start));
    CHECK_OK(mg_event_create(b, &end));
    CHECK_OK(mg_event_create(b, &plain));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_event_record(start, s));
    CHECK_OK(mg_memset_async(b, d, 9, 1 << 16, s));
    CHECK_OK(mg_event_record(end, s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    /* Recorded only into a graph that has not run: no time yet. */
    CHECK_STATUS(mg_event_elapsed_ms(start, end, &ms), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("never recorded");
    CHECK_OK(mg_event_query(start)); /* as never recorded: complete */
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_event_synchronize(end));
    CHECK_OK(mg_event_elapsed_ms(start, end, &ms));
    CHECK(ms >= 0.0f);
    CHECK_OK(mg_event_record(plain, s));
    CHECK_OK(mg_event_elapsed_ms(plain, start, &ms));
    CHECK(ms <= 0.0f);
    CHECK_OK(mg_event_destroy(start));
    CHECK_OK(mg_event_destroy(end));
    CHECK_OK(mg_graph_launch(g, s)); /* records into events whose handles are gone */
    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_event_destroy(plain));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_free(b, d));
}

/* A graph launched into a capture is recorded as a copy of its nodes. */
static void test_graph_into_capture(mg_backend *b) {
    mg_stream *s = NULL;
    mg_graph *inner = NULL, *outer = NULL;
    mg_devptr d = 0;
    uint8_t got[64], want[64];
    CHECK_OK(mg_alloc(b, 64, &d));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, d, 0x11, 64, s));
    CHECK_OK(mg_graph_end_capture(s, &inner));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_graph_launch(inner, s));
    CHECK_OK(mg_memset_async(b, d + 32, 0x22, 32, s));
    CHECK_OK(mg_graph_end_capture(s, &outer));
    CHECK_OK(mg_graph_destroy(inner)); /* the outer graph holds its own copy */
    CHECK_OK(mg_memset(b, d, 0, 64));
    CHECK_OK(mg_graph_launch(outer, s));
    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_copy_d2h(b, got, d, 64));
    memset(want, 0x11, 32);
    memset(want + 32, 0x22, 32);
    CHECK(memcmp(got, want, 64) == 0);
    CHECK_OK(mg_graph_destroy(outer));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_free(b, d));
}

/* The update is in place only when the node kinds and kernels are the same. */
static void test_graph_update_topology(mg_backend *b) {
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_kernel *add = NULL, *empty = NULL;
    mg_devptr d = 0;
    bool in_place = true;
    CHECK_OK(mg_alloc(b, 1024, &d));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &add));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &empty));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){64, 1, 1}, 0);
    mg_launch_arg_ptr(&l, d);
    mg_launch_arg_ptr(&l, d);
    mg_launch_arg_ptr(&l, d);
    mg_launch_arg_u32(&l, 256);
    mg_launch none;
    mg_launch_init(&none, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);

    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_launch_run(b, add, s, &l));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_launch_run(b, empty, s, &none)); /* same node count, another kernel */
    CHECK_OK(mg_graph_end_capture_update(s, g, &in_place));
    CHECK(!in_place);
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, d, 0, 8, s)); /* same count, another kind */
    CHECK_OK(mg_graph_end_capture_update(s, g, &in_place));
    CHECK(!in_place);
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, d + 8, 7, 16, s)); /* parameters only */
    CHECK_OK(mg_graph_end_capture_update(s, g, &in_place));
    CHECK(in_place);
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    uint8_t got[16];
    CHECK_OK(mg_copy_d2h(b, got, d + 8, 16));
    CHECK(got[0] == 7 && got[15] == 7);
    mg_kernel_release(add);
    mg_kernel_release(empty);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_free(b, d));
}

/* ------------------------------------------------------------------ kernel registry */

static mg_launch seen_launch;
static int scale_calls;

/* test:scale(ptr x, f32 factor, u32 n): x[i] *= factor. Keeps a copy of what it was given. */
static mg_status kernel_scale(const mg_launch *l) {
    seen_launch = *l;
    scale_calls++;
    float *x = (float *)(uintptr_t)mg_launch_get_ptr(l, 0);
    float factor = mg_launch_get_f32(l, 1);
    uint32_t n = mg_launch_get_u32(l, 2);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= factor;
    return MG_OK;
}

static mg_status kernel_offset(const mg_launch *l) {
    float *x = (float *)(uintptr_t)mg_launch_get_ptr(l, 0);
    uint32_t n = mg_launch_get_u32(l, 2);
    for (uint32_t i = 0; i < n; i++)
        x[i] += mg_launch_get_f32(l, 1);
    return MG_OK;
}

static mg_status kernel_failing(const mg_launch *l) {
    (void)l;
    return MG_ERR_DEVICE;
}

static void test_kernel_registry(mg_backend *b) {
    enum { N = 1000 };
    float host[N], got[N];
    mg_devptr d = 0;
    mg_kernel *k = NULL, *k_again = NULL, *bad = NULL;
    for (int i = 0; i < N; i++)
        host[i] = (float)i - 500.0f;
    CHECK_OK(mg_alloc(b, sizeof host, &d));
    CHECK_OK(mg_copy_h2d(b, d, host, sizeof host));
    CHECK_OK(mg_cpu_kernel_register("test", "scale", kernel_scale));
    CHECK_OK(mg_kernel_lookup(b, "test", "scale", &k));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){3, 2, 1}, (mg_dim3){64, 1, 1}, 4096);
    mg_launch_arg_ptr(&l, d);
    mg_launch_arg_f32(&l, 2.0f);
    mg_launch_arg_u32(&l, N);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    CHECK(scale_calls == 1);
    /* The kernel got the builder's exact list. */
    CHECK(seen_launch.grid.x == 3 && seen_launch.grid.y == 2 && seen_launch.block.x == 64);
    CHECK(seen_launch.shared_bytes == 4096 && seen_launch.arg_count == 3);
    CHECK(memcmp(seen_launch.slots, l.slots, l.slot_count * 8) == 0);
    CHECK_OK(mg_copy_d2h(b, got, d, sizeof got));
    CHECK(got[0] == -1000.0f && got[N - 1] == 998.0f);

    /* Registering again replaces the function behind handles already looked up. */
    CHECK_OK(mg_cpu_kernel_register("test", "scale", kernel_offset));
    CHECK_OK(mg_kernel_lookup(b, "test", "scale", &k_again));
    CHECK(k_again == k);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    CHECK(scale_calls == 1);
    CHECK_OK(mg_copy_d2h(b, got, d, sizeof got));
    CHECK(got[0] == -998.0f);

    /* A kernel's failure is the launch's status. */
    CHECK_OK(mg_cpu_kernel_register("test", "failing", kernel_failing));
    CHECK_OK(mg_kernel_lookup(b, "test", "failing", &bad));
    CHECK_STATUS(mg_launch_run(b, bad, NULL, &l), MG_ERR_DEVICE);

    CHECK_STATUS(mg_cpu_kernel_register(NULL, "x", kernel_scale), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("module");
    CHECK_STATUS(mg_cpu_kernel_register("test", "", kernel_scale), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("function");
    CHECK_STATUS(mg_cpu_kernel_register("test", "x", NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL kernel function");
    mg_kernel *missing = NULL;
    CHECK_STATUS(mg_kernel_lookup(b, "test", "never_registered", &missing), MG_ERR_NOT_FOUND);
    CHECK_MESSAGE("never_registered");
    CHECK_MESSAGE("\"test\"");

    mg_kernel_release(k);
    mg_kernel_release(k_again);
    mg_kernel_release(bad);
    CHECK_OK(mg_free(b, d));
}

/* The built-in vector_add checks its argument list and the ranges it touches. */
static void test_vector_add_checks(mg_backend *b) {
    mg_kernel *k = NULL;
    mg_devptr a = 0, out = 0;
    float poison[64], got[64];
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    CHECK_OK(mg_alloc(b, 256, &a));
    CHECK_OK(mg_alloc(b, 256, &out));
    test_fill_random(poison, sizeof poison);
    CHECK_OK(mg_copy_h2d(b, out, poison, sizeof poison));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){64, 1, 1}, 0);
    mg_launch_arg_ptr(&l, a);
    mg_launch_arg_ptr(&l, a);
    mg_launch_arg_ptr(&l, out);
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT); /* 3 arguments */
    CHECK_MESSAGE("takes 4 arguments");
    mg_launch_arg_u32(&l, 65); /* 260 bytes of 256 */
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overrun");
    CHECK_MESSAGE("metrale:vector_add argument 0");
    mg_launch_clear_args(&l);
    mg_launch_arg_ptr(&l, a);
    mg_launch_arg_ptr(&l, a);
    mg_launch_arg_ptr(&l, out + 2);
    mg_launch_arg_u32(&l, 8);
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("misaligned");
    mg_launch_clear_args(&l);
    mg_launch_arg_ptr(&l, a);
    mg_launch_arg_u32(&l, 8); /* wrong kind in slot 1 */
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, 8);
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("argument 1 must be buffer");
    CHECK_OK(mg_copy_d2h(b, got, out, sizeof got));
    CHECK(memcmp(got, poison, sizeof got) == 0); /* no failed launch wrote */
    mg_kernel_release(k);
    CHECK_OK(mg_free(b, a));
    CHECK_OK(mg_free(b, out));
}

int main(void) {
    test_seed();
    test_devices();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 2, &b));
    if (!b)
        return test_finish();
    test_counters(b);
    test_allocation_cap(b);
    test_fail_nth_allocation(b);
    test_capabilities(b);
    test_host_memory(b);
    test_capture_sources(b);
    test_replay_after_free(b);
    test_events_in_graphs(b);
    test_graph_into_capture(b);
    test_graph_update_topology(b);
    test_kernel_registry(b);
    test_vector_add_checks(b);
    uint64_t live, count;
    CHECK_OK(mg_ledger_live(b, &live, &count));
    CHECK(live == 0 && count == 0);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
