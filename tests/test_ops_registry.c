/* test_ops_registry.c - the op registry of metrale/ops.h on every usable backend (the CPU
 * always, CUDA where a GPU is): which ops a backend supports, forcing providers (and the clear
 * errors for providers that do not exist, belong to another backend or cannot run a shape),
 * statistics, queries that leave mg_last_error alone, and GEMMs and ragged attention plans in
 * a caller-supplied workspace that allocate nothing. */
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
    /* the fast CPU providers first, then the reference (which defines the results), then the
     * kernel-by-name GEMM of every backend that ships it (the reference's code on the CPU) */
    CHECK(mg_op_providers(MG_OP_GEMM_BF16, MG_BACKEND_CPU, names, 4) == 4);
    CHECK(names[0] && !strcmp(names[0], "cpu_avx2") && names[1] &&
          !strcmp(names[1], "cpu_portable"));
    CHECK(names[2] && !strcmp(names[2], "reference"));
    CHECK(names[3] && !strcmp(names[3], "kernels"));
    /* the FP8 GEMM has no kernel-by-name provider */
    CHECK(mg_op_providers(MG_OP_GEMM_FP8, MG_BACKEND_CPU, names, 4) == 3);
    CHECK(names[2] && !strcmp(names[2], "reference"));
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
static int gemm_round_trip(mg_backend *b, mg_stream *s, const mg_gemm_tensors *operands, uint32_t m,
                           uint32_t n, uint32_t k) {
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
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_F32};
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

/* Device buffers of one attention test: inputs sized for the largest batch used. */
typedef struct attn_buffers {
    mg_devptr q, k, v, o_lib, o_ws, lse_lib, lse_ws;
    size_t q_bytes, kv_bytes, lse_bytes;
} attn_buffers;

enum { ATTN_QO_HEADS = 4, ATTN_KV_HEADS = 2, ATTN_HEAD_DIM = 64, ATTN_MAX_Q = 24, ATTN_MAX_K = 40 };

static mg_attention_tensors attn_tensors(const attn_buffers *a, bool ws, const int32_t *qo,
                                         const int32_t *kv, uint32_t batch) {
    return (mg_attention_tensors){.q = a->q,
                                  .k = a->k,
                                  .v = a->v,
                                  .o = ws ? a->o_ws : a->o_lib,
                                  .lse = ws ? a->lse_ws : a->lse_lib,
                                  .qo_rows = (uint32_t)qo[batch],
                                  .kv_rows = (uint32_t)kv[batch]};
}

/* Whether the two plans' outputs (o and lse, poisoned alike first) are bitwise equal. */
static bool attn_same_outputs(mg_backend *b, const attn_buffers *a) {
    uint8_t *x = malloc(a->q_bytes), *y = malloc(a->q_bytes);
    bool same = x && y;
    if (same) {
        CHECK_OK(mg_copy_d2h(b, x, a->o_lib, a->q_bytes));
        CHECK_OK(mg_copy_d2h(b, y, a->o_ws, a->q_bytes));
        same = !memcmp(x, y, a->q_bytes);
        CHECK_OK(mg_copy_d2h(b, x, a->lse_lib, a->lse_bytes));
        CHECK_OK(mg_copy_d2h(b, y, a->lse_ws, a->lse_bytes));
        same = same && !memcmp(x, y, a->lse_bytes);
    }
    free(x);
    free(y);
    return same;
}

static void attn_poison(mg_backend *b, const attn_buffers *a) {
    CHECK_OK(mg_memset(b, a->o_lib, 0x5A, a->q_bytes));
    CHECK_OK(mg_memset(b, a->o_ws, 0x5A, a->q_bytes));
    CHECK_OK(mg_memset(b, a->lse_lib, 0x5A, a->lse_bytes));
    CHECK_OK(mg_memset(b, a->lse_ws, 0x5A, a->lse_bytes));
}

