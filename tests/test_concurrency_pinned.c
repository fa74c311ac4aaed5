/*
 * test_concurrency_pinned.c - the pinned-host registry under many threads (metrale/pinned.h),
 * run under ThreadSanitizer by `make test-tsan`.
 *
 * Readers look up ranges registered before the threads start (always a hit) and the gaps
 * between them (always a miss) while writers register, re-register and unregister ranges in
 * their own address windows, checking that each of their own changes is visible to
 * themselves at once. Afterwards only the stable ranges remain.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "metrale/pinned.h"
#include "utils_test_support.h"

#define AT(addr) ((const void *)(uintptr_t)(addr))

#define READERS 8
#define WRITERS 4
#define STABLE_RANGES 300
#define WRITER_ROUNDS 3000
#define READER_ROUNDS 20000

static const uintptr_t STABLE_BASE = (uintptr_t)0x200000000000ull;
static const uintptr_t WRITER_BASE = (uintptr_t)0x300000000000ull;

static pthread_barrier_t start_line;
static atomic_int reader_errors, writer_errors;

static void *reader(void *arg) {
    uint64_t state = 0x9e3779b97f4a7c15ull * (uint64_t)((intptr_t)arg + 1);
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < READER_ROUNDS; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        uintptr_t k = state % STABLE_RANGES;
        uintptr_t base = STABLE_BASE + k * 1024;
        if (!mg_pinned_contains(AT(base + (state >> 32) % 448), 1 + (state >> 40) % 64))
            atomic_fetch_add(&reader_errors, 1);
        if (mg_pinned_contains(AT(base + 512 + (state >> 32) % 256), 1)) /* gap */
            atomic_fetch_add(&reader_errors, 1);
        /* churned windows: either answer is fine, only the absence of races matters */
        (void)mg_pinned_contains(AT(WRITER_BASE + (state >> 20) % (WRITERS << 20)), 8);
        (void)mg_pinned_count();
    }
    return NULL;
}

static void *writer(void *arg) {
    uintptr_t window = WRITER_BASE + ((uintptr_t)(intptr_t)arg << 20);
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < WRITER_ROUNDS; i++) {
        uintptr_t base = window + (uintptr_t)(i % 64) * 4096;
        bool ok = mg_pinned_register(AT(base), 4096) == MG_OK;
        ok = ok && mg_pinned_contains(AT(base + 4000), 96);
        ok = ok && mg_pinned_register(AT(base), 100) == MG_OK; /* re-register: shrink */
        ok = ok && !mg_pinned_contains(AT(base + 4000), 96);
        ok = ok && mg_pinned_unregister(AT(base)) == MG_OK;
        ok = ok && !mg_pinned_contains(AT(base), 1);
        if (!ok)
            atomic_fetch_add(&writer_errors, 1);
    }
    return NULL;
}

int main(void) {
    for (uintptr_t k = 0; k < STABLE_RANGES; k++)
        CHECK(mg_pinned_register(AT(STABLE_BASE + k * 1024), 512) == MG_OK);

    pthread_t threads[READERS + WRITERS];
    pthread_barrier_init(&start_line, NULL, READERS + WRITERS);
    for (intptr_t i = 0; i < READERS; i++)
        CHECK(pthread_create(&threads[i], NULL, reader, (void *)i) == 0);
    for (intptr_t i = 0; i < WRITERS; i++)
        CHECK(pthread_create(&threads[READERS + i], NULL, writer, (void *)i) == 0);
    for (int i = 0; i < READERS + WRITERS; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&start_line);

    CHECKF(atomic_load(&reader_errors) == 0, "%d wrong lookups of stable ranges",
           atomic_load(&reader_errors));
    CHECKF(atomic_load(&writer_errors) == 0, "%d writer rounds saw a wrong state",
           atomic_load(&writer_errors));
    CHECK(mg_pinned_count() == STABLE_RANGES);
    for (uintptr_t k = 0; k < STABLE_RANGES; k++)
        CHECK(mg_pinned_unregister(AT(STABLE_BASE + k * 1024)) == MG_OK);
    CHECK(mg_pinned_count() == 0);
    return test_finish();
}
