/*
 * test_forward_cpu.c - the forward pass of src/model (what `metrale-gpu run` drives) on the
 * CPU backend against a second computation written here with plain float loops over the same
 * weights: each request processed one token at a time with its own key/value history (which
 * is what a causal prefill followed by decode steps computes), BF16 rounding where the ops
 * store BF16, fed the library's tokens: each must be the reference's best or within a near-tie
 * of it, every pass's logits (mg_fwd_logits) within the same tolerance of the reference's, and
 * the final hidden states must agree within 2% (FP8: 8%, see `tolerance`). After the prefill
 * every request's token is replaced by a random one (mg_fwd_force_tokens), and the reference
 * is fed those: the next passes must have read them. Then the configuration errors the model
 * must refuse with a message.
 *
 * With NVFP4 weights the layer matrices are quantized here with mg_nvfp4_quantize (global
 * scale amax / 2688 of the whole tensor, the rule model.h documents), their codes and block
 * scales read back and decoded by hand (E2M1 nibbles, E4M3 bytes); the products then follow
 * the NVFP4 GEMM's definition: FP64 sums of activation x e2m1 x e4m3, times the global scale,
 * one rounding to BF16; the MLP's gate and up are not rounded before silu(gate) * up; the LM
 * head's logits are BF16 (argmax ties to the lowest id). The MoE preset tiny-moe (NVFP4, BF16
 * and FP8 experts) adds, per token: router logits (FP32 sums), the k largest (ties to the lower
 * expert), weights expf(l - max) renormalized over the k, each chosen expert's fused gate_up and
 * down as above, and out = bf16 of the fmaf chain of weight x expert row in slot order.
 *
 * With FP8 weights every layer matrix and the LM head is quantized here, row by row, by an E4M3
 * rounding written in this file (nearest of the 127 finite magnitudes, ties to the even code;
 * scale = row amax / 448), and so is every GEMM input, per token, before its products:
 * bf16((sum of the decoded codes' products) * act scale * weight scale); logits in BF16.
 *
 * The BF16 decode steps run the fused GEMMs (norms, residual adds and SiLU-mul folded in,
 * mg_fwd_config.unfused); on the CPU a fused call is the composition of the unfused ones, so
 * a fused and an unfused run of the same config give the same logits at every pass, bit for
 * bit (check_fusion_exact), and mg_fwd_info says which ran.
 *
 * Then the per-op timing spans (mg_fwd_set_timing): a prefill and an eager decode step recorded
 * (after graph-replayed steps where the backend captures), one span per op per layer, none for
 * steps without timing, and the Chrome trace written with every op's name, structurally valid
 * JSON.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "model.h"
#include "test_util.h"

static float bf(float x) {
    return mg_bf16_to_f32(mg_f32_to_bf16(x));
}

/* Tensor `id` as floats (the generator is the shared definition of the weights). */
static float *tensor(const mg_fwd_preset *p, uint64_t seed, uint32_t id) {
    uint32_t rows, cols;
    float offset, scale;
    if (mg_fwd_tensor_shape(&p->shape, p->layers, id, &rows, &cols, &offset, &scale))
        return NULL;
    size_t n = (size_t)rows * cols;
    uint16_t *h = malloc(n * 2);
    float *f = malloc(n * sizeof *f);
    mg_fwd_weight_fill(seed, id, offset, scale, 0, n, h);
    for (size_t i = 0; i < n; i++)
        f[i] = mg_bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* An E4M3 byte (bias 7, 3 mantissa bits; the quantizer writes 0x00..0x7e) by hand. */
static double e4m3_value(uint8_t c) {
    int e = (c >> 3) & 15, man = c & 7;
    double v = e ? ldexp(1.0 + man / 8.0, e - 7) : ldexp(man / 8.0, -6);
    return (c & 0x80) ? -v : v;
}

/* A nibble: bit 3 the sign, bits 0-2 an E2M1 magnitude. */
static double e2m1_value(uint8_t nibble) {
    static const double magnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (nibble & 8) ? -magnitude[nibble & 7] : magnitude[nibble & 7];
}

/* Tensor `id` quantized to NVFP4 on `be` and decoded here: floats e2m1 x e4m3 (exact), with
 * the tensor's global scale in *global. */
static float *tensor_nvfp4(mg_backend *be, const mg_fwd_preset *p, uint64_t seed, uint32_t id,
                           double *global) {
    uint32_t rows, cols;
    float offset, scale;
    if (mg_fwd_tensor_shape(&p->shape, p->layers, id, &rows, &cols, &offset, &scale))
        return NULL;
    size_t n = (size_t)rows * cols;
    uint16_t *h = malloc(n * 2);
    uint8_t *codes = malloc(n / 2), *scales = malloc(n / 16);
    float *f = malloc(n * sizeof *f);
    mg_fwd_weight_fill(seed, id, offset, scale, 0, n, h);
    float amax = 0;
    for (size_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(mg_bf16_to_f32(h[i])));
    float g = amax / 2688.0f;
    mg_devptr d_in = 0, d_g = 0, d_codes = 0, d_scales = 0;
    CHECK_OK(mg_alloc(be, n * 2, &d_in));
    CHECK_OK(mg_alloc(be, 4, &d_g));
    CHECK_OK(mg_alloc(be, n / 2, &d_codes));
    CHECK_OK(mg_alloc(be, n / 16, &d_scales));
    CHECK_OK(mg_copy_h2d(be, d_in, h, n * 2));
    CHECK_OK(mg_copy_h2d(be, d_g, &g, 4));
    CHECK_OK(mg_memset(be, d_codes, 0xff, n / 2));
    CHECK_OK(mg_memset(be, d_scales, 0xff, n / 16));
    CHECK_OK(mg_nvfp4_quantize(be, NULL, rows, cols, 0, d_in, d_g, d_codes, d_scales));
    CHECK_OK(mg_copy_d2h(be, codes, d_codes, n / 2));
    CHECK_OK(mg_copy_d2h(be, scales, d_scales, n / 16));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(e2m1_value((uint8_t)(codes[i / 2] >> (4 * (i % 2)))) *
                       e4m3_value(scales[i / 16]));
    *global = g;
    mg_devptr d[] = {d_in, d_g, d_codes, d_scales};
    for (size_t i = 0; i < 4; i++)
        CHECK_OK(mg_free(be, d[i]));
    free(h), free(codes), free(scales);
    return f;
}

/* y[n] = bf16(x[k] . W[n, k]) (or FP32 when round is false), in order of k. */
static void matvec(const float *x, const float *w, uint32_t n, uint32_t k, float *y, bool round) {
    for (uint32_t j = 0; j < n; j++) {
        float acc = 0;
        for (uint32_t i = 0; i < k; i++)
            acc += x[i] * w[(size_t)j * k + i];
        y[j] = round ? bf(acc) : acc;
    }
}

/* The NVFP4 GEMM: y[n] = bf16((FP64 sum over k of x[k] W[n, k]) * global). */
static void matvec_nvfp4(const float *x, const float *w, double global, uint32_t n, uint32_t k,
                         double *y_exact, float *y) {
    for (uint32_t j = 0; j < n; j++) {
        double acc = 0;
        for (uint32_t i = 0; i < k; i++)
            acc += (double)x[i] * w[(size_t)j * k + i];
        acc *= global;
        if (y_exact)
            y_exact[j] = acc;
        if (y)
            y[j] = bf((float)acc);
    }
}

static void rmsnorm(const float *x, const float *w, uint32_t n, float eps, float *y) {
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(sum / n + eps));
    for (uint32_t i = 0; i < n; i++)
        y[i] = bf(x[i] * inv * w[i]);
}

