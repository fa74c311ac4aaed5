/* check_gemm.c - the "gemm" check group: every GEMM variant and the FP8 scale transpose on the
 * backend under test against the CPU reference backend, on fresh random inputs of awkward
 * shapes with poisoned outputs; bad arguments; the activation-scale layout trap; batch
 * invariance; capture after prewarm; two streams at once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "metrale/status.h"

/* Relative error bounds, norm-wise ||out - ref|| / ||ref||. Both sides compute from the same
 * BF16 or FP8 inputs in FP32; what differs is the summation order and, for BF16 outputs, one
 * rounding each (2^-9 relative), so the bounds sit at the top of the 1e-3..1e-2 range the GPU
 * machine's method allows for BF16 inputs. */
#define BOUND_BF16_OUT 1e-2
#define BOUND_F32_OUT 1e-3

static const uint32_t awkward_m[] = {1, 3, 17, 130};
#define AWKWARD_M_COUNT (sizeof awkward_m / sizeof awkward_m[0])

#define POISON MG_CHECK_POISON

/* ------------------------------------------------------------------ helpers */

/* BF16 values uniform in [-magnitude, magnitude). */
static uint16_t *random_bf16(uint64_t *rng, size_t count, float magnitude) {
    uint16_t *v = malloc(count * sizeof *v);
    for (size_t i = 0; v && i < count; i++)
        v[i] = mg_f32_to_bf16(((float)(mg_check_rng_next(rng) >> 40) * 0x1p-24f * 2.0f - 1.0f) *
                              magnitude);
    return v;
}

/* One GEMM's host inputs. act/weight are BF16 values or E4M3 codes; the scales are in the
 * GEMM's layout, except when act_rows_natural != 0: then act_scale is the quantizer's
 * [act_rows_natural, L] layout and is transposed on the backend into [L, plan.m]. */
typedef struct gemm_inputs {
    mg_gemm_plan plan;
    const void *act, *weight;
    const float *act_scale, *weight_scale;
    uint32_t act_rows_natural;
} gemm_inputs;

static size_t input_bytes(const gemm_inputs *in, bool act) {
    size_t rows = act ? in->plan.m : in->plan.n;
    return rows * in->plan.k * mg_dtype_bytes(mg_gemm_kind_describe(in->plan.kind)->input_type);
}

static size_t output_bytes(const mg_gemm_plan *p) {
    return (size_t)p->m * p->ldc * mg_dtype_bytes(p->out_type);
}

static mg_status launch_gemm(mg_backend *b, mg_stream *s, const mg_gemm_plan *p, mg_devptr act,
                             mg_devptr act_scale, mg_devptr weight, mg_devptr weight_scale,
                             mg_devptr out) {
    mg_gemm_tensors t = {.act = act,
                         .weight = weight,
                         .out = out,
                         .act_scale = act_scale,
                         .weight_scale = weight_scale};
    return mg_gemm(b, s, p, &t);
}

/* Uploads the inputs to `b`, poisons the output, runs the GEMM on stream `s` and downloads
 * the whole output (padding columns included) to out_host. */
static mg_status run_gemm(mg_backend *b, mg_stream *s, const gemm_inputs *in, void *out_host) {
    const mg_gemm_plan *p = &in->plan;
    mg_devptr act = 0, weight = 0, act_scale = 0, weight_scale = 0, natural = 0, out = 0;
    mg_status st;
    if ((st = mg_check_upload(b, in->act, input_bytes(in, true), &act)) ||
        (st = mg_check_upload(b, in->weight, input_bytes(in, false), &weight)) ||
        (st = mg_check_alloc_poisoned(b, output_bytes(p), &out)))
        goto done;
    if (p->kind != MG_GEMM_BF16) {
        if ((st = mg_check_upload(b, in->weight_scale, mg_gemm_scale_count(p, false) * 4,
                                  &weight_scale)))
            goto done;
        if (in->act_rows_natural) {
            size_t natural_bytes = (size_t)in->act_rows_natural * mg_fp8_k_blocks(p->k) * 4;
            if ((st = mg_check_upload(b, in->act_scale, natural_bytes, &natural)) ||
                (st = mg_check_alloc_poisoned(b, mg_gemm_scale_count(p, true) * 4, &act_scale)) ||
                (st = mg_fp8_act_scales_transpose(b, s, in->act_rows_natural, p->m, p->k, natural,
                                                  act_scale)))
                goto done;
        } else if ((st = mg_check_upload(b, in->act_scale, mg_gemm_scale_count(p, true) * 4,
                                         &act_scale))) {
            goto done;
        }
    }
    if ((st = launch_gemm(b, s, p, act, act_scale, weight, weight_scale, out)))
        goto done;
    if ((st = mg_stream_synchronize(s ? s : mg_stream_default(b))))
        goto done;
    st = mg_copy_d2h(b, out_host, out, output_bytes(p));
done:
    mg_free(b, act);
    mg_free(b, weight);
    mg_free(b, act_scale);
    mg_free(b, weight_scale);
    mg_free(b, natural);
    mg_free(b, out);
    return st;
}

static double output_value(const mg_gemm_plan *p, const void *out, size_t i) {
    return p->out_type == MG_DTYPE_F32 ? ((const float *)out)[i]
                                       : mg_bf16_to_f32(((const uint16_t *)out)[i]);
}

/* ||got - ref|| / ||ref|| over the M x N results (NaN and infinities give +inf); the padding
 * columns of `got` must still hold the poison (*padding_ok). */
