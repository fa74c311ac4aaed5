/* check_mlx.c - the "mlx" check group: the MLX affine-quantized ops (metrale/mlx.h) on the
 * backend under test against the CPU reference, on fresh random layers of awkward shapes for
 * bits 4 and 8, groups of 32, 64 and 128, BF16 and FP16 scales, outputs poisoned first.
 * Dequant must agree bit for bit (both layers of a pair); products within
 *   2^-7 |ref| + 2^-10 sum |w a| + sum |(deq(w) - w) a|
 * (both sides round to BF16; the summation orders differ; silu's expf may differ by an ulp,
 * hence the spread term 2^-8 for the silu forms; the last term because a GEMV may multiply the
 * exact weights w = scale * q + bias or the dequant's BF16 ones, metrale/mlx.h, and the
 * reference multiplies the exact ones). Also a GEMV captured in a graph and replayed on new
 * activations. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/mlx.h"
#include "metrale/safetensors.h"

typedef enum mlx_op {
    OP_DEQUANT,
    OP_GEMV,
    OP_SILU,
    OP_SILU_RESID,
    OP_GATE_UP,
    OP_GEMM,
    OP_GATE_UP_SILU /* gate_up with the SiLU-mul epilogue */
} mlx_op;

static const char *const op_names[] = {"dequant", "gemv", "silu_gate",   "silu_gate_resid",
                                       "gate_up", "gemm", "gate_up_silu"};

/* One random layer pair and activations, as host data. */
typedef struct mlx_inputs {
    mg_mlx_linear shape; /* no buffers */
    uint32_t m, experts, expert;
    uint32_t *words[2];
    uint16_t *scales[2], *biases[2];
    uint16_t *x, *u, *resid;
    size_t word_bytes, group_bytes, act_bytes, out_bytes;
} mlx_inputs;

static uint16_t random_half(uint64_t *rng, mg_dtype type, int lo, int hi) {
    uint64_t r = mg_check_rng_next(rng);
    int e = lo + (int)(r % (uint64_t)(hi - lo));
    uint16_t sign = (uint16_t)((r >> 8 & 1) << 15);
    if (type == MG_DTYPE_F16)
        return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(r >> 16 & 0x3ff);
    return sign | (uint16_t)((e + 127) << 7) | (uint16_t)(r >> 16 & 0x7f);
}

static uint16_t random_activation(uint64_t *rng) {
    return mg_f32_to_bf16((float)((double)(mg_check_rng_next(rng) % 40001) / 10000.0 - 2.0));
}

static void inputs_free(mlx_inputs *in) {
    for (int i = 0; i < 2; i++) {
        free(in->words[i]);
        free(in->scales[i]);
        free(in->biases[i]);
    }
    free(in->x);
    free(in->u);
    free(in->resid);
}

static bool inputs_make(uint64_t *rng, uint32_t bits, uint32_t group, mg_dtype type, uint32_t m,
                        mlx_inputs *in) {
    memset(in, 0, sizeof *in);
    uint32_t n = 1 + (uint32_t)(mg_check_rng_next(rng) % 90);
    uint32_t k = group * (1 + (uint32_t)(mg_check_rng_next(rng) % (2600 / group)));
    in->experts = 2;
    in->expert = 1;
    in->m = m;
    in->shape = (mg_mlx_linear){
        .experts = 2, .n = n, .k = k, .bits = bits, .group_size = group, .scale_type = type};
    in->word_bytes = (size_t)2 * n * k * bits / 8;
    in->group_bytes = (size_t)2 * n * (k / group) * 2;
    in->act_bytes = (size_t)m * k * 2;
    in->out_bytes = (size_t)m * n * 2;
    for (int i = 0; i < 2; i++) {
        in->words[i] = malloc(in->word_bytes);
        in->scales[i] = malloc(in->group_bytes);
        in->biases[i] = malloc(in->group_bytes);
        if (!in->words[i] || !in->scales[i] || !in->biases[i])
            return false;
        for (size_t w = 0; w < in->word_bytes / 4; w++)
            in->words[i][w] = (uint32_t)mg_check_rng_next(rng);
        for (size_t g = 0; g < in->group_bytes / 2; g++) {
            in->scales[i][g] = random_half(rng, type, -9, -4);
            in->biases[i][g] = random_half(rng, type, -6, -2);
        }
    }
    in->x = malloc(in->act_bytes);
    in->u = malloc(in->act_bytes);
    in->resid = malloc(in->out_bytes);
    if (!in->x || !in->u || !in->resid)
        return false;
    for (size_t i = 0; i < in->act_bytes / 2; i++) {
        in->x[i] = random_activation(rng);
        in->u[i] = random_activation(rng);
    }
    for (size_t i = 0; i < in->out_bytes / 2; i++)
        in->resid[i] = random_activation(rng);
    return true;
}

