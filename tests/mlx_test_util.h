/*
 * mlx_test_util.h - random MLX-quantized layers for the MLX op tests (test_mlx_ops.c on the
 * CPU backend against float64, test_cuda_mlx.c on CUDA against the CPU backend): packed codes,
 * scales and biases in BF16 or FP16, uploaded to a backend, and the exact float64 weights.
 */
#ifndef METRALE_MLX_TEST_UTIL_H
#define METRALE_MLX_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/dtype.h"
#include "metrale/mlx.h"
#include "metrale/ops.h"
#include "test_util.h"

typedef struct mlx_test_layer {
    mg_mlx_linear w; /* on the backend */
    uint32_t *words; /* host copies */
    uint16_t *scales, *biases;
} mlx_test_layer;

/* A random FP16 or BF16 value of magnitude in [2^lo, 2^hi), random sign. */
static inline uint16_t mlx_test_half(mg_dtype type, int lo, int hi) {
    int e = (int)test_rand_range((uint64_t)(lo + 64), (uint64_t)(hi + 63)) - 64;
    uint16_t sign = (uint16_t)((test_rand() & 1) << 15);
    if (type == MG_DTYPE_F16)
        return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(test_rand() & 0x3ff);
    return sign | (uint16_t)((e + 127) << 7) | (uint16_t)(test_rand() & 0x7f);
}

static inline double mlx_test_half_value(mg_dtype type, uint16_t h) {
    if (type == MG_DTYPE_BF16)
        return mg_bf16_to_f32(h);
    double v = ldexp(1.0 + (h & 0x3ff) / 1024.0, ((h >> 10) & 0x1f) - 15);
    return h & 0x8000 ? -v : v;
}

static inline mg_devptr mlx_test_upload(mg_backend *b, const void *data, size_t bytes) {
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, bytes, &p));
    if (p)
        CHECK_OK(mg_copy_h2d(b, p, data, bytes));
    return p;
}

/* Fresh random experts x [n, k] at `bits`, `group`, `type`, on `b`. */
static inline void mlx_test_layer_make(mg_backend *b, mlx_test_layer *l, uint32_t experts,
                                       uint32_t n, uint32_t k, uint32_t bits, uint32_t group,
                                       mg_dtype type) {
    size_t words = (size_t)experts * n * k * bits / 32, groups = (size_t)experts * n * (k / group);
    l->words = malloc(words * 4);
    l->scales = malloc(groups * 2);
    l->biases = malloc(groups * 2);
    test_fill_random(l->words, words * 4);
    for (size_t i = 0; i < groups; i++) {
        l->scales[i] = mlx_test_half(type, -9, -4);
        l->biases[i] = mlx_test_half(type, -6, -2);
    }
    l->w = (mg_mlx_linear){
        .experts = experts, .n = n, .k = k, .bits = bits, .group_size = group, .scale_type = type};
    l->w.weight = mlx_test_upload(b, l->words, words * 4);
    l->w.scales = mlx_test_upload(b, l->scales, groups * 2);
    l->w.biases = mlx_test_upload(b, l->biases, groups * 2);
}

/* The same host data on another backend. */
static inline void mlx_test_layer_copy(mg_backend *b, const mlx_test_layer *from,
                                       mlx_test_layer *to) {
    const mg_mlx_linear *w = &from->w;
    size_t words = (size_t)w->experts * w->n * w->k * w->bits / 32;
    size_t groups = (size_t)w->experts * w->n * (w->k / w->group_size);
    *to = (mlx_test_layer){.w = *w};
    to->w.weight = mlx_test_upload(b, from->words, words * 4);
    to->w.scales = mlx_test_upload(b, from->scales, groups * 2);
    to->w.biases = mlx_test_upload(b, from->biases, groups * 2);
}

static inline void mlx_test_layer_free(mg_backend *b, mlx_test_layer *l) {
    mg_mlx_linear_free(b, &l->w);
    free(l->words);
    free(l->scales);
    free(l->biases);
    memset(l, 0, sizeof *l);
}

/* The exact weight [row, j] of expert e; *magnitude (when not NULL) gets |scale*q| + |bias|,
 * what the dequant's roundings are relative to. */
