/* test_gemm_cpu.c - the FP8 E4M3 conversions, the FP8 quantizer and scale layouts, and the
 * reference GEMMs against float64 on random awkward shapes; then the "gemm" check group on
 * the CPU backend (the ops' dispatch, argument checks and reference kernels). Runs without a
 * GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gemm_reference.h"
#include "metrale/dtype.h"
#include "metrale/ops_gemm.h"
#include "metrale/status.h"
#include "utils_test_support.h" /* CHECKF; test_util.h */

/* ------------------------------------------------------------------ random inputs */

/* Uniform in [-1, 1). */
static float rng_unit(void) {
    return (float)((double)(test_rand() >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static uint32_t rng_below(uint32_t n) {
    return (uint32_t)(test_rand() % n);
}

static uint16_t *random_bf16(size_t count, float magnitude) {
    uint16_t *v = malloc(count * sizeof *v);
    for (size_t i = 0; i < count; i++)
        v[i] = mg_f32_to_bf16(rng_unit() * magnitude);
    return v;
}

static void *poisoned(size_t bytes) {
    unsigned char *p = malloc(bytes);
    memset(p, 0xa5, bytes);
    return p;
}

/* ------------------------------------------------------------------ E4M3 */

/* Independent decode from the format's definition, in double. */
static double e4m3_value(int code) {
    int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
    double v = e == 0 ? m / 8.0 * pow(2.0, -6) : (1.0 + m / 8.0) * pow(2.0, e - 7);
    return sign ? -v : v;
}

/* Nearest finite code by exhaustive search; ties go to the even code (even mantissa), values
 * beyond 448 saturate. */
static uint8_t e4m3_nearest(double x) {
    int sign = signbit(x) ? 0x80 : 0;
    double a = fabs(x);
    if (a >= 448.0)
        return (uint8_t)(sign | 0x7e);
    int best = 0;
    double best_d = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        double d = fabs(e4m3_value(c) - a);
        if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1))) {
            best = c;
            best_d = d;
        }
    }
    return (uint8_t)(sign | best);
}

static void test_e4m3_all_codes(void) {
    int nan_codes = 0;
    for (int c = 0; c < 256; c++) {
        float f = mg_fp8_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            nan_codes++;
            CHECKF(isnan(f), "code 0x%02x decodes to %g, want NaN", c, f);
            CHECKF((mg_f32_to_fp8_e4m3(f) & 0x7f) == 0x7f, "NaN code 0x%02x re-encodes to 0x%02x",
                   c, mg_f32_to_fp8_e4m3(f));
            continue;
        }
        CHECKF((double)f == e4m3_value(c), "code 0x%02x decodes to %.9g, want %.9g", c, f,
               e4m3_value(c));
        CHECKF((signbit(f) != 0) == ((c & 0x80) != 0), "code 0x%02x sign", c);
        CHECKF(mg_f32_to_fp8_e4m3(f) == c, "code 0x%02x round-trips to 0x%02x", c,
               mg_f32_to_fp8_e4m3(f));
    }
    CHECKF(nan_codes == 2, "%d NaN codes", nan_codes);
    CHECKF(mg_fp8_e4m3_to_f32(0x7e) == MG_FP8_E4M3_MAX, "max %g", mg_fp8_e4m3_to_f32(0x7e));
    CHECKF(mg_fp8_e4m3_to_f32(0x01) == 0x1p-9f, "smallest subnormal %g", mg_fp8_e4m3_to_f32(1));
}