static void rope(float *x, uint32_t d, uint32_t pos, float theta) {
    for (uint32_t i = 0; i < d / 2; i++) {
        double a = pos * pow(theta, -(double)(2 * i) / d);
        float x0 = x[i], x1 = x[i + d / 2];
        x[i] = bf((float)(x0 * cos(a) - x1 * sin(a)));
        x[i + d / 2] = bf((float)(x1 * cos(a) + x0 * sin(a)));
    }
}

/* The E4M3 value nearest to v (|v| <= 448 finite), ties to the even code; what the FP8
 * quantizers' round-to-nearest-even gives, found here by search over the codes' values. */
static float e4m3_round(float v) {
    static double value[127]; /* codes 0x00..0x7e in increasing order */
    if (value[1] == 0)
        for (int c = 0; c < 127; c++)
            value[c] = e4m3_value((uint8_t)c);
    double a = fabs((double)v);
    int lo = 0;
    while (lo < 126 && value[lo + 1] <= a)
        lo++;
    int c = lo;
    if (lo < 126) {
        double below = a - value[lo], above = value[lo + 1] - a;
        if (above < below || (above == below && (lo & 1)))
            c = lo + 1;
    }
    return (float)(v < 0 ? -value[c] : value[c]);
}

/* x[n] quantized as one FP8 group: q[i] = decoded code, returns the scale (amax / 448, 1 when
 * every value is 0). */