/* Runs `op` of `in` on `b` and returns its output (host, malloc'd) in *out, *out_bytes. For
 * gate_up the output is gate's then up's. */
static mg_status run_op(mg_backend *b, mlx_op op, const mlx_inputs *in, uint16_t **out,
                        size_t *out_bytes) {
    mg_mlx_linear w[2] = {in->shape, in->shape};
    mg_devptr x = 0, u = 0, y = 0, scratch = 0;
    size_t bytes = op == OP_DEQUANT   ? 2 * mg_mlx_gemm_scratch_bytes(&in->shape)
                   : op == OP_GATE_UP ? 2 * in->out_bytes
                                      : in->out_bytes;
    mg_status st = MG_OK;
    for (int i = 0; i < 2 && !st; i++)
        if ((st = mg_check_upload(b, in->words[i], in->word_bytes, &w[i].weight)) ||
            (st = mg_check_upload(b, in->scales[i], in->group_bytes, &w[i].scales)) ||
            (st = mg_check_upload(b, in->biases[i], in->group_bytes, &w[i].biases)))
            break;
    if (!st && !(st = mg_check_upload(b, in->x, in->act_bytes, &x)) &&
        !(st = mg_check_upload(b, in->u, in->act_bytes, &u)) &&
        !(st = mg_check_alloc_poisoned(b, bytes, &y)) &&
        !(st = mg_check_alloc_poisoned(b, mg_mlx_gemm_scratch_bytes(&in->shape), &scratch))) {
        switch (op) {
        case OP_DEQUANT: /* both layers: the first's, then the second's */
            if (!(st = mg_mlx_dequant(b, NULL, &w[0], in->expert, y)))
                st = mg_mlx_dequant(b, NULL, &w[1], in->expert,
                                    y + mg_mlx_gemm_scratch_bytes(&in->shape));
            break;
        case OP_GEMV:
            st = mg_mlx_gemv(b, NULL, &w[0], in->expert, in->m, x, y);
            break;
        case OP_SILU:
            st = mg_mlx_gemv_silu_gate(b, NULL, &w[0], in->expert, in->m, x, u, y);
            break;
        case OP_SILU_RESID:
            if (!(st = mg_copy_h2d(b, y, in->resid, in->out_bytes)))
                st = mg_mlx_gemv_silu_gate_resid(b, NULL, &w[0], in->expert, in->m, x, u, y, y);
            break;
        case OP_GATE_UP:
            st = mg_mlx_gemv_gate_up(b, NULL, &w[0], &w[1], in->expert, in->m, x, y,
                                     y + in->out_bytes);
            break;
        case OP_GEMM:
            st = mg_mlx_gemm(b, NULL, &w[0], in->expert, in->m, x, y, scratch);
            break;
        case OP_GATE_UP_SILU: {
            const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
            const mg_gemm_fusion_tensors none = {0};
            st =
                mg_mlx_gemv_fused(b, NULL, &w[0], &w[1], in->expert, in->m, x, y, &silu_mul, &none);
            break;
        }
        }
    }
    if (!st && !(*out = malloc(bytes)))
        st = MG_ERR_OUT_OF_MEMORY;
    if (!st && (st = mg_copy_d2h(b, *out, y, bytes))) {
        free(*out);
        *out = NULL;
    }
    *out_bytes = bytes;
    mg_devptr all[] = {w[0].weight, w[0].scales, w[0].biases, w[1].weight, w[1].scales,
                       w[1].biases, x,           u,           y,           scratch};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            mg_free(b, all[i]);
    return st;
}