static void test_e4m3_encode_rounding(void) {
    /* Midpoints between neighbours and one float ulp either side, for every adjacent pair of
     * finite positive codes, both signs. */
    for (int c = 0; c < 0x7e; c++) {
        double lo = e4m3_value(c), hi = e4m3_value(c + 1);
        float mid = (float)((lo + hi) / 2);
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; i++)
            for (int s = 0; s < 2; s++) {
                float x = s ? -probes[i] : probes[i];
                CHECKF(mg_f32_to_fp8_e4m3(x) == e4m3_nearest(x),
                       "encode(%.9g) = 0x%02x, want 0x%02x", x, mg_f32_to_fp8_e4m3(x),
                       e4m3_nearest(x));
            }
    }
    /* Random magnitudes over the whole range, including float subnormals and saturation. */
    for (int i = 0; i < 20000; i++) {
        float x = ldexpf(rng_unit(), (int)rng_below(40) - 30);
        CHECKF(mg_f32_to_fp8_e4m3(x) == e4m3_nearest(x), "encode(%.9g) = 0x%02x, want 0x%02x", x,
               mg_f32_to_fp8_e4m3(x), e4m3_nearest(x));
    }
    CHECKF(mg_f32_to_fp8_e4m3(INFINITY) == 0x7e, "inf saturates");
    CHECKF(mg_f32_to_fp8_e4m3(-INFINITY) == 0xfe, "-inf saturates");
    CHECKF(mg_f32_to_fp8_e4m3(1e30f) == 0x7e, "1e30 saturates");
    CHECKF(mg_f32_to_fp8_e4m3(463.9f) == 0x7e, "463.9 rounds to 448");
    CHECKF(mg_f32_to_fp8_e4m3(-0.0f) == 0x80, "-0 keeps its sign");
    CHECKF(mg_f32_to_fp8_e4m3(NAN) == 0x7f, "NaN");
    CHECKF(mg_f32_to_fp8_e4m3(0x1p-11f) == 0x00, "2^-11 rounds to 0 (tie to even)");
    CHECKF(mg_f32_to_fp8_e4m3(0x1.8p-10f) == 0x01, "3*2^-11 rounds to 2^-9");
}

/* ------------------------------------------------------------------ scale layouts */

static void test_scale_layout_math(void) {
    CHECKF(mg_fp8_k_blocks(1) == 1 && mg_fp8_k_blocks(128) == 1 && mg_fp8_k_blocks(129) == 2,
           "k_blocks");
    CHECKF(mg_fp8_k_blocks(0xffffffffu) == 33554432u, "k_blocks at the top of the range");
    CHECKF(mg_fp8_rows_padded(1) == 4 && mg_fp8_rows_padded(4) == 4 &&
               mg_fp8_rows_padded(130) == 132,
           "rows_padded");
    /* 1x128: [L, rows], rows contiguous. */
    CHECKF(mg_fp8_block_scale_count(MG_FP8_BLOCK_1X128, 8, 300) == 24, "1x128 count");
    CHECKF(mg_fp8_block_scale_index(MG_FP8_BLOCK_1X128, 8, 300, 5, 2) == 21, "1x128 index");
    /* 128x128: [ceil(rows/128), L4]; K = 600 -> L = 5, L4 = 8. */
    CHECKF(mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, 300, 600) == 24, "128x128 count");
    CHECKF(mg_fp8_block_scale_index(MG_FP8_BLOCK_128X128, 300, 600, 257, 4) == 20, "128x128 index");
    CHECKF(mg_fp8_block_scale_index(MG_FP8_BLOCK_128X128, 300, 600, 127, 0) == 0,
           "rows of one block share a scale");
    CHECKF(mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, 128, 512) == 4, "no padding at L=4");

    /* Every (row, block) lands inside the tensor; 1x128 is a bijection. */
    for (int trial = 0; trial < 50; trial++) {
        uint32_t rows = 1 + rng_below(400), k = 1 + rng_below(1200);
        for (int mode = 0; mode < 2; mode++) {
            size_t count = mg_fp8_block_scale_count((mg_fp8_block_scale)mode, rows, k);
            unsigned char *seen = calloc(count, 1);
            for (uint32_t r = 0; r < rows; r++)
                for (uint32_t g = 0; g < mg_fp8_k_blocks(k); g++) {
                    size_t i = mg_fp8_block_scale_index((mg_fp8_block_scale)mode, rows, k, r, g);
                    CHECKF(i < count, "mode %d rows %u k %u: index %zu >= %zu", mode, rows, k, i,
                           count);
                    if (i < count)
                        seen[i]++;
                }
            if (mode == MG_FP8_BLOCK_1X128)
                for (size_t i = 0; i < count; i++)
                    CHECKF(seen[i] == 1, "1x128 rows %u k %u: slot %zu used %d times", rows, k, i,
                           seen[i]);
            free(seen);
        }
    }
}