static double relative_error(const mg_gemm_plan *p, const void *got, const void *ref, uint32_t rows,
                             bool *padding_ok) {
    double diff = 0, norm = 0;
    size_t esize = mg_dtype_bytes(p->out_type);
    *padding_ok = true;
    for (uint32_t t = 0; t < rows; t++) {
        for (uint32_t j = 0; j < p->n; j++) {
            size_t i = (size_t)t * p->ldc + j;
            double g = output_value(p, got, i), r = output_value(p, ref, i);
            if (!isfinite(g))
                return INFINITY;
            diff += (g - r) * (g - r);
            norm += r * r;
        }
        for (uint32_t j = p->n; j < p->ldc; j++)
            for (size_t byte = 0; byte < esize; byte++)
                if (((const unsigned char *)got)[((size_t)t * p->ldc + j) * esize + byte] != POISON)
                    *padding_ok = false;
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

/* Runs `in` on the backend under test and on the reference; returns the relative error, or
 * a negative value after filling r on failure. */
static double compare_with_reference(mg_check_ctx *ctx, const gemm_inputs *in, uint32_t rows,
                                     mg_check_result *r) {
    size_t bytes = output_bytes(&in->plan);
    void *got = malloc(bytes), *ref = malloc(bytes);
    double err = -1;
    mg_status st;
    if (!got || !ref) {
        MG_CHECK_FAIL(r, "out of host memory for %zu-byte outputs", bytes);
    } else if ((st = run_gemm(ctx->backend, NULL, in, got))) {
        MG_CHECK_FAIL(r, "M=%u N=%u K=%u on the backend: %s: %s", in->plan.m, in->plan.n,
                      in->plan.k, mg_status_name(st), mg_last_error());
    } else if ((st = run_gemm(ctx->reference, NULL, in, ref))) {
        MG_CHECK_FAIL(r, "M=%u on the reference: %s: %s", in->plan.m, mg_status_name(st),
                      mg_last_error());
    } else {
        bool padding_ok;
        err = relative_error(&in->plan, got, ref, rows, &padding_ok);
        if (!padding_ok) {
            MG_CHECK_FAIL(r, "M=%u N=%u ldc=%u: the padding columns of the output were written",
                          in->plan.m, in->plan.n, in->plan.ldc);
            err = -1;
        }
    }
    free(got);
    free(ref);
    return err;
}

/* Records the worst error over a sweep and the verdict against `bound`. */
static void finish_sweep(mg_check_result *r, double worst, double bound, const char *what) {
    r->error = worst;
    if (!r->passed)
        return;
    if (!(worst <= bound))
        MG_CHECK_FAIL(r, "%s: relative error %.3g exceeds %.0e", what, worst, bound);
    else
        snprintf(r->detail, sizeof r->detail, "%s: worst relative error %.2e (bound %.0e)", what,
                 worst, bound);
}

/* Marks the check skipped when the backend cannot run the op (no cuBLASLt, an older GPU, a
 * backend without GEMMs). */
static bool skipped_without(mg_check_ctx *ctx, mg_check_result *r, mg_op op) {
    if (mg_op_supported(ctx->backend, op))
        return false;
    r->skipped = true;
    snprintf(r->detail, sizeof r->detail, "the backend has no %s GEMMs",
             op == MG_OP_GEMM_FP8 ? "FP8" : "BF16");
    return true;
}

/* ------------------------------------------------------------------ BF16 */

static void check_bf16(mg_check_ctx *ctx, mg_check_result *r, mg_dtype out_type) {
    if (skipped_without(ctx, r, MG_OP_GEMM_BF16))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    uint64_t rng = ctx->seed ^ (out_type == MG_DTYPE_F32 ? 0x11 : 0x12);
    const uint32_t n = 203, k = 328, ldc = n + 5;
    double worst = 0;
    for (size_t i = 0; i < AWKWARD_M_COUNT && r->passed; i++) {
        uint32_t m = awkward_m[i];
        uint16_t *act = random_bf16(&rng, (size_t)m * k, 2.0f);
        uint16_t *weight = random_bf16(&rng, (size_t)n * k, 0.25f);
        gemm_inputs in = {
            .plan =
                {.kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = ldc, .out_type = out_type},
            .act = act,
            .weight = weight};
        if (!act || !weight)
            MG_CHECK_FAIL(r, "out of host memory");
        else {
            double err = compare_with_reference(ctx, &in, m, r);
            if (err > worst)
                worst = err;
        }
        free(act);
        free(weight);
    }
    finish_sweep(r, worst, out_type == MG_DTYPE_F32 ? BOUND_F32_OUT : BOUND_BF16_OUT,
                 out_type == MG_DTYPE_F32 ? "bf16 -> f32, M in {1,3,17,130}, N=203 K=328 ldc=208"
                                          : "bf16 -> bf16, M in {1,3,17,130}, N=203 K=328 ldc=208");
}

static void check_bf16_out_bf16(mg_check_ctx *ctx, mg_check_result *r) {
    check_bf16(ctx, r, MG_DTYPE_BF16);
}

static void check_bf16_out_f32(mg_check_ctx *ctx, mg_check_result *r) {
    check_bf16(ctx, r, MG_DTYPE_F32);
}

/* ------------------------------------------------------------------ FP8 */

/* FP8 operands made by the host quantizer from random BF16 values, in the layouts a caller
 * hands to the GEMM. For a 1x128 activation the scales stay in the quantizer's natural
 * layout and the backend transposes them (act_rows_natural = m), which is the documented
 * flow; `m_pad` rows are given to the GEMM, the padding rows zero. */
typedef struct fp8_operands {
    uint8_t *act, *weight;
    float *act_scale, *weight_scale;
} fp8_operands;

static void free_operands(fp8_operands *o) {
    free(o->act);
    free(o->weight);
    free(o->act_scale);
    free(o->weight_scale);
}

/* Quantizes random activations of `m` real rows (padded with zero rows to p->m) and weights. */
static mg_status make_fp8_operands(uint64_t *rng, const mg_gemm_plan *p, uint32_t m,
                                   fp8_operands *o) {
    memset(o, 0, sizeof *o);
    uint16_t *act = random_bf16(rng, (size_t)p->m * p->k, 4.0f);
    uint16_t *weight = random_bf16(rng, (size_t)p->n * p->k, 0.05f);
    o->act = calloc((size_t)p->m * p->k, 1);
    o->weight = malloc((size_t)p->n * p->k);
    o->act_scale = calloc(mg_gemm_scale_count(p, true) + (size_t)p->m * mg_fp8_k_blocks(p->k), 4);
    o->weight_scale = malloc(mg_gemm_scale_count(p, false) * 4);
    mg_status st = MG_ERR_OUT_OF_MEMORY;
    if (act && weight && o->act && o->weight && o->act_scale && o->weight_scale) {
        memset(act + (size_t)m * p->k, 0, (size_t)(p->m - m) * p->k * 2);
        bool natural = p->kind == MG_GEMM_FP8_BLOCKSCALED && p->act_mode == MG_FP8_BLOCK_1X128;
        st = mg_gemm_quantize_operand(p, true, act, natural ? m : p->m, o->act, o->act_scale);
        if (st == MG_OK)
            st = mg_gemm_quantize_operand(p, false, weight, p->n, o->weight, o->weight_scale);
    }
    free(act);
    free(weight);
    if (st)
        free_operands(o);
    return st;
}

static void check_fp8(mg_check_ctx *ctx, mg_check_result *r, mg_gemm_kind kind,
                      mg_fp8_block_scale act_mode, mg_fp8_block_scale weight_mode, uint32_t k,
                      const char *what) {
    if (skipped_without(ctx, r, MG_OP_GEMM_FP8))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    uint64_t rng = ctx->seed ^ (0x100u + kind * 16 + act_mode * 4 + weight_mode + k * 64);
    const uint32_t n = 208, ldc = 216;
    double worst = 0;
    for (size_t i = 0; i < AWKWARD_M_COUNT && r->passed; i++) {
        uint32_t m = awkward_m[i];
        bool blocked = kind == MG_GEMM_FP8_BLOCKSCALED;
        mg_gemm_plan plan = {kind,     blocked ? mg_fp8_rows_padded(m) : m,
                             n,        k,
                             ldc,      MG_DTYPE_BF16,
                             act_mode, weight_mode,
                             0};
        fp8_operands o;
        mg_status st = make_fp8_operands(&rng, &plan, m, &o);
        if (st) {
            MG_CHECK_FAIL(r, "quantizing the operands: %s", mg_last_error());
            break;
        }
        gemm_inputs in = {.plan = plan,
                          .act = o.act,
                          .weight = o.weight,
                          .act_scale = o.act_scale,
                          .weight_scale = o.weight_scale,
                          .act_rows_natural = blocked && act_mode == MG_FP8_BLOCK_1X128 ? m : 0};
        double err = compare_with_reference(ctx, &in, plan.m, r);
        if (err > worst)
            worst = err;
        free_operands(&o);
    }
    char text[192];
    snprintf(text, sizeof text, "%s, M in {1,3,17,130}%s", what,
             kind == MG_GEMM_FP8_BLOCKSCALED ? " padded to 4" : "");
    finish_sweep(r, worst, BOUND_BF16_OUT, text);
}

/* K = 400 is 3 full 128-blocks and a partial one; K = 1152 is 9 blocks, not a multiple of
 * 4, so the 128x128 layout has padding columns. */
static void check_fp8_tensorwise(mg_check_ctx *ctx, mg_check_result *r) {
    check_fp8(ctx, r, MG_GEMM_FP8_TENSORWISE, 0, 0, 400, "fp8 per-tensor, N=208 K=400 ldc=216");
}

static void check_fp8_rowwise(mg_check_ctx *ctx, mg_check_result *r) {
    check_fp8(ctx, r, MG_GEMM_FP8_ROWWISE, 0, 0, 400, "fp8 row-wise, N=208 K=400 ldc=216");
}

static void check_fp8_block_1x128_128x128(mg_check_ctx *ctx, mg_check_result *r) {
    check_fp8(ctx, r, MG_GEMM_FP8_BLOCKSCALED, MG_FP8_BLOCK_1X128, MG_FP8_BLOCK_128X128, 1152,
              "fp8 act 1x128 (transposed on the backend) x weight 128x128, N=208 K=1152");
}

static void check_fp8_block_1x128_128x128_partial(mg_check_ctx *ctx, mg_check_result *r) {
    check_fp8(ctx, r, MG_GEMM_FP8_BLOCKSCALED, MG_FP8_BLOCK_1X128, MG_FP8_BLOCK_128X128, 400,
              "fp8 act 1x128 x weight 128x128, partial last K-block, N=208 K=400");
}

static void check_fp8_block_1x128_1x128(mg_check_ctx *ctx, mg_check_result *r) {
    check_fp8(ctx, r, MG_GEMM_FP8_BLOCKSCALED, MG_FP8_BLOCK_1X128, MG_FP8_BLOCK_1X128, 1152,
              "fp8 act 1x128 x weight 1x128, N=208 K=1152");
}

static void check_fp8_block_128x128_1x128(mg_check_ctx *ctx, mg_check_result *r) {
    check_fp8(ctx, r, MG_GEMM_FP8_BLOCKSCALED, MG_FP8_BLOCK_128X128, MG_FP8_BLOCK_1X128, 1152,
              "fp8 act 128x128 x weight 1x128, N=208 K=1152");
}

/* ------------------------------------------------------------------ scale transpose */

static mg_status run_transpose(mg_backend *b, uint32_t m, uint32_t m_pad, uint32_t k,
                               const float *src, float *dst_host, size_t guard_floats) {
    size_t src_bytes = (size_t)m * mg_fp8_k_blocks(k) * 4;
    size_t dst_bytes = ((size_t)m_pad * mg_fp8_k_blocks(k) + guard_floats) * 4;
    mg_devptr s = 0, d = 0;
    mg_status st;
    if (!(st = mg_check_upload(b, src, src_bytes, &s)) &&
        !(st = mg_check_alloc_poisoned(b, dst_bytes, &d)) &&
        !(st = mg_fp8_act_scales_transpose(b, NULL, m, m_pad, k, s, d)) &&
        !(st = mg_stream_synchronize(mg_stream_default(b))))
        st = mg_copy_d2h(b, dst_host, d, dst_bytes);
    mg_free(b, s);
    mg_free(b, d);
    return st;
}

static void check_scale_transpose(mg_check_ctx *ctx, mg_check_result *r) {
    if (skipped_without(ctx, r, MG_OP_GEMM_FP8))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    static const uint32_t shapes[][3] = {
        {1, 4, 128}, {3, 8, 129}, {130, 132, 4096}, {517, 520, 7168}, {2048, 2048, 1000}};
    uint64_t rng = ctx->seed ^ 0x7a;
    const size_t guard = 16;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && r->passed; i++) {
        uint32_t m = shapes[i][0], m_pad = shapes[i][1], k = shapes[i][2];
        size_t count = (size_t)m * mg_fp8_k_blocks(k),
               out_count = (size_t)m_pad * mg_fp8_k_blocks(k);
        float *src = malloc(count * 4), *got = malloc((out_count + guard) * 4),
              *ref = malloc((out_count + guard) * 4);
        for (size_t j = 0; src && j < count; j++) /* every bit pattern but NaN-free */
            src[j] = ldexpf((float)(mg_check_rng_next(&rng) >> 41),
                            -(int)(mg_check_rng_next(&rng) % 40));
        mg_status st = MG_ERR_OUT_OF_MEMORY;
        if (src && got && ref && !(st = run_transpose(ctx->backend, m, m_pad, k, src, got, guard)))
            st = run_transpose(ctx->reference, m, m_pad, k, src, ref, guard);
        if (st)
            MG_CHECK_FAIL(r, "M=%u m_pad=%u K=%u: %s: %s", m, m_pad, k, mg_status_name(st),
                          mg_last_error());
        else if (memcmp(got, ref, out_count * 4))
            MG_CHECK_FAIL(r, "M=%u m_pad=%u K=%u: the result differs from the CPU reference", m,
                          m_pad, k);
        else
            for (size_t j = 0; j < guard * 4; j++)
                if (((unsigned char *)(got + out_count))[j] != POISON) {
                    MG_CHECK_FAIL(r, "M=%u m_pad=%u K=%u: wrote past the end of dst", m, m_pad, k);
                    break;
                }
        free(src);
        free(got);
        free(ref);
    }
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "bit-exact vs CPU, padding zero-filled, nothing past dst (5 shapes up to "
                 "2048 x 1000)");
}

