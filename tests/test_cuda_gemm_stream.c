/*
 * test_cuda_gemm_stream.c - a stream's cuBLASLt workspace lives as long as the stream
 * (skipped without a CUDA device or cuBLASLt): GEMMs on a created stream (checked against a
 * float64 reference) create its workspace; destroying the stream frees it, so the ledger and
 * the GEMM layer's workspace records return to where they were, stream after stream.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "test_cuda_util.h"

/* The workspace bytes the GEMM ops of `b` hold now (each stream's, shared by both ops). */
static uint64_t gemm_workspace_bytes(mg_backend *b) {
    mg_op_stats stats;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    return stats.workspace_bytes;
}

/* One BF16 GEMM with F32 output on `s`, checked against float64 (small integer inputs make
 * every product and sum exact in FP32). */
static void gemm_on_stream(mg_backend *b, mg_stream *s) {
    uint32_t m = (uint32_t)test_rand_range(1, 61), n = (uint32_t)test_rand_range(1, 67) * 8,
             k = (uint32_t)test_rand_range(1, 90) * 8;
    size_t act_n = (size_t)m * k, weight_n = (size_t)n * k, out_n = (size_t)m * n;
    uint16_t *act = malloc(act_n * 2), *weight = malloc(weight_n * 2);
    float *out = malloc(out_n * 4);
    mg_devptr d_act = 0, d_weight = 0, d_out = 0;
    CHECK(act && weight && out);
    if (!act || !weight || !out)
        goto done;
    for (size_t i = 0; i < act_n; i++)
        act[i] = mg_f32_to_bf16((float)((int)test_rand_range(0, 14) - 7));
    for (size_t i = 0; i < weight_n; i++)
        weight[i] = mg_f32_to_bf16((float)((int)test_rand_range(0, 14) - 7));
    CHECK_OK(mg_alloc(b, act_n * 2, &d_act));
    CHECK_OK(mg_alloc(b, weight_n * 2, &d_weight));
    CHECK_OK(mg_alloc(b, out_n * 4, &d_out));
    CHECK_OK(mg_copy_h2d(b, d_act, act, act_n * 2));
    CHECK_OK(mg_copy_h2d(b, d_weight, weight, weight_n * 2));
    CHECK_OK(mg_memset(b, d_out, 0x7F, out_n * 4)); /* poison: NaN-like pattern */
    CHECK_OK(mg_gemm_bf16(b, s, m, n, k, d_act, d_weight, d_out, MG_DTYPE_F32, n));
    CHECK_OK(mg_stream_synchronize(s ? s : mg_stream_default(b)));
    CHECK_OK(mg_copy_d2h(b, out, d_out, out_n * 4));
    size_t wrong = 0;
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < n; j++) {
            double ref = 0;
            for (uint32_t x = 0; x < k; x++)
                ref += (double)mg_bf16_to_f32(act[(size_t)i * k + x]) *
                       mg_bf16_to_f32(weight[(size_t)j * k + x]);
            wrong += out[(size_t)i * n + j] != (float)ref;
        }
    if (wrong)
        fprintf(stderr, "  GEMM %ux%ux%u: %zu of %zu outputs wrong\n", m, n, k, wrong, out_n);
    CHECK(wrong == 0);
done:
    mg_free(b, d_act);
    mg_free(b, d_weight);
    mg_free(b, d_out);
    free(act);
    free(weight);
    free(out);
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_gemm_stream");
    if (!mg_op_supported(b, MG_OP_GEMM_BF16)) {
        printf("test_cuda_gemm_stream: skipped: no BF16 GEMM here (cuBLASLt not loadable)\n");
        mg_backend_close(b);
        return TEST_SKIP_EXIT;
    }
    /* The default stream's workspace lives as long as the backend: create it first. */
    gemm_on_stream(b, NULL);
    uint64_t bytes0 = 0, count0 = 0, bytes = 0, count = 0;
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = 1, .n = 8, .k = 8, .ldc = 8, .out_type = MG_DTYPE_F32};
    size_t workspace_bytes = 0;
    CHECK_OK(mg_gemm_workspace_bytes(b, &plan, &workspace_bytes));
    CHECK(workspace_bytes > 0);
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    uint64_t held0 = gemm_workspace_bytes(b);
    CHECK(held0 == workspace_bytes); /* the default stream's */
    for (int round = 0; round < 3; round++) {
        mg_stream *s = NULL;
        CHECK_OK(mg_stream_create(b, &s));
        if (!s)
            break;
        gemm_on_stream(b, s);
        gemm_on_stream(b, s);
        CHECK_OK(mg_ledger_live(b, &bytes, &count));
        CHECK(count == count0 + 1 && bytes == bytes0 + workspace_bytes);
        CHECK(gemm_workspace_bytes(b) == held0 + workspace_bytes);
        CHECK_OK(mg_stream_destroy(s));
        CHECK_OK(mg_ledger_live(b, &bytes, &count));
        if (count != count0 || bytes != bytes0)
            fprintf(stderr,
                    "  round %d: ledger %llu bytes in %llu blocks after destroy, %llu in "
                    "%llu before\n",
                    round, (unsigned long long)bytes, (unsigned long long)count,
                    (unsigned long long)bytes0, (unsigned long long)count0);
        CHECK(count == count0 && bytes == bytes0);
        CHECK(gemm_workspace_bytes(b) == held0);
    }
    /* The default stream keeps its workspace and still computes. */
    gemm_on_stream(b, NULL);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