static void test_act_scales_transpose(void) {
    for (int trial = 0; trial < 20; trial++) {
        uint32_t m = 1 + rng_below(200), k = 1 + rng_below(1000);
        uint32_t m_pad = mg_fp8_rows_padded(m) + 4 * rng_below(3);
        uint32_t blocks = mg_fp8_k_blocks(k);
        float *src = malloc((size_t)m * blocks * sizeof *src);
        for (size_t i = 0; i < (size_t)m * blocks; i++)
            src[i] = rng_unit();
        size_t count = (size_t)blocks * m_pad;
        float *dst = poisoned((count + 8) * sizeof *dst);
        float guard;
        memcpy(&guard, (unsigned char *)dst + count * sizeof *dst, sizeof guard);
        mg_fp8_act_scales_transpose_cpu(m, m_pad, k, src, dst);
        for (uint32_t g = 0; g < blocks; g++)
            for (uint32_t t = 0; t < m_pad; t++) {
                float want = t < m ? src[(size_t)t * blocks + g] : 0.0f;
                float got = dst[mg_fp8_block_scale_index(MG_FP8_BLOCK_1X128, m_pad, k, t, g)];
                CHECKF(memcmp(&got, &want, sizeof got) == 0, "m %u k %u t %u g %u: %g want %g", m,
                       k, t, g, got, want);
            }
        for (int i = 0; i < 8; i++)
            CHECKF(memcmp(&dst[count + i], &guard, sizeof guard) == 0,
                   "transpose wrote past its end");
        free(src);
        free(dst);
    }
}

/* ------------------------------------------------------------------ quantizer */

/* |decode(q) * scale - x| within half an E4M3 ulp of x (relative 2^-4), or of the subnormal
 * spacing scale * 2^-9 / 2. */
static void expect_quantized(const uint16_t *x, const uint8_t *q, size_t i, float scale,
                             const char *what) {
    double v = mg_bf16_to_f32(x[i]);
    double back = (double)mg_fp8_e4m3_to_f32(q[i]) * scale;
    double bound = fmax(fabs(v) * 0x1p-4, scale * 0x1p-10) * (1 + 1e-6);
    CHECKF(fabs(back - v) <= bound, "%s element %zu: %g -> %g (scale %g)", what, i, v, back, scale);
}