/* ------------------------------------------------------------------ the layout trap */

/* Measures what the transpose prevents: the same 1x128 x 128x128 GEMM given the quantizer's
 * untransposed [M, L] scales (a layout error nothing can detect) against the BF16 product. */
static void check_layout_trap(mg_check_ctx *ctx, mg_check_result *r) {
    if (skipped_without(ctx, r, MG_OP_GEMM_FP8))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    uint64_t rng = ctx->seed ^ 0x7b;
    const uint32_t m = 64, n = 256, k = 1024, blocks = mg_fp8_k_blocks(k);
    uint16_t *act = random_bf16(&rng, (size_t)m * k, 1.0f);
    uint16_t *weight = random_bf16(&rng, (size_t)n * k, 1.0f);
    for (size_t i = 0; act && i < (size_t)m * blocks; i++) { /* per-block magnitudes 1..64 */
        float magnitude = ldexpf(1.0f, (int)(mg_check_rng_next(&rng) % 7));
        for (uint32_t j = 0; j < 128; j++) {
            uint16_t *v = &act[(i / blocks) * k + (i % blocks) * 128 + j];
            *v = mg_f32_to_bf16(mg_bf16_to_f32(*v) * magnitude);
        }
    }
    fp8_operands o = {malloc((size_t)m * k), malloc((size_t)n * k), malloc((size_t)m * blocks * 4),
                      malloc(mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, n, k) * 4)};
    mg_gemm_plan exact_plan = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_BF16};
    mg_gemm_plan fp8_plan = {MG_GEMM_FP8_BLOCKSCALED, m, n, k, n, MG_DTYPE_BF16, MG_FP8_BLOCK_1X128,
                             MG_FP8_BLOCK_128X128,    0};
    void *exact = malloc(output_bytes(&exact_plan)), *right = malloc(output_bytes(&fp8_plan)),
         *wrong = malloc(output_bytes(&fp8_plan));
    mg_status st = MG_ERR_OUT_OF_MEMORY;
    if (act && weight && o.act && o.weight && o.act_scale && o.weight_scale && exact && right &&
        wrong && !(st = mg_fp8_quantize_1x128(act, m, k, o.act, o.act_scale)) &&
        !(st = mg_fp8_quantize_128x128(weight, n, k, o.weight, o.weight_scale))) {
        gemm_inputs bf16_in = {.plan = exact_plan, .act = act, .weight = weight};
        gemm_inputs right_in = {.plan = fp8_plan,
                                .act = o.act,
                                .weight = o.weight,
                                .act_scale = o.act_scale,
                                .weight_scale = o.weight_scale,
                                .act_rows_natural = m};
        gemm_inputs wrong_in = right_in;
        wrong_in.act_rows_natural = 0; /* [M, L] passed where [L, M] belongs */
        if (!(st = run_gemm(ctx->reference, NULL, &bf16_in, exact)) &&
            !(st = run_gemm(ctx->backend, NULL, &right_in, right)))
            st = run_gemm(ctx->backend, NULL, &wrong_in, wrong);
    }
    if (st) {
        MG_CHECK_FAIL(r, "%s: %s", mg_status_name(st), mg_last_error());
    } else {
        bool padding_ok;
        double e_right = relative_error(&fp8_plan, right, exact, m, &padding_ok);
        double e_wrong = relative_error(&fp8_plan, wrong, exact, m, &padding_ok);
        r->error = e_right;
        if (!(e_right < 0.06) || !(e_wrong > 10 * e_right))
            MG_CHECK_FAIL(r,
                          "relative error vs BF16: %.2e with transposed scales, %.2e untransposed",
                          e_right, e_wrong);
        else
            snprintf(r->detail, sizeof r->detail,
                     "relative error vs BF16: %.2e with transposed scales (FP8 quantization), "
                     "%.2e with the untransposed layout the transpose prevents",
                     e_right, e_wrong);
    }
    free(act), free(weight), free(exact), free(right), free(wrong);
    free_operands(&o);
}