/* Whether the device bytes at `p` equal `want`. */
static bool device_equals(mg_backend *b, mg_devptr p, const uint8_t *want, size_t bytes) {
    uint8_t *got = malloc(bytes);
    bool same = got && mg_copy_d2h(b, got, p, bytes) == MG_OK && !memcmp(got, want, bytes);
    free(got);
    return same;
}

/* Ragged attention in a caller-owned workspace: its size is queried, a plan carves everything
 * out of it (create after the first plan, update within its size and run allocate nothing),
 * computes what a library-owned plan computes, refuses batches and workspaces that do not fit
 * without writing, and leaves the caller's memory allocated when destroyed. */
static void test_attention_workspace(mg_backend *b, mg_stream *s) {
    if (!mg_op_supported(b, MG_OP_ATTENTION_RAGGED))
        return;
    mg_attention_desc d = {.num_qo_heads = ATTN_QO_HEADS,
                           .num_kv_heads = ATTN_KV_HEADS,
                           .head_dim = ATTN_HEAD_DIM,
                           .causal = true,
                           .window_left = -1,
                           .sm_scale = 0.125f};
    int32_t qo1[4] = {0, 3, 10, 12}, kv1[4] = {0, 5, 17, 30};
    int32_t qo2[4] = {0, 8, 9, 20}, kv2[4] = {0, 8, 21, 36};
    int32_t qo_big[7] = {0, 1, 2, 3, 4, 5, 6}, kv_big[7] = {0, 1, 2, 3, 4, 5, 6};
    attn_buffers a = {0};
    a.q_bytes = (size_t)ATTN_MAX_Q * ATTN_QO_HEADS * ATTN_HEAD_DIM * 2;
    a.kv_bytes = (size_t)ATTN_MAX_K * ATTN_KV_HEADS * ATTN_HEAD_DIM * 2;
    a.lse_bytes = (size_t)ATTN_MAX_Q * ATTN_QO_HEADS * 4;
    CHECK_OK(mg_alloc(b, a.q_bytes, &a.q));
    CHECK_OK(mg_alloc(b, a.kv_bytes, &a.k));
    CHECK_OK(mg_alloc(b, a.kv_bytes, &a.v));
    CHECK_OK(mg_alloc(b, a.q_bytes, &a.o_lib));
    CHECK_OK(mg_alloc(b, a.q_bytes, &a.o_ws));
    CHECK_OK(mg_alloc(b, a.lse_bytes, &a.lse_lib));
    CHECK_OK(mg_alloc(b, a.lse_bytes, &a.lse_ws));
    uint16_t *host = malloc(a.kv_bytes > a.q_bytes ? a.kv_bytes : a.q_bytes);
    if (!host)
        return;
    mg_devptr inputs[3] = {a.q, a.k, a.v};
    for (int t = 0; t < 3; t++) {
        size_t n = (t ? a.kv_bytes : a.q_bytes) / 2;
        for (size_t i = 0; i < n; i++)
            host[i] = mg_f32_to_bf16(((float)test_rand_range(0, 2000) - 1000.0f) / 1000.0f);
        CHECK_OK(mg_copy_h2d(b, inputs[t], host, n * 2));
    }
    free(host);
    mg_stream *ds = s ? s : mg_stream_default(b);

    /* The query: validated like create, host-only. */
    size_t need1 = 0, need2 = 0, bytes = 7;
    CHECK_OK(mg_attention_workspace_bytes(b, &d, qo1, kv1, 3, &need1));
    CHECK_OK(mg_attention_workspace_bytes(b, &d, qo2, kv2, 3, &need2));
    CHECK(need1 > 0 && need1 % 16 == 0 && need2 > 0 && need2 % 16 == 0);
    CHECK_STATUS(mg_attention_workspace_bytes(b, &d, qo1, kv1, 0, &bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK(bytes == 0);
    CHECK_STATUS(mg_attention_workspace_bytes(b, NULL, qo1, kv1, 3, &bytes),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_attention_workspace_bytes(b, &d, qo1, kv1, 3, NULL), MG_ERR_INVALID_ARGUMENT);

    /* The library-owned plan first (it may look up kernels or load the plugin). */
    attn_poison(b, &a);
    mg_attention_plan *lib = NULL, *ws = NULL;
    CHECK_OK(mg_attention_plan_create(b, &d, qo1, kv1, 3, s, &lib));
    mg_attention_tensors t = attn_tensors(&a, false, qo1, kv1, 3);
    CHECK_OK(mg_attention_run(lib, &t, s));

    const size_t ws_bytes = need1 > need2 ? need1 : need2;
    mg_devptr workspace = 0;
    CHECK_OK(mg_alloc(b, ws_bytes, &workspace));
    mg_op_stats stats0, stats1;
    CHECK_OK(mg_op_stats_get(b, MG_OP_ATTENTION_RAGGED, &stats0));
    uint64_t bytes0 = 0, count0 = 0, bytes1 = 1, count1 = 1;
    CHECK_OK(mg_stream_synchronize(ds));
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    mg_attention_desc dw = d;
    dw.workspace = workspace;
    dw.workspace_bytes = ws_bytes;
    CHECK_OK(mg_attention_plan_create(b, &dw, qo1, kv1, 3, s, &ws));
    t = attn_tensors(&a, true, qo1, kv1, 3);
    CHECK_OK(mg_attention_run(ws, &t, s));
    CHECK_OK(mg_attention_plan_update(ws, qo2, kv2, 3, s));
    CHECK_OK(mg_stream_synchronize(ds));
    CHECK_OK(mg_ledger_live(b, &bytes1, &count1));
    CHECK(bytes1 == bytes0 && count1 == count0); /* create, run, update: nothing allocated */
    mg_attention_plan_info info;
    CHECK_OK(mg_attention_plan_get_info(ws, &info));
    CHECK(info.workspace_bytes > 0 && info.workspace_bytes <= ws_bytes);
    CHECK(attn_same_outputs(b, &a));

    /* The second batch, on both plans. */
    attn_poison(b, &a);
    CHECK_OK(mg_attention_plan_update(lib, qo2, kv2, 3, s));
    t = attn_tensors(&a, false, qo2, kv2, 3);
    CHECK_OK(mg_attention_run(lib, &t, s));
    CHECK_OK(mg_stream_synchronize(ds));
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    t = attn_tensors(&a, true, qo2, kv2, 3);
    CHECK_OK(mg_attention_run(ws, &t, s));
    CHECK_OK(mg_stream_synchronize(ds));
    CHECK_OK(mg_ledger_live(b, &bytes1, &count1));
    CHECK(bytes1 == bytes0 && count1 == count0);
    CHECK(attn_same_outputs(b, &a));
    CHECK_OK(mg_op_stats_get(b, MG_OP_ATTENTION_RAGGED, &stats1));
    CHECK(stats1.caller_workspace_calls == stats0.caller_workspace_calls + 2);
    CHECK(stats1.calls == stats0.calls + 3);

    /* A batch that needs more than the caller gave is refused, writes nothing into the
     * workspace and leaves the previous batch planned. */
    size_t need_big = 0;
    CHECK_OK(mg_attention_workspace_bytes(b, &d, qo_big, kv_big, 6, &need_big));
    uint8_t *image = malloc(ws_bytes);
    if (need_big > ws_bytes && image) {
        CHECK_OK(mg_copy_d2h(b, image, workspace, ws_bytes));
        CHECK_STATUS(mg_attention_plan_update(ws, qo_big, kv_big, 6, s), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("workspace");
        CHECK_OK(mg_stream_synchronize(ds));
        CHECK(device_equals(b, workspace, image, ws_bytes));
        CHECK_OK(mg_attention_plan_get_info(ws, &info));
        CHECK(info.batch_size == 3 && info.qo_total == (uint32_t)qo2[3]);
        CHECK_OK(mg_memset(b, a.o_ws, 0x5A, a.q_bytes));
        CHECK_OK(mg_memset(b, a.lse_ws, 0x5A, a.lse_bytes));
        CHECK_OK(mg_attention_run(ws, &t, s));
        CHECK_OK(mg_stream_synchronize(ds));
        CHECK(attn_same_outputs(b, &a));
    }

    /* Destroy leaves the caller's workspace allocated (freeing it later succeeds). */
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    CHECK_OK(mg_attention_plan_destroy(ws));
    CHECK_OK(mg_ledger_live(b, &bytes1, &count1));
    CHECK(bytes1 == bytes0 && count1 == count0);

    /* A workspace smaller than the query's answer, misaligned, outside its allocation or
     * bytes without a pointer: refused at create, nothing written. */
    mg_attention_plan *bad = NULL;
    if (image) {
        CHECK_OK(mg_memset(b, workspace, 0xC3, ws_bytes));
        CHECK_OK(mg_copy_d2h(b, image, workspace, ws_bytes));
    }
    dw.workspace_bytes = need1 - 16;
    CHECK_STATUS(mg_attention_plan_create(b, &dw, qo1, kv1, 3, s, &bad), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("workspace");
    CHECK(bad == NULL);
    dw.workspace = workspace + 8;
    dw.workspace_bytes = need1;
    CHECK_STATUS(mg_attention_plan_create(b, &dw, qo1, kv1, 3, s, &bad), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    dw.workspace = workspace;
    dw.workspace_bytes = ws_bytes + 4096;
    CHECK_STATUS(mg_attention_plan_create(b, &dw, qo1, kv1, 3, s, &bad), MG_ERR_INVALID_ARGUMENT);
    dw.workspace = 0;
    dw.workspace_bytes = need1;
    CHECK_STATUS(mg_attention_plan_create(b, &dw, qo1, kv1, 3, s, &bad), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("workspace_bytes");
    CHECK(bad == NULL);
    CHECK_OK(mg_stream_synchronize(ds));
    if (image)
        CHECK(device_equals(b, workspace, image, ws_bytes));
    free(image);

    CHECK_OK(mg_attention_plan_destroy(lib));
    CHECK_OK(mg_free(b, workspace)); /* still the caller's allocation */
    mg_devptr all[7] = {a.q, a.k, a.v, a.o_lib, a.o_ws, a.lse_lib, a.lse_ws};
    for (int i = 0; i < 7; i++)
        mg_free(b, all[i]);
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
    CHECK(!mg_op_provider_available(b, MG_OP_GEMM_BF16, "no-such-provider", reason, sizeof reason));
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
    const char *native = names[0]; /* the first this machine can run (cpu_avx2 needs AVX2) */
    for (size_t i = 0;
         i < 4 && names[i] && !mg_op_provider_available(b, MG_OP_GEMM_BF16, native, NULL, 0); i++)
        native = names[i];
    CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, native));
    mg_op_stats stats;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(!strcmp(stats.forced, native));
    CHECK(stats.calls == 0 && stats.provider[0] == '\0');

    /* A GEMM in a caller-supplied workspace: after the first call (plans, kernel lookups),
     * later calls on a new stream allocate nothing. */
    uint32_t m = (uint32_t)test_rand_range(1, 37), n = (uint32_t)test_rand_range(1, 40) * 8,
             k = (uint32_t)test_rand_range(1, 50) * 8;
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_F32};
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
    test_attention_workspace(b, s);
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(stats.workspace_bytes == 0);

    /* A forced provider that cannot run a shape fails the call with its reason. */
    if (kind == MG_BACKEND_CUDA && mg_op_supported(b, MG_OP_ATTENTION_RAGGED)) {
        CHECK_OK(mg_op_force_provider(b, MG_OP_ATTENTION_RAGGED, "flashinfer"));
        mg_attention_desc d = {.num_qo_heads = 4,
                               .num_kv_heads = 1,
                               .head_dim = 96,
                               .window_left = -1,
                               .sm_scale = 0.1f};
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