static void test_quantizers(void) {
    for (int trial = 0; trial < 10; trial++) {
        uint32_t rows = 1 + rng_below(300), cols = 1 + rng_below(700);
        size_t count = (size_t)rows * cols;
        float magnitude = ldexpf(1.0f, (int)rng_below(30) - 15);
        uint16_t *x = random_bf16(count, magnitude);
        if (rows > 2) /* an all-zero row: its group scale is 1 and its codes are 0 */
            memset(x + cols, 0, cols * sizeof *x);
        uint8_t *q = poisoned(count);
        uint32_t blocks = mg_fp8_k_blocks(cols);

        float tensor_scale = -1;
        CHECKF(mg_fp8_quantize_tensorwise(x, rows, cols, q, &tensor_scale) == MG_OK, "%s",
               mg_last_error());
        float amax = 0;
        for (size_t i = 0; i < count; i++)
            amax = fmaxf(amax, fabsf(mg_bf16_to_f32(x[i])));
        CHECKF(tensor_scale == amax / 448.0f, "tensor scale %g, amax %g", tensor_scale, amax);
        int at_max = 0;
        for (size_t i = 0; i < count; i++) {
            expect_quantized(x, q, i, tensor_scale, "tensorwise");
            at_max += (q[i] & 0x7f) == 0x7e;
        }
        CHECKF(at_max >= 1, "the amax element quantizes to 448");

        float *row_scales = malloc(rows * sizeof *row_scales);
        CHECKF(mg_fp8_quantize_rowwise(x, rows, cols, q, row_scales) == MG_OK, "%s",
               mg_last_error());
        for (size_t i = 0; i < count; i++)
            expect_quantized(x, q, i, row_scales[i / cols], "rowwise");
        if (rows > 2) {
            CHECKF(row_scales[1] == 1.0f, "all-zero row scale %g", row_scales[1]);
            for (uint32_t c = 0; c < cols; c++)
                CHECKF(q[cols + c] == 0, "zero row code 0x%02x", q[cols + c]);
        }

        float *block_scales = malloc((size_t)rows * blocks * sizeof *block_scales);
        CHECKF(mg_fp8_quantize_1x128(x, rows, cols, q, block_scales) == MG_OK, "%s",
               mg_last_error());
        for (size_t i = 0; i < count; i++)
            expect_quantized(x, q, i,
                             block_scales[(i / cols) * blocks + (i % cols) / MG_FP8_SCALE_BLOCK],
                             "1x128");

        size_t tile_count = mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, rows, cols);
        float *tile_scales = poisoned(tile_count * sizeof *tile_scales);
        CHECKF(mg_fp8_quantize_128x128(x, rows, cols, q, tile_scales) == MG_OK, "%s",
               mg_last_error());
        for (size_t i = 0; i < count; i++)
            expect_quantized(x, q, i,
                             tile_scales[mg_fp8_block_scale_index(
                                 MG_FP8_BLOCK_128X128, rows, cols, (uint32_t)(i / cols),
                                 (uint32_t)(i % cols) / MG_FP8_SCALE_BLOCK)],
                             "128x128");
        uint32_t l4 = (uint32_t)(tile_count / mg_fp8_k_blocks(rows));
        for (size_t i = 0; i < tile_count; i++)
            if (i % l4 >= blocks)
                CHECKF(tile_scales[i] == 0.0f, "padding column %zu is %g", i, tile_scales[i]);
        free(x);
        free(q);
        free(row_scales);
        free(block_scales);
        free(tile_scales);
    }
}

static void test_quantizer_bad_input(void) {
    uint16_t x[4] = {0};
    uint8_t q[4];
    float s[4];
    mg_clear_error();
    CHECKF(mg_fp8_quantize_rowwise(NULL, 2, 2, q, s) == MG_ERR_INVALID_ARGUMENT, "NULL input");
    CHECKF(strstr(mg_last_error(), "mg_fp8_quantize_rowwise") && strstr(mg_last_error(), "input"),
           "message: %s", mg_last_error());
    CHECKF(mg_fp8_quantize_1x128(x, 2, 2, q, NULL) == MG_ERR_INVALID_ARGUMENT, "NULL scales");
    CHECKF(strstr(mg_last_error(), "scales"), "message: %s", mg_last_error());
    memset(q, 0x5a, sizeof q);
    CHECKF(mg_fp8_quantize_tensorwise(x, 0, 2, q, s) == MG_ERR_INVALID_ARGUMENT, "empty shape");
    CHECKF(strstr(mg_last_error(), "0 x 2"), "message: %s", mg_last_error());
    CHECKF(q[0] == 0x5a && q[3] == 0x5a, "nothing written on error");
    CHECKF(mg_fp8_quantize_128x128(x, 2, 0, q, s) == MG_ERR_INVALID_ARGUMENT, "empty shape");
}

/* ------------------------------------------------------------------ reference GEMMs */

/* Per-element bound for an FP32-accumulated dot product of K terms whose magnitudes sum to
 * `abs_sum`, rounded once to the output type. */