/* ------------------------------------------------------------------ bad arguments */

static void check_bad_arguments(mg_check_ctx *ctx, mg_check_result *r) {
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    mg_backend *b = ctx->backend;
    const uint32_t m = 8, n = 64, k = 128;
    mg_devptr act = 0, weight = 0, scales = 0, out = 0;
    size_t out_bytes = (size_t)m * n * 4;
    mg_status st;
    if ((st = mg_check_alloc_poisoned(b, (size_t)m * k * 2, &act)) ||
        (st = mg_check_alloc_poisoned(b, (size_t)n * k * 2, &weight)) ||
        (st = mg_check_alloc_poisoned(b, 4096, &scales)) ||
        (st = mg_check_alloc_poisoned(b, out_bytes, &out))) {
        MG_CHECK_FAIL(r, "setup: %s", mg_last_error());
        goto done;
    }
    struct {
        const char *what;
        mg_status status;
        const char *needle;
    } expected[] = {
        {"ldc < N", MG_ERR_INVALID_ARGUMENT, "ldc"},
        {"M = 0", MG_ERR_INVALID_ARGUMENT, "empty shape"},
        {"bf16 -> f16 output", MG_ERR_INVALID_ARGUMENT, "output type"},
        {"misaligned bf16 weight", MG_ERR_INVALID_ARGUMENT, "aligned"},
        {"fp8 K = 120", MG_ERR_INVALID_ARGUMENT, "multiples of 16"},
        {"fp8 misaligned act", MG_ERR_INVALID_ARGUMENT, "16-byte aligned"},
        {"fp8 null scale", MG_ERR_INVALID_ARGUMENT, "act_scale is null"},
        {"fp8 ldc % 8", MG_ERR_INVALID_ARGUMENT, "ldc"},
        {"block M = 3", MG_ERR_INVALID_ARGUMENT, "multiple of 4"},
        {"block 128x128 pair", MG_ERR_UNSUPPORTED, "not supported"},
        {"transpose m_pad < M", MG_ERR_INVALID_ARGUMENT, "m_pad"},
    };
    mg_status got[sizeof expected / sizeof expected[0]];
    char messages[sizeof expected / sizeof expected[0]][160];
    size_t i = 0;
#define TRY(call)                                                                                  \
    (got[i] = (call), snprintf(messages[i], sizeof messages[i], "%s", mg_last_error()), i++)
    TRY(mg_gemm_bf16(b, NULL, m, n, k, act, weight, out, MG_DTYPE_BF16, n - 1));
    TRY(mg_gemm_bf16(b, NULL, 0, n, k, act, weight, out, MG_DTYPE_BF16, n));
    TRY(mg_gemm_bf16(b, NULL, m, n, k, act, weight, out, MG_DTYPE_F16, n));
    TRY(mg_gemm_bf16(b, NULL, m, n, k, act, weight + 1, out, MG_DTYPE_BF16, n));
    TRY(mg_gemm_fp8_tensorwise(b, NULL, m, n, 120, act, scales, weight, scales, out, n));
    TRY(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act + 8, scales, weight, scales, out, n));
    TRY(mg_gemm_fp8_tensorwise(b, NULL, m, n, k, act, 0, weight, scales, out, n));
    TRY(mg_gemm_fp8_tensorwise(b, NULL, m, 48, k, act, scales, weight, scales, out, 52));
    TRY(mg_gemm_fp8_blockscaled(b, NULL, 3, n, k, act, scales, MG_FP8_BLOCK_1X128, weight, scales,
                                MG_FP8_BLOCK_128X128, out, n));
    TRY(mg_gemm_fp8_blockscaled(b, NULL, m, n, k, act, scales, MG_FP8_BLOCK_128X128, weight, scales,
                                MG_FP8_BLOCK_128X128, out, n));
    TRY(mg_fp8_act_scales_transpose(b, NULL, 9, 8, k, scales, out));
