/* test_ops_registry.c - the op registry of metrale/ops.h on every usable backend (the CPU
 * always, CUDA where a GPU is): which ops a backend supports, forcing providers (and the clear
 * errors for providers that do not exist, belong to another backend or cannot run a shape),
 * statistics, queries that leave mg_last_error alone, and GEMMs in a caller-supplied workspace
 * that allocate nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/ops.h"
#include "metrale/ops_attention.h"
#include "metrale/ops_gemm.h"
#include "test_util.h"

static void test_names(void) {
    for (int i = 0; i < MG_OP_COUNT; i++) {
        mg_op parsed = MG_OP_COUNT;
        CHECK(strcmp(mg_op_name((mg_op)i), "?") != 0);
        CHECK_OK(mg_op_parse(mg_op_name((mg_op)i), &parsed));
        CHECK(parsed == (mg_op)i);
    }
    mg_op parsed;
    CHECK_STATUS(mg_op_parse("gemm_int3", &parsed), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("gemm_int3");
    CHECK(!strcmp(mg_op_name(MG_OP_COUNT), "?"));
    const char *names[4] = {0};
    CHECK(mg_op_providers(MG_OP_GEMM_BF16, MG_BACKEND_CPU, names, 4) == 1);
    CHECK(names[0] && !strcmp(names[0], "reference"));
    CHECK(mg_op_providers(MG_OP_COUNT, MG_BACKEND_CPU, names, 4) == 0);
}

static void test_closed_backend(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    CHECK_OK(mg_backend_close(b));
    CHECK(!mg_op_supported(b, MG_OP_GEMM_BF16));
    CHECK(!mg_op_supported(NULL, MG_OP_GEMM_BF16));
    CHECK_STATUS(mg_op_force_provider(b, MG_OP_GEMM_BF16, "reference"), MG_ERR_INVALID_ARGUMENT);
    mg_op_stats stats;
    CHECK_STATUS(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats), MG_ERR_INVALID_ARGUMENT);
}

/* Small integer inputs make every product and sum exact in FP32: the result is known. */
static int gemm_round_trip(mg_backend *b, mg_stream *s, const mg_gemm_tensors *operands,
                           uint32_t m, uint32_t n, uint32_t k) {
    size_t act_n = (size_t)m * k, weight_n = (size_t)n * k, out_n = (size_t)m * n;
    uint16_t *act = malloc(act_n * 2), *weight = malloc(weight_n * 2);
    float *out = malloc(out_n * 4);
    int wrong = -1;
    if (!act || !weight || !out)
        goto done;
    for (size_t i = 0; i < act_n; i++)
        act[i] = mg_f32_to_bf16((float)((int)test_rand_range(0, 14) - 7));
    for (size_t i = 0; i < weight_n; i++)
        weight[i] = mg_f32_to_bf16((float)((int)test_rand_range(0, 14) - 7));
    CHECK_OK(mg_copy_h2d(b, operands->act, act, act_n * 2));
    CHECK_OK(mg_copy_h2d(b, operands->weight, weight, weight_n * 2));
    CHECK_OK(mg_memset(b, operands->out, 0x7F, out_n * 4)); /* poison */
    mg_gemm_plan plan = {.kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n,
                         .out_type = MG_DTYPE_F32};
    CHECK_OK(mg_gemm(b, s, &plan, operands));
    CHECK_OK(mg_stream_synchronize(s ? s : mg_stream_default(b)));
    CHECK_OK(mg_copy_d2h(b, out, operands->out, out_n * 4));
    wrong = 0;
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < n; j++) {
            double ref = 0;
            for (uint32_t x = 0; x < k; x++)
                ref += (double)mg_bf16_to_f32(act[(size_t)i * k + x]) *
                       mg_bf16_to_f32(weight[(size_t)j * k + x]);
            wrong += out[(size_t)i * n + j] != (float)ref;
        }
done:
    free(act);
    free(weight);
    free(out);
    return wrong;
}

