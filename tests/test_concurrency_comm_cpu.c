/* test_concurrency_comm_cpu.c - CPU communicators driven by one thread per rank (also run
 * under ThreadSanitizer): ranks meet through mg_comm_create_rank, then each thread runs many
 * collectives without groups and send/recv pairs in groups, checking every result against
 * plain arithmetic; an abort from one thread makes the others fail instead of waiting. */
#include <pthread.h>
#include <stdatomic.h>

#include "comm_test_util.h"

#define RANKS 4
#define ROUNDS 40
#define COUNT 257

static mg_backend *backends[RANKS];
static mg_comm_id shared_id;
static _Atomic int failures;

typedef struct worker {
    int rank;
    mg_comm *comm;
    mg_status create_status;
} worker;

static void note(bool ok, const char *what, int rank) {
    if (!ok) {
        atomic_fetch_add(&failures, 1);
        fprintf(stderr, "FAIL rank %d: %s (last error: %s)\n", rank, what, mg_last_error());
    }
}

/* Deterministic per (rank, round, i) values, so every thread knows every rank's input. */
static float value_of(int rank, int round, int i) {
    return (float)((rank * 7 + round * 3 + i) % 29) - 14.0f;
}

static void *run_rank(void *arg) {
    worker *w = arg;
    int r = w->rank;
    mg_comm_options options = {.timeout_ms = 20000};
    w->create_status = mg_comm_create_rank(backends[r], &shared_id, RANKS, r, &options, &w->comm);
    if (w->create_status)
        return NULL;
    mg_backend *b = backends[r];
    mg_stream *s;
    mg_devptr x, gathered, msg;
    note(!mg_stream_create(b, &s) && !mg_alloc(b, COUNT * 4, &x) &&
             !mg_alloc(b, (size_t)RANKS * COUNT * 4, &gathered) && !mg_alloc(b, COUNT * 4, &msg),
         "setup", r);
    float host[COUNT], all[RANKS * COUNT];
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < COUNT; i++)
            host[i] = value_of(r, round, i);
        note(!mg_copy_h2d(b, x, host, sizeof host), "upload", r);
        note(!mg_comm_all_reduce(w->comm, s, x, x, COUNT, MG_DTYPE_F32, MG_COMM_SUM), "all_reduce",
             r);
        note(!mg_comm_all_gather(w->comm, s, x, gathered, COUNT, MG_DTYPE_F32), "all_gather", r);
        /* ring exchange of the original values */
        note(!mg_copy_h2d(b, x, host, sizeof host), "upload", r);
        note(!mg_comm_group_begin(), "group_begin", r);
        note(!mg_comm_send(w->comm, s, x, COUNT, MG_DTYPE_F32, (r + 1) % RANKS), "send", r);
        note(!mg_comm_recv(w->comm, s, msg, COUNT, MG_DTYPE_F32, (r + RANKS - 1) % RANKS), "recv",
             r);
        note(!mg_comm_group_end(), "group_end", r);
        note(!mg_comm_wait(w->comm, s), "wait", r);
        note(!mg_copy_d2h(b, all, gathered, sizeof all), "download", r);
        note(!mg_copy_d2h(b, host, msg, sizeof host), "download", r);
        int bad = 0;
        for (int i = 0; i < COUNT; i++) {
            float sum = 0;
            for (int q = 0; q < RANKS; q++)
                sum += value_of(q, round, i);
            for (int q = 0; q < RANKS; q++)
                bad += all[q * COUNT + i] != sum;
            bad += host[i] != value_of((r + RANKS - 1) % RANKS, round, i);
        }
        note(bad == 0, "results", r);
    }
    mg_free(b, x);
    mg_free(b, gathered);
    mg_free(b, msg);
    mg_stream_destroy(s);
    return NULL;
}

/* Rank 0 aborts while the others wait in an all-reduce it never joins. */
static void *abort_rank(void *arg) {
    worker *w = arg;
    mg_devptr x;
    note(!mg_alloc(backends[w->rank], 64, &x), "alloc", w->rank);
    if (w->rank == 0) {
        struct timespec pause = {0, 50 * 1000000L};
        nanosleep(&pause, NULL);
        note(!mg_comm_abort(w->comm), "abort", 0);
    } else {
        mg_status st = mg_comm_all_reduce(w->comm, NULL, x, x, 16, MG_DTYPE_F32, MG_COMM_SUM);
        note(st == MG_ERR_DEVICE, "a waiting rank fails after the abort", w->rank);
    }
    mg_free(backends[w->rank], x);
    return NULL;
}

int main(void) {
    test_seed();
    for (int r = 0; r < RANKS; r++)
        if (mg_backend_open(MG_BACKEND_CPU, r, &backends[r])) {
            fprintf(stderr, "cannot open CPU device %d: %s\n", r, mg_last_error());
            return 1;
        }
    CHECK_OK(mg_comm_get_id(MG_BACKEND_CPU, &shared_id));
    worker workers[RANKS];
    pthread_t threads[RANKS];
    for (int r = 0; r < RANKS; r++) {
        workers[r] = (worker){.rank = r};
        CHECK(pthread_create(&threads[r], NULL, run_rank, &workers[r]) == 0);
    }
    for (int r = 0; r < RANKS; r++) {
        pthread_join(threads[r], NULL);
        CHECK_OK(workers[r].create_status);
    }
    for (int r = 0; r < RANKS; r++)
        CHECK_OK(mg_comm_check(workers[r].comm));

    /* The same communicators, one more phase: an abort releases the waiting ranks. The
     * others wait at most their 20 s timeout, far longer than the abort takes. */
    for (int r = 0; r < RANKS; r++)
        CHECK(pthread_create(&threads[r], NULL, abort_rank, &workers[r]) == 0);
    for (int r = 0; r < RANKS; r++)
        pthread_join(threads[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        CHECK_STATUS(mg_comm_check(workers[r].comm), MG_ERR_DEVICE);
        CHECK_OK(mg_comm_destroy(workers[r].comm));
        CHECK_OK(mg_backend_close(backends[r]));
    }
    CHECK(atomic_load(&failures) == 0);
    return test_finish();
}
