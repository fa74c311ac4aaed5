/*
 * test_cuda_shared_limit.c - the dynamic shared memory limit of one kernel handle raised by
 * several threads at once (skipped without a CUDA device): each thread launches the same
 * shared_reverse handle with its own size past the 48 KiB default, starting together, many
 * rounds on fresh handles. Every launch must succeed and fill its output: a smaller raise
 * racing a larger one must never leave the function's limit below a launch that passed the
 * check.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_cuda_util.h"

enum { THREADS = 6, ROUNDS = 24 };

typedef struct {
    mg_backend *b;
    mg_kernel *_Atomic kernel; /* the round's shared handle */
    pthread_barrier_t start, done;
    uint32_t max_shared;
} shared_test;

typedef struct {
    shared_test *t;
    int index;
    uint32_t seed;
    int failures; /* launches that failed or wrote wrong words */
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    shared_test *t = w->t;
    mg_stream *s = NULL;
    mg_devptr out = 0;
    uint32_t max_words = t->max_shared / 4;
    uint32_t *host = malloc((size_t)max_words * 4);
    if (mg_stream_create(t->b, &s) || mg_alloc(t->b, (size_t)max_words * 4, &out) || !host)
        w->failures++;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(&t->start);
        /* sizes spread between the default limit and the opt-in maximum, a different order
         * every round so the largest raise meets smaller ones in every interleaving */
        uint32_t span = t->max_shared - 48 * 1024;
        uint32_t slot = (uint32_t)((w->index + round) % THREADS) + 1;
        uint32_t shared = (48 * 1024 + span / THREADS * slot) & ~3u;
        uint32_t words = shared / 4, seed = w->seed + (uint32_t)round;
        if (s && out && host) {
            mg_launch l;
            mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){256, 1, 1}, shared);
            mg_launch_arg_ptr(&l, out);
            mg_launch_arg_u32(&l, words);
            mg_launch_arg_u32(&l, seed);
            mg_status st = mg_launch_run(t->b, atomic_load(&t->kernel), s, &l);
            if (st == MG_OK)
                st = mg_stream_synchronize(s);
            if (st == MG_OK)
                st = mg_copy_d2h(t->b, host, out, (size_t)words * 4);
            if (st != MG_OK) {
                fprintf(stderr, "FAIL thread %d round %d: %u bytes of shared memory: %s: %s\n",
                        w->index, round, shared, mg_status_name(st), mg_last_error());
                w->failures++;
            } else {
                size_t wrong = 0;
                for (uint32_t i = 0; i < words; i++)
                    wrong += host[i] != (words - 1 - i) * 2654435761u + seed;
                if (wrong) {
                    fprintf(stderr, "FAIL thread %d round %d: %zu of %u words wrong\n", w->index,
                            round, wrong, words);
                    w->failures++;
                }
            }
        }
        pthread_barrier_wait(&t->done);
    }
    free(host);
    if (out)
        mg_free(t->b, out);
    if (s)
        mg_stream_destroy(s);
    return NULL;
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_shared_limit");
    mg_device_info info;
    CHECK_OK(mg_device_get_info(b, &info));
    if (info.max_shared_per_block_optin <= 48 * 1024 + 4 * THREADS) {
        printf("test_cuda_shared_limit: skipped: %s allows only %u bytes per block\n", info.name,
               info.max_shared_per_block_optin);
        mg_backend_close(b);
        return TEST_SKIP_EXIT;
    }
    shared_test t = {.b = b, .max_shared = info.max_shared_per_block_optin};
    pthread_barrier_init(&t.start, NULL, THREADS + 1);
    pthread_barrier_init(&t.done, NULL, THREADS + 1);
    worker workers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){.t = &t, .index = i, .seed = (uint32_t)test_rand()};
        CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
    }
    for (int round = 0; round < ROUNDS; round++) {
        /* a fresh handle each round starts at the default limit */
        mg_kernel *k = cuda_test_kernel(b, "shared_reverse");
        atomic_store(&t.kernel, k);
        pthread_barrier_wait(&t.start);
        pthread_barrier_wait(&t.done);
        if (k)
            CHECK_OK(mg_kernel_release(k));
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += workers[i].failures;
    }
    CHECK(failures == 0);
    pthread_barrier_destroy(&t.start);
    pthread_barrier_destroy(&t.done);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