static double half_value(mg_dtype type, uint16_t h) {
    return type == MG_DTYPE_F16 ? mg_f16_to_f32(h) : mg_bf16_to_f32(h);
}

/* The exact weight scale * q + bias [r, j] of layer `layer` (0 or 1), expert in->expert. */
static double exact_weight(const mlx_inputs *in, int layer, uint32_t r, uint32_t j) {
    const mg_mlx_linear *w = &in->shape;
    uint32_t per = 32 / w->bits;
    size_t row = (size_t)in->expert * w->n + r;
    uint32_t word = in->words[layer][row * (w->k / per) + j / per];
    uint32_t q = (word >> ((j % per) * w->bits)) & ((1u << w->bits) - 1);
    size_t g = row * (w->k / w->group_size) + j / w->group_size;
    return half_value(w->scale_type, in->scales[layer][g]) * q +
           half_value(w->scale_type, in->biases[layer][g]);
}

/* The tolerance of element [t, r] of layer `layer` (the formula above), from the reference's
 * BF16 weights of that layer (deq, [n, k]) and the exact ones (a: x, or |g * u| for silu, which
 * bounds |silu(g) * u|). */
static double tolerance(const uint16_t *deq, const mlx_inputs *in, int layer, bool silu, uint32_t t,
                        uint32_t r, double want) {
    double spread = 0, rounding = 0;
    uint32_t k = in->shape.k;
    for (uint32_t j = 0; j < k; j++) {
        size_t i = (size_t)t * k + j;
        double a = fabs(mg_bf16_to_f32(in->x[i]) * (silu ? mg_bf16_to_f32(in->u[i]) : 1.0));
        double d = mg_bf16_to_f32(deq[(size_t)r * k + j]);
        spread += fabs(d) * a;
        rounding += fabs(d - exact_weight(in, layer, r, j)) * a;
    }
    return ldexp(fabs(want), -7) + ldexp(spread, silu ? -8 : -10) + rounding + 1e-30;
}

/* The largest error of `got` against `ref` relative to its tolerance (> 1 fails). */
static double product_error(const uint16_t *got, const uint16_t *ref, const uint16_t *deq,
                            const mlx_inputs *in, mlx_op op, long *worst) {
    bool silu = op == OP_SILU || op == OP_SILU_RESID;
    uint32_t rows = op == OP_GATE_UP ? 2 * in->m : in->m, n = in->shape.n;
    double worst_ratio = 0;
    for (uint32_t t = 0; t < rows; t++)
        for (uint32_t r = 0; r < n; r++) {
            size_t i = (size_t)t * n + r;
            double want = mg_bf16_to_f32(ref[i]), have = mg_bf16_to_f32(got[i]);
            /* gate_up's second half is up's: deq holds both layers' weights. */
            int layer = t >= in->m;
            double tol = tolerance(deq + (size_t)layer * n * in->shape.k, in, layer, silu,
                                   t % in->m, r, want);
            double ratio = isnan(have) ? INFINITY : fabs(have - want) / tol;
            if (ratio > worst_ratio) {
                worst_ratio = ratio;
                *worst = (long)i;
            }
        }
    return worst_ratio;
}

/* silu(g) * u of two BF16 values rounded to BF16, as mg_silu_mul_bf16 defines it. */
static uint16_t silu_mul_value(uint16_t gate, uint16_t up) {
    const float g = mg_bf16_to_f32(gate);
    return mg_f32_to_bf16(g / (1.0f + expf(-g)) * mg_bf16_to_f32(up));
}

/* gate_up's SiLU-mul epilogue: the backend's fused output against the SiLU-mul, computed here,
 * of the same backend's gate_up products (checked against the reference by "gate_up"): equal,
 * or one BF16 step apart (a device's expf may differ from the host's by an ulp). */