static double gemm_bound(uint32_t k, double abs_sum, double ref, mg_dtype out_type) {
    double accumulate = (k + 2) * 0x1p-24 * abs_sum;
    double round = out_type == MG_DTYPE_BF16 ? fabs(ref) * 0x1p-8 : fabs(ref) * 0x1p-24;
    return accumulate + round + 1e-30;
}

static float read_output(const void *out, mg_dtype t, size_t i) {
    return t == MG_DTYPE_F32 ? ((const float *)out)[i] : mg_bf16_to_f32(((const uint16_t *)out)[i]);
}

/* Checks out against a float64 reference computed by `ref(t, j, &abs_sum)`; the padding
 * columns [n, ldc) must still hold the poison. */
typedef double (*ref_fn)(void *ctx, uint32_t t, uint32_t j, double *abs_sum);

static void check_output(const char *what, uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                         const void *out, mg_dtype out_type, ref_fn ref, void *ctx) {
    size_t esize = mg_dtype_bytes(out_type);
    unsigned char poison[4];
    memset(poison, 0xa5, sizeof poison);
    double worst = 0;
    for (uint32_t t = 0; t < m; t++) {
        for (uint32_t j = 0; j < n; j++) {
            double abs_sum;
            double want = ref(ctx, t, j, &abs_sum);
            double got = read_output(out, out_type, (size_t)t * ldc + j);
            double err = fabs(got - want), bound = gemm_bound(k, abs_sum, want, out_type);
            if (err > bound * worst || worst == 0)
                worst = fmax(worst, err / bound);
            if (err > bound) {
                CHECKF(err <= bound, "%s m %u n %u k %u: out[%u,%u] = %.9g, want %.9g (bound %g)",
                       what, m, n, k, t, j, got, want, bound);
                return;
            }
        }
        for (uint32_t j = n; j < ldc; j++)
            CHECKF(memcmp((const unsigned char *)out + ((size_t)t * ldc + j) * esize, poison,
                          esize) == 0,
                   "%s: padding column %u of row %u was written", what, j, t);
    }
}

typedef struct bf16_case {
    const uint16_t *act, *weight;
    uint32_t k;
} bf16_case;

static double bf16_ref(void *ctx, uint32_t t, uint32_t j, double *abs_sum) {
    const bf16_case *c = ctx;
    double acc = 0, s = 0;
    for (uint32_t i = 0; i < c->k; i++) {
        double p = (double)mg_bf16_to_f32(c->act[(size_t)t * c->k + i]) *
                   mg_bf16_to_f32(c->weight[(size_t)j * c->k + i]);
        acc += p;
        s += fabs(p);
    }
    *abs_sum = s;
    return acc;
}

static void test_gemm_bf16_reference(void) {
    for (int trial = 0; trial < 12; trial++) {
        uint32_t m = 1 + rng_below(40), n = 1 + rng_below(70), k = 1 + rng_below(600);
        uint32_t ldc = n + rng_below(5);
        mg_dtype out_type = trial % 2 ? MG_DTYPE_F32 : MG_DTYPE_BF16;
        uint16_t *act = random_bf16((size_t)m * k, 3.0f),
                 *weight = random_bf16((size_t)n * k, 0.5f);
        void *out = poisoned((size_t)m * ldc * mg_dtype_bytes(out_type));
        mg_gemm_bf16_cpu(m, n, k, act, weight, out, out_type, ldc);
        bf16_case c = {act, weight, k};
        check_output(out_type == MG_DTYPE_F32 ? "bf16->f32" : "bf16->bf16", m, n, k, ldc, out,
                     out_type, bf16_ref, &c);
        free(act);
        free(weight);
        free(out);
    }
}

typedef struct fp8_case {
    mg_fp8_operand_host act, weight;
    uint32_t m, n, k;
} fp8_case;

/* Float64 reference written from the definitions in metrale/ops_gemm.h, not from gemm_reference.c:
 * every product scaled individually. */
