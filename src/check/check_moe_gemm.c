/* check_moe_gemm.c - `metrale-gpu check moe_gemm`: the grouped MoE GEMM (metrale/ops_moe_gemm.h)
 * on the backend under test against the CPU reference, on fresh random inputs of awkward
 * sizes with skewed and empty experts, outputs poisoned first. A kind the backend cannot run
 * (MG_ERR_UNSUPPORTED / MG_ERR_UNAVAILABLE) is skipped with the reason. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops_moe_gemm.h"

typedef struct moe_inputs {
    mg_moe_gemm_desc d;
    uint32_t n_w;
    uint16_t *act;
    int32_t *ids, offsets[17];
    uint8_t *weight;
    float *scale;
    size_t act_bytes, weight_bytes, scale_bytes, out_bytes;
} moe_inputs;

static float rng_unit(uint64_t *rng) { /* uniform in [-1, 1) */
    return (float)(mg_check_rng_next(rng) >> 40) * 0x1p-23f - 1.0f;
}

/* 13 experts, 0..16 rows each with about a third empty, one expert given 40 more. */
static bool make_inputs(uint64_t *rng, mg_moe_gemm_kind kind, bool gate_up, moe_inputs *in) {
    memset(in, 0, sizeof *in);
    uint32_t experts = 13, act_rows = 41;
    in->offsets[0] = 0;
    uint32_t heavy = (uint32_t)(mg_check_rng_next(rng) % experts);
    for (uint32_t e = 0; e < experts; e++) {
        uint32_t count =
            mg_check_rng_next(rng) % 3 == 0 ? 0 : (uint32_t)(mg_check_rng_next(rng) % 17);
        in->offsets[e + 1] = in->offsets[e] + (int32_t)(count + (e == heavy ? 40 : 0));
    }
    uint32_t rows = (uint32_t)in->offsets[experts];
    in->d = (mg_moe_gemm_desc){.kind = kind,
                               .experts = experts,
                               .rows = rows,
                               .act_rows = act_rows,
                               .n = gate_up ? 72 : 144,
                               .k = 304,
                               .act_pitch = 312,
                               .ldc = gate_up ? 0 : 152,
                               .gate_up = gate_up};
    in->n_w = 144; /* the weight rows: 2 x 72 or 144 */
    bool fp8 = kind != MG_MOE_GEMM_BF16;
    in->act_bytes = ((size_t)(act_rows - 1) * 312 + 304) * 2;
    in->weight_bytes = (size_t)experts * in->n_w * 304 * (fp8 ? 1 : 2);
    size_t scales = kind == MG_MOE_GEMM_FP8_ROWWISE ? (size_t)experts * in->n_w
                    : fp8                           ? (size_t)experts * 2 * 3
                                                    : 0;
    in->scale_bytes = scales * 4;
    uint32_t ldc = in->d.ldc ? in->d.ldc : in->d.n;
    in->out_bytes = ((size_t)(rows - 1) * ldc + in->d.n) * 2;
    in->act = malloc(in->act_bytes);
    in->ids = malloc((size_t)rows * 4);
    in->weight = malloc(in->weight_bytes);
    in->scale = scales ? malloc(in->scale_bytes) : NULL;
    if (!in->act || !in->ids || !in->weight || (scales && !in->scale))
        return false;
    for (size_t i = 0; i < in->act_bytes / 2; i++)
        in->act[i] = mg_f32_to_bf16(2.0f * rng_unit(rng));
    for (uint32_t r = 0; r < rows; r++)
        in->ids[r] = (int32_t)(mg_check_rng_next(rng) % act_rows);
    for (size_t i = 0; i < in->weight_bytes; i += fp8 ? 1 : 2) {
        if (fp8) {
            uint8_t code = (uint8_t)mg_check_rng_next(rng);
            in->weight[i] = (code & 0x7f) == 0x7f ? (uint8_t)(code ^ 1) : code; /* no NaN */
        } else {
            uint16_t v = mg_f32_to_bf16(rng_unit(rng));
            memcpy(in->weight + i, &v, 2);
        }
    }
    for (size_t i = 0; i < scales; i++)
        in->scale[i] = 0.002f + 0.01f * fabsf(rng_unit(rng));
    return true;
}

static void free_inputs(moe_inputs *in) {
    free(in->act);
    free(in->ids);
    free(in->weight);
    free(in->scale);
}