#undef TRY
    for (size_t j = 0; j < i && r->passed; j++)
        if (got[j] != expected[j].status || !strstr(messages[j], expected[j].needle))
            MG_CHECK_FAIL(r, "%s: got %s \"%s\", expected %s mentioning \"%s\"", expected[j].what,
                          mg_status_name(got[j]), messages[j], mg_status_name(expected[j].status),
                          expected[j].needle);
    unsigned char *host = malloc(out_bytes);
    if (r->passed && host && mg_copy_d2h(b, host, out, out_bytes) == MG_OK) {
        for (size_t j = 0; j < out_bytes; j++)
            if (host[j] != POISON) {
                MG_CHECK_FAIL(r, "a rejected call wrote the output (byte %zu)", j);
                break;
            }
    } else if (r->passed) {
        MG_CHECK_FAIL(r, "reading the output back: %s", mg_last_error());
    }
    free(host);
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "%zu bad calls rejected with the documented status and message; output "
                 "untouched",
                 i);
done:
    mg_free(b, act);
    mg_free(b, weight);
    mg_free(b, scales);
    mg_free(b, out);
}

/* ------------------------------------------------------------------ batch invariance */

/* The rows of an M=512 batch, run again as M=1 and M=17 batches: bitwise the same in
 * batch-invariant mode. */
static void check_batch_invariant(mg_check_ctx *ctx, mg_check_result *r) {
    if (skipped_without(ctx, r, MG_OP_GEMM_BF16))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    mg_backend *b = ctx->backend;
    uint64_t rng = ctx->seed ^ 0x8b;
    const uint32_t big = 512, n = 1024, k = 768;
    static const uint32_t small[] = {1, 17};
    uint16_t *act = random_bf16(&rng, (size_t)big * k, 1.0f),
             *weight = random_bf16(&rng, (size_t)n * k, 0.1f);
    uint16_t *full = malloc((size_t)big * n * 2), *part = malloc((size_t)big * n * 2);
    mg_status st = mg_gemm_set_batch_invariant(b, true);
    if (st || !act || !weight || !full || !part) {
        MG_CHECK_FAIL(r, "setup: %s", st ? mg_last_error() : "out of host memory");
        goto done;
    }
    gemm_inputs in = {
        .plan =
            {.kind = MG_GEMM_BF16, .m = big, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_BF16},
        .act = act,
        .weight = weight};
    if ((st = run_gemm(b, NULL, &in, full))) {
        MG_CHECK_FAIL(r, "M=%u: %s", big, mg_last_error());
        goto done;
    }
    for (size_t i = 0; i < sizeof small / sizeof small[0] && r->passed; i++) {
        /* The same leading rows, and rows from the middle of the batch. */
        for (uint32_t first = 0; first + small[i] <= big && r->passed; first += 255) {
            in.plan.m = small[i];
            in.act = act + (size_t)first * k;
            if ((st = run_gemm(b, NULL, &in, part)))
                MG_CHECK_FAIL(r, "M=%u: %s", small[i], mg_last_error());
            else if (memcmp(part, full + (size_t)first * n, (size_t)small[i] * n * 2))
                MG_CHECK_FAIL(r, "rows %u..%u differ between M=%u and M=%u", first,
                              first + small[i] - 1, small[i], big);
        }
    }
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "bf16 N=%u K=%u: rows of an M=%u batch bitwise equal at M=1 and M=17", n, k, big);
done:
    mg_gemm_set_batch_invariant(b, false);
    free(act), free(weight), free(full), free(part);
}

/* ------------------------------------------------------------------ capture */

/* A shape first seen inside a capture is refused with MG_ERR_CAPTURING; after
 * mg_gemm_prewarm the same GEMM captures, replays to the reference's result, and steady-state
 * calls create no plans. */
