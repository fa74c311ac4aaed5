/* test_gemm_fusion_cpu.c - the fused GEMMs of metrale/ops_gemm.h on the CPU backend: the
 * "gemm/fusion_" check cases (every fusion against the unfused calls, argument errors), a
 * provider that declares no fusion refusing one whole when forced, planning and workspace
 * queries of fused plans, a captured fused call replayed bit for bit equal to eager, and the
 * fusion names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "metrale/status.h"
#include "test_util.h"

#define POISON 0xa5

static void fill_bf16(uint16_t *v, size_t count, float offset, float magnitude) {
    for (size_t i = 0; i < count; i++) {
        double u = (double)(test_rand() >> 11) * 0x1p-53 * 2.0 - 1.0;
        v[i] = mg_f32_to_bf16(offset + (float)u * magnitude);
    }
}

static mg_status upload(mg_backend *b, const void *host, size_t bytes, mg_devptr *out) {
    mg_status st = mg_alloc(b, bytes, out);
    return st ? st : mg_copy_h2d(b, *out, host, bytes);
}

static mg_status poisoned(mg_backend *b, size_t bytes, mg_devptr *out) {
    void *p = malloc(bytes);
    if (!p)
        return MG_ERR_OUT_OF_MEMORY;
    memset(p, POISON, bytes);
    mg_status st = upload(b, p, bytes, out);
    free(p);
    return st;
}

static bool all_poison(mg_backend *b, mg_devptr p, size_t bytes) {
    unsigned char *h = malloc(bytes);
    bool ok = h && mg_copy_d2h(b, h, p, bytes) == MG_OK;
    for (size_t i = 0; ok && i < bytes; i++)
        ok = h[i] == POISON;
    free(h);
    return ok;
}

/* Every fusion against the composition, and the argument errors: the check cases. */
static void test_fusion_checks(mg_backend *b) {
    int passed = 0, skipped = 0;
    int failed = mg_check_run_all(b, "gemm/fusion_", stdout, &passed, &skipped);
    CHECK(failed == 0);
    CHECK(skipped == 0); /* the CPU reference runs every fusion */
    CHECK(passed == 19); /* 18 fusions (one of them the in-place residual add) + bad arguments */
}

/* A provider without the fusion, forced, refuses the call as a whole, naming the fusion, the
 * provider and the backend; nothing is written. The automatic choice passes it over. */
