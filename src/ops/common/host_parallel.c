/* host_parallel.c - mg_host_parallel_for (host_parallel.h) on pthreads. */
#include "host_parallel.h"

#include <pthread.h>
#include <unistd.h>

#define MAX_THREADS 16

typedef struct part {
    mg_host_range_fn fn;
    void *ctx;
    size_t first, count;
} part;

static void *run_part(void *arg) {
    part *p = arg;
    p->fn(p->ctx, p->first, p->count);
    return NULL;
}

void mg_host_parallel_for(size_t items, size_t min_items, mg_host_range_fn fn, void *ctx) {
    if (!items)
        return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cores > 1 ? (size_t)cores : 1;
    threads = threads > MAX_THREADS ? MAX_THREADS : threads;
    if (min_items && items / min_items < threads)
        threads = items / min_items ? items / min_items : 1;
    part parts[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (size_t t = 0; t < threads; t++) {
        size_t lo = items * t / threads, hi = items * (t + 1) / threads;
        parts[t] = (part){.fn = fn, .ctx = ctx, .first = lo, .count = hi - lo};
    }
    for (size_t t = 0; t + 1 < threads; t++)
        started[t] = pthread_create(&tids[t], NULL, run_part, &parts[t]) == 0;
    for (size_t t = 0; t + 1 < threads; t++)
        if (!started[t])
            run_part(&parts[t]);
    run_part(&parts[threads - 1]);
    for (size_t t = 0; t + 1 < threads; t++)
        if (started[t])
            pthread_join(tids[t], NULL);
}