static inline double mlx_test_weight_parts(const mlx_test_layer *l, uint32_t e, uint32_t row,
                                           uint32_t j, double *magnitude) {
    const mg_mlx_linear *w = &l->w;
    uint32_t per = 32 / w->bits;
    size_t r = (size_t)e * w->n + row;
    uint32_t word = l->words[r * (w->k / per) + j / per];
    uint32_t q = (word >> ((j % per) * w->bits)) & ((1u << w->bits) - 1);
    size_t g = r * (w->k / w->group_size) + j / w->group_size;
    double sq = mlx_test_half_value(w->scale_type, l->scales[g]) * q;
    double bias = mlx_test_half_value(w->scale_type, l->biases[g]);
    if (magnitude)
        *magnitude = fabs(sq) + fabs(bias);
    return sq + bias;
}

static inline double mlx_test_weight(const mlx_test_layer *l, uint32_t e, uint32_t row,
                                     uint32_t j) {
    return mlx_test_weight_parts(l, e, row, j, NULL);
}

/* Random BF16 activations in about [-2, 2]. */
static inline uint16_t *mlx_test_activations(size_t count) {
    uint16_t *x = malloc(count * 2);
    for (size_t i = 0; i < count; i++)
        x[i] = mg_f32_to_bf16((float)((double)(test_rand() % 40001) / 10000.0 - 2.0));
    return x;
}

static inline mg_devptr mlx_test_poisoned(mg_backend *b, size_t bytes) {
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, bytes, &p));
    if (p)
        CHECK_OK(mg_memset(b, p, 0xff, bytes));
    return p;
}

static inline uint16_t *mlx_test_download(mg_backend *b, mg_devptr p, size_t bytes) {
    uint16_t *h = malloc(bytes);
    CHECK_OK(mg_copy_d2h(b, h, p, bytes));
    return h;
}

#endif

#ifndef METRALE_MLX_TEST_RUN
#define METRALE_MLX_TEST_RUN
/* One case's inputs (host) and every op's outputs (host, BF16). */
typedef struct mlx_test_case {
    uint32_t expert, m, m_gemm;
    uint16_t *x, *g, *u, *resid, *x_gemm; /* [m, k] ..., resid [m, n], x_gemm [m_gemm, k] */
} mlx_test_case;

typedef struct mlx_test_outputs {
    uint16_t *deq, *plain, *silu, *resid, *gate, *up, *gemm;
    uint16_t *silu_mul; /* gate_up with the SiLU-mul epilogue (mg_mlx_gemv_fused) */
} mlx_test_outputs;

static inline void mlx_test_case_make(mlx_test_case *c, const mg_mlx_linear *w, uint32_t m,
                                      uint32_t m_gemm) {
    c->expert = w->experts - 1;
    c->m = m;
    c->m_gemm = m_gemm;
    c->x = mlx_test_activations((size_t)m * w->k);
    c->g = mlx_test_activations((size_t)m * w->k);
    c->u = mlx_test_activations((size_t)m * w->k);
    c->resid = mlx_test_activations((size_t)m * w->n);
    c->x_gemm = mlx_test_activations((size_t)m_gemm * w->k);
}

static inline void mlx_test_case_free(mlx_test_case *c) {
    free(c->x);
    free(c->g);
    free(c->u);
    free(c->resid);
    free(c->x_gemm);
}

static inline void mlx_test_outputs_free(mlx_test_outputs *o) {
    uint16_t *all[] = {o->deq, o->plain, o->silu, o->resid, o->gate, o->up, o->gemm, o->silu_mul};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    memset(o, 0, sizeof *o);
}

/* Runs every op of `c` on `b` (outputs poisoned first): dequant, GEMV, silu_gate,
 * silu_gate_resid in place (resid is y), gate_up (gate = w, up = w2), gate_up with the SiLU-mul
 * epilogue, GEMM. */
