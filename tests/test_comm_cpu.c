/* test_comm_cpu.c - communicators across CPU backends of one process (metrale/comm.h): every
 * collective, dtype and reduction on random data of odd sizes against plain arithmetic, in
 * place and not, for 2 and 3 ranks; graph capture and replay; argument checks and closed
 * backends; mismatched calls and missing peers fail (within the timeout) instead of hanging. */
#include "comm_test_util.h"
#include "metrale/ops.h"

#define MAX_RANKS 3

static mg_backend *backends[MAX_RANKS];

static void check_case(mg_comm *const *comms, int size, comm_case_kind k, mg_dtype t,
                       mg_comm_reduce op, size_t count, bool in_place) {
    size_t e = mg_dtype_bytes(t);
    size_t sc = comm_send_count(k, count, size), rc = comm_recv_count(k, count, size);
    void *in[MAX_RANKS], *out[MAX_RANKS];
    int root = (int)(count % (size_t)size);
    for (int r = 0; r < size; r++) {
        in[r] = malloc(sc * e);
        out[r] = malloc(rc * e);
        comm_fill(t, in[r], sc);
    }
    mg_status st = comm_run_case(comms, size, k, t, op, count, root, in_place, in, out);
    CHECK_OK(st);
    int bad = 0;
    for (int r = 0; r < size && !st; r++)
        for (size_t i = 0; i < rc; i++) {
            double want = comm_expect(k, t, op, count, size, root, in, r, i);
            double got = comm_decode(t, out[r], i);
            if (!comm_close(k, t, op, size, got, want) && bad++ < 3)
                fprintf(stderr,
                        "  %s %s %s count %zu size %d%s rank %d [%zu]: got %.9g want %.9g\n",
                        comm_case_names[k], mg_dtype_name(t), mg_comm_reduce_name(op), count, size,
                        in_place ? " in place" : "", r, i, got, want);
        }
    CHECK(bad == 0);
    for (int r = 0; r < size; r++) {
        free(in[r]);
        free(out[r]);
    }
}

static void test_every_case(int size) {
    mg_comm *comms[MAX_RANKS];
    CHECK_OK(mg_comm_create_local(backends, size, NULL, comms));
    CHECK(mg_comm_size(comms[0]) == size && mg_comm_rank(comms[size - 1]) == size - 1);
    static const mg_dtype dtypes[] = {MG_DTYPE_BF16, MG_DTYPE_F16, MG_DTYPE_F32, MG_DTYPE_FP8_E4M3};
    static const size_t counts[] = {1, 7, 1029, 4099};
    for (int k = CASE_ALL_REDUCE; k <= CASE_SEND_RECV; k++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                bool reduces = k == CASE_ALL_REDUCE || k == CASE_REDUCE_SCATTER;
                for (int op = MG_COMM_SUM; op <= (reduces ? MG_COMM_MAX : MG_COMM_SUM); op++) {
                    check_case(comms, size, (comm_case_kind)k, dtypes[d], (mg_comm_reduce)op,
                               counts[c], false);
                    if (k != CASE_SEND_RECV)
                        check_case(comms, size, (comm_case_kind)k, dtypes[d], (mg_comm_reduce)op,
                                   counts[c], true);
                }
            }
    for (int r = 0; r < size; r++)
        CHECK_OK(mg_comm_destroy(comms[r]));
}

/* All-reduce captured on each rank's stream, replayed (in a group: one thread drives both
 * ranks) with new inputs: each replay reduces the inputs current at replay time. */
static void test_graph_replay(void) {
    mg_comm *comms[2];
    CHECK_OK(mg_comm_create_local(backends, 2, NULL, comms));
    const size_t n = 333;
    mg_devptr x[2];
    mg_stream *s[2];
    mg_graph *g[2] = {0};
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_alloc(backends[r], n * 4, &x[r]));
        CHECK_OK(mg_stream_create(backends[r], &s[r]));
        CHECK_OK(mg_graph_begin_capture(s[r]));
        CHECK_OK(mg_comm_all_reduce(comms[r], s[r], x[r], x[r], n, MG_DTYPE_F32, MG_COMM_SUM));
        CHECK_OK(mg_graph_end_capture(s[r], &g[r]));
    }
    /* Capturing enqueued nothing: a wait returns at once. */
    CHECK_OK(mg_comm_wait(comms[0], s[0]));
    for (int replay = 0; replay < 3; replay++) {
        float a[333], b[333], out[333];
        comm_fill(MG_DTYPE_F32, a, n);
        comm_fill(MG_DTYPE_F32, b, n);
        CHECK_OK(mg_copy_h2d(backends[0], x[0], a, n * 4));
        CHECK_OK(mg_copy_h2d(backends[1], x[1], b, n * 4));
        CHECK_OK(mg_comm_group_begin());
        CHECK_OK(mg_graph_launch(g[0], s[0]));
        CHECK_OK(mg_graph_launch(g[1], s[1]));
        CHECK_OK(mg_comm_group_end());
        int bad = 0;
        for (int r = 0; r < 2; r++) {
            CHECK_OK(mg_comm_wait(comms[r], s[r]));
            CHECK_OK(mg_copy_d2h(backends[r], out, x[r], n * 4));
            for (size_t i = 0; i < n; i++)
                bad += out[i] != a[i] + b[i];
        }
        CHECK(bad == 0);
    }
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_graph_destroy(g[r]));
        CHECK_OK(mg_stream_destroy(s[r]));
        CHECK_OK(mg_free(backends[r], x[r]));
        CHECK_OK(mg_comm_destroy(comms[r]));
    }
}

