/* test_cuda_comm.c - NCCL communicators on two GPUs (skipped, 77, with fewer than two or
 * without NCCL): every collective, dtype and reduction on random data of odd sizes, in place
 * and not, against the CPU communicators on the same inputs; an all-reduce captured into
 * graphs and replayed with new inputs. */
#include "comm_test_util.h"

static mg_backend *gpu[2], *cpu[2];
static mg_comm *gpu_comms[2], *cpu_comms[2];

static void check_case(comm_case_kind k, mg_dtype t, mg_comm_reduce op, size_t count,
                       bool in_place) {
    size_t e = mg_dtype_bytes(t);
    size_t sc = comm_send_count(k, count, 2), rc = comm_recv_count(k, count, 2);
    void *in[2], *want[2], *got[2];
    int root = (int)(count % 2);
    for (int r = 0; r < 2; r++) {
        in[r] = malloc(sc * e);
        want[r] = malloc(rc * e);
        got[r] = malloc(rc * e);
        comm_fill(t, in[r], sc);
    }
    CHECK_OK(comm_run_case(cpu_comms, 2, k, t, op, count, root, in_place, in, want));
    mg_status st = comm_run_case(gpu_comms, 2, k, t, op, count, root, in_place, in, got);
    CHECK_OK(st);
    int bad = 0;
    for (int r = 0; r < 2 && !st; r++)
        for (size_t i = 0; i < rc; i++) {
            double w = comm_decode(t, want[r], i), g = comm_decode(t, got[r], i);
            double exact = comm_expect(k, t, op, count, 2, root, in, r, i);
            /* the GPU's value is the exact result rounded, as the CPU's is */
            bool ok = comm_close(k, t, op, 2, g, exact) && comm_close(k, t, op, 2, g, w);
            if (!ok && bad++ < 3)
                fprintf(stderr, "  %s %s %s count %zu%s rank %d [%zu]: gpu %.9g cpu %.9g\n",
                        comm_case_names[k], mg_dtype_name(t), mg_comm_reduce_name(op), count,
                        in_place ? " in place" : "", r, i, g, w);
        }
    CHECK(bad == 0);
    for (int r = 0; r < 2; r++) {
        free(in[r]);
        free(want[r]);
        free(got[r]);
    }
}

static void test_graph_replay(void) {
    const size_t n = 4099;
    mg_devptr x[2];
    mg_stream *s[2];
    mg_graph *g[2] = {0};
    float *a = malloc(n * 4), *b = malloc(n * 4), *out = malloc(n * 4);
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_alloc(gpu[r], n * 4, &x[r]));
        CHECK_OK(mg_stream_create(gpu[r], &s[r]));
    }
    /* one call before capturing: NCCL connects the peers on first use */
    CHECK_OK(mg_comm_group_begin());
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_all_reduce(gpu_comms[r], s[r], x[r], x[r], n, MG_DTYPE_F32, MG_COMM_SUM));
    CHECK_OK(mg_comm_group_end());
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_wait(gpu_comms[r], s[r]));
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_graph_begin_capture(s[r]));
    CHECK_OK(mg_comm_group_begin());
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_all_reduce(gpu_comms[r], s[r], x[r], x[r], n, MG_DTYPE_F32, MG_COMM_SUM));
    CHECK_OK(mg_comm_group_end());
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_graph_end_capture(s[r], &g[r]));
    for (int replay = 0; replay < 3 && g[0] && g[1]; replay++) {
        comm_fill(MG_DTYPE_F32, a, n);
        comm_fill(MG_DTYPE_F32, b, n);
        CHECK_OK(mg_copy_h2d(gpu[0], x[0], a, n * 4));
        CHECK_OK(mg_copy_h2d(gpu[1], x[1], b, n * 4));
        for (int r = 0; r < 2; r++)
            CHECK_OK(mg_graph_launch(g[r], s[r]));
        int bad = 0;
        for (int r = 0; r < 2; r++) {
            CHECK_OK(mg_comm_wait(gpu_comms[r], s[r]));
            CHECK_OK(mg_copy_d2h(gpu[r], out, x[r], n * 4));
            for (size_t i = 0; i < n; i++)
                bad += out[i] != a[i] + b[i];
        }
        CHECK(bad == 0);
    }
    for (int r = 0; r < 2; r++) {
        if (g[r])
            CHECK_OK(mg_graph_destroy(g[r]));
        CHECK_OK(mg_stream_destroy(s[r]));
        CHECK_OK(mg_free(gpu[r], x[r]));
    }
    free(a);
    free(b);
    free(out);
}

int main(void) {
    comm_open_two_cuda_or_skip("test_cuda_comm", gpu);
    test_seed();
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_backend_open(MG_BACKEND_CPU, r, &cpu[r]));
    mg_comm_options options = {.timeout_ms = 60000};
    CHECK_OK(mg_comm_create_local(gpu, 2, &options, gpu_comms));
    CHECK_OK(mg_comm_create_local(cpu, 2, &options, cpu_comms));
    if (test_failures)
        return test_finish();
    mg_dtype dtypes[4] = {MG_DTYPE_BF16, MG_DTYPE_F16, MG_DTYPE_F32, MG_DTYPE_FP8_E4M3};
    int dtype_count = mg_comm_supports_dtype(gpu_comms[0], MG_DTYPE_FP8_E4M3) ? 4 : 3;
    if (dtype_count == 3)
        printf("FP8 not supported by this NCCL: not tested\n");
    static const size_t counts[] = {1, 7, 1029, 65537, (1u << 20) + 3};
    for (int k = CASE_ALL_REDUCE; k <= CASE_SEND_RECV; k++)
        for (int d = 0; d < dtype_count; d++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                bool reduces = k == CASE_ALL_REDUCE || k == CASE_REDUCE_SCATTER;
                for (int op = MG_COMM_SUM; op <= (reduces ? MG_COMM_MAX : MG_COMM_SUM); op++) {
                    check_case((comm_case_kind)k, dtypes[d], (mg_comm_reduce)op, counts[c], false);
                    if (k != CASE_SEND_RECV)
                        check_case((comm_case_kind)k, dtypes[d], (mg_comm_reduce)op, counts[c],
                                   true);
                }
            }
    test_graph_replay();
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_comm_check(gpu_comms[r]));
        CHECK_OK(mg_comm_destroy(gpu_comms[r]));
        CHECK_OK(mg_comm_destroy(cpu_comms[r]));
        CHECK_OK(mg_backend_close(gpu[r]));
        CHECK_OK(mg_backend_close(cpu[r]));
    }
    return test_finish();
}