static inline void mlx_test_run(mg_backend *b, const mg_mlx_linear *w, const mg_mlx_linear *w2,
                                const mlx_test_case *c, mlx_test_outputs *o) {
    size_t act = (size_t)c->m * w->k * 2, out = (size_t)c->m * w->n * 2;
    size_t act_gemm = (size_t)c->m_gemm * w->k * 2, out_gemm = (size_t)c->m_gemm * w->n * 2;
    mg_devptr x = mlx_test_upload(b, c->x, act), g = mlx_test_upload(b, c->g, act),
              u = mlx_test_upload(b, c->u, act), xg = mlx_test_upload(b, c->x_gemm, act_gemm);
    mg_devptr deq = mlx_test_poisoned(b, mg_mlx_gemm_scratch_bytes(w));
    mg_devptr y = mlx_test_poisoned(b, out), y2 = mlx_test_poisoned(b, out);
    mg_devptr yg = mlx_test_poisoned(b, out_gemm);
    CHECK_OK(mg_mlx_dequant(b, NULL, w, c->expert, deq));
    o->deq = mlx_test_download(b, deq, mg_mlx_gemm_scratch_bytes(w));
    CHECK_OK(mg_mlx_gemv(b, NULL, w, c->expert, c->m, x, y));
    o->plain = mlx_test_download(b, y, out);
    CHECK_OK(mg_memset(b, y, 0xff, out));
    CHECK_OK(mg_mlx_gemv_silu_gate(b, NULL, w, c->expert, c->m, g, u, y));
    o->silu = mlx_test_download(b, y, out);
    CHECK_OK(mg_copy_h2d(b, y, c->resid, out));
    CHECK_OK(mg_mlx_gemv_silu_gate_resid(b, NULL, w, c->expert, c->m, g, u, y, y));
    o->resid = mlx_test_download(b, y, out);
    CHECK_OK(mg_memset(b, y, 0xff, out));
    CHECK_OK(mg_mlx_gemv_gate_up(b, NULL, w, w2, c->expert, c->m, x, y, y2));
    o->gate = mlx_test_download(b, y, out);
    o->up = mlx_test_download(b, y2, out);
    CHECK_OK(mg_memset(b, y, 0xff, out));
    const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
    const mg_gemm_fusion_tensors none = {0};
    CHECK_OK(mg_mlx_gemv_fused(b, NULL, w, w2, c->expert, c->m, x, y, &silu_mul, &none));
    o->silu_mul = mlx_test_download(b, y, out);
    CHECK_OK(mg_mlx_gemm(b, NULL, w, c->expert, c->m_gemm, xg, yg, deq));
    o->gemm = mlx_test_download(b, yg, out_gemm);
    mg_devptr all[] = {x, g, u, xg, deq, y, y2, yg};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        mg_free(b, all[i]);
}

/* silu(gate) * up of two BF16 values, rounded to BF16: mg_silu_mul_bf16's definition
 * (metrale/ops_activation.h), FP32 arithmetic with expf. */
static inline uint16_t mlx_test_silu_mul(uint16_t gate, uint16_t up) {
    const float g = mg_bf16_to_f32(gate);
    return mg_f32_to_bf16(g / (1.0f + expf(-g)) * mg_bf16_to_f32(up));
}

/* The SiLU-mul epilogue's output `got` [count] against the SiLU-mul of the same backend's
 * gate_up products: equal, or (ulps = 1, a device whose expf may differ from the host's by an
 * ulp) at most one BF16 step apart. */
static inline void mlx_test_check_silu_mul(const char *what, const uint16_t *got,
                                           const uint16_t *gate, const uint16_t *up, size_t count,
                                           int ulps) {
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        const uint16_t want = mlx_test_silu_mul(gate[i], up[i]);
        const int step = (int)(got[i] & 0x7fff) - (int)(want & 0x7fff);
        const bool near = (got[i] & 0x8000) == (want & 0x8000) && step <= ulps && step >= -ulps;
        if (!(got[i] == want || (near && (got[i] & 0x7f80) != 0x7f80)) && bad++ < 3)
            fprintf(stderr, "FAIL %s [%zu]: 0x%04x, want 0x%04x (gate 0x%04x up 0x%04x)\n", what, i,
                    got[i], want, gate[i], up[i]);
    }
    test_checks++;
    test_failures += bad != 0;
}

/* got (BF16 [rows, n]) against want (per element) within 2^-7 |want| + 2^-shift * spread
 * (spread: sum |w a| of the element); prints the first few misses. */
static inline void mlx_test_compare(const char *what, const uint16_t *got, const double *want,
                                    const double *spread, size_t count, int shift) {
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        double have = mg_bf16_to_f32(got[i]);
        double tol = ldexp(fabs(want[i]), -7) + ldexp(spread[i], -shift);
        if (!(fabs(have - want[i]) <= tol) && bad++ < 3)
            fprintf(stderr, "FAIL %s [%zu]: %.8g, want %.8g (tolerance %.3g)\n", what, i, have,
                    want[i], tol);
    }
    test_checks++;
    test_failures += bad != 0;
}
#endif
