/* host_parallel.c - mg_host_parallel_for (host_parallel.h) on pthreads.
 *
 * A pool of one worker per other online core, started at the first call and kept for the
 * process, takes the parts of one call at a time: starting threads per call cost tens of
 * microseconds, as much as a decode GEMV's whole work; waits spin briefly before sleeping (below).
 * A call that finds the pool busy (another thread's call, or a nested call from inside a part)
 * starts threads of its own, as before. */
#include "host_parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
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

/* A decode step runs about 200 parallel regions a few tens of microseconds apart; a worker
 * that sleeps on the condition variable between them pays a futex wake-up (several
 * microseconds, more on a loaded machine) each time. So a waiting thread first polls its
 * atomic for up to SPIN_NS, and only then sleeps; an idle pool costs no CPU after that. */
#define SPIN_NS_DEFAULT 200000

/* METRALE_HOST_SPIN_US overrides the poll time in microseconds (0: sleep at once), read at pool
 * start; a value that is not a decimal number up to 1000000 is ignored. */
static uint64_t spin_ns = SPIN_NS_DEFAULT;

typedef struct slot {
    _Atomic uint64_t generation; /* bumped, release, when parts[index] holds new work */
    char pad[64 - sizeof(uint64_t)];
} slot;

static struct {
    pthread_mutex_t busy; /* held by the call using the pool */
    pthread_mutex_t lock; /* pairs with the condition variables */
    pthread_cond_t start, done;
    part parts[MAX_THREADS];
    slot slots[MAX_THREADS];
    uint64_t generation;     /* one per call; written under busy only */
    _Atomic size_t pending;  /* worker parts not finished */
    _Atomic size_t sleepers; /* workers in (or entering) pthread_cond_wait(start) */
    _Atomic bool caller_asleep;
    size_t workers; /* started */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .start = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls until *word differs from old or SPIN_NS pass; returns the last value read. */
static uint64_t spin_while_equal(_Atomic uint64_t *word, uint64_t old) {
    uint64_t v = atomic_load_explicit(word, memory_order_acquire);
    if (v != old)
        return v;
    const uint64_t deadline = now_ns() + spin_ns;
    for (unsigned i = 1;; i++) {
        cpu_relax();
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != old)
            return v;
        if ((i & 63) == 0) {
            if (now_ns() > deadline)
                return v;
            sched_yield();
        }
    }
}

static void *worker(void *arg) {
    const size_t index = (size_t)(uintptr_t)arg;
    _Atomic uint64_t *mine = &pool.slots[index].generation;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = spin_while_equal(mine, seen);
        if (g == seen) {
            /* sleepers is raised before the generation is read again and the caller bumps the
             * generation before reading sleepers (both seq_cst), so either this worker sees
             * the new work or the caller sees a sleeper and broadcasts under the lock. */
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((g = atomic_load(mine)) == seen)
                pthread_cond_wait(&pool.start, &pool.lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = g;
        part p = pool.parts[index];
        run_part(&p);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1 &&
            atomic_load(&pool.caller_asleep)) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
    return NULL;
}

static void pool_start(void) {
    const char *env = getenv("METRALE_HOST_SPIN_US");
    if (env && *env >= '0' && *env <= '9') {
        char *end = NULL;
        const unsigned long long us = strtoull(env, &end, 10);
        if (!*end && us <= 1000000u)
            spin_ns = (uint64_t)us * 1000u;
    }
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

/* Polls pending down to zero for up to SPIN_NS, then sleeps on done. */
static void wait_pending(void) {
    const uint64_t deadline = now_ns() + spin_ns;
    for (unsigned i = 1; atomic_load_explicit(&pool.pending, memory_order_acquire); i++) {
        cpu_relax();
        if ((i & 63) == 0 && now_ns() <= deadline)
            sched_yield();
        else if ((i & 63) == 0) {
            /* caller_asleep is raised before pending is read again and the last worker lowers
             * pending before reading caller_asleep (seq_cst): one of them sees the other. */
            pthread_mutex_lock(&pool.lock);
            atomic_store(&pool.caller_asleep, true);
            while (atomic_load(&pool.pending))
                pthread_cond_wait(&pool.done, &pool.lock);
            atomic_store(&pool.caller_asleep, false);
            pthread_mutex_unlock(&pool.lock);
            return;
        }
    }
}

/* Runs parts[0 .. threads) on the pool and the calling thread (which takes the last); false,
 * with nothing run, when the pool is busy or has too few workers. Only the workers given a
 * part are woken. */
static bool pool_run(part *parts, size_t threads) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pool_start);
    if (pool.workers + 1 < threads || pthread_mutex_trylock(&pool.busy))
        return false;
    const uint64_t g = ++pool.generation;
    atomic_store_explicit(&pool.pending, threads - 1, memory_order_relaxed);
    for (size_t t = 0; t + 1 < threads; t++) {
        pool.parts[t] = parts[t];
        atomic_store(&pool.slots[t].generation, g);
    }
    if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.start);
        pthread_mutex_unlock(&pool.lock);
    }
    run_part(&parts[threads - 1]);
    wait_pending();
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