static void check_gate_up_silu(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "gate_up_silu");
    static const uint32_t groups[] = {32, 64, 128};
    size_t checked = 0, off_by_one = 0;
    for (uint32_t bits = 4; bits <= 8 && result->passed; bits += 4)
        for (int g = 0; g < 3 && result->passed; g++) {
            mg_dtype type = g % 2 ? MG_DTYPE_F16 : MG_DTYPE_BF16;
            uint32_t m = 1 + (uint32_t)(mg_check_rng_next(&rng) % 8);
            mlx_inputs in;
            uint16_t *fused = NULL, *parts = NULL;
            size_t bytes = 0, parts_bytes = 0;
            if (!inputs_make(&rng, bits, groups[g], type, m, &in)) {
                MG_CHECK_FAIL(result, "out of host memory");
            } else if (run_op(ctx->backend, OP_GATE_UP_SILU, &in, &fused, &bytes) ||
                       run_op(ctx->backend, OP_GATE_UP, &in, &parts, &parts_bytes)) {
                MG_CHECK_FAIL(result, "bits=%u group=%u: %s", bits, groups[g], mg_last_error());
            } else {
                const size_t count = in.out_bytes / 2;
                for (size_t i = 0; i < count && result->passed; i++) {
                    const uint16_t want = silu_mul_value(parts[i], parts[count + i]);
                    const int step = (int)(fused[i] & 0x7fff) - (int)(want & 0x7fff);
                    const bool same_sign = (fused[i] & 0x8000) == (want & 0x8000);
                    if (fused[i] != want && !(same_sign && (step == 1 || step == -1)))
                        MG_CHECK_FAIL(result,
                                      "bits=%u group=%u m=%u: [%zu] is 0x%04x, silu_mul of "
                                      "gate_up's products 0x%04x",
                                      bits, groups[g], m, i, fused[i], want);
                    off_by_one += fused[i] != want;
                    checked++;
                }
            }
            free(fused);
            free(parts);
            inputs_free(&in);
        }
    if (result->passed)
        snprintf(result->detail, sizeof result->detail,
                 "6 layer pairs (bits 4/8, groups 32/64/128); %zu outputs, %zu one step apart",
                 checked, off_by_one);
}

static void check_op(mg_check_ctx *ctx, mg_check_result *result, mlx_op op) {
    result->passed = true;
    if (!ctx->reference) {
        MG_CHECK_FAIL(result, "no CPU reference backend");
        return;
    }
    uint64_t rng = mg_check_rng_seed(ctx, op_names[op]);
    static const uint32_t groups[] = {32, 64, 128};
    double worst_error = 0;
    for (uint32_t bits = 4; bits <= 8 && result->passed; bits += 4)
        for (int g = 0; g < 3 && result->passed; g++)
            for (int t = 0; t < 2 && result->passed; t++) {
                mg_dtype type = t ? MG_DTYPE_F16 : MG_DTYPE_BF16;
                uint32_t m = op == OP_GEMM ? 9 + (uint32_t)(mg_check_rng_next(&rng) % 60)
                                           : 1 + (uint32_t)(mg_check_rng_next(&rng) % 8);
                mlx_inputs in;
                uint16_t *got = NULL, *ref = NULL, *deq = NULL;
                size_t bytes = 0, ref_bytes = 0, deq_bytes = 0;
                mg_status st;
                char what[96];
                if (!inputs_make(&rng, bits, groups[g], type, m, &in)) {
                    MG_CHECK_FAIL(result, "out of host memory");
                } else {
                    snprintf(what, sizeof what, "bits=%u group=%u %s n=%u k=%u m=%u", bits,
                             groups[g], mg_dtype_name(type), in.shape.n, in.shape.k, m);
                    if ((st = run_op(ctx->backend, op, &in, &got, &bytes)))
                        MG_CHECK_FAIL(result, "%s %s: %s", op_names[op], what, mg_last_error());
                    else if ((st = run_op(ctx->reference, op, &in, &ref, &ref_bytes)) ||
                             (st = run_op(ctx->reference, OP_DEQUANT, &in, &deq, &deq_bytes)))
                        MG_CHECK_FAIL(result, "reference %s: %s", what, mg_last_error());
                    else if (op == OP_DEQUANT) {
                        for (size_t i = 0; i < bytes / 2; i++)
                            if (got[i] != ref[i]) {
                                MG_CHECK_FAIL(result,
                                              "dequant %s: [%zu] is 0x%04x, the reference 0x%04x",
                                              what, i, got[i], ref[i]);
                                break;
                            }
                    } else {
                        long worst = 0;
                        double e = product_error(got, ref, deq, &in, op, &worst);
                        if (e > worst_error)
                            worst_error = e;
                        if (!(e <= 1.0))
                            MG_CHECK_FAIL(result,
                                          "%s %s: [%ld] is %g, the reference %g (%.2f x "
                                          "the tolerance)",
                                          op_names[op], what, worst, mg_bf16_to_f32(got[worst]),
                                          mg_bf16_to_f32(ref[worst]), e);
                    }
                }
                free(got);
                free(ref);
                free(deq);
                inputs_free(&in);
            }
    result->error = worst_error;
    if (result->passed)
        snprintf(result->detail, sizeof result->detail,
                 "12 layers (bits 4/8, groups 32/64/128, bf16/f16); worst %.2f of the tolerance",
                 worst_error);
}