static float fp8_quantize_row(const float *x, uint32_t n, float *q) {
    float amax = 0;
    for (uint32_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax > 0 ? amax / 448.0f : 1.0f;
    for (uint32_t i = 0; i < n; i++)
        q[i] = e4m3_round(x[i] / scale);
    return scale;
}

/* Tensor `id` in FP8: decoded codes [rows, cols], one scale per row into *row_scales. */
static float *tensor_fp8(const mg_fwd_preset *p, uint64_t seed, uint32_t id, float **row_scales) {
    uint32_t rows, cols;
    float offset, scale;
    if (mg_fwd_tensor_shape(&p->shape, p->layers, id, &rows, &cols, &offset, &scale))
        return NULL;
    float *f = tensor(p, seed, id);
    *row_scales = malloc(rows * sizeof(float));
    for (uint32_t r = 0; r < rows; r++)
        (*row_scales)[r] = fp8_quantize_row(f + (size_t)r * cols, cols, f + (size_t)r * cols);
    return f;
}

/* The FP8 row-wise GEMM of one token: y[n] = bf16((sum of q(x) w) * x scale * w_scale[j]). */
static void matvec_fp8(const float *x, const float *w, const float *w_scale, uint32_t n, uint32_t k,
                       float *y) {
    float *q = malloc(k * sizeof *q);
    float xs = fp8_quantize_row(x, k, q);
    for (uint32_t j = 0; j < n; j++) {
        double acc = 0;
        for (uint32_t i = 0; i < k; i++)
            acc += (double)q[i] * w[(size_t)j * k + i];
        y[j] = bf((float)(acc * xs * w_scale[j]));
    }
    free(q);
}

typedef struct reference {
    const mg_fwd_preset *p;
    float *emb, *final_norm, *lm;
    float **w;         /* [layers * MG_FWD_LAYER_TENSORS] */
    float **row_scale; /* [layers * MG_FWD_LAYER_TENSORS]: FP8 matrices' row scales, else NULL */
    float *lm_scale;   /* the FP8 LM head's row scales, else NULL */
    /* Relative tolerance of the final hidden states and of every logit: 2%, FP8 8%. A one-ulp
     * BF16 difference between the two computations (summation order) may move an activation
     * across an E4M3 rounding boundary: a whole E4M3 step, 1/8 relative, in one element, which
     * the next layers' quantizations spread. Measured over 180 seeds (tiny fp8 and tiny-moe
     * fp8, 2026-12-03): about half agree exactly, the rest reach 0.039-0.055 of the largest
     * logit; the quantizer rounding toward zero instead of to nearest reaches 0.13-0.18, and a
     * wrong scale far more. BF16 and NVFP4 weights stay below 0.008. */
    float tolerance;
    double *global;   /* [layers * MG_FWD_LAYER_TENSORS]: NVFP4 matrices' global scales, else 0 */
    double lm_global; /* the NVFP4 LM head's global scale, else 0 */
} reference;

static void moe_reference(const reference *ref, uint32_t l, const float *a, float *out);

/* A layer matrix product: BF16 weights (float sums) or NVFP4 (see matvec_nvfp4). */
static void linear(const reference *ref, uint32_t l, uint32_t slot, const float *x, uint32_t n,
                   uint32_t k, float *y) {
    size_t at = (size_t)l * MG_FWD_LAYER_TENSORS + slot;
    if (ref->row_scale[at])
        matvec_fp8(x, ref->w[at], ref->row_scale[at], n, k, y);
    else if (ref->global[at] > 0)
        matvec_nvfp4(x, ref->w[at], ref->global[at], n, k, NULL, y);
    else
        matvec(x, ref->w[at], n, k, y, true);
}

/* Runs request r: its prompt, then `steps` greedy tokens, teacher-forced with the library's
 * tokens `forced` (the reference's own argmax can differ from them at a near-tie of two logits,
 * after which the two runs would decode different texts). Writes the reference's argmax at
 * each step into `generated` and the final-normed hidden state of the last token; returns how
 * many of the library's tokens are not within the tolerance of the reference's best logit. */
/* Request r through the reference, fed the library's tokens `forced` (those it chose, and
 * those mg_fwd_force_tokens replaced: is_forced[pass]); the library's logits of each pass,
 * lib_logits [passes][batch][vocab] (mg_fwd_logits), must be within the tolerance of the
 * reference's (relative to the largest), and its chosen tokens near the reference's best.
 * The reference's own argmax per pass to `generated`; the number of misses returned. */
/* The largest deviation of a library logit from the reference's, relative to the largest
 * reference logit, over the requests and passes of one check_against_reference (printed: the
 * margin to the tolerance). */
static double worst_logit_deviation;

static int reference_request(const reference *ref, const mg_fwd_config *c, uint32_t r,
                             const int32_t *forced, const bool *is_forced, const float *lib_logits,
                             int32_t *generated, float *final_hidden) {
    const mg_model_shape *s = &ref->p->shape;
    uint32_t H = s->hidden, D = s->head_dim, QD = s->heads * D, KD = s->kv_heads * D;
    uint32_t I = s->intermediate, len = mg_fwd_prompt_length(c, r), total = len + c->steps;
    uint32_t L = ref->p->layers, group = s->heads / s->kv_heads;
    float eps = ref->p->norm_eps;
    float *kc = malloc(sizeof(float) * L * total * KD),
          *vc = malloc(sizeof(float) * L * total * KD);
    float *h = malloc(sizeof(float) * H), *a = malloc(sizeof(float) * H);
    float *q = malloc(sizeof(float) * QD), *kv = malloc(sizeof(float) * 2 * KD);
    float *o = malloc(sizeof(float) * QD), *proj = malloc(sizeof(float) * H);
    float *gu = malloc(sizeof(float) * 2 * I), *act = malloc(sizeof(float) * I);
    double *gu_exact = malloc(sizeof(double) * 2 * I);
    float *logits = malloc(sizeof(float) * s->vocab), *scores = malloc(sizeof(float) * total);
    int32_t token = 0;
    uint32_t produced = 0;
    int far_from_best = 0;
    for (uint32_t t = 0; t + 1 < total + 1 && produced < c->steps + 1; t++) {
        token = t < len ? mg_fwd_prompt_token(c->seed, s->vocab, r, t) : forced[produced - 1];
        for (uint32_t i = 0; i < H; i++)
            h[i] = ref->emb[(size_t)token * H + i];
        for (uint32_t l = 0; l < L; l++) {
            float *const *w = ref->w + (size_t)l * MG_FWD_LAYER_TENSORS;
            if (l)
                for (uint32_t i = 0; i < H; i++)
                    h[i] = bf(h[i] + proj[i]);
            rmsnorm(h, w[MG_FWD_ATTN_NORM], H, eps, a);
            linear(ref, l, MG_FWD_WQ, a, QD, H, q);
            linear(ref, l, MG_FWD_WKV, a, 2 * KD, H, kv);
            for (uint32_t hd = 0; hd < s->heads; hd++)
                rope(q + hd * D, D, t, ref->p->rope_theta);
            for (uint32_t hd = 0; hd < s->kv_heads; hd++)
                rope(kv + hd * D, D, t, ref->p->rope_theta);
            float *kl = kc + (size_t)l * total * KD, *vl = vc + (size_t)l * total * KD;
            memcpy(kl + (size_t)t * KD, kv, KD * sizeof(float));
            memcpy(vl + (size_t)t * KD, kv + KD, KD * sizeof(float));
            for (uint32_t hd = 0; hd < s->heads; hd++) {
                uint32_t g = hd / group;
                double mx = -INFINITY, sum = 0;
                for (uint32_t j = 0; j <= t; j++) {
                    double dot = 0;
                    for (uint32_t i = 0; i < D; i++)
                        dot += (double)q[hd * D + i] * kl[(size_t)j * KD + g * D + i];
                    scores[j] = (float)(dot / sqrt((double)D));
                    mx = fmax(mx, scores[j]);
                }
                for (uint32_t j = 0; j <= t; j++)
                    sum += exp(scores[j] - mx);
                for (uint32_t i = 0; i < D; i++) {
                    double acc = 0;
                    for (uint32_t j = 0; j <= t; j++)
                        acc += exp(scores[j] - mx) * vl[(size_t)j * KD + g * D + i];
                    o[hd * D + i] = bf((float)(acc / sum));
                }
            }
            linear(ref, l, MG_FWD_WO, o, H, QD, proj);
            for (uint32_t i = 0; i < H; i++)
                h[i] = bf(h[i] + proj[i]);
            rmsnorm(h, w[MG_FWD_MLP_NORM], H, eps, a);
            double gate_up_global =
                ref->global[(size_t)l * MG_FWD_LAYER_TENSORS + MG_FWD_W_GATE_UP];
            if (s->experts) {
                moe_reference(ref, l, a, proj);
                continue;
            }
            if (gate_up_global > 0) {
                /* fused: gate and up unrounded, silu(gate) * up rounded once */
                matvec_nvfp4(a, w[MG_FWD_W_GATE_UP], gate_up_global, 2 * I, H, gu_exact, NULL);
                for (uint32_t i = 0; i < I; i++) {
                    double g = gu_exact[i];
                    act[i] = bf((float)(g / (1.0 + exp(-g)) * gu_exact[I + i]));
                }
            } else {
                linear(ref, l, MG_FWD_W_GATE_UP, a, 2 * I, H, gu);
                for (uint32_t i = 0; i < I; i++) {
                    float g = gu[i];
                    act[i] = bf(g / (1.0f + expf(-g)) * gu[I + i]);
                }
            }
            linear(ref, l, MG_FWD_W_DOWN, act, H, I, proj);
        }
        if (t + 1 < len)
            continue;
        for (uint32_t i = 0; i < H; i++)
            h[i] = bf(h[i] + proj[i]);
        rmsnorm(h, ref->final_norm, H, eps, final_hidden);
        if (ref->lm_scale) /* BF16 logits */
            matvec_fp8(final_hidden, ref->lm, ref->lm_scale, s->vocab, H, logits);
        else if (ref->lm_global > 0) /* BF16 logits */
            matvec_nvfp4(final_hidden, ref->lm, ref->lm_global, s->vocab, H, NULL, logits);
        else
            matvec(final_hidden, ref->lm, s->vocab, H, logits, false);
        uint32_t best = 0;
        float largest = 0;
        for (uint32_t v = 1; v < s->vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        for (uint32_t v = 0; v < s->vocab; v++)
            largest = fmaxf(largest, fabsf(logits[v]));
        /* The library's final hidden state may differ by BF16 roundings (checked to the same
         * tolerance below), so its logits may by about as much: its token must be within the
         * tolerance (of the largest logit magnitude) of the best one. */
        int32_t chosen = forced[produced];
        if (!is_forced[produced] && (chosen < 0 || (uint32_t)chosen >= s->vocab ||
                                     logits[chosen] < logits[best] - ref->tolerance * largest)) {
            far_from_best++;
            fprintf(stderr,
                    "request %u pass %u: token %d's logit %g, the best (%u) %g, largest %g\n", r,
                    produced, chosen,
                    chosen >= 0 && (uint32_t)chosen < s->vocab ? logits[chosen] : NAN, best,
                    logits[best], largest);
        }
        const float *lib = lib_logits + ((size_t)produced * c->batch + r) * s->vocab;
        for (uint32_t v = 0; v < s->vocab; v++)
            worst_logit_deviation =
                fmax(worst_logit_deviation, fabsf(lib[v] - logits[v]) / largest);
        for (uint32_t v = 0; v < s->vocab; v++)
            if (!(fabsf(lib[v] - logits[v]) <= ref->tolerance * largest)) { /* NaN fails */
                far_from_best++;
                fprintf(stderr,
                        "request %u pass %u: logit %u is %g, the reference's %g, largest %g\n", r,
                        produced, v, lib[v], logits[v], largest);
                break;
            }
        generated[produced++] = (int32_t)best;
    }
    free(kc), free(vc), free(h), free(a), free(q), free(kv), free(o), free(proj), free(gu);
    free(act), free(logits), free(scores), free(gu_exact);
    return far_from_best;
}

/* The MoE MLP of layer l for one token: a (normed) -> out (BF16 values). */
static void moe_reference(const reference *ref, uint32_t l, const float *a, float *out) {
    const mg_model_shape *s = &ref->p->shape;
    uint32_t H = s->hidden, I = s->intermediate, E = s->experts, K = s->experts_per_token;
    float *const *w = ref->w + (size_t)l * MG_FWD_LAYER_TENSORS;
    const double *g = ref->global + (size_t)l * MG_FWD_LAYER_TENSORS;
    float *logits = malloc(E * sizeof *logits), *act = malloc(I * sizeof *act);
    float *rows = malloc((size_t)K * H * sizeof *rows), weight[8];
    double *gu = malloc(2 * I * sizeof *gu);
    bool taken[256] = {false};
    uint32_t chosen[8];
    matvec(a, w[MG_FWD_ROUTER], E, H, logits, false);
    for (uint32_t j = 0; j < K; j++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t e = 0; e < E; e++)
            if (!taken[e] && (best == UINT32_MAX || logits[e] > logits[best]))
                best = e;
        taken[best] = true;
        chosen[j] = best;
    }
    float max = logits[chosen[0]], sum = 0;
    for (uint32_t j = 0; j < K; j++)
        sum += expf(logits[chosen[j]] - max);
    float *const *sc = ref->row_scale + (size_t)l * MG_FWD_LAYER_TENSORS;
    float *gu_rounded = malloc(2 * I * sizeof *gu_rounded);
    for (uint32_t j = 0; j < K; j++) {
        uint32_t e = chosen[j];
        weight[j] = expf(logits[e] - max) / sum;
        const float *wgu = w[MG_FWD_W_GATE_UP] + (size_t)e * 2 * I * H;
        const float *wdn = w[MG_FWD_W_DOWN] + (size_t)e * H * I;
        if (g[MG_FWD_W_GATE_UP] > 0) { /* NVFP4: gate and up not rounded before silu * up */
            matvec_nvfp4(a, wgu, g[MG_FWD_W_GATE_UP], 2 * I, H, gu, NULL);
            for (uint32_t i = 0; i < I; i++)
                act[i] = bf((float)(gu[i] / (1.0 + exp(-gu[i])) * gu[I + i]));
            matvec_nvfp4(act, wdn, g[MG_FWD_W_DOWN], H, I, NULL, rows + (size_t)j * H);
            continue;
        }
        /* BF16 or FP8 experts (metrale/ops_moe_gemm.h): gate and up rounded to BF16 first,
         * then silu(gate) * up in single precision (mg_silu_mul_bf16's definition) */
        if (sc[MG_FWD_W_GATE_UP])
            matvec_fp8(a, wgu, sc[MG_FWD_W_GATE_UP] + (size_t)e * 2 * I, 2 * I, H, gu_rounded);
        else
            matvec(a, wgu, 2 * I, H, gu_rounded, true);
        for (uint32_t i = 0; i < I; i++) {
            float gate = gu_rounded[i];
            act[i] = bf(gate / (1.0f + expf(-gate)) * gu_rounded[I + i]);
        }
        if (sc[MG_FWD_W_DOWN])
            matvec_fp8(act, wdn, sc[MG_FWD_W_DOWN] + (size_t)e * H, H, I, rows + (size_t)j * H);
        else
            matvec(act, wdn, H, I, rows + (size_t)j * H, true);
    }
    free(gu_rounded);
    for (uint32_t h = 0; h < H; h++) {
        float acc = 0;
        for (uint32_t j = 0; j < K; j++)
            acc = fmaf(weight[j], rows[(size_t)j * H + h], acc);
        out[h] = bf(acc);
    }
    free(logits), free(act), free(rows), free(gu);
}

static void check_against_reference(mg_backend *be, mg_fwd_config c) {
    const mg_fwd_preset *p = c.preset;
    reference ref = {.p = p};
    ref.emb = tensor(p, c.seed, MG_FWD_TENSOR_EMBEDDING);
    ref.final_norm = tensor(p, c.seed, MG_FWD_TENSOR_FINAL_NORM);
    bool fp8 = c.weights == MG_FWD_WEIGHTS_FP8;
    ref.tolerance = fp8 ? 0.08f : 0.02f;
    ref.lm = c.weights == MG_FWD_WEIGHTS_NVFP4
                 ? tensor_nvfp4(be, p, c.seed, MG_FWD_TENSOR_LM_HEAD, &ref.lm_global)
             : fp8 ? tensor_fp8(p, c.seed, MG_FWD_TENSOR_LM_HEAD, &ref.lm_scale)
                   : tensor(p, c.seed, MG_FWD_TENSOR_LM_HEAD);
    ref.w = calloc((size_t)p->layers * MG_FWD_LAYER_TENSORS, sizeof *ref.w);
    ref.row_scale = calloc((size_t)p->layers * MG_FWD_LAYER_TENSORS, sizeof *ref.row_scale);
    ref.global = calloc((size_t)p->layers * MG_FWD_LAYER_TENSORS, sizeof *ref.global);
    for (uint32_t l = 0; l < p->layers; l++)
        for (uint32_t slot = 0; slot < MG_FWD_LAYER_TENSORS; slot++) {
            size_t at = (size_t)l * MG_FWD_LAYER_TENSORS + slot;
            bool matrix = slot != MG_FWD_ATTN_NORM && slot != MG_FWD_MLP_NORM &&
                          slot != MG_FWD_ROUTER; /* the router stays BF16 */
            uint32_t id = mg_fwd_layer_tensor(l, slot);
            if (slot == MG_FWD_ROUTER && !p->shape.experts)
                continue;
            ref.w[at] = c.weights == MG_FWD_WEIGHTS_NVFP4 && matrix
                            ? tensor_nvfp4(be, p, c.seed, id, &ref.global[at])
                        : fp8 && matrix ? tensor_fp8(p, c.seed, id, &ref.row_scale[at])
                                        : tensor(p, c.seed, id);
        }

    mg_stream *s = NULL;
    mg_fwd *m = NULL;
    worst_logit_deviation = 0;
    CHECK_OK(mg_stream_create(be, &s));
    mg_status st = mg_fwd_create(be, &c, &m);
    CHECK(st == MG_OK);
    if (st) {
        fprintf(stderr, "mg_fwd_create: %s\n", mg_last_error());
        return;
    }
    /* Every pass's logits (poisoned first); after the prefill's, every request's token is
     * replaced by a random one (mg_fwd_force_tokens), which the reference is then fed: the next
     * pass must have read the forced ids. */
    const uint32_t V = p->shape.vocab, passes = c.steps + 1;
    float *logits = malloc((size_t)passes * c.batch * V * sizeof(float));
    bool *is_forced = calloc(passes, sizeof(bool));
    int32_t *force = malloc(c.batch * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)passes * c.batch * V; i++)
        logits[i] = NAN;
    CHECK_STATUS(mg_fwd_logits(m, logits), MG_ERR_INVALID_ARGUMENT); /* no pass yet */
    CHECK_STATUS(mg_fwd_force_tokens(m, force), MG_ERR_INVALID_ARGUMENT);
    for (uint32_t pass = 0; pass < passes; pass++) {
        CHECK(pass ? mg_fwd_decode(m, s) == MG_OK : mg_fwd_prefill(m, s) == MG_OK);
        float *l = logits + (size_t)pass * c.batch * V;
        CHECK_OK(mg_fwd_logits(m, l));
        for (uint32_t r = 0; r < c.batch; r++) {
            uint32_t count, best = 0;
            const int32_t token = mg_fwd_tokens(m, r, &count)[pass];
            for (uint32_t v = 1; v < V; v++)
                best = l[(size_t)r * V + v] > l[(size_t)r * V + best] ? v : best;
            CHECK(count == pass + 1 && token == (int32_t)best); /* ties to the lowest id */
            force[r] = (int32_t)test_rand_range(0, V - 1);
        }
        if (pass == 0 && passes > 1) {
            force[0] = (int32_t)V; /* refused: nothing replaced */
            CHECK_STATUS(mg_fwd_force_tokens(m, force), MG_ERR_INVALID_ARGUMENT);
            CHECK(strstr(mg_last_error(), "outside") != NULL);
            force[0] = 0;
            CHECK_OK(mg_fwd_force_tokens(m, force));
            is_forced[0] = true;
            for (uint32_t r = 0; r < c.batch; r++) {
                uint32_t count;
                CHECK(mg_fwd_tokens(m, r, &count)[0] == force[r]);
            }
        }
    }
    CHECK(mg_fwd_decode(m, s) == MG_ERR_INVALID_ARGUMENT); /* beyond the planned steps */
    uint32_t H = p->shape.hidden;
    uint16_t *hidden = malloc((size_t)c.batch * H * 2);
    memset(hidden, 0xff, (size_t)c.batch * H * 2); /* NaN: an element not written fails */
    CHECK(mg_fwd_final_hidden(m, hidden) == MG_OK);
    int32_t *want = malloc((c.steps + 1) * sizeof(int32_t)); /* the reference's argmax */
    float *want_hidden = malloc(H * sizeof(float));
    for (uint32_t r = 0; r < c.batch; r++) {
        uint32_t count;
        const int32_t *got = mg_fwd_tokens(m, r, &count);
        CHECK(count == c.steps + 1);
        if (count != c.steps + 1)
            continue;
        int far = reference_request(&ref, &c, r, got, is_forced, logits, want, want_hidden);
        int differ = 0;
        for (uint32_t i = 0; i < count; i++)
            differ += got[i] != want[i] && !is_forced[i];
        CHECK(far == 0);
        if (far || differ) {
            fprintf(stderr, "%s%s weights, seed %llu: request %u tokens%s:",
                    c.preset->shape.experts ? "MoE, " : "", mg_fwd_weights_name(c.weights),
                    (unsigned long long)c.seed, r,
                    far ? "" : " (near-ties: within tolerance of the best logit)");
            for (uint32_t i = 0; i < count; i++)
                fprintf(stderr, " %d/%d", got[i], want[i]);
            fprintf(stderr, " (got/reference argmax)\n");
        }
        double diff = 0, scale = 0;
        for (uint32_t i = 0; i < H; i++) {
            double x = mg_bf16_to_f32(hidden[(size_t)r * H + i]);
            diff = isnan(x) ? INFINITY : fmax(diff, fabs(x - want_hidden[i]));
            scale = fmax(scale, fabs(want_hidden[i]));
        }
        CHECK(scale > 0.1 && diff / scale < ref.tolerance);
        if (!(diff / scale < ref.tolerance))
            fprintf(stderr, "request %u final hidden: max rel err %g\n", r, diff / scale);
    }
    printf("  worst logit deviation %.4f of the largest logit (tolerance %.2f)\n",
           worst_logit_deviation, ref.tolerance);
    free(hidden), free(want), free(want_hidden), free(logits), free(is_forced), free(force);
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
    free(ref.emb), free(ref.final_norm), free(ref.lm);
    for (size_t i = 0; i < (size_t)p->layers * MG_FWD_LAYER_TENSORS; i++)
        free(ref.w[i]), free(ref.row_scale[i]);
    free(ref.w);
    free(ref.row_scale);
    free(ref.lm_scale);
    free(ref.global);
}