static void test_bad_arguments(void) {
    mg_comm *comms[2];
    CHECK_STATUS(mg_comm_create_local(NULL, 2, NULL, comms), MG_ERR_INVALID_ARGUMENT);
    mg_backend *same[2] = {backends[0], backends[0]};
    CHECK_STATUS(mg_comm_create_local(same, 2, NULL, comms), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("same backend");
    CHECK_STATUS(mg_comm_create_local(backends, 0, NULL, comms), MG_ERR_INVALID_ARGUMENT);
    mg_comm_id id;
    CHECK_STATUS(mg_comm_get_id(MG_BACKEND_AUTO, &id), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_comm_get_id(MG_BACKEND_CPU, &id));
    mg_comm *one;
    CHECK_STATUS(mg_comm_create_rank(backends[0], &id, 2, 2, NULL, &one), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("rank 2");
    CHECK_STATUS(mg_comm_group_end(), MG_ERR_INVALID_ARGUMENT);

    CHECK_OK(mg_comm_create_local(backends, 2, NULL, comms));
    CHECK_OK(mg_comm_group_begin());
    CHECK_STATUS(mg_comm_wait(comms[0], NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("inside a group");
    mg_comm *inside[2];
    CHECK_STATUS(mg_comm_create_local(backends, 2, NULL, inside), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_comm_group_end());
    mg_devptr a, b1, big;
    CHECK_OK(mg_alloc(backends[0], 64, &a));
    CHECK_OK(mg_alloc(backends[1], 64, &b1));
    CHECK_OK(mg_alloc(backends[0], 256, &big));
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, a, 0, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("count is 0");
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, a, 4, MG_DTYPE_U8, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, a, 17, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT); /* 68 bytes overrun the 64 */
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, 0, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("recv is null");
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a + 2, a + 2, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, a + 4, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, b1, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT); /* another backend's buffer */
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, a, a, 4, MG_DTYPE_F32, (mg_comm_reduce)7),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_comm_all_reduce(comms[0], mg_stream_default(backends[1]), a, a, 4, MG_DTYPE_F32,
                                    MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("another backend");
    /* In place all-gather: send must be this rank's slice (rank 0: the start). */
    CHECK_STATUS(mg_comm_all_gather(comms[0], NULL, big + 16, big, 4, MG_DTYPE_F32),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_comm_reduce_scatter(comms[0], NULL, big, big + 4, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_comm_broadcast(comms[0], NULL, a, a, 4, MG_DTYPE_F32, 2),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("root 2");
    CHECK_STATUS(mg_comm_send(comms[0], NULL, a, 4, MG_DTYPE_F32, 0), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("peer 0");
    CHECK_STATUS(mg_comm_all_reduce(NULL, NULL, a, a, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK(mg_comm_rank(NULL) == -1 && mg_comm_size(NULL) == -1);
    /* Nothing bad was enqueued: the communicator still works. */
    CHECK_OK(mg_comm_check(comms[0]));
    CHECK_OK(mg_free(backends[0], a));
    CHECK_OK(mg_free(backends[1], b1));
    CHECK_OK(mg_free(backends[0], big));
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_destroy(comms[r]));
    CHECK_OK(mg_comm_destroy(NULL));
}

/* A closed backend is refused by name, at creation and on every later call of a rank whose
 * backend was closed; its communicator can still be destroyed. */
static void test_closed_backend(void) {
    mg_backend *extra;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, MAX_RANKS, &extra));
    mg_backend *pair[2] = {backends[1], extra};
    mg_comm *comms[2];
    CHECK_OK(mg_comm_create_local(pair, 2, NULL, comms));
    mg_devptr x;
    CHECK_OK(mg_alloc(backends[1], 64, &x));
    CHECK_OK(mg_backend_close(extra));
    CHECK_STATUS(mg_comm_all_reduce(comms[1], NULL, x, x, 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("closed backend");
    mg_comm *again[2];
    CHECK_STATUS(mg_comm_create_local(pair, 2, NULL, again), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("backends[1]");
    CHECK(again[0] == NULL && again[1] == NULL);
    mg_comm_id id;
    CHECK_OK(mg_comm_get_id(MG_BACKEND_CPU, &id));
    mg_comm *one = NULL;
    CHECK_STATUS(mg_comm_create_rank(extra, &id, 1, 0, NULL, &one), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("closed backend");
    CHECK(one == NULL);
    CHECK_OK(mg_comm_check(comms[0]));
    CHECK_OK(mg_free(backends[1], x));
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_destroy(comms[r]));
}

/* Ranks that disagree fail together; a rank whose peer never calls fails within the timeout;
 * a failed communicator refuses further calls at once. */
static void test_failures_do_not_hang(void) {
    mg_comm *comms[2];
    mg_comm_options options = {.timeout_ms = 300};
    CHECK_OK(mg_comm_create_local(backends, 2, &options, comms));
    mg_devptr x[2];
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_alloc(backends[r], 64, &x[r]));
    CHECK_OK(mg_comm_group_begin());
    CHECK_OK(mg_comm_all_reduce(comms[0], NULL, x[0], x[0], 4, MG_DTYPE_F32, MG_COMM_SUM));
    CHECK_STATUS(mg_comm_all_reduce(comms[1], NULL, x[1], x[1], 5, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("count 5");
    CHECK(mg_comm_group_end() != MG_OK);
    CHECK_STATUS(mg_comm_check(comms[0]), MG_ERR_DEVICE);
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, x[0], x[0], 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_DEVICE);
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_destroy(comms[r]));

    /* Only rank 0 calls, outside a group: it waits the timeout, then fails. */
    CHECK_OK(mg_comm_create_local(backends, 2, &options, comms));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, x[0], x[0], 4, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_DEVICE);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK(ms >= 250 && ms < 5000);
    CHECK_MESSAGE("1 of 2 arrived");
    CHECK_STATUS(mg_comm_check(comms[1]), MG_ERR_DEVICE); /* the peer sees it too */
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_destroy(comms[r]));

    /* A rank that never joins: create_rank of the other fails within the timeout. */
    mg_comm_id id;
    CHECK_OK(mg_comm_get_id(MG_BACKEND_CPU, &id));
    mg_comm *lonely = NULL;
    CHECK_STATUS(mg_comm_create_rank(backends[0], &id, 2, 0, &options, &lonely), MG_ERR_DEVICE);
    CHECK_MESSAGE("1 of 2 ranks joined");
    CHECK(lonely == NULL);

    /* mg_comm_abort marks the communicator failed. */
    CHECK_OK(mg_comm_create_local(backends, 2, &options, comms));
    CHECK_OK(mg_comm_abort(comms[1]));
    CHECK_STATUS(mg_comm_wait(comms[0], NULL), MG_ERR_DEVICE);
    CHECK_MESSAGE("aborted");
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_comm_destroy(comms[r]));
        CHECK_OK(mg_free(backends[r], x[r]));
    }
}

/* Communicators are op MG_OP_COMM: the CPU transport is its provider "cpu", each enqueued
 * call counts, and forcing follows the op registry's rules. */
static void test_op_registry(void) {
    CHECK(strcmp(mg_op_name(MG_OP_COMM), "comm") == 0);
    CHECK(mg_op_supported(backends[0], MG_OP_COMM));
    mg_op_stats before, after;
    CHECK_OK(mg_op_stats_get(backends[0], MG_OP_COMM, &before));
    CHECK_OK(mg_op_force_provider(backends[0], MG_OP_COMM, "cpu"));
    mg_comm *comms[2];
    CHECK_OK(mg_comm_create_local(backends, 2, NULL, comms));
    mg_devptr x[2];
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_alloc(backends[r], 64, &x[r]));
    CHECK_OK(mg_comm_group_begin());
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_all_reduce(comms[r], NULL, x[r], x[r], 16, MG_DTYPE_F32, MG_COMM_SUM));
    CHECK_OK(mg_comm_group_end());
    CHECK_OK(mg_op_stats_get(backends[0], MG_OP_COMM, &after));
    CHECK(after.calls == before.calls + 1);
    CHECK(strcmp(after.provider, "cpu") == 0 && strcmp(after.forced, "cpu") == 0);
    /* a refused call counts nothing */
    CHECK_STATUS(mg_comm_all_reduce(comms[0], NULL, x[0], x[0], 17, MG_DTYPE_F32, MG_COMM_SUM),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_op_stats_get(backends[0], MG_OP_COMM, &after));
    CHECK(after.calls == before.calls + 1);
    /* NCCL runs on CUDA backends (or is not compiled in) */
    CHECK_STATUS(mg_op_force_provider(backends[0], MG_OP_COMM, "nccl"), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_op_force_provider(backends[0], MG_OP_COMM, "auto"));
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_comm_wait(comms[r], NULL));
        CHECK_OK(mg_free(backends[r], x[r]));
        CHECK_OK(mg_comm_destroy(comms[r]));
    }
}

int main(void) {
    test_seed();
    for (int r = 0; r < MAX_RANKS; r++)
        if (mg_backend_open(MG_BACKEND_CPU, r, &backends[r])) {
            fprintf(stderr, "cannot open CPU device %d: %s\n", r, mg_last_error());
            return 1;
        }
    CHECK(mg_comm_available(MG_BACKEND_CPU, NULL, 0));
    test_every_case(2);
    test_every_case(3);
    test_graph_replay();
    test_bad_arguments();
    test_closed_backend();
    test_failures_do_not_hang();
    test_op_registry();
    for (int r = 0; r < MAX_RANKS; r++)
        CHECK_OK(mg_backend_close(backends[r]));
    return test_finish();
}