static void check_capture_after_prewarm(mg_check_ctx *ctx, mg_check_result *r) {
    if (skipped_without(ctx, r, MG_OP_GEMM_BF16))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    mg_backend *b = ctx->backend;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        r->skipped = true;
        snprintf(r->detail, sizeof r->detail, "backend has no graphs");
        return;
    }
    uint64_t rng = ctx->seed ^ 0x9c;
    /* A shape no other check uses, with M > 16: the decode GEMV, which plans nothing and so
     * captures any shape, does not take it. */
    const uint32_t m = 17, n = 136, k = 264;
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_F32};
    uint16_t *act = random_bf16(&rng, (size_t)m * k, 1.0f),
             *weight = random_bf16(&rng, (size_t)n * k, 1.0f);
    float *got = malloc(output_bytes(&plan)), *ref = malloc(output_bytes(&plan));
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_devptr a = 0, w = 0, out = 0;
    mg_status st;
    if (!act || !weight || !got || !ref || (st = mg_stream_create(b, &s)) ||
        (st = mg_check_upload(b, act, (size_t)m * k * 2, &a)) ||
        (st = mg_check_upload(b, weight, (size_t)n * k * 2, &w)) ||
        (st = mg_check_alloc_poisoned(b, output_bytes(&plan), &out))) {
        MG_CHECK_FAIL(r, "setup: %s", mg_last_error());
        goto done;
    }
    if ((st = mg_graph_begin_capture(s))) {
        MG_CHECK_FAIL(r, "begin capture: %s", mg_last_error());
        goto done;
    }
    /* Only backends that plan (CUDA) refuse; the CPU reference captures any GEMM. */
    bool plans = mg_backend_get_kind(b) == MG_BACKEND_CUDA;
    st = mg_gemm_bf16(b, s, m, n, k, a, w, out, MG_DTYPE_F32, n);
    bool refused = st == MG_ERR_CAPTURING && strstr(mg_last_error(), "mg_gemm_prewarm");
    char message[200];
    snprintf(message, sizeof message, "%s", mg_last_error());
    mg_graph_abort_capture(s);
    if (plans ? !refused : st != MG_OK) {
        MG_CHECK_FAIL(r, "an unplanned shape in a capture gave %s \"%s\", expected %s",
                      mg_status_name(st), message, plans ? "MG_ERR_CAPTURING" : "MG_OK");
        goto done;
    }
    size_t plans_before = 0, plans_after = 0;
    if ((st = mg_gemm_prewarm(b, s, &plan, 1)) || (st = mg_graph_begin_capture(s))) {
        MG_CHECK_FAIL(r, "prewarm: %s", mg_last_error());
        goto done;
    }
    mg_op_stats stats;
    if (mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats) == MG_OK)
        plans_before = stats.plans;
    st = mg_gemm_bf16(b, s, m, n, k, a, w, out, MG_DTYPE_F32, n);
    if (st) {
        MG_CHECK_FAIL(r, "GEMM in the capture after prewarm: %s", mg_last_error());
        mg_graph_abort_capture(s);
        goto done;
    }
    if ((st = mg_graph_end_capture(s, &g)) || (st = mg_graph_launch(g, s)) ||
        (st = mg_graph_launch(g, s)) || (st = mg_stream_synchronize(s)) ||
        (st = mg_copy_d2h(b, got, out, output_bytes(&plan)))) {
        MG_CHECK_FAIL(r, "replay: %s", mg_last_error());
        goto done;
    }
    if (mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats) == MG_OK)
        plans_after = stats.plans;
    gemm_inputs in = {.plan = plan, .act = act, .weight = weight};
    if ((st = run_gemm(ctx->reference, NULL, &in, ref))) {
        MG_CHECK_FAIL(r, "reference: %s", mg_last_error());
        goto done;
    }
    bool padding_ok;
    r->error = relative_error(&plan, got, ref, m, &padding_ok);
    if (!(r->error <= BOUND_F32_OUT))
        MG_CHECK_FAIL(r, "replayed result: relative error %.3g", r->error);
    else if (plans_after != plans_before)
        MG_CHECK_FAIL(r, "steady-state calls created %zu plans", plans_after - plans_before);
    else
        snprintf(r->detail, sizeof r->detail,
                 "%s; after prewarm captured and replayed, relative error %.2e, no plan "
                 "created",
                 plans ? "unplanned shape refused in capture" : "no planning needed", r->error);
done:
    mg_graph_destroy(g);
    mg_free(b, a);
    mg_free(b, w);
    mg_free(b, out);
    mg_stream_destroy(s);
    free(act), free(weight), free(got), free(ref);
}

/* ------------------------------------------------------------------ two streams */

/* The same FP8 row-wise shape on two streams at once, each with its own inputs and scales:
 * separate workspaces and per-call scale pointers keep the results apart. */