static void test_forced_provider_refuses(mg_backend *b) {
    const uint32_t m = 3, n = 37, k = 40, ldc = 40;
    uint16_t *act = malloc((size_t)m * k * 2), *w = malloc((size_t)n * k * 2);
    uint16_t *resid = malloc((size_t)m * ldc * 2);
    mg_devptr d_act = 0, d_w = 0, d_resid = 0, d_out = 0;
    fill_bf16(act, (size_t)m * k, 0, 2);
    fill_bf16(w, (size_t)n * k, 0, 0.25f);
    fill_bf16(resid, (size_t)m * ldc, 0, 1);
    CHECK_OK(upload(b, act, (size_t)m * k * 2, &d_act));
    CHECK_OK(upload(b, w, (size_t)n * k * 2, &d_w));
    CHECK_OK(upload(b, resid, (size_t)m * ldc * 2, &d_resid));
    CHECK_OK(poisoned(b, (size_t)m * ldc * 2, &d_out));
    mg_gemm_plan p = {.kind = MG_GEMM_BF16,
                      .m = m,
                      .n = n,
                      .k = k,
                      .ldc = ldc,
                      .out_type = MG_DTYPE_BF16,
                      .fusion = {.epilogue = MG_GEMM_EPILOGUE_RESIDUAL_ADD}};
    mg_gemm_tensors t = {.act = d_act, .weight = d_w, .out = d_out, .fusion.residual = d_resid};
    const char *fast[] = {"cpu_portable", "cpu_avx2"};
    for (int i = 0; i < 2; i++) {
        if (!mg_op_provider_available(b, MG_OP_GEMM_BF16, fast[i], NULL, 0))
            continue;
        unsigned char poison[3 * 40 * 2]; /* m * ldc * 2 */
        memset(poison, POISON, sizeof poison);
        CHECK_OK(mg_copy_h2d(b, d_out, poison, sizeof poison));
        CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, fast[i]));
        CHECK_STATUS(mg_gemm(b, NULL, &p, &t), MG_ERR_UNSUPPORTED);
        CHECK_MESSAGE(fast[i]);
        CHECK_MESSAGE("residual_add");
        CHECK_MESSAGE("mg_gemm_bf16 with fusion epilogue residual_add");
        /* planning refuses it too, before any capture */
        CHECK_STATUS(mg_gemm_prewarm(b, NULL, &p, 1), MG_ERR_UNSUPPORTED);
        CHECK_MESSAGE("residual_add");
        CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
        CHECK(all_poison(b, d_out, (size_t)m * ldc * 2));
        /* the same provider still runs the plain GEMM */
        mg_gemm_plan plain = p;
        plain.fusion = (mg_gemm_fusion){0};
        mg_gemm_tensors tp = t;
        tp.fusion = (mg_gemm_fusion_tensors){0};
        CHECK_OK(mg_gemm(b, NULL, &plain, &tp));
        CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, NULL));
    }
    /* automatic: the reference */
    CHECK_OK(mg_gemm(b, NULL, &p, &t));
    mg_op_stats stats;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(strcmp(stats.provider, "reference") == 0);
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    mg_free(b, d_act);
    mg_free(b, d_w);
    mg_free(b, d_resid);
    mg_free(b, d_out);
    free(act);
    free(w);
    free(resid);
}