static void check_dequant(mg_check_ctx *c, mg_check_result *r) {
    check_op(c, r, OP_DEQUANT);
}
static void check_gemv(mg_check_ctx *c, mg_check_result *r) {
    check_op(c, r, OP_GEMV);
}
static void check_silu(mg_check_ctx *c, mg_check_result *r) {
    check_op(c, r, OP_SILU);
}
static void check_silu_resid(mg_check_ctx *c, mg_check_result *r) {
    check_op(c, r, OP_SILU_RESID);
}
static void check_gate_up(mg_check_ctx *c, mg_check_result *r) {
    check_op(c, r, OP_GATE_UP);
}
static void check_gemm(mg_check_ctx *c, mg_check_result *r) {
    check_op(c, r, OP_GEMM);
}

/* A GEMV captured once and replayed on new activations must follow them. */
static void check_graph_replay(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "the backend has no graphs");
        return;
    }
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "graph_replay");
    mlx_inputs in;
    mg_mlx_linear w = {0};
    mg_devptr x = 0, y = 0;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    uint16_t *got = NULL, *ref = NULL, *deq = NULL;
    size_t bytes;
    mg_status st;
    if (!ctx->reference || !inputs_make(&rng, 4, 64, MG_DTYPE_BF16, 3, &in))
        FAIL("no CPU reference backend, or out of host memory");
    w = in.shape;
    if ((st = mg_check_upload(b, in.words[0], in.word_bytes, &w.weight)) ||
        (st = mg_check_upload(b, in.scales[0], in.group_bytes, &w.scales)) ||
        (st = mg_check_upload(b, in.biases[0], in.group_bytes, &w.biases)) ||
        (st = mg_check_alloc_poisoned(b, in.act_bytes, &x)) ||
        (st = mg_check_alloc_poisoned(b, in.out_bytes, &y)) || (st = mg_stream_create(b, &s)) ||
        !(got = malloc(in.out_bytes)))
        FAIL("setup: %s", mg_last_error());
    OK(mg_graph_begin_capture(s));
    if ((st = mg_mlx_gemv(b, s, &w, in.expert, in.m, x, y))) {
        mg_graph_abort_capture(s);
        FAIL("gemv in the capture: %s", mg_last_error());
    }
    OK(mg_graph_end_capture(s, &g));
    for (int replay = 0; replay < 3; replay++) {
        for (size_t i = 0; i < in.act_bytes / 2; i++)
            in.x[i] = random_activation(&rng);
        OK(mg_copy_h2d(b, x, in.x, in.act_bytes));
        OK(mg_memset(b, y, MG_CHECK_POISON, in.out_bytes));
        OK(mg_graph_launch(g, s));
        OK(mg_stream_synchronize(s));
        OK(mg_copy_d2h(b, got, y, in.out_bytes));
        free(ref);
        free(deq);
        ref = deq = NULL;
        OK(run_op(ctx->reference, OP_GEMV, &in, &ref, &bytes));
        OK(run_op(ctx->reference, OP_DEQUANT, &in, &deq, &bytes));
        long worst = 0;
        double e = product_error(got, ref, deq, &in, OP_GEMV, &worst);
        EXPECT(e <= 1.0, "replay %d: [%ld] is %g, the reference %g", replay, worst,
               mg_bf16_to_f32(got[worst]), mg_bf16_to_f32(ref[worst]));
    }
    snprintf(result->detail, sizeof result->detail, "3 replays on new activations");