static void check_two_streams(mg_check_ctx *ctx, mg_check_result *r) {
    if (skipped_without(ctx, r, MG_OP_GEMM_FP8))
        return;
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    mg_backend *b = ctx->backend;
    uint64_t rng = ctx->seed ^ 0xad;
    mg_gemm_plan plan = {.kind = MG_GEMM_FP8_ROWWISE,
                         .m = 256,
                         .n = 512,
                         .k = 1024,
                         .ldc = 512,
                         .out_type = MG_DTYPE_BF16};
    fp8_operands o[2] = {0};
    mg_devptr dev[2][5] = {{0}};
    mg_stream *s[2] = {NULL, NULL};
    uint16_t *got[2] = {malloc(output_bytes(&plan)), malloc(output_bytes(&plan))};
    uint16_t *ref = malloc(output_bytes(&plan));
    mg_status st = MG_OK;
    for (int i = 0; i < 2 && !st; i++) {
        if ((st = make_fp8_operands(&rng, &plan, plan.m, &o[i])) ||
            (st = mg_stream_create(b, &s[i])) ||
            (st = mg_check_upload(b, o[i].act, input_bytes(&(gemm_inputs){.plan = plan}, true),
                                  &dev[i][0])) ||
            (st = mg_check_upload(b, o[i].weight, input_bytes(&(gemm_inputs){.plan = plan}, false),
                                  &dev[i][1])) ||
            (st = mg_check_upload(b, o[i].act_scale, plan.m * 4, &dev[i][2])) ||
            (st = mg_check_upload(b, o[i].weight_scale, plan.n * 4, &dev[i][3])) ||
            (st = mg_check_alloc_poisoned(b, output_bytes(&plan), &dev[i][4])))
            MG_CHECK_FAIL(r, "setup: %s", mg_last_error());
    }
    for (int rep = 0; rep < 4 && !st; rep++)
        for (int i = 0; i < 2 && !st; i++)
            if ((st = mg_gemm_fp8_rowwise(b, s[i], plan.m, plan.n, plan.k, dev[i][0], dev[i][2],
                                          dev[i][1], dev[i][3], dev[i][4], plan.ldc)))
                MG_CHECK_FAIL(r, "stream %d: %s", i, mg_last_error());
    for (int i = 0; i < 2 && !st; i++) {
        if ((st = mg_stream_synchronize(s[i])) ||
            (st = mg_copy_d2h(b, got[i], dev[i][4], output_bytes(&plan)))) {
            MG_CHECK_FAIL(r, "stream %d: %s", i, mg_last_error());
            break;
        }
        gemm_inputs in = {.plan = plan,
                          .act = o[i].act,
                          .weight = o[i].weight,
                          .act_scale = o[i].act_scale,
                          .weight_scale = o[i].weight_scale};
        if ((st = run_gemm(ctx->reference, NULL, &in, ref))) {
            MG_CHECK_FAIL(r, "reference: %s", mg_last_error());
            break;
        }
        bool padding_ok;
        double err = relative_error(&plan, got[i], ref, plan.m, &padding_ok);
        if (err > r->error)
            r->error = err;
    }
    if (r->passed && !(r->error <= BOUND_BF16_OUT))
        MG_CHECK_FAIL(r, "relative error %.3g on one of the streams", r->error);
    else if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "fp8 row-wise 256x512x1024 on two streams, 4 rounds each: worst relative error "
                 "%.2e",
                 r->error);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 5; j++)
            mg_free(b, dev[i][j]);
        mg_stream_destroy(s[i]);
        free_operands(&o[i]);
        free(got[i]);
    }
    free(ref);
}

/* ------------------------------------------------------------------ the decode GEMV */

/* The same inputs on `b`, captured into a graph on a stream of its own and replayed twice; the
 * whole output (padding included) into out_host. */
static mg_status run_gemm_replayed(mg_backend *b, const gemm_inputs *in, void *out_host) {
    const mg_gemm_plan *p = &in->plan;
    mg_devptr act = 0, weight = 0, act_scale = 0, weight_scale = 0, out = 0;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_status st;
    bool fp8 = p->kind != MG_GEMM_BF16;
    if ((st = mg_stream_create(b, &s)) ||
        (st = mg_check_upload(b, in->act, input_bytes(in, true), &act)) ||
        (st = mg_check_upload(b, in->weight, input_bytes(in, false), &weight)) ||
        (fp8 &&
         (st = mg_check_upload(b, in->act_scale, mg_gemm_scale_count(p, true) * 4, &act_scale))) ||
        (fp8 && (st = mg_check_upload(b, in->weight_scale, mg_gemm_scale_count(p, false) * 4,
                                      &weight_scale))) ||
        (st = mg_check_alloc_poisoned(b, output_bytes(p), &out)) ||
        (st = mg_gemm_prewarm(b, s, p, 1)) || (st = mg_graph_begin_capture(s)))
        goto done;
    if ((st = launch_gemm(b, s, p, act, act_scale, weight, weight_scale, out))) {
        mg_graph_abort_capture(s);
        goto done;
    }
    if ((st = mg_graph_end_capture(s, &g)) || (st = mg_graph_launch(g, s)) ||
        (st = mg_graph_launch(g, s)) || (st = mg_stream_synchronize(s)))
        goto done;
    st = mg_copy_d2h(b, out_host, out, output_bytes(p));
done:
    mg_graph_destroy(g);
    mg_free(b, act);
    mg_free(b, weight);
    mg_free(b, act_scale);
    mg_free(b, weight_scale);
    mg_free(b, out);
    mg_stream_destroy(s);
    return st;
}

/* One decode-GEMV shape at every M of {1, 2, 3, 5, 8, 9, 16}: against the reference; at M = 16
 * also a graph replay against the eager call, and each row against the same row computed alone
 * (M = 1), both bit for bit. */
static void decode_gemv_shape(mg_check_ctx *ctx, mg_check_result *r, mg_gemm_kind kind,
                              mg_dtype out_type, uint32_t n, uint32_t k, uint32_t ldc,
                              uint64_t *rng, double *worst) {
    static const uint32_t ms[] = {1, 2, 3, 5, 8, 9, 16};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0] && r->passed; i++) {
        mg_gemm_plan plan = {
            .kind = kind, .m = ms[i], .n = n, .k = k, .ldc = ldc, .out_type = out_type};
        fp8_operands o = {0};
        uint16_t *act = NULL, *weight = NULL;
        gemm_inputs in = {.plan = plan};
        if (kind == MG_GEMM_BF16) {
            act = random_bf16(rng, (size_t)plan.m * k, 2.0f);
            weight = random_bf16(rng, (size_t)n * k, 0.25f);
            in.act = act, in.weight = weight;
            if (!act || !weight)
                MG_CHECK_FAIL(r, "out of host memory");
        } else if (make_fp8_operands(rng, &plan, plan.m, &o)) {
            MG_CHECK_FAIL(r, "quantizing the operands: %s", mg_last_error());
        } else {
            in.act = o.act, in.weight = o.weight;
            in.act_scale = o.act_scale, in.weight_scale = o.weight_scale;
        }
        double err = r->passed ? compare_with_reference(ctx, &in, plan.m, r) : -1;
        if (err > *worst)
            *worst = err;
        size_t bytes = output_bytes(&plan), row_bytes = (size_t)ldc * mg_dtype_bytes(out_type);
        unsigned char *eager = malloc(bytes), *again = malloc(bytes), *alone = malloc(row_bytes);
        mg_status st;
        if (r->passed && plan.m == 16) {
            if (!eager || !again || !alone)
                MG_CHECK_FAIL(r, "out of host memory");
            else if ((st = run_gemm(ctx->backend, NULL, &in, eager)) ||
                     (st = run_gemm_replayed(ctx->backend, &in, again)))
                MG_CHECK_FAIL(r, "M=16 N=%u K=%u eager or replayed: %s", n, k, mg_last_error());
            else if (memcmp(eager, again, bytes))
                MG_CHECK_FAIL(r, "M=16 N=%u K=%u: the graph replay differs from the eager call", n,
                              k);
            size_t in_row = (size_t)k * (kind == MG_GEMM_BF16 ? 2 : 1);
            for (uint32_t t = 0; t < plan.m && r->passed; t++) {
                gemm_inputs one = in;
                one.plan.m = 1;
                one.act = (const unsigned char *)in.act + t * in_row;
                if (kind == MG_GEMM_FP8_ROWWISE)
                    one.act_scale = in.act_scale + t;
                if ((st = run_gemm(ctx->backend, NULL, &one, alone)))
                    MG_CHECK_FAIL(r, "row %u alone: %s", t, mg_last_error());
                else if (memcmp(alone, eager + t * row_bytes, (size_t)n * mg_dtype_bytes(out_type)))
                    MG_CHECK_FAIL(r,
                                  "N=%u K=%u: row %u computed alone differs from the same row "
                                  "in a batch of 16",
                                  n, k, t);
            }
        }
        free(eager), free(again), free(alone);
        free(act), free(weight);
        free_operands(&o);
    }
}