/* Whether `text` is one JSON value as far as its brackets go: braces and brackets balanced and
 * properly nested outside strings, strings closed, nothing after the outermost value. */
static bool json_balanced(const char *text) {
    char stack[64];
    size_t depth = 0;
    bool in_string = false, seen = false;
    for (const char *c = text; *c; c++) {
        if (in_string) {
            if (*c == '\\' && c[1])
                c++;
            else if (*c == '"')
                in_string = false;
            continue;
        }
        if (*c == '"')
            in_string = true;
        else if (*c == '{' || *c == '[') {
            if (depth == sizeof stack || (depth == 0 && seen))
                return false;
            stack[depth++] = *c;
            seen = true;
        } else if (*c == '}' || *c == ']') {
            if (!depth || stack[--depth] != (*c == '}' ? '{' : '['))
                return false;
        }
    }
    return seen && depth == 0 && !in_string;
}

/* The per-op spans (mg_fwd_set_timing) and their Chrome trace: the prefill and one decode step
 * recorded, decode steps without timing record nothing, every op of the pass has one span per
 * layer and pass, the lanes one span each, and the trace file names them all. A fused decode
 * step has no norm span but the final one and no silu_mul span (folded into the GEMMs). */
static void check_trace(mg_backend *be, mg_fwd_config c) {
    static const char *const per_layer[] = {"qkv_gemm", "rope_append", "attention", "o_gemm",
                                            "gate_up",  "silu_mul",    "down"};
    static const char *const per_pass[] = {"embedding", "last_rows", "lm_head", "argmax"};
    const mg_fwd_preset *p = c.preset;
    mg_stream *s = NULL;
    mg_fwd *m = NULL;
    mg_timing *t = NULL;
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .kernel_span_every = 1};
    CHECK_OK(mg_stream_create(be, &s));
    CHECK_OK(mg_timing_create(be, &o, &t));
    CHECK_OK(mg_fwd_create(be, &c, &m));
    if (!m || !t)
        return;
    CHECK_OK(mg_fwd_set_timing(m, t));
    CHECK_OK(mg_fwd_prefill(m, s));
    CHECK_OK(mg_fwd_set_timing(m, NULL));
    for (uint32_t i = 0; i + 1 < c.steps; i++) /* untimed (graph replays when use_graphs) */
        CHECK_OK(mg_fwd_decode(m, s));
    mg_fwd_info info;
    mg_fwd_get_info(m, &info);
    uint32_t replays = info.graph_steps;
    CHECK_OK(mg_fwd_set_timing(m, t));
    CHECK_OK(mg_fwd_decode(m, s));
    CHECK_OK(mg_fwd_set_timing(m, NULL));
    mg_fwd_get_info(m, &info);
    CHECK(info.graph_steps == replays); /* the timed step ran eagerly */
    CHECK_OK(mg_timing_harvest(t, NULL));
    mg_timing_counters counters;
    CHECK_OK(mg_timing_get_counters(t, &counters));
    CHECK(counters.open == 0 && counters.pending == 0 && counters.dropped_pool_full == 0);
    size_t n = mg_timing_summary_count(t), found = 0;
    for (size_t i = 0; i < n; i++) {
        mg_timing_summary sum;
        CHECK_OK(mg_timing_summary_get(t, i, &sum));
        uint64_t want = 0;
        if (sum.kind == MG_TIMING_LANE)
            want = 1; /* "prefill", "decode" */
        else if (!strcmp(sum.name, "rmsnorm"))
            want = 2 * p->layers + 1 + (info.fused_decode ? 1 : 2 * p->layers + 1);
        else if (!strcmp(sum.name, "fp8_quant"))
            /* the prefill's 4 per layer and the LM head's; a fused decode step quantizes only
             * the output and down projections' inputs */
            want = c.weights == MG_FWD_WEIGHTS_FP8
                       ? 4 * p->layers + 1 + (info.fused_decode ? 2 : 4) * p->layers + 1
                       : 0;
        for (size_t k = 0; k < sizeof per_layer / sizeof per_layer[0]; k++)
            want = strcmp(sum.name, per_layer[k])                       ? want
                   : info.fused_decode && !strcmp(sum.name, "silu_mul") ? p->layers
                                                                        : 2 * p->layers;
        for (size_t k = 0; k < sizeof per_pass / sizeof per_pass[0]; k++)
            want = strcmp(sum.name, per_pass[k]) ? want : 2;
        found += want > 0;
        CHECK(sum.count == want && sum.total_us >= 0);
        if (sum.count != want)
            fprintf(stderr, "span %s: %llu, want %llu\n", sum.name, (unsigned long long)sum.count,
                    (unsigned long long)want);
    }
    size_t expected = 2 + 1 + sizeof per_layer / sizeof per_layer[0] +
                      sizeof per_pass / sizeof per_pass[0] + (c.weights == MG_FWD_WEIGHTS_FP8);
    CHECK(found == expected && n == expected);
    char path[] = "/tmp/metrale_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    CHECK_OK(mg_timing_export_chrome_trace(t, path));
    FILE *f = fopen(path, "r");
    char *text = calloc(1u << 20, 1);
    size_t len = f ? fread(text, 1, (1u << 20) - 1, f) : 0;
    if (f)
        fclose(f);
    remove(path);
    CHECK(len > 0 && len < (1u << 20) - 1);
    CHECK(!strncmp(text, "{\"traceEvents\"", 14) || text[0] == '[');
    CHECK(json_balanced(text));
    const char *names[] = {"prefill", "decode", "rmsnorm", "fp8_quant"};
    for (size_t k = 0;
         k < 4 + sizeof per_layer / sizeof per_layer[0] + sizeof per_pass / sizeof per_pass[0];
         k++) {
        const char *name = k < 4 ? names[k]
                           : k < 4 + sizeof per_layer / sizeof per_layer[0]
                               ? per_layer[k - 4]
                               : per_pass[k - 4 - sizeof per_layer / sizeof per_layer[0]];
        if (k == 3 && c.weights != MG_FWD_WEIGHTS_FP8)
            continue;
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"name\": \"%s\"", name);
        CHECK(strstr(text, quoted) != NULL);
        if (!strstr(text, quoted))
            fprintf(stderr, "trace lacks %s\n", quoted);
    }
    printf("trace (%s weights, %u layers): %zu span series, %zu bytes of JSON, %u replays "
           "before the eager timed step\n",
           mg_fwd_weights_name(c.weights), p->layers, n, len, replays);
    free(text);
    mg_fwd_destroy(m);
    CHECK_OK(mg_timing_destroy(t));
    mg_stream_destroy(s);
}

