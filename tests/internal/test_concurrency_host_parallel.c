/* test_concurrency_host_parallel.c - mg_host_parallel_for's pool, whose workers poll for work
 * before they sleep: every item of every call runs exactly once and its writes are seen by
 * the caller on return, whether the workers were polling (calls back to back) or asleep (a
 * pause longer than the poll time between calls), with several threads calling at once (the
 * pool busy: threads of their own) and calls nested inside parts (also run under
 * ThreadSanitizer: make test-tsan, which would report a missing happens-before edge). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/host_parallel.h"
#include "test_util.h"

enum { ITEMS = 1031, CALLERS = 3, ROUNDS = 300 };

typedef struct job {
    unsigned *hits; /* plain writes: the pool must order them before the call returns */
    size_t items;
    bool nest;
} job;

static void count_range(void *ctx, size_t first, size_t count) {
    job *j = ctx;
    for (size_t i = first; i < first + count; i++)
        j->hits[i]++;
    if (j->nest && count) {
        unsigned inner[17];
        memset(inner, 0, sizeof inner);
        job nested = {.hits = inner, .items = 17, .nest = false};
        mg_host_parallel_for(17, 1, count_range, &nested);
        for (size_t i = 0; i < 17; i++)
            if (inner[i] != 1)
                j->hits[first] += 1000; /* flagged by the caller's count check */
    }
}

static atomic_int failures;

/* Runs ROUNDS calls on a fresh array of awkward size, pausing now and then for longer than
 * the poll time so that the workers go to sleep and must be woken. */
static void rounds(unsigned seed, bool pauses) {
    unsigned *hits = malloc(ITEMS * sizeof *hits);
    if (!hits) {
        atomic_fetch_add(&failures, 1);
        return;
    }
    for (int r = 0; r < ROUNDS; r++) {
        seed = seed * 1103515245u + 12345u;
        const size_t items = 1 + (seed >> 8) % ITEMS;
        const size_t min_items = (seed >> 4) % 7; /* 0 .. 6: sometimes the caller alone */
        memset(hits, 0xA5, ITEMS * sizeof *hits); /* poisoned, then counted from zero */
        memset(hits, 0, items * sizeof *hits);
        job j = {.hits = hits, .items = items, .nest = r % 17 == 0};
        mg_host_parallel_for(items, min_items, count_range, &j);
        for (size_t i = 0; i < items; i++)
            if (hits[i] != 1) {
                atomic_fetch_add(&failures, 1);
                break;
            }
        if (hits[items - 1 + (items < ITEMS)] != (items < ITEMS ? 0xA5A5A5A5u : 1u))
            atomic_fetch_add(&failures, 1); /* nothing written past the range */
        if (pauses && r % 50 == 0) {
            struct timespec pause = {0, 3 * 1000 * 1000}; /* 3 ms, over the 1 ms poll time */
            nanosleep(&pause, NULL);
        }
    }
    free(hits);
}

static void *caller(void *arg) {
    rounds((unsigned)(uintptr_t)arg, false);
    return NULL;
}

int main(void) {
    /* a short poll time so the sleeping path runs too; read when the pool starts */
    setenv("METRALE_HOST_SPIN_US", "1000", 1);
    rounds(12345u, true); /* one caller: the pool, polling and sleeping */
    pthread_t tids[CALLERS];
    for (int t = 0; t < CALLERS; t++)
        CHECK(pthread_create(&tids[t], NULL, caller, (void *)(uintptr_t)(777u + t)) == 0);
    for (int t = 0; t < CALLERS; t++)
        pthread_join(tids[t], NULL);
    CHECK(atomic_load(&failures) == 0);
    return test_finish();
}