static double fp8_scale(const mg_fp8_operand_host *op, uint32_t rows, uint32_t k, uint32_t r,
                        uint32_t i) {
    uint32_t g = i / 128, l4 = (mg_fp8_k_blocks(k) + 3) / 4 * 4;
    switch (op->scaling) {
    case MG_FP8_SCALING_TENSOR:
        return op->scales[0];
    case MG_FP8_SCALING_ROW:
        return op->scales[r];
    case MG_FP8_SCALING_1X128:
        return op->scales[(size_t)g * rows + r];
    case MG_FP8_SCALING_128X128:
        return op->scales[(size_t)(r / 128) * l4 + g];
    }
    return NAN;
}

static double fp8_ref(void *ctx, uint32_t t, uint32_t j, double *abs_sum) {
    const fp8_case *c = ctx;
    double acc = 0, s = 0;
    for (uint32_t i = 0; i < c->k; i++) {
        double p = (double)mg_fp8_e4m3_to_f32(c->act.codes[(size_t)t * c->k + i]) *
                   fp8_scale(&c->act, c->m, c->k, t, i) *
                   mg_fp8_e4m3_to_f32(c->weight.codes[(size_t)j * c->k + i]) *
                   fp8_scale(&c->weight, c->n, c->k, j, i);
        acc += p;
        s += fabs(p);
    }
    *abs_sum = s;
    return acc;
}

static uint8_t *random_fp8(size_t count) {
    uint8_t *v = malloc(count);
    for (size_t i = 0; i < count; i++) {
        v[i] = (uint8_t)test_rand();
        if ((v[i] & 0x7f) == 0x7f)
            v[i] ^= 1; /* no NaN inputs */
    }
    return v;
}

static float *random_scales(size_t count) {
    float *v = malloc(count * sizeof *v);
    for (size_t i = 0; i < count; i++)
        v[i] = ldexpf(1.0f + rng_unit() * 0.5f, -(int)rng_below(12));
    return v;
}

static size_t scale_count(mg_fp8_scaling s, uint32_t rows, uint32_t k) {
    switch (s) {
    case MG_FP8_SCALING_TENSOR:
        return 1;
    case MG_FP8_SCALING_ROW:
        return rows;
    case MG_FP8_SCALING_1X128:
        return mg_fp8_block_scale_count(MG_FP8_BLOCK_1X128, rows, k);
    case MG_FP8_SCALING_128X128:
        return mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, rows, k);
    }
    return 0;
}

static void test_gemm_fp8_reference(void) {
    static const mg_fp8_scaling pairs[][2] = {
        {MG_FP8_SCALING_TENSOR, MG_FP8_SCALING_TENSOR},
        {MG_FP8_SCALING_ROW, MG_FP8_SCALING_ROW},
        {MG_FP8_SCALING_1X128, MG_FP8_SCALING_1X128},
        {MG_FP8_SCALING_1X128, MG_FP8_SCALING_128X128},
        {MG_FP8_SCALING_128X128, MG_FP8_SCALING_1X128},
    };
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (int trial = 0; trial < 3; trial++) {
            uint32_t m = 1 + rng_below(150), n = 1 + rng_below(150), k = 1 + rng_below(700);
            uint32_t ldc = n + rng_below(9);
            fp8_case c = {{random_fp8((size_t)m * k), NULL, pairs[p][0]},
                          {random_fp8((size_t)n * k), NULL, pairs[p][1]},
                          m,
                          n,
                          k};
            c.act.scales = random_scales(scale_count(pairs[p][0], m, k));
            c.weight.scales = random_scales(scale_count(pairs[p][1], n, k));
            uint16_t *out = poisoned((size_t)m * ldc * 2);
            mg_gemm_fp8_cpu(m, n, k, c.act, c.weight, out, ldc);
            char what[64];
            snprintf(what, sizeof what, "fp8 scaling %d/%d", pairs[p][0], pairs[p][1]);
            check_output(what, m, n, k, ldc, out, MG_DTYPE_BF16, fp8_ref, &c);
            free((void *)c.act.codes);
            free((void *)c.weight.codes);
            free((void *)c.act.scales);
            free((void *)c.weight.scales);
            free(out);
        }
}