done:
    if (g)
        mg_graph_destroy(g);
    if (s)
        mg_stream_destroy(s);
    mg_devptr all[] = {w.weight, w.scales, w.biases, x, y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            mg_free(b, all[i]);
    free(got);
    free(ref);
    free(deq);
    inputs_free(&in);
}

/* The directory of the committed MLX checkpoints (tests/mlx/checkpoints, made by MLX itself:
 * tests/mlx/make_checkpoint.py): METRALE_MLX_CHECKPOINTS in the environment, else the source
 * tree's, compiled in. */
static const char *checkpoints_dir(void) {
    const char *env = getenv("METRALE_MLX_CHECKPOINTS");
    if (env && *env)
        return env;
#ifdef METRALE_MLX_CHECKPOINTS
    return METRALE_MLX_CHECKPOINTS;
#else
    return NULL;
#endif
}

/* One layer of a checkpoint loaded on the backend under test and on the reference: dequant
 * bit for bit, and a GEMV of m = 3 random rows within the product tolerance above. */
static void check_checkpoint_layer(mg_check_ctx *ctx, mg_check_result *result, mg_st_model *m,
                                   mg_mlx_config *c, const char *path, uint64_t *rng,
                                   double *worst_error) {
    mg_backend *b = ctx->backend, *ref_b = ctx->reference;
    mg_mlx_linear w = {0}, wr = {0};
    mg_devptr x = 0, y = 0, xr = 0, yr = 0, dr = 0, d = 0;
    uint16_t *got = NULL, *ref = NULL, *deq = NULL, *deq_got = NULL;
    mlx_inputs in;
    memset(&in, 0, sizeof in);
    mg_status st;
    if ((st = mg_mlx_linear_load(b, m, c, path, &w)) ||
        (st = mg_mlx_linear_load(ref_b, m, c, path, &wr)))
        FAIL("loading %s: %s", path, mg_last_error());
    in.shape = wr;
    in.m = 3;
    in.act_bytes = (size_t)in.m * w.k * 2;
    in.out_bytes = (size_t)in.m * w.n * 2;
    size_t deq_bytes = (size_t)w.n * w.k * 2;
    if (!(in.x = malloc(in.act_bytes)) || !(got = malloc(in.out_bytes)) ||
        !(ref = malloc(in.out_bytes)) || !(deq = malloc(deq_bytes)) ||
        !(deq_got = malloc(deq_bytes)))
        FAIL("out of host memory");
    for (size_t i = 0; i < in.act_bytes / 2; i++)
        in.x[i] = random_activation(rng);
    /* The layer's words, scales and biases as host data, for the exact weights. */
    in.word_bytes = (size_t)wr.experts * wr.n * wr.k * wr.bits / 8;
    in.group_bytes = (size_t)wr.experts * wr.n * (wr.k / wr.group_size) * 2;
    if (!(in.words[0] = malloc(in.word_bytes)) || !(in.scales[0] = malloc(in.group_bytes)) ||
        !(in.biases[0] = malloc(in.group_bytes)))
        FAIL("out of host memory");
    OK(mg_copy_d2h(ref_b, in.words[0], wr.weight, in.word_bytes));
    OK(mg_copy_d2h(ref_b, in.scales[0], wr.scales, in.group_bytes));
    OK(mg_copy_d2h(ref_b, in.biases[0], wr.biases, in.group_bytes));
    OK(mg_check_upload(b, in.x, in.act_bytes, &x));
    OK(mg_check_upload(ref_b, in.x, in.act_bytes, &xr));
    OK(mg_check_alloc_poisoned(b, in.out_bytes, &y));
    OK(mg_check_alloc_poisoned(ref_b, in.out_bytes, &yr));
    OK(mg_check_alloc_poisoned(b, deq_bytes, &d));
    OK(mg_check_alloc_poisoned(ref_b, deq_bytes, &dr));
    OK(mg_mlx_dequant(b, NULL, &w, 0, d));
    OK(mg_mlx_dequant(ref_b, NULL, &wr, 0, dr));
    OK(mg_mlx_gemv(b, NULL, &w, 0, in.m, x, y));
    OK(mg_mlx_gemv(ref_b, NULL, &wr, 0, in.m, xr, yr));
    OK(mg_copy_d2h(b, deq_got, d, deq_bytes));
    OK(mg_copy_d2h(ref_b, deq, dr, deq_bytes));
    OK(mg_copy_d2h(b, got, y, in.out_bytes));
    OK(mg_copy_d2h(ref_b, ref, yr, in.out_bytes));
    EXPECT(!memcmp(deq_got, deq, deq_bytes), "%s: dequant differs from the reference", path);
    long worst = 0;
    double e = product_error(got, ref, deq, &in, OP_GEMV, &worst);
    if (e > *worst_error)
        *worst_error = e;
    EXPECT(e <= 1.0, "%s gemv: [%ld] is %g, the reference %g (%.2f x the tolerance)", path, worst,
           mg_bf16_to_f32(got[worst]), mg_bf16_to_f32(ref[worst]), e);
done:
    mg_mlx_linear_free(b, &w);
    mg_mlx_linear_free(ref_b, &wr);
    mg_devptr mine[] = {x, y, d}, theirs[] = {xr, yr, dr};
    for (int i = 0; i < 3; i++) {
        if (mine[i])
            mg_free(b, mine[i]);
        if (theirs[i])
            mg_free(ref_b, theirs[i]);
    }
    inputs_free(&in);
    free(got);
    free(ref);
    free(deq);
    free(deq_got);
}