/* One call on `b` into `out` (poisoned first). */
static mg_status run_on(mg_backend *b, const moe_inputs *in, uint16_t *out) {
    mg_devptr act = 0, ids = 0, offsets = 0, weight = 0, scale = 0, o = 0, ws = 0;
    size_t ws_bytes = 0;
    mg_status st;
    if (!(st = mg_moe_gemm_workspace_bytes(b, &in->d, &ws_bytes)) &&
        !(st = mg_check_upload(b, in->act, in->act_bytes, &act)) &&
        !(st = mg_check_upload(b, in->ids, (size_t)in->d.rows * 4, &ids)) &&
        !(st = mg_check_upload(b, in->offsets, ((size_t)in->d.experts + 1) * 4, &offsets)) &&
        !(st = mg_check_upload(b, in->weight, in->weight_bytes, &weight)) &&
        !(st = in->scale ? mg_check_upload(b, in->scale, in->scale_bytes, &scale) : MG_OK) &&
        !(st = mg_check_alloc_poisoned(b, in->out_bytes, &o)) &&
        !(st = ws_bytes ? mg_alloc(b, ws_bytes, &ws) : MG_OK)) {
        mg_moe_gemm_tensors t = {.act = act,
                                 .sorted_token_ids = ids,
                                 .expert_offsets = offsets,
                                 .weight = weight,
                                 .weight_scale = scale,
                                 .out = o,
                                 .workspace = ws,
                                 .workspace_bytes = ws_bytes};
        if (!(st = mg_moe_gemm(b, NULL, &in->d, &t)) &&
            !(st = mg_stream_synchronize(mg_stream_default(b))))
            st = mg_copy_d2h(b, out, o, in->out_bytes);
    }
    const mg_devptr all[] = {act, ids, offsets, weight, scale, o, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            mg_free(b, all[i]);
    return st;
}

static void check_kind(mg_check_ctx *ctx, mg_check_result *result, mg_moe_gemm_kind kind,
                       bool gate_up, const char *name) {
    uint64_t rng = mg_check_rng_seed(ctx, name);
    moe_inputs in;
    uint16_t *got = NULL, *want = NULL;
    if (!make_inputs(&rng, kind, gate_up, &in))
        FAIL("out of host memory");
    got = malloc(in.out_bytes);
    want = malloc(in.out_bytes);
    if (!got || !want)
        FAIL("out of host memory");
    mg_status st = run_on(ctx->backend, &in, got);
    if (st == MG_ERR_UNSUPPORTED || st == MG_ERR_UNAVAILABLE) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    EXPECT(st == MG_OK, "%s on the backend: %s", name, mg_last_error());
    OK(run_on(ctx->reference, &in, want));
    uint32_t ldc = in.d.ldc ? in.d.ldc : in.d.n;
    double largest = 0, worst = 0;
    for (uint32_t r = 0; r < in.d.rows; r++)
        for (uint32_t j = 0; j < in.d.n; j++) {
            double w = fabs(mg_bf16_to_f32(want[(size_t)r * ldc + j]));
            largest = w > largest ? w : largest;
        }
    for (uint32_t r = 0; r < in.d.rows; r++) {
        for (uint32_t j = 0; j < ldc && (r + 1 < in.d.rows || j < in.d.n); j++) {
            size_t at = (size_t)r * ldc + j;
            if (j >= in.d.n) { /* the padding columns are never written */
                EXPECT(got[at] == (MG_CHECK_POISON << 8 | MG_CHECK_POISON),
                       "out[%u, %u] (padding) was written", r, j);
                continue;
            }
            double g = mg_bf16_to_f32(got[at]), w = mg_bf16_to_f32(want[at]);
            double err = fabs(g - w) / (0.02 * fabs(w) + 4e-3 * largest + 1e-30);
            EXPECT(err <= 1.0, "out[%u, %u] = %g, reference %g", r, j, g, w);
            worst = err > worst ? err : worst;
        }
    }
    result->error = worst;
    PASS();
done:
    free(got);
    free(want);
    free_inputs(&in);
}

static void check_bf16(mg_check_ctx *c, mg_check_result *r) {
    check_kind(c, r, MG_MOE_GEMM_BF16, false, "moe_gemm_bf16");
}
static void check_bf16_gate_up(mg_check_ctx *c, mg_check_result *r) {
    check_kind(c, r, MG_MOE_GEMM_BF16, true, "moe_gemm_bf16_gate_up");
}
static void check_fp8_rowwise(mg_check_ctx *c, mg_check_result *r) {
    check_kind(c, r, MG_MOE_GEMM_FP8_ROWWISE, false, "moe_gemm_fp8_rowwise");
}
static void check_fp8_block(mg_check_ctx *c, mg_check_result *r) {
    check_kind(c, r, MG_MOE_GEMM_FP8_BLOCKSCALED, true, "moe_gemm_fp8_blockscaled_gate_up");
}

const mg_check_case mg_checks_moe_gemm[] = {
    {"moe_gemm", "bf16", check_bf16},
    {"moe_gemm", "bf16_gate_up", check_bf16_gate_up},
    {"moe_gemm", "fp8_rowwise", check_fp8_rowwise},
    {"moe_gemm", "fp8_blockscaled_gate_up", check_fp8_block},
    {NULL, NULL, NULL},
};