/* The layout trap: feeding a 1x128 GEMM the quantizer's [M, L] scales instead of the
 * transposed [L, M] layout runs without complaint and is wrong by far more than FP8 error. */
static void test_untransposed_scales_trap(void) {
    uint32_t m = 64, n = 96, k = 1024, blocks = mg_fp8_k_blocks(k);
    uint16_t *x = random_bf16((size_t)m * k, 1.0f), *w = random_bf16((size_t)n * k, 1.0f);
    for (uint32_t t = 0; t < m; t++) /* magnitudes that differ per token and block */
        for (uint32_t g = 0; g < blocks; g++) {
            float magnitude = ldexpf(1.0f, (int)rng_below(7));
            for (uint32_t i = g * 128; i < (g + 1) * 128; i++)
                x[(size_t)t * k + i] =
                    mg_f32_to_bf16(mg_bf16_to_f32(x[(size_t)t * k + i]) * magnitude);
        }
    uint8_t *xq = malloc((size_t)m * k), *wq = malloc((size_t)n * k);
    float *natural = malloc((size_t)m * blocks * sizeof(float));
    float *transposed = malloc((size_t)m * blocks * sizeof(float));
    float *ws = malloc(mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, n, k) * sizeof(float));
    mg_fp8_quantize_1x128(x, m, k, xq, natural);
    mg_fp8_quantize_128x128(w, n, k, wq, ws);
    mg_fp8_act_scales_transpose_cpu(m, m, k, natural, transposed);
    uint16_t *good = malloc((size_t)m * n * 2), *bad = malloc((size_t)m * n * 2);
    float *exact = malloc((size_t)m * n * sizeof(float));
    mg_fp8_operand_host wop = {wq, ws, MG_FP8_SCALING_128X128};
    mg_gemm_fp8_cpu(m, n, k, (mg_fp8_operand_host){xq, transposed, MG_FP8_SCALING_1X128}, wop, good,
                    n);
    mg_gemm_fp8_cpu(m, n, k, (mg_fp8_operand_host){xq, natural, MG_FP8_SCALING_1X128}, wop, bad, n);
    mg_gemm_bf16_cpu(m, n, k, x, w, exact, MG_DTYPE_F32, n);
    double e_good = 0, e_bad = 0, norm = 0;
    for (size_t i = 0; i < (size_t)m * n; i++) {
        e_good += pow(mg_bf16_to_f32(good[i]) - exact[i], 2);
        e_bad += pow(mg_bf16_to_f32(bad[i]) - exact[i], 2);
        norm += pow(exact[i], 2);
    }
    e_good = sqrt(e_good / norm);
    e_bad = sqrt(e_bad / norm);
    printf("layout trap: relative error %.2e with transposed scales, %.2e untransposed\n", e_good,
           e_bad);
    CHECKF(e_good < 0.05, "FP8 error with the right layout %.3g", e_good);
    CHECKF(e_bad > 10 * e_good, "the wrong layout should be visibly wrong: %.3g vs %.3g", e_bad,
           e_good);
    free(x), free(w), free(xq), free(wq), free(natural), free(transposed), free(ws), free(good),
        free(bad), free(exact);
}

/* The ops through the public API on the CPU backend: the "gemm" check group, whose
 * reference is the backend itself. */
static void test_gemm_checks_on_cpu_backend(void) {
    mg_backend *b = NULL;
    CHECKF(mg_backend_open(MG_BACKEND_CPU, 0, &b) == MG_OK, "open: %s", mg_last_error());
    if (!b)
        return;
    int passed = 0, skipped = 0;
    int failed = mg_check_run_all(b, "gemm/", stdout, &passed, &skipped);
    CHECKF(failed == 0 && passed >= 10, "%d gemm checks failed, %d passed", failed, passed);
    CHECKF(mg_backend_close(b) == MG_OK, "close: %s", mg_last_error());
}