/* A refusal: the status and a one-line message naming `needle`. */
/* Every pass's logits of config c (poisoned first), and whether its decode steps ran fused. */
/* Every pass's logits of a run of config `c` (prefill, then c->steps decode steps), and the
 * model's mg_fwd_info after them in *info. */
static float *run_logits(mg_backend *be, const mg_fwd_config *c, mg_fwd_info *info) {
    const size_t row = (size_t)c->batch * c->preset->shape.vocab, passes = c->steps + 1;
    float *logits = malloc(passes * row * sizeof(float));
    for (size_t i = 0; logits && i < passes * row; i++)
        logits[i] = NAN;
    mg_stream *s = NULL;
    mg_fwd *m = NULL;
    bool ok = logits && mg_stream_create(be, &s) == MG_OK && mg_fwd_create(be, c, &m) == MG_OK;
    for (size_t pass = 0; ok && pass < passes; pass++)
        ok = (pass ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s)) == MG_OK &&
             mg_fwd_logits(m, logits + pass * row) == MG_OK;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "run_logits: %s\n", mg_last_error());
    *info = (mg_fwd_info){0};
    if (m)
        mg_fwd_get_info(m, info);
    mg_fwd_destroy(m);
    if (s)
        mg_stream_destroy(s);
    return logits;
}