/* The decode GEMV forced, on shapes whose K leaves partial 128-byte chunks and whose N leaves a
 * partial 8-row tile (BF16; FP8 N is a multiple of 16 by the front's rule), with long K, and
 * with more row tiles than resident blocks (9000 rows and up: each block walks several tiles,
 * up to ten on a 132-SM H200). */
static void check_decode_gemv(mg_check_ctx *ctx, mg_check_result *r, mg_gemm_kind kind,
                              mg_dtype out_type) {
    mg_op op = kind == MG_GEMM_BF16 ? MG_OP_GEMM_BF16 : MG_OP_GEMM_FP8;
    if (skipped_without(ctx, r, op))
        return;
    char reason[200];
    if (!mg_op_provider_available(ctx->backend, op, "decode_gemv", reason, sizeof reason)) {
        r->skipped = true;
        snprintf(r->detail, sizeof r->detail, "%s", reason);
        return;
    }
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    if (mg_op_force_provider(ctx->backend, op, "decode_gemv")) {
        MG_CHECK_FAIL(r, "forcing decode_gemv: %s", mg_last_error());
        return;
    }
    uint64_t rng = ctx->seed ^ (0x5e0u + kind * 4 + (out_type == MG_DTYPE_F32));
    double worst = 0;
    if (kind == MG_GEMM_BF16) {
        decode_gemv_shape(ctx, r, kind, out_type, 203, 328, 208, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 77, 4104, 77, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 9001, 136, 9001, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 20001, 72, 20008, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 40003, 40, 40003, &rng, &worst);
    } else {
        decode_gemv_shape(ctx, r, kind, out_type, 208, 400, 216, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 48, 4112, 56, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 9008, 144, 9016, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 20000, 80, 20000, &rng, &worst);
        decode_gemv_shape(ctx, r, kind, out_type, 40000, 48, 40008, &rng, &worst);
    }
    mg_op_force_provider(ctx->backend, op, NULL);
    char text[192];
    snprintf(text, sizeof text,
             "decode_gemv %s -> %s, M in {1,2,3,5,8,9,16}, N x K %s; replay "
             "and rows alone bit-equal",
             mg_gemm_kind_describe(kind)->name, mg_dtype_name(out_type),
             kind == MG_GEMM_BF16 ? "203x328, 77x4104, 9001x136, 20001x72, 40003x40"
                                  : "208x400, 48x4112, 9008x144, 20000x80, 40000x48");
    finish_sweep(r, worst, out_type == MG_DTYPE_F32 ? BOUND_F32_OUT : BOUND_BF16_OUT, text);
}

static void check_decode_gemv_bf16(mg_check_ctx *ctx, mg_check_result *r) {
    check_decode_gemv(ctx, r, MG_GEMM_BF16, MG_DTYPE_BF16);
}

static void check_decode_gemv_bf16_f32(mg_check_ctx *ctx, mg_check_result *r) {
    check_decode_gemv(ctx, r, MG_GEMM_BF16, MG_DTYPE_F32);
}

static void check_decode_gemv_fp8_rowwise(mg_check_ctx *ctx, mg_check_result *r) {
    check_decode_gemv(ctx, r, MG_GEMM_FP8_ROWWISE, MG_DTYPE_BF16);
}

static void check_decode_gemv_fp8_tensorwise(mg_check_ctx *ctx, mg_check_result *r) {
    check_decode_gemv(ctx, r, MG_GEMM_FP8_TENSORWISE, MG_DTYPE_BF16);
}

/* ------------------------------------------------------------------ the group */

const mg_check_case mg_checks_gemm[] = {
    {"gemm", "bf16_out_bf16", check_bf16_out_bf16},
    {"gemm", "bf16_out_f32", check_bf16_out_f32},
    {"gemm", "fp8_tensorwise", check_fp8_tensorwise},
    {"gemm", "fp8_rowwise", check_fp8_rowwise},
    {"gemm", "fp8_block_1x128_128x128", check_fp8_block_1x128_128x128},
    {"gemm", "fp8_block_partial_k", check_fp8_block_1x128_128x128_partial},
    {"gemm", "fp8_block_1x128_1x128", check_fp8_block_1x128_1x128},
    {"gemm", "fp8_block_128x128_1x128", check_fp8_block_128x128_1x128},
    {"gemm", "fp8_scale_transpose", check_scale_transpose},
    {"gemm", "fp8_scale_layout_trap", check_layout_trap},
    {"gemm", "bad_arguments", check_bad_arguments},
    {"gemm", "batch_invariant", check_batch_invariant},
    {"gemm", "capture_after_prewarm", check_capture_after_prewarm},
    {"gemm", "two_streams", check_two_streams},
    {"gemm", "decode_gemv_bf16", check_decode_gemv_bf16},
    {"gemm", "decode_gemv_bf16_f32", check_decode_gemv_bf16_f32},
    {"gemm", "decode_gemv_fp8_rowwise", check_decode_gemv_fp8_rowwise},
    {"gemm", "decode_gemv_fp8_tensorwise", check_decode_gemv_fp8_tensorwise},
    {NULL, NULL, NULL},
};
