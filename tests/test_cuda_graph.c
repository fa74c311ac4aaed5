/*
 * test_cuda_graph.c - graphs and launches of the CUDA backend on a real device (skipped
 * without one): capture and replay of copies, memsets and kernels with fresh data each
 * replay; in-place update of a graph's kernel arguments and re-instantiation when the
 * topology changes; launches with more than 48 KiB of dynamic shared memory; event timing
 * and queries. Results are checked against values computed on the host.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_cuda_util.h"

static void read_u32(mg_backend *b, mg_devptr p, uint32_t *out, uint32_t n) {
    CHECK_OK(mg_copy_d2h(b, out, p, (size_t)n * 4));
}

static size_t count_not(const uint32_t *v, uint32_t n, uint32_t expect) {
    size_t bad = 0;
    for (uint32_t i = 0; i < n; i++)
        bad += v[i] != expect;
    return bad;
}

/* A step made of an h2d copy from pinned memory, a d2d copy, a memset, a kernel and a d2h
 * copy, captured once and replayed with new inputs: out = 2 * in each time. */
static void test_capture_replay(mg_backend *b, mg_stream *s) {
    uint32_t n = (uint32_t)test_rand_range(1000, 300000);
    size_t bytes = (size_t)n * sizeof(float);
    float *in = NULL, *out = NULL;
    CHECK_OK(mg_host_alloc(b, bytes, (void **)&in));
    CHECK_OK(mg_host_alloc(b, bytes, (void **)&out));
    mg_devptr x = 0, y = 0, z = 0;
    CHECK_OK(mg_alloc(b, bytes, &x));
    CHECK_OK(mg_alloc(b, bytes, &y));
    CHECK_OK(mg_alloc(b, bytes, &z));
    mg_kernel *add = cuda_test_kernel(b, "vector_add");
    if (!in || !out || !add)
        return;
    for (uint32_t i = 0; i < n; i++)
        out[i] = -1.0f; /* poison: a replay must overwrite every element */

    CHECK_OK(mg_graph_begin_capture(s));
    bool capturing = false;
    CHECK_OK(mg_stream_is_capturing(s, &capturing));
    CHECK(capturing);
    CHECK_OK(mg_copy_h2d_async_retained(b, x, in, bytes, s));
    CHECK_OK(mg_copy_d2d_async(b, y, x, bytes, s));
    CHECK_OK(mg_memset_async(b, z, 0xFF, bytes, s)); /* NaNs, overwritten by the kernel */
    CHECK_OK(cuda_test_vector_add(b, add, s, x, y, z, n));
    CHECK_OK(mg_copy_d2h_async(b, out, z, bytes, s));
    CHECK_STATUS(mg_stream_synchronize(s), MG_ERR_CAPTURING);
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_stream_is_capturing(s, &capturing));
    CHECK(!capturing);
    CHECK(out[0] == -1.0f && out[n - 1] == -1.0f); /* captured work did not run */

    for (int replay = 0; replay < 4 && g; replay++) {
        for (uint32_t i = 0; i < n; i++)
            in[i] = (float)(int32_t)(test_rand() % 2000001) - 1000000.0f;
        CHECK_OK(mg_graph_launch(g, s));
        CHECK_OK(mg_stream_synchronize(s));
        size_t wrong = 0;
        for (uint32_t i = 0; i < n; i++)
            wrong += out[i] != 2.0f * in[i];
        CHECK(wrong == 0);
    }
    CHECK_OK(mg_graph_destroy(g));
    mg_kernel_release(add);
    CHECK_OK(mg_free(b, x));
    CHECK_OK(mg_free(b, y));
    CHECK_OK(mg_free(b, z));
    CHECK_OK(mg_host_free(b, in));
    CHECK_OK(mg_host_free(b, out));
}

/* Same topology, new kernel arguments: updated in place. New topology: re-instantiated,
 * and the handle keeps working. */
static void test_graph_update(mg_backend *b, mg_stream *s) {
    uint32_t n = (uint32_t)test_rand_range(5000, 100000);
    mg_devptr p = 0, q = 0;
    CHECK_OK(mg_alloc(b, (size_t)n * 4, &p));
    CHECK_OK(mg_alloc(b, (size_t)n * 4, &q));
    mg_kernel *fill = cuda_test_kernel(b, "fill_u32");
    uint32_t *host = malloc((size_t)n * 4);
    if (!fill || !host)
        return;
    uint32_t v1 = (uint32_t)test_rand() | 1u, v2 = v1 + 2, v3 = v1 + 4;

    mg_graph *g = NULL;
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(cuda_test_fill_u32(b, fill, s, p, v1, n));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_memset(b, p, 0, (size_t)n * 4));
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    read_u32(b, p, host, n);
    CHECK(count_not(host, n, v1) == 0);

    bool in_place = false;
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(cuda_test_fill_u32(b, fill, s, q, v2, n)); /* new pointer and value */
    CHECK_OK(mg_graph_end_capture_update(s, g, &in_place));
    CHECK(in_place);
    CHECK_OK(mg_memset(b, p, 0, (size_t)n * 4));
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    read_u32(b, q, host, n);
    CHECK(count_not(host, n, v2) == 0);
    read_u32(b, p, host, n);
    CHECK(count_not(host, n, 0) == 0); /* the old argument is gone */

    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(cuda_test_fill_u32(b, fill, s, p, v3, n));
    CHECK_OK(mg_memset_async(b, q, 0x5A, (size_t)n * 4, s));
    CHECK_OK(mg_graph_end_capture_update(s, g, &in_place));
    CHECK(!in_place);
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    read_u32(b, p, host, n);
    CHECK(count_not(host, n, v3) == 0);
    read_u32(b, q, host, n);
    CHECK(count_not(host, n, 0x5A5A5A5Au) == 0);

    CHECK_OK(mg_graph_destroy(g));
    mg_kernel_release(fill);
    CHECK_OK(mg_free(b, p));
    CHECK_OK(mg_free(b, q));
    free(host);
}