static void check_fusion_exact(mg_backend *be, mg_fwd_config c) {
    mg_fwd_config plain = c;
    plain.unfused = true;
    mg_fwd_info fi, pi;
    float *a = run_logits(be, &c, &fi);
    float *b = run_logits(be, &plain, &pi);
    const bool fused = fi.fused_decode, plain_fused = pi.fused_decode, qkv = fi.fused_qkv,
               plain_qkv = pi.fused_qkv, append = fi.fused_kv_append,
               plain_append = pi.fused_kv_append;
    const size_t n = (size_t)(c.steps + 1) * c.batch * c.preset->shape.vocab;
    CHECK(fused && !plain_fused);
    /* one token row: the q and kv projections are one GEMV over the joined matrices */
    CHECK(qkv == (c.batch == 1) && !plain_qkv);
    /* ... with RoPE and the KV append in it (the presets have no q/k norm or bias) */
    CHECK(append == (c.batch == 1) && !plain_append);
    CHECK(a && b && !memcmp(a, b, n * sizeof(float)));
    printf("%s: batch %u, %u decode steps fused%s and unfused: every pass's logits equal bit "
           "for bit\n",
           c.preset->name, c.batch, c.steps,
           append ? " (q and kv in one GEMV with RoPE and the KV append)" : "");
    free(a);
    free(b);
}