/* Every quantized layer of the committed MLX checkpoints (8 and 4 bits), as loaded by the
 * public loader on the backend under test, against the same checkpoint on the reference. */
static void check_checkpoint(mg_check_ctx *ctx, mg_check_result *result) {
    static const char *const modules[] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const char *dir = checkpoints_dir();
    if (!dir) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail,
                 "no checkpoint directory (set METRALE_MLX_CHECKPOINTS)");
        return;
    }
    result->passed = true;
    if (!ctx->reference)
        FAIL("no CPU reference backend");
    uint64_t rng = mg_check_rng_seed(ctx, "checkpoint");
    double worst_error = 0;
    unsigned layers = 0;
    for (unsigned bits = 8; bits >= 4 && result->passed; bits -= 4) {
        char path[1024];
        snprintf(path, sizeof path, "%s/micro-mlx%u", dir, bits);
        mg_st_model *m = NULL;
        mg_mlx_config *c = NULL;
        mg_status st = mg_st_open(path, &m);
        if (!st)
            st = mg_mlx_config_open(path, &c);
        if (st) {
            MG_CHECK_FAIL(result, "opening %s: %s", path, mg_last_error());
        } else {
            for (unsigned l = 0; l < 2 && result->passed; l++)
                for (size_t i = 0; i < sizeof modules / sizeof *modules && result->passed; i++) {
                    char name[128];
                    snprintf(name, sizeof name, "model.layers.%u.%s", l, modules[i]);
                    check_checkpoint_layer(ctx, result, m, c, name, &rng, &worst_error);
                    layers++;
                }
        }
        mg_mlx_config_close(c);
        if (m)
            mg_st_close(m);
    }
    result->error = worst_error;
    if (result->passed)
        snprintf(result->detail, sizeof result->detail,
                 "%u layers of micro-mlx8 and micro-mlx4: dequant exact, GEMV worst %.2f of the "
                 "tolerance",
                 layers, worst_error);
done:;
}

const mg_check_case mg_checks_mlx[] = {
    {"mlx", "dequant", check_dequant},
    {"mlx", "gemv", check_gemv},
    {"mlx", "silu_gate", check_silu},
    {"mlx", "silu_gate_resid", check_silu_resid},
    {"mlx", "gate_up", check_gate_up},
    {"mlx", "gate_up_silu", check_gate_up_silu},
    {"mlx", "gemm", check_gemm},
    {"mlx", "graph_replay", check_graph_replay},
    {"mlx", "checkpoint", check_checkpoint},
    {NULL, NULL, NULL},
};
