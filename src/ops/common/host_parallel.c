/* host_parallel.c - mg_host_parallel_for (host_parallel.h) on pthreads.
 *
 * A pool of one worker per other online core, started at the first call and kept for the
 * process, takes the parts of one call at a time: starting threads per call cost tens of
 * microseconds, as much as a decode GEMV's whole work. A call that finds the pool busy (another
 * thread's call, or a nested call from inside a part) starts threads of its own, as before. */
#include "host_parallel.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
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

static size_t online_cores(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cores > 1 ? (size_t)cores : 1;
    return threads > MAX_THREADS ? MAX_THREADS : threads;
}

/* ------------------------------------------------------------------ the pool */

static struct {
    pthread_mutex_t busy; /* held by the call using the pool */
    pthread_mutex_t lock; /* guards the fields below */
    pthread_cond_t start, done;
    uint64_t generation; /* one per call */
    part parts[MAX_THREADS];
    size_t worker_parts; /* parts[0 .. worker_parts) go to workers 0 .. worker_parts - 1 */
    size_t pending;      /* worker parts not finished */
    size_t workers;      /* started */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .start = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static void *worker(void *arg) {
    const size_t index = (size_t)(uintptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.generation == seen)
            pthread_cond_wait(&pool.start, &pool.lock);
        seen = pool.generation;
        if (index >= pool.worker_parts)
            continue;
        part p = pool.parts[index];
        pthread_mutex_unlock(&pool.lock);
        run_part(&p);
        pthread_mutex_lock(&pool.lock);
        if (--pool.pending == 0)
            pthread_cond_signal(&pool.done);
    }
    return NULL;
}

static void pool_start(void) {
    const size_t want = online_cores() - 1;
    for (size_t i = 0; i < want; i++) {
        pthread_t tid;
        pthread_attr_t attr;
        if (pthread_attr_init(&attr))
            break;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const bool ok = pthread_create(&tid, &attr, worker, (void *)(uintptr_t)i) == 0;
        pthread_attr_destroy(&attr);
        if (!ok)
            break;
        pool.workers++;
    }
}

/* Runs parts[0 .. threads) on the pool and the calling thread (which takes the last); false,
 * with nothing run, when the pool is busy or has too few workers. */
static bool pool_run(part *parts, size_t threads) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pool_start);
    if (pool.workers + 1 < threads || pthread_mutex_trylock(&pool.busy))
        return false;
    pthread_mutex_lock(&pool.lock);
    for (size_t t = 0; t + 1 < threads; t++)
        pool.parts[t] = parts[t];
    pool.worker_parts = pool.pending = threads - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    run_part(&parts[threads - 1]);
    pthread_mutex_lock(&pool.lock);
    while (pool.pending)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
    return true;
}

/* ------------------------------------------------------------------ mg_host_parallel_for */

void mg_host_parallel_for(size_t items, size_t min_items, mg_host_range_fn fn, void *ctx) {
    if (!items)
        return;
    size_t threads = online_cores();
    if (min_items && items / min_items < threads)
        threads = items / min_items ? items / min_items : 1;
    part parts[MAX_THREADS];
    for (size_t t = 0; t < threads; t++) {
        size_t lo = items * t / threads, hi = items * (t + 1) / threads;
        parts[t] = (part){.fn = fn, .ctx = ctx, .first = lo, .count = hi - lo};
    }
    if (threads == 1) {
        run_part(&parts[0]);
        return;
    }
    if (pool_run(parts, threads))
        return;
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
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