/* Fused plans are planned and sized like plain ones; a bad fusion is refused there too. */
static void test_plans(mg_backend *b) {
    mg_gemm_plan plans[] = {
        {.kind = MG_GEMM_BF16,
         .m = 1,
         .n = 64,
         .k = 40,
         .ldc = 32,
         .out_type = MG_DTYPE_BF16,
         .fusion = {MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_SILU_MUL, 1e-6f}},
        {.kind = MG_GEMM_FP8_ROWWISE,
         .m = 5,
         .n = 48,
         .k = 64,
         .ldc = 48,
         .out_type = MG_DTYPE_BF16,
         .fusion = {MG_GEMM_PROLOGUE_NONE, MG_GEMM_EPILOGUE_ARGMAX, 0}},
    };
    CHECK_OK(mg_gemm_prewarm(b, NULL, plans, 2));
    size_t bytes = 1;
    CHECK_OK(mg_gemm_workspace_bytes(b, &plans[0], &bytes));
    CHECK(bytes == 0);
    mg_gemm_plan bad = plans[0];
    bad.ldc = 31; /* the output has N/2 = 32 columns */
    CHECK_STATUS(mg_gemm_prewarm(b, NULL, &bad, 1), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("32 output columns");
    bad = plans[0];
    bad.fusion.prologue = (mg_gemm_prologue)7;
    CHECK_STATUS(mg_gemm_workspace_bytes(b, &bad, &bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("unknown fusion");
    bad = plans[1];
    bad.kind = MG_GEMM_FP8_TENSORWISE;
    CHECK_STATUS(mg_gemm_prewarm(b, NULL, &bad, 1), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("epilogue argmax");
}

/* A captured RMSNorm + SiLU-mul GEMM replays what eager computes from the inputs current at
 * replay. */
static void test_capture(mg_backend *b) {
    const uint32_t m = 17, n = 2 * 45, k = 56, ldc = 48;
    size_t act_bytes = (size_t)m * k * 2, out_bytes = (size_t)m * ldc * 2;
    uint16_t *act = malloc(act_bytes), *w = malloc((size_t)n * k * 2), *nw = malloc(k * 2);
    unsigned char *eager = malloc(out_bytes), *replayed = malloc(out_bytes);
    fill_bf16(w, (size_t)n * k, 0, 0.25f);
    fill_bf16(nw, k, 1, 0.5f);
    mg_devptr d_act = 0, d_w = 0, d_nw = 0, d_out = 0;
    CHECK_OK(poisoned(b, act_bytes, &d_act));
    CHECK_OK(upload(b, w, (size_t)n * k * 2, &d_w));
    CHECK_OK(upload(b, nw, k * 2, &d_nw));
    CHECK_OK(poisoned(b, out_bytes, &d_out));
    mg_gemm_plan p = {.kind = MG_GEMM_BF16,
                      .m = m,
                      .n = n,
                      .k = k,
                      .ldc = ldc,
                      .out_type = MG_DTYPE_BF16,
                      .fusion = {MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_SILU_MUL, 1e-5f}};
    mg_gemm_tensors t = {.act = d_act, .weight = d_w, .out = d_out, .fusion.norm_weight = d_nw};
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_gemm(b, s, &p, &t));
    CHECK_OK(mg_graph_end_capture(s, &g));
    fill_bf16(act, (size_t)m * k, 0, 3);
    CHECK_OK(mg_copy_h2d(b, d_act, act, act_bytes));
    CHECK(all_poison(b, d_out, out_bytes)); /* captured, not run */
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_copy_d2h(b, replayed, d_out, out_bytes));
    memset(eager, POISON, out_bytes);
    CHECK_OK(mg_copy_h2d(b, d_out, eager, out_bytes));
    CHECK_OK(mg_gemm(b, NULL, &p, &t));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    CHECK_OK(mg_copy_d2h(b, eager, d_out, out_bytes));
    CHECK(memcmp(eager, replayed, out_bytes) == 0);
    bool padding_kept = true, written = true;
    for (uint32_t r = 0; r < m; r++)
        for (uint32_t j = 0; j < ldc; j++) {
            const unsigned char *e = eager + ((size_t)r * ldc + j) * 2;
            bool poison = e[0] == POISON && e[1] == POISON;
            if (j >= n / 2 && !poison)
                padding_kept = false;
            if (j < n / 2 && poison)
                written = false;
        }
    CHECK(padding_kept);
    CHECK(written);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_stream_destroy(s));
    mg_free(b, d_act);
    mg_free(b, d_w);
    mg_free(b, d_nw);
    mg_free(b, d_out);
    free(act), free(w), free(nw), free(eager), free(replayed);
}

static void test_names(void) {
    CHECK(strcmp(mg_gemm_prologue_name(MG_GEMM_PROLOGUE_NONE), "none") == 0);
    CHECK(strcmp(mg_gemm_prologue_name(MG_GEMM_PROLOGUE_RMSNORM), "rmsnorm") == 0);
    CHECK(strcmp(mg_gemm_epilogue_name(MG_GEMM_EPILOGUE_RESIDUAL_ADD), "residual_add") == 0);
    CHECK(strcmp(mg_gemm_epilogue_name(MG_GEMM_EPILOGUE_SILU_MUL), "silu_mul") == 0);
    CHECK(strcmp(mg_gemm_epilogue_name(MG_GEMM_EPILOGUE_ARGMAX), "argmax") == 0);
    CHECK(strcmp(mg_gemm_epilogue_name(MG_GEMM_EPILOGUE_KV_APPEND), "kv_append") == 0);
    CHECK(mg_gemm_prologue_name((mg_gemm_prologue)MG_GEMM_PROLOGUE_COUNT) == NULL);
    CHECK(mg_gemm_epilogue_name((mg_gemm_epilogue)-1) == NULL);
}

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!b)
        return test_finish();
    test_names();
    test_fusion_checks(b);
    test_forced_provider_refuses(b);
    test_plans(b);
    test_capture(b);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