/* The captured decode step's kernel counts (mg_fwd_info): the step is the kernels outside the
 * layers plus each layer's, two presets of other depths count the same per layer, and the
 * replayed steps' logits equal eager ones bit for bit (the counting captures leave the model
 * as it was). Returns the kernels per layer. */
static uint32_t check_layer_kernels(mg_backend *be, mg_fwd_config c) {
    c.use_graphs = true;
    c.steps = 3; /* one eager step, one captured, one replayed */
    const size_t bytes = (size_t)(c.steps + 1) * c.batch * c.preset->shape.vocab * sizeof(float);
    mg_fwd_info info, eager_info;
    float *replayed = run_logits(be, &c, &info);
    const uint32_t layers = c.preset->layers;
    CHECK(info.graph_steps >= 1 && info.graph_kernels > 0);
    CHECK(info.graph_layer_kernels > 0 && info.graph_outside_kernels > 0);
    CHECK(info.graph_kernels == info.graph_outside_kernels + layers * info.graph_layer_kernels);
    printf("%s %s%s batch %u: %u kernels per decode step, %u per layer x %u, %u outside\n",
           c.preset->name, mg_fwd_weights_name(c.weights), c.unfused ? " unfused" : "", c.batch,
           info.graph_kernels, info.graph_layer_kernels, layers, info.graph_outside_kernels);
    mg_fwd_config eager = c;
    eager.use_graphs = false;
    float *want = run_logits(be, &eager, &eager_info);
    CHECK(replayed && want && !memcmp(want, replayed, bytes));
    free(want);
    free(replayed);
    return info.graph_layer_kernels;
}

static void check_refused(mg_backend *be, mg_fwd_config c, mg_status want, const char *needle) {
    mg_fwd *m = (mg_fwd *)1;
    mg_status st = mg_fwd_create(be, &c, &m);
    CHECK(st == want);
    CHECK(m == NULL);
    CHECK(strstr(mg_last_error(), needle) != NULL && !strchr(mg_last_error(), '\n'));
    if (st == MG_OK)
        mg_fwd_destroy(m);
    else if (!strstr(mg_last_error(), needle))
        fprintf(stderr, "message '%s' lacks '%s'\n", mg_last_error(), needle);
}