static void test_backend(mg_backend_kind kind) {
    mg_backend *b = NULL;
    if (mg_backend_open(kind, 0, &b) != MG_OK)
        return;
    printf("  %s backend\n", mg_backend_kind_name(kind));
    CHECK(mg_op_supported(b, MG_OP_GEMM_BF16));
    CHECK(mg_op_supported(b, MG_OP_ATTENTION_RAGGED) || kind != MG_BACKEND_CPU);

    /* Queries never touch the caller's error. */
    mg_op parsed;
    CHECK_STATUS(mg_op_parse("no such op", &parsed), MG_ERR_INVALID_ARGUMENT);
    char before[256];
    snprintf(before, sizeof before, "%s", mg_last_error());
    for (int i = 0; i < MG_OP_COUNT; i++)
        (void)mg_op_supported(b, (mg_op)i);
    char reason[256] = "";
    CHECK(!mg_op_provider_available(b, MG_OP_GEMM_BF16, "no-such-provider", reason,
                                    sizeof reason));
    CHECK(strstr(reason, "no-such-provider") != NULL);
    CHECK(!strcmp(before, mg_last_error()));

    /* Forcing: unknown names and another backend's provider are refused, naming them. */
    CHECK_STATUS(mg_op_force_provider(b, MG_OP_GEMM_BF16, "no-such-provider"),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no-such-provider");
    const char *foreign = kind == MG_BACKEND_CPU ? "cublaslt" : "reference";
    mg_status st = mg_op_force_provider(b, MG_OP_GEMM_BF16, foreign);
    CHECK(st == MG_ERR_INVALID_ARGUMENT);
    if (st == MG_ERR_INVALID_ARGUMENT && kind == MG_BACKEND_CPU &&
        mg_op_providers(MG_OP_GEMM_BF16, MG_BACKEND_CUDA, NULL, 0))
        CHECK_MESSAGE("runs on the cuda backend");
    CHECK_STATUS(mg_op_force_provider(b, MG_OP_COUNT, NULL), MG_ERR_INVALID_ARGUMENT);

    const char *names[4] = {0};
    CHECK(mg_op_providers(MG_OP_GEMM_BF16, kind, names, 4) >= 1);
    const char *native = names[0];
    CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, native));
    mg_op_stats stats;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(!strcmp(stats.forced, native));
    CHECK(stats.calls == 0 && stats.provider[0] == '\0');

    /* A GEMM in a caller-supplied workspace: after the first call (plans, kernel lookups),
     * later calls on a new stream allocate nothing. */
    uint32_t m = (uint32_t)test_rand_range(1, 37), n = (uint32_t)test_rand_range(1, 40) * 8,
             k = (uint32_t)test_rand_range(1, 50) * 8;
    mg_gemm_plan plan = {.kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n,
                         .out_type = MG_DTYPE_F32};
    size_t workspace_bytes = 1;
    CHECK_OK(mg_gemm_workspace_bytes(b, &plan, &workspace_bytes));
    CHECK(kind != MG_BACKEND_CPU || workspace_bytes == 0);
    mg_gemm_tensors t = {0};
    CHECK_OK(mg_alloc(b, (size_t)m * k * 2, &t.act));
    CHECK_OK(mg_alloc(b, (size_t)n * k * 2, &t.weight));
    CHECK_OK(mg_alloc(b, (size_t)m * n * 4, &t.out));
    t.workspace_bytes = workspace_bytes ? workspace_bytes : 256;
    CHECK_OK(mg_alloc(b, t.workspace_bytes, &t.workspace));
    CHECK(gemm_round_trip(b, NULL, &t, m, n, k) == 0);
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    uint64_t bytes0 = 0, count0 = 0, bytes1 = 0, count1 = 0;
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    CHECK(gemm_round_trip(b, s, &t, m, n, k) == 0);
    CHECK(gemm_round_trip(b, s, &t, m, n, k) == 0);
    CHECK_OK(mg_ledger_live(b, &bytes1, &count1));
    CHECK(bytes1 == bytes0 && count1 == count0);
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(stats.calls == 3 && stats.caller_workspace_calls == 3);
    CHECK(!strcmp(stats.provider, native));
    CHECK(stats.workspace_bytes == 0); /* the op holds none of its own */

    /* A workspace smaller than the provider needs is refused before anything runs. */
    if (workspace_bytes > 16) {
        mg_gemm_tensors small = t;
        small.workspace_bytes = workspace_bytes - 16;
        CHECK_STATUS(mg_gemm(b, s, &plan, &small), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("workspace");
    }
    /* A workspace range outside its allocation is refused. */
    mg_gemm_tensors overrun = t;
    overrun.workspace_bytes = t.workspace_bytes + 4096;
    CHECK_STATUS(mg_gemm(b, s, &plan, &overrun), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_gemm(b, s, NULL, &t), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_gemm(b, s, &plan, NULL), MG_ERR_INVALID_ARGUMENT);

    /* The automatic choice comes back; the library's own workspace is counted. */
    CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, "auto"));
    mg_gemm_tensors own = t;
    own.workspace = 0;
    own.workspace_bytes = 0;
    CHECK(gemm_round_trip(b, s, &own, m, n, k) == 0);
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(stats.forced[0] == '\0' && stats.calls == 4 && stats.caller_workspace_calls == 3);
    CHECK(stats.workspace_bytes == workspace_bytes); /* s's own workspace, if the op needs one */
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(stats.workspace_bytes == 0);

    /* A forced provider that cannot run a shape fails the call with its reason. */
    if (kind == MG_BACKEND_CUDA && mg_op_supported(b, MG_OP_ATTENTION_RAGGED)) {
        CHECK_OK(mg_op_force_provider(b, MG_OP_ATTENTION_RAGGED, "flashinfer"));
        mg_attention_desc d = {.num_qo_heads = 4, .num_kv_heads = 1, .head_dim = 96,
                               .window_left = -1, .sm_scale = 0.1f};
        int32_t qo[2] = {0, 3}, kv[2] = {0, 5};
        mg_attention_plan *p = NULL;
        CHECK_STATUS(mg_attention_plan_create(b, &d, qo, kv, 1, NULL, &p), MG_ERR_UNSUPPORTED);
        CHECK_MESSAGE("flashinfer");
        CHECK(p == NULL);
    }
    mg_free(b, t.act);
    mg_free(b, t.weight);
    mg_free(b, t.out);
    mg_free(b, t.workspace);
    CHECK_OK(mg_backend_close(b));
}

int main(void) {
    test_seed();
    test_names();
    test_closed_backend();
    test_backend(MG_BACKEND_CPU);
    mg_backend_probe probe;
    if (mg_backend_probe_kind(MG_BACKEND_CUDA, &probe) == MG_OK && probe.usable)
        test_backend(MG_BACKEND_CUDA);
    else
        printf("  cuda backend not usable here: %s\n", probe.reason);
    return test_finish();
}
