/*
 * test_cuda_pending_work.c - what waits for queued device work and what does not (skipped
 * without a CUDA device); the spin kernel keeps a stream busy for a known time:
 *  - op-cache scratch growth while a kernel still runs on the stream retires the old buffer
 *    (still live in the ledger, so the kernel may keep using it); once the stream has
 *    synchronized, the next scratch call frees it and the ledger is back;
 *  - a timing span ended before its work finished stays pending: a harvest neither blocks
 *    nor reads it, a harvest after the work completes does, with the spin's duration.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "metrale/timing.h"
#include "op_cache.h"
#include "test_cuda_util.h"

#define SPIN_NS (300ull * 1000 * 1000) /* long enough that the host checks finish first */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void test_scratch_retirement(mg_backend *b, mg_kernel *spin, mg_stream *s) {
    mg_op_cache *c = mg_backend_op_cache(b);
    uint64_t bytes0 = 0, count0 = 0, bytes = 0, count = 0;
    size_t live = 0, retired = 0, live0 = 0, retired0 = 0;
    size_t small_bytes = (size_t)test_rand_range(1000, 100000);
    size_t big_bytes = small_bytes * 3 + 17;
    CHECK_OK(mg_stream_synchronize(s));
    mg_op_cache_scratch_counts(c, &live0, &retired0);
    CHECK(retired0 == 0);
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));

    mg_devptr small = 0, big = 0, again = 0;
    CHECK_OK(mg_op_cache_scratch(c, "test.retire", small_bytes, s, &small));
    CHECK_OK(cuda_test_spin(b, spin, s, SPIN_NS));
    double t0 = now_ms();
    CHECK_OK(mg_op_cache_scratch(c, "test.retire", big_bytes, s, &big)); /* grows: retires */
    CHECK(big && big != small);
    mg_op_cache_scratch_counts(c, &live, &retired);
    CHECK(live == live0 + 1 && retired == 1);
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(count == count0 + 2 && bytes == bytes0 + small_bytes + big_bytes); /* old still live */
    /* a scratch call while the kernel runs does not wait for it, nor free the old buffer */
    CHECK_OK(mg_op_cache_scratch(c, "test.retire", 10, s, &again));
    CHECK(again == big);
    mg_op_cache_scratch_counts(c, &live, &retired);
    CHECK(retired == 1);
    double host_ms = now_ms() - t0;
    CHECK(host_ms < SPIN_NS / 1e6 / 2); /* none of the above waited for the spin */

    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_op_cache_scratch(c, "test.retire", 10, s, &again)); /* reclaims */
    CHECK(again == big);
    mg_op_cache_scratch_counts(c, &live, &retired);
    CHECK(live == live0 + 1 && retired == 0);
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(count == count0 + 1 && bytes == bytes0 + big_bytes);
}

static void test_pending_span(mg_backend *b, mg_kernel *spin, mg_stream *s) {
    mg_timing_options o = {.level = MG_TELEMETRY_BASIC};
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    if (!t)
        return;
    uint32_t lane = 0;
    CHECK_OK(mg_timing_lane(t, "spin", &lane));
    CHECK_OK(mg_stream_synchronize(s));
    mg_timing_span span = 0;
    CHECK_OK(mg_timing_lane_begin(t, lane, s, &span));
    CHECK_OK(cuda_test_spin(b, spin, s, SPIN_NS));
    CHECK_OK(mg_timing_span_end(t, span, s));

    double t0 = now_ms();
    size_t harvested = 99;
    CHECK_OK(mg_timing_harvest(t, &harvested));
    double host_ms = now_ms() - t0;
    CHECK(harvested == 0);
    CHECK(host_ms < SPIN_NS / 1e6 / 2); /* did not wait for the spin */
    mg_timing_counters counters;
    CHECK_OK(mg_timing_get_counters(t, &counters));
    CHECK(counters.pending == 1 && counters.harvested == 0 && counters.open == 0);
    CHECK_OK(mg_timing_step_begin(t, 1)); /* harvests too, and does not block either */
    CHECK(now_ms() - t0 < SPIN_NS / 1e6 / 2);
    CHECK_OK(mg_timing_get_counters(t, &counters));
    CHECK(counters.pending == 1);

    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_timing_harvest(t, &harvested));
    CHECK(harvested == 1);
    CHECK_OK(mg_timing_get_counters(t, &counters));
    CHECK(counters.pending == 0 && counters.harvested == 1);
    mg_timing_summary sum;
    CHECK_OK(mg_timing_summary_get(t, 0, &sum));
    CHECK(sum.count == 1 && strcmp(sum.name, "spin") == 0);
    CHECK(sum.total_us >= SPIN_NS / 1e3 * 0.99 && sum.total_us < SPIN_NS / 1e3 * 20);
    CHECK_OK(mg_timing_destroy(t));
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_pending_work");
    mg_kernel *spin = cuda_test_kernel(b, "spin_kernel");
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    if (spin && s) {
        test_scratch_retirement(b, spin, s);
        test_pending_span(b, spin, s);
    }
    if (s)
        CHECK_OK(mg_stream_destroy(s));
    if (spin)
        CHECK_OK(mg_kernel_release(spin));
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
