/*
 * test_concurrency_timing.c - one timing object shared by several threads (metrale/timing.h),
 * run under ThreadSanitizer by `make test-tsan`: each worker records lane and kernel spans on
 * its own stream while another thread starts steps and harvests. Every attempted span is
 * either recorded or counted as dropped, every recorded span is harvested once, and the
 * per-lane summaries add up.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "metrale/timing.h"
#include "utils_test_support.h"

#define WORKERS 4
#define SPANS_PER_WORKER 400

static mg_backend *backend;
static mg_timing *timing;
static uint32_t lanes[WORKERS];
static atomic_int workers_done;
static atomic_uint_fast64_t attempted;
static atomic_int errors;

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    mg_stream *s = NULL;
    if (mg_stream_create(backend, &s) != MG_OK) {
        atomic_fetch_add(&errors, 1);
        atomic_fetch_add(&workers_done, 1);
        return NULL;
    }
    for (int i = 0; i < SPANS_PER_WORKER; i++) {
        mg_timing_span lane = 0, kernel = 0;
        if (mg_timing_lane_begin(timing, lanes[id], s, &lane) != MG_OK)
            atomic_fetch_add(&errors, 1);
        atomic_fetch_add(&attempted, 1);
        if (mg_timing_kernel_begin(timing, id % 2 ? "metrale:odd" : "metrale:even", s, &kernel) !=
            MG_OK)
            atomic_fetch_add(&errors, 1);
        atomic_fetch_add(&attempted, 1); /* every step is armed: each call is an attempt */
        if (mg_timing_span_end(timing, kernel, s) != MG_OK ||
            mg_timing_span_end(timing, lane, s) != MG_OK)
            atomic_fetch_add(&errors, 1);
    }
    mg_stream_destroy(s);
    atomic_fetch_add(&workers_done, 1);
    return NULL;
}

static void *stepper(void *arg) {
    (void)arg;
    uint64_t step = 0;
    while (atomic_load(&workers_done) < WORKERS) {
        if (mg_timing_step_begin(timing, step++) != MG_OK)
            atomic_fetch_add(&errors, 1);
        (void)mg_timing_kernel_spans_armed(timing);
        (void)mg_timing_summary_count(timing);
    }
    return NULL;
}

int main(void) {
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &backend));
    if (!backend)
        return test_finish();
    /* a small pool so that drops happen while the stepper lags */
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .pool_pairs = 64, .kernel_span_every = 1};
    CHECK_OK(mg_timing_create(backend, &o, &timing));
    if (!timing)
        return test_finish();
    CHECK_OK(mg_timing_step_begin(timing, 0)); /* armed from now on */
    for (int i = 0; i < WORKERS; i++) {
        char name[16];
        snprintf(name, sizeof name, "worker%d", i);
        CHECK_OK(mg_timing_lane(timing, name, &lanes[i]));
    }
    pthread_t threads[WORKERS + 1];
    for (intptr_t i = 0; i < WORKERS; i++)
        CHECK(pthread_create(&threads[i], NULL, worker, (void *)i) == 0);
    CHECK(pthread_create(&threads[WORKERS], NULL, stepper, NULL) == 0);
    for (int i = 0; i <= WORKERS; i++)
        pthread_join(threads[i], NULL);
    CHECK_OK(mg_timing_harvest(timing, NULL));

    CHECK(atomic_load(&errors) == 0);
    mg_timing_counters c;
    CHECK_OK(mg_timing_get_counters(timing, &c));
    CHECK(c.open == 0 && c.pending == 0 && c.abandoned == 0);
    CHECK(c.recorded + c.dropped_pool_full == atomic_load(&attempted));
    CHECK(c.harvested == c.recorded);
    uint64_t summarised = 0, lane_spans = 0;
    for (size_t i = 0; i < mg_timing_summary_count(timing); i++) {
        mg_timing_summary s;
        CHECK_OK(mg_timing_summary_get(timing, i, &s));
        summarised += s.count;
        if (s.kind == MG_TIMING_LANE)
            lane_spans += s.count;
        CHECK(s.count == 0 ||
              (s.min_us <= s.p50_us && s.p50_us <= s.p99_us && s.p99_us <= s.max_us));
    }
    CHECK(summarised == c.harvested);
    CHECK(lane_spans <= WORKERS * SPANS_PER_WORKER);
    printf("recorded %llu, dropped %llu of %llu attempted spans\n", (unsigned long long)c.recorded,
           (unsigned long long)c.dropped_pool_full, (unsigned long long)atomic_load(&attempted));
    CHECK_OK(mg_timing_destroy(timing));
    CHECK_OK(mg_backend_close(backend));
    return test_finish();
}