/* More than 48 KiB of dynamic shared memory: the function's limit is raised first. Asking
 * for more than the device allows fails before launching, naming the sizes. */
static void test_large_shared(mg_backend *b, mg_stream *s) {
    mg_device_info info;
    CHECK_OK(mg_device_get_info(b, &info));
    mg_kernel *k = cuda_test_kernel(b, "shared_reverse");
    if (!k)
        return;
    uint32_t sizes[] = {1024, 48 * 1024, 48 * 1024 + 4, 100 * 1024,
                        info.max_shared_per_block_optin};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        uint32_t shared =
            sizes[t] > info.max_shared_per_block_optin ? info.max_shared_per_block_optin : sizes[t];
        uint32_t words = shared / 4, seed = (uint32_t)test_rand();
        mg_devptr out = 0;
        CHECK_OK(mg_alloc(b, (size_t)words * 4, &out));
        CHECK_OK(mg_memset(b, out, 0xEE, (size_t)words * 4));
        mg_launch l;
        mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){256, 1, 1}, shared);
        mg_launch_arg_ptr(&l, out);
        mg_launch_arg_u32(&l, words);
        mg_launch_arg_u32(&l, seed);
        CHECK_OK(mg_launch_run(b, k, s, &l));
        CHECK_OK(mg_stream_synchronize(s));
        uint32_t *host = malloc((size_t)words * 4);
        if (host) {
            read_u32(b, out, host, words);
            size_t wrong = 0;
            for (uint32_t i = 0; i < words; i++)
                wrong += host[i] != (words - 1 - i) * 2654435761u + seed;
            if (wrong)
                fprintf(stderr, "  shared_reverse with %u bytes: %zu words wrong\n", shared, wrong);
            CHECK(wrong == 0);
            free(host);
        }
        CHECK_OK(mg_free(b, out));
    }
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){32, 1, 1},
                   info.max_shared_per_block_optin + 4);
    mg_launch_arg_ptr(&l, 0);
    mg_launch_arg_u32(&l, 0);
    mg_launch_arg_u32(&l, 0);
    CHECK_STATUS(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("shared_reverse");
    CHECK_MESSAGE("dynamic shared memory");
    mg_kernel_release(k);
}

static void test_events(mg_backend *b, mg_stream *s) {
    mg_kernel *spin = cuda_test_kernel(b, "spin_kernel");
    mg_event *start = NULL, *end = NULL;
    CHECK_OK(mg_event_create(b, &start));
    CHECK_OK(mg_event_create(b, &end));
    if (!spin || !start || !end)
        return;
    CHECK_OK(mg_event_record(start, s));
    CHECK_OK(cuda_test_spin(b, spin, s, 200ull * 1000 * 1000));
    CHECK_OK(mg_event_record(end, s));
    CHECK_STATUS(mg_event_query(end), MG_ERR_NOT_READY);
    float ms = 0;
    CHECK_STATUS(mg_event_elapsed_ms(start, end, &ms), MG_ERR_NOT_READY);
    CHECK_OK(mg_event_synchronize(end));
    CHECK_OK(mg_event_query(end));
    CHECK_OK(mg_event_elapsed_ms(start, end, &ms));
    CHECK(ms >= 199.0f && isfinite(ms));

    /* Cross-stream ordering: the default stream waits for `end` of s. */
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, 4, &p));
    CHECK_OK(mg_memset(b, p, 0, 4));
    CHECK_OK(mg_event_record(start, s));
    CHECK_OK(cuda_test_spin(b, spin, s, 50ull * 1000 * 1000));
    CHECK_OK(mg_memset_async(b, p, 0x01, 4, s));
    CHECK_OK(mg_event_record(end, s));
    CHECK_OK(mg_stream_wait_event(mg_stream_default(b), end));
    CHECK_OK(mg_memset_async(b, p + 3, 0x02, 1, NULL));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    uint8_t got[4];
    CHECK_OK(mg_copy_d2h(b, got, p, 4));
    CHECK(got[0] == 1 && got[1] == 1 && got[2] == 1 && got[3] == 2);
    CHECK_OK(mg_free(b, p));
    CHECK_OK(mg_event_destroy(start));
    CHECK_OK(mg_event_destroy(end));
    mg_kernel_release(spin);
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_graph");
    CHECK(mg_backend_supports(b, MG_CAP_GRAPHS) && mg_backend_supports(b, MG_CAP_GRAPH_UPDATE));
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    if (s) {
        test_capture_replay(b, s);
        test_graph_update(b, s);
        test_large_shared(b, s);
        test_events(b, s);
    }
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
