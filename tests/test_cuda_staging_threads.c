/*
 * test_cuda_staging_threads.c - the CUDA backend's shared staging ring under concurrent use
 * (skipped without a device): several threads, each on its own stream, issue staged
 * host-to-device copies of random sizes (small ones that share a staging buffer, and ones
 * larger than a buffer) from a source they overwrite right after each call, plus staged
 * device-to-host reads. Every byte must arrive; no region may be touched by another thread.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_cuda_util.h"

#define THREADS 4
#define REGION_BYTES ((size_t)24 << 20)

typedef struct worker {
    mg_backend *b;
    mg_devptr region; /* this thread's part of the device buffer */
    unsigned char *expect;
    uint64_t seed;
    int failures;
    int copies;
} worker;

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static void *work(void *arg) {
    worker *w = arg;
    mg_stream *s = NULL;
    unsigned char *scratch = malloc((size_t)9 << 20);
    if (mg_stream_create(w->b, &s) || !scratch) {
        w->failures++;
        free(scratch);
        return NULL;
    }
    memset(w->expect, 0xCD, REGION_BYTES);
    size_t cursor = 0;
    while (cursor < REGION_BYTES) {
        uint64_t r = next_rand(&w->seed);
        size_t n =
            r % 4 == 0 ? (size_t)(r >> 8) % ((size_t)9 << 20) + 1 : (size_t)(r >> 8) % 30000 + 1;
        if (cursor + n > REGION_BYTES)
            n = REGION_BYTES - cursor;
        for (size_t i = 0; i < n; i++)
            scratch[i] = (unsigned char)(next_rand(&w->seed) >> 56);
        memcpy(w->expect + cursor, scratch, n);
        if (mg_copy_h2d_async(w->b, w->region + cursor, scratch, n, s) != MG_OK) {
            fprintf(stderr, "  staged copy failed: %s\n", mg_last_error());
            w->failures++;
            break;
        }
        memset(scratch, 0x99, n);
        cursor += n;
        w->copies++;
    }
    if (mg_stream_synchronize(s) != MG_OK)
        w->failures++;
    /* Read back through staging too (whole slots, while other threads stage uploads). */
    unsigned char *got = malloc(REGION_BYTES);
    if (!got || mg_copy_d2h_async(w->b, got, w->region, REGION_BYTES, s) != MG_OK ||
        mg_stream_synchronize(s) != MG_OK) {
        w->failures++;
    } else {
        size_t wrong = 0;
        for (size_t i = 0; i < REGION_BYTES; i++)
            wrong += got[i] != w->expect[i];
        if (wrong) {
            fprintf(stderr, "  thread region: %zu bytes wrong of %zu\n", wrong, REGION_BYTES);
            w->failures++;
        }
    }
    free(got);
    free(scratch);
    mg_stream_destroy(s);
    return NULL;
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_staging_threads");
    mg_devptr all = 0;
    CHECK_OK(mg_alloc(b, THREADS * REGION_BYTES, &all));
    CHECK_OK(mg_memset(b, all, 0xCD, THREADS * REGION_BYTES));
    worker w[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){
            b, all + (mg_devptr)i * REGION_BYTES, malloc(REGION_BYTES), test_rand() | 1, 0, 0};
        CHECK(w[i].expect != NULL);
    }
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        printf("  thread %d: %d staged copies, %d failures\n", i, w[i].copies, w[i].failures);
        CHECK(w[i].failures == 0);
        free(w[i].expect);
    }
    CHECK_OK(mg_free(b, all));
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