/* Operands that overrun their buffers are rejected before anything runs, and the output's
 * neighbours are untouched. */
static void test_gemm_operand_ranges(void) {
    mg_backend *b = NULL;
    if (mg_backend_open(MG_BACKEND_CPU, 5, &b) != MG_OK) {
        CHECK(0);
        return;
    }
    uint32_t m = 3, n = 5, k = 7, ldc = 9;
    mg_devptr act = 0, weight = 0, out = 0;
    CHECK(mg_alloc(b, (size_t)m * k * 2, &act) == MG_OK);
    CHECK(mg_alloc(b, (size_t)n * k * 2 - 2, &weight) == MG_OK); /* one element short */
    size_t out_bytes = ((size_t)(m - 1) * ldc + n) * 4;
    CHECK(mg_alloc(b, out_bytes, &out) == MG_OK);
    CHECK(mg_gemm_bf16(b, NULL, m, n, k, act, weight, out, MG_DTYPE_F32, ldc) ==
          MG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mg_last_error(), "weight") && strstr(mg_last_error(), "overruns"));
    /* The last output row needs only N elements, not a whole ldc: this fits exactly. */
    mg_devptr weight_ok = 0;
    CHECK(mg_alloc(b, (size_t)n * k * 2, &weight_ok) == MG_OK);
    CHECK(mg_memset(b, act, 0x3c, (size_t)m * k * 2) == MG_OK);
    CHECK(mg_memset(b, weight_ok, 0x3c, (size_t)n * k * 2) == MG_OK);
    CHECK(mg_gemm_bf16(b, NULL, m, n, k, act, weight_ok, out, MG_DTYPE_F32, ldc) == MG_OK);
    CHECK(mg_gemm_bf16(b, NULL, m + 1, n, k, act, weight_ok, out, MG_DTYPE_F32, ldc) ==
          MG_ERR_INVALID_ARGUMENT);
    /* The scale transpose checks both of its buffers: [M, L] in, [L, M_pad] out. */
    mg_devptr scales = 0, scales_t = 0;
    uint32_t tm = 5, tm_pad = 8, tk = 300; /* L = 3 */
    CHECK(mg_alloc(b, (size_t)tm * 3 * 4, &scales) == MG_OK);
    CHECK(mg_alloc(b, (size_t)tm_pad * 3 * 4 - 4, &scales_t) == MG_OK); /* one short */
    CHECK(mg_fp8_act_scales_transpose(b, NULL, tm, tm_pad, tk, scales, scales_t) ==
          MG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mg_last_error(), "dst") && strstr(mg_last_error(), "overruns"));
    CHECK(mg_fp8_act_scales_transpose(b, NULL, tm + 1, tm_pad, tk, scales, scales_t + 64) ==
          MG_ERR_INVALID_ARGUMENT);
    /* Shapes whose spans overflow 64 bits are refused, not wrapped into small spans. */
    CHECK(mg_gemm_bf16(b, NULL, 0x80000001u, 1, 1, act, weight_ok, out, MG_DTYPE_F32,
                       0x80000000u) == MG_ERR_INVALID_ARGUMENT);
    CHECK(mg_gemm_bf16(b, NULL, 0xffffffffu, 0xffffffffu, 0xffffffffu, act, weight_ok, out,
                       MG_DTYPE_BF16, 0xffffffffu) == MG_ERR_INVALID_ARGUMENT);
    CHECK(mg_backend_close(b) == MG_OK);
}

int main(void) {
    test_seed();
    test_e4m3_all_codes();
    test_e4m3_encode_rounding();
    test_scale_layout_math();
    test_act_scales_transpose();
    test_quantizers();
    test_quantizer_bad_input();
    test_gemm_bf16_reference();
    test_gemm_fp8_reference();
    test_untransposed_scales_trap();
    test_gemm_checks_on_cpu_backend();
    test_gemm_operand_ranges();
    return test_finish();
}