int main(void) {
    test_seed();
    mg_backend *be = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &be));
    const mg_fwd_preset *tiny = mg_fwd_preset_find("tiny");
    CHECK(tiny != NULL && mg_fwd_preset_find("no-such-preset") == NULL);
    /* Awkward sizes: prompts crossing page boundaries, a fresh seed each run. */
    mg_fwd_config c = mg_fwd_config_default(tiny);
    c.batch = 3;
    c.prompt_len = (uint32_t)test_rand_range(9, 21);
    c.steps = (uint32_t)test_rand_range(3, 6);
    c.seed = test_rand();
    c.use_graphs = false;
    printf("tiny: batch %u, prompt_len %u, steps %u, seed %llu\n", c.batch, c.prompt_len, c.steps,
           (unsigned long long)c.seed);
    check_against_reference(be, c);
    check_fusion_exact(be, c);
    mg_fwd_config one = c;
    one.batch = 1;
    one.prompt_len = (uint32_t)test_rand_range(9, 40);
    check_fusion_exact(be, one);
    /* NVFP4 and FP8 weights: each another ragged batch and seed */
    for (int w = 0; w < 2; w++) {
        mg_fwd_config f = c;
        f.weights = w ? MG_FWD_WEIGHTS_FP8 : MG_FWD_WEIGHTS_NVFP4;
        f.batch = (uint32_t)test_rand_range(3, 6);
        f.prompt_len = (uint32_t)test_rand_range(9, 21);
        f.seed = test_rand();
        printf("tiny %s: batch %u, prompt_len %u, steps %u, seed %llu\n",
               mg_fwd_weights_name(f.weights), f.batch, f.prompt_len, f.steps,
               (unsigned long long)f.seed);
        check_against_reference(be, f);
        if (f.weights == MG_FWD_WEIGHTS_FP8) { /* the fused FP8 step, and at one token row */
            check_fusion_exact(be, f);
            mg_fwd_config f1 = f;
            f1.batch = 1;
            check_fusion_exact(be, f1);
        }
    }
    /* the spans and the trace (FP8, then BF16 weights), with graph replays before the timed
     * step where the CPU backend captures them */
    mg_fwd_config f8 = c;
    f8.weights = MG_FWD_WEIGHTS_FP8;
    f8.use_graphs = true;
    f8.steps = 4;
    check_trace(be, f8);
    mg_fwd_config traced = c;
    traced.steps = 2;
    check_trace(be, traced);
    /* MoE (NVFP4 experts), tiny-moe's shapes with every expert chosen: a token's expert choice
     * is discontinuous in the router logits, so a one-ulp difference between this computation
     * and the library's (attention, RMSNorm sums) would pick another expert at a near-tie;
     * with k = E only the rank order (the combine's summation order) can change. The top-k
     * selection itself is checked exactly by the moe_routing checks. */
    const mg_fwd_preset *tiny_moe = mg_fwd_preset_find("tiny-moe");
    CHECK(tiny_moe != NULL && tiny_moe->shape.experts > 0);
    mg_fwd_preset all_experts = *tiny_moe;
    all_experts.shape.experts_per_token = all_experts.shape.experts;
    mg_fwd_config e = mg_fwd_config_default(&all_experts);
    e.weights = MG_FWD_WEIGHTS_NVFP4;
    e.batch = (uint32_t)test_rand_range(3, 6);
    e.prompt_len = (uint32_t)test_rand_range(9, 21);
    e.steps = (uint32_t)test_rand_range(3, 6);
    e.seed = test_rand();
    e.use_graphs = false;
    printf("tiny-moe (top-%u of %u) nvfp4: batch %u, prompt_len %u, steps %u, seed %llu\n",
           all_experts.shape.experts_per_token, all_experts.shape.experts, e.batch, e.prompt_len,
           e.steps, (unsigned long long)e.seed);
    check_against_reference(be, e);
    /* the same with BF16 and with FP8 experts (the grouped GEMM op, metrale/ops_moe_gemm.h) */
    for (int w = 0; w < 2; w++) {
        mg_fwd_config moe = e;
        moe.weights = w ? MG_FWD_WEIGHTS_FP8 : MG_FWD_WEIGHTS_BF16;
        moe.seed = test_rand();
        printf("tiny-moe (top-%u of %u) %s: seed %llu\n", all_experts.shape.experts_per_token,
               all_experts.shape.experts, mg_fwd_weights_name(moe.weights),
               (unsigned long long)moe.seed);
        check_against_reference(be, moe);
    }
    /* kernels per layer: the same at 2 layers (tiny) and 4 (small), fused or not, BF16 or
     * NVFP4, and for the MoE preset */
    for (int w = 0; w < 2; w++)
        for (int unfused = 0; unfused < 2; unfused++) {
            mg_fwd_config k = c;
            k.weights = w ? MG_FWD_WEIGHTS_NVFP4 : MG_FWD_WEIGHTS_BF16;
            k.unfused = unfused;
            const uint32_t tiny_layer = check_layer_kernels(be, k);
            k.preset = mg_fwd_preset_find("small");
            k.prompt_len = 16;
            CHECK(check_layer_kernels(be, k) == tiny_layer);
        }
    check_layer_kernels(be, e);
    mg_fwd_config moe_mlx = e;
    moe_mlx.weights = MG_FWD_WEIGHTS_MLX8;
    check_refused(be, moe_mlx, MG_ERR_UNSUPPORTED, "mixture of experts");

    mg_fwd_config bad = c;
    bad.batch = tiny->max_batch_size + 1;
    check_refused(be, bad, MG_ERR_INVALID_ARGUMENT, "--batch");
    bad.batch = 0;
    check_refused(be, bad, MG_ERR_INVALID_ARGUMENT, "--batch");
    bad = c;
    bad.batch = 64;
    bad.prompt_len = 100000;
    check_refused(be, bad, MG_ERR_INVALID_ARGUMENT, "tokens");
    bad = mg_fwd_config_default(mg_fwd_preset_find("qwen3-30b-a3b"));
    bad.weights = MG_FWD_WEIGHTS_MLX4;
    check_refused(be, bad, MG_ERR_UNSUPPORTED, "mixture of experts");
    bad = c;
    bad.weights = (mg_fwd_weights)7;
    check_refused(be, bad, MG_ERR_INVALID_ARGUMENT, "weight format");
    CHECK_OK(mg_backend_close(be));
    return test_finish();
}
