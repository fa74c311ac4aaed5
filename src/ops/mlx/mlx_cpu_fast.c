/* mlx_cpu_fast.c - the fast CPU kernels of the MLX ops (mlx_cpu_fast.h): dequant, the GEMV and
 * the gate/up GEMV pair, in an AVX2 + FMA + F16C version and a portable one.
 *
 * The GEMV splits each output as the reference does, per group g of the row:
 *     y = sum_g scale_g * (sum_j code_j * a_j) + bias_g * (sum_j a_j)
 * The activations a (FP32) and their per-group sums are formed once per call, before the rows
 * are shared out over the cores in blocks of ROWS; the codes are unpacked to FP32 eight at a
 * time and never stored. The group sums of a are kept as eight lane sums (lane l: the elements
 * stored at j0 + l, j0 + l + 8, ...), which is what the AVX2 code multiplies by the bias as a
 * vector.
 *
 * For 4-bit codes the AVX2 kernel stores a split: each chunk of 16 elements as [the 8 even
 * ones][the 8 odd ones], so that 8 bytes of a row (16 codes) widened to 8 lanes give the even
 * codes in their low nibbles and the odd ones in their high nibbles, with no shuffle (k is a
 * multiple of the group size, itself a multiple of 32). The AVX-512 kernel does the same with
 * chunks of 32 (16 bytes widened to 16 lanes). */
#include "mlx_cpu_fast.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_isa.h"
#include "cpu_kernels.h"
#include "error.h"
#include "host_parallel.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "mlx_reference.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define HAVE_X86_TARGETS 1
#include <immintrin.h>
#endif

#define ROWS 4  /* weight rows per block: the unit the threads share out */
#define LANES 8 /* lanes of the activations' group sums */

bool mg_mlx_cpu_avx2_built(void) {
#ifdef HAVE_X86_TARGETS
    return true;
#else
    return false;
#endif
}

/* ------------------------------------------------------------------ layers and activations */

typedef mg_mlx_cpu_layer layer;

static float scale_value(const layer *w, const uint16_t *p, size_t i) {
    return w->scale_type == MG_MLX_SCALE_F16 ? mg_f16_to_f32(p[i]) : mg_bf16_to_f32(p[i]);
}

/* The reference's SiLU-gated activation (mlx_reference.c): the same operations, so the same
 * BF16 value. */
static float silu_gate_value(uint16_t g, uint16_t u) {
    float gf = mg_bf16_to_f32(g);
    return mg_bf16_to_f32(mg_f32_to_bf16(gf / (1.0f + expf(-gf)) * mg_bf16_to_f32(u)));
}

typedef struct gemv_job {
    const layer *w[2]; /* one layer, or gate and up */
    uint16_t *y[2];
    uint32_t layers, m, blocks; /* blocks per layer */
    const float *act;           /* [m][k] */
    const float *xs;            /* [m][groups][LANES] */
    const uint16_t *resid;
} gemv_job;

#define SPLIT 16        /* elements per split chunk of the AVX2 kernel (above) */
#define SPLIT_AVX512 32 /* and of the AVX-512 one */

/* Where element j of a row is stored: j itself (split 0), or its place in a split layout of
 * chunks of `split` elements. */
static size_t stored_at(uint32_t j, uint32_t split) {
    if (!split)
        return j;
    const uint32_t e = j % split;
    return j - e + (e % 2) * (split / 2) + e / 2;
}

/* act and xs of gemv_job for m token rows (act in the split layout of chunks of `split`, or as
 * it is for 0); false when out of host memory. */
static bool activations(const layer *w, uint32_t m, const uint16_t *x, const uint16_t *u,
                        uint32_t split, float **act_out, float **xs_out) {
    const uint32_t k = w->k, groups = k / w->group_size;
    float *act = malloc((size_t)m * k * sizeof *act);
    float *xs = calloc((size_t)m * groups * LANES, sizeof *xs);
    if (!act || !xs) {
        free(act);
        free(xs);
        return false;
    }
    for (uint32_t t = 0; t < m; t++)
        for (uint32_t j = 0; j < k; j++) {
            const size_t i = (size_t)t * k + j;
            act[(size_t)t * k + stored_at(j, split)] =
                u ? silu_gate_value(x[i], u[i]) : mg_bf16_to_f32(x[i]);
        }
    for (uint32_t t = 0; t < m; t++)
        for (uint32_t j = 0; j < k; j++)
            xs[((size_t)t * groups + j / w->group_size) * LANES + j % LANES] +=
                act[(size_t)t * k + j];
    *act_out = act;
    *xs_out = xs;
    return true;
}

static void store_row(const gemv_job *g, uint32_t which, uint32_t t, uint32_t r, float v) {
    const size_t o = (size_t)t * g->w[which]->n + r;
    if (g->resid)
        v += mg_bf16_to_f32(g->resid[o]);
    g->y[which][o] = mg_f32_to_bf16(v);
}

/* ------------------------------------------------------------------ portable */

static uint32_t code_at(const uint32_t *row, uint32_t bits, uint32_t j) {
    const uint32_t per_word = 32 / bits;
    return (row[j / per_word] >> ((j % per_word) * bits)) & ((1u << bits) - 1);
}

static void portable_row(const gemv_job *g, uint32_t which, uint32_t r) {
    const layer *w = g->w[which];
    const uint32_t k = w->k, gs = w->group_size, groups = k / gs;
    const uint32_t *row = w->weight + (size_t)r * (k / (32 / w->bits));
    for (uint32_t t = 0; t < g->m; t++) {
        const float *a = g->act + (size_t)t * k;
        float sum = 0.0f;
        for (uint32_t grp = 0; grp < groups; grp++) {
            const size_t gi = (size_t)r * groups + grp;
            float q = 0.0f, xs = 0.0f;
            for (uint32_t j = grp * gs; j < (grp + 1) * gs; j++)
                q += (float)code_at(row, w->bits, j) * a[j];
            for (uint32_t l = 0; l < LANES; l++)
                xs += g->xs[((size_t)t * groups + grp) * LANES + l];
            sum += scale_value(w, w->scales, gi) * q + scale_value(w, w->biases, gi) * xs;
        }
        store_row(g, which, t, r, sum);
    }
}

static void portable_blocks(void *ctx, size_t first, size_t count) {
    const gemv_job *g = ctx;
    for (size_t blk = first; blk < first + count; blk++) {
        const uint32_t which = (uint32_t)(blk / g->blocks), b = (uint32_t)(blk % g->blocks);
        for (uint32_t r = b * ROWS; r < g->w[which]->n && r < (b + 1) * ROWS; r++)
            portable_row(g, which, r);
    }
}

/* ------------------------------------------------------------------ AVX2 */

#ifdef HAVE_X86_TARGETS
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Codes j .. j + 7 of a row (j a multiple of 8) as FP32: one word of eight 4-bit codes, or two
 * words of four 8-bit codes. */
AVX2_INLINE static __m256 codes8(const uint32_t *row, uint32_t j, const uint32_t bits) {
    if (bits == 4) {
        __m256i v = _mm256_set1_epi32((int)row[j / 8]);
        v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    }
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + j / 4))));
}

AVX2_INLINE static float scale_avx2(uint32_t scale_type, const uint16_t *p, size_t i) {
    if (scale_type == MG_MLX_SCALE_F16)
        return _cvtsh_ss(p[i]);
    uint32_t x = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Row r times tokens t0 .. t0 + T - 1. Per token: the group's code-activation products in one
 * vector, scaled into `acc`; the bias times the lane sums into `bacc` (independent chains). */
AVX2_INLINE static void avx2_row(const gemv_job *g, uint32_t which, uint32_t r, uint32_t t0,
                                 const uint32_t T, const uint32_t bits) {
    const layer *w = g->w[which];
    const uint32_t k = w->k, gs = w->group_size, groups = k / gs;
    const uint32_t *row = w->weight + (size_t)r * (k / (32 / bits));
    __m256 acc[4], bacc[4];
    for (uint32_t t = 0; t < T; t++)
        acc[t] = bacc[t] = _mm256_setzero_ps();
    for (uint32_t grp = 0; grp < groups; grp++) {
        const uint32_t j0 = grp * gs;
        const size_t gi = (size_t)r * groups + grp;
        __m256 q[4];
        for (uint32_t t = 0; t < T; t++)
            q[t] = _mm256_setzero_ps();
        if (bits == 4) { /* 16 codes from 8 bytes; the activations split (above) */
            for (uint32_t j = j0; j < j0 + gs; j += SPLIT) {
                const __m256i c = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + j / 2)));
                const __m256 even = _mm256_cvtepi32_ps(_mm256_and_si256(c, _mm256_set1_epi32(15)));
                const __m256 odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4));
                for (uint32_t t = 0; t < T; t++) {
                    const float *a = g->act + (size_t)(t0 + t) * k + j;
                    q[t] = _mm256_fmadd_ps(even, _mm256_loadu_ps(a), q[t]);
                    q[t] = _mm256_fmadd_ps(odd, _mm256_loadu_ps(a + SPLIT / 2), q[t]);
                }
            }
        } else {
            for (uint32_t j = j0; j < j0 + gs; j += 8) {
                const __m256 c = codes8(row, j, bits);
                for (uint32_t t = 0; t < T; t++)
                    q[t] = _mm256_fmadd_ps(c, _mm256_loadu_ps(g->act + (size_t)(t0 + t) * k + j),
                                           q[t]);
            }
        }
        const __m256 s = _mm256_set1_ps(scale_avx2(w->scale_type, w->scales, gi));
        const __m256 b = _mm256_set1_ps(scale_avx2(w->scale_type, w->biases, gi));
        for (uint32_t t = 0; t < T; t++) {
            acc[t] = _mm256_fmadd_ps(s, q[t], acc[t]);
            bacc[t] = _mm256_fmadd_ps(
                b, _mm256_loadu_ps(g->xs + ((size_t)(t0 + t) * groups + grp) * LANES), bacc[t]);
        }
    }
    for (uint32_t t = 0; t < T; t++)
        store_row(g, which, t0 + t, r, hsum8(_mm256_add_ps(acc[t], bacc[t])));
}

/* Tokens in tiles of at most 4 (so a tile's sums stay in registers), each row's codes unpacked
 * once per tile. */
AVX2_INLINE static void avx2_rows_bits(const gemv_job *g, uint32_t which, uint32_t r0, uint32_t r1,
                                       const uint32_t bits) {
    for (uint32_t r = r0; r < r1; r++) {
        uint32_t t = 0;
        for (; t + 4 <= g->m; t += 4)
            avx2_row(g, which, r, t, 4, bits);
        switch (g->m - t) {
        case 3:
            avx2_row(g, which, r, t, 3, bits);
            break;
        case 2:
            avx2_row(g, which, r, t, 2, bits);
            break;
        case 1:
            avx2_row(g, which, r, t, 1, bits);
            break;
        default:
            break;
        }
    }
}

AVX2 static void avx2_blocks(void *ctx, size_t first, size_t count) {
    const gemv_job *g = ctx;
    for (size_t blk = first; blk < first + count; blk++) {
        const uint32_t which = (uint32_t)(blk / g->blocks), b = (uint32_t)(blk % g->blocks);
        const uint32_t n = g->w[which]->n, r0 = b * ROWS, r1 = r0 + ROWS < n ? r0 + ROWS : n;
        if (g->w[which]->bits == 4)
            avx2_rows_bits(g, which, r0, r1, 4);
        else
            avx2_rows_bits(g, which, r0, r1, 8);
    }
}

/* ------------------------------------------------------------------ AVX-512 */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_INLINE                                                                              \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline

/* avx2_row in 16 lanes: a chunk of 32 4-bit codes (16 bytes, the activations split by 32) or of
 * 16 8-bit codes (16 bytes) per step; the bias times the group's eight lane sums. */
AVX512_INLINE static void avx512_row(const gemv_job *g, uint32_t which, uint32_t r, uint32_t t0,
                                     const uint32_t T, const uint32_t bits) {
    const layer *w = g->w[which];
    const uint32_t k = w->k, gs = w->group_size, groups = k / gs;
    const uint32_t *row = w->weight + (size_t)r * (k / (32 / bits));
    __m512 acc[4], bacc[4];
    for (uint32_t t = 0; t < T; t++)
        acc[t] = bacc[t] = _mm512_setzero_ps();
    for (uint32_t grp = 0; grp < groups; grp++) {
        const uint32_t j0 = grp * gs;
        const size_t gi = (size_t)r * groups + grp;
        __m512 q[4];
        for (uint32_t t = 0; t < T; t++)
            q[t] = _mm512_setzero_ps();
        if (bits == 4) {
            for (uint32_t j = j0; j < j0 + gs; j += SPLIT_AVX512) {
                const __m512i c = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)((const uint8_t *)row + j / 2)));
                const __m512 even = _mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(15)));
                const __m512 odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
                for (uint32_t t = 0; t < T; t++) {
                    const float *a = g->act + (size_t)(t0 + t) * k + j;
                    q[t] = _mm512_fmadd_ps(even, _mm512_loadu_ps(a), q[t]);
                    q[t] = _mm512_fmadd_ps(odd, _mm512_loadu_ps(a + SPLIT_AVX512 / 2), q[t]);
                }
            }
        } else {
            for (uint32_t j = j0; j < j0 + gs; j += 16) {
                const __m512 c = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + j / 4))));
                for (uint32_t t = 0; t < T; t++)
                    q[t] = _mm512_fmadd_ps(c, _mm512_loadu_ps(g->act + (size_t)(t0 + t) * k + j),
                                           q[t]);
            }
        }
        const __m512 s = _mm512_set1_ps(scale_avx2(w->scale_type, w->scales, gi));
        const __m512 b = _mm512_set1_ps(scale_avx2(w->scale_type, w->biases, gi));
        for (uint32_t t = 0; t < T; t++) {
            acc[t] = _mm512_fmadd_ps(s, q[t], acc[t]);
            bacc[t] = _mm512_fmadd_ps(b,
                                      _mm512_zextps256_ps512(_mm256_loadu_ps(
                                          g->xs + ((size_t)(t0 + t) * groups + grp) * LANES)),
                                      bacc[t]);
        }
    }
    for (uint32_t t = 0; t < T; t++)
        store_row(g, which, t0 + t, r, _mm512_reduce_add_ps(_mm512_add_ps(acc[t], bacc[t])));
}

AVX512_INLINE static void avx512_rows_bits(const gemv_job *g, uint32_t which, uint32_t r0,
                                           uint32_t r1, const uint32_t bits) {
    for (uint32_t r = r0; r < r1; r++) {
        uint32_t t = 0;
        for (; t + 4 <= g->m; t += 4)
            avx512_row(g, which, r, t, 4, bits);
        switch (g->m - t) {
        case 3:
            avx512_row(g, which, r, t, 3, bits);
            break;
        case 2:
            avx512_row(g, which, r, t, 2, bits);
            break;
        case 1:
            avx512_row(g, which, r, t, 1, bits);
            break;
        default:
            break;
        }
    }
}

AVX512 static void avx512_blocks(void *ctx, size_t first, size_t count) {
    const gemv_job *g = ctx;
    for (size_t blk = first; blk < first + count; blk++) {
        const uint32_t which = (uint32_t)(blk / g->blocks), b = (uint32_t)(blk % g->blocks);
        const uint32_t n = g->w[which]->n, r0 = b * ROWS, r1 = r0 + ROWS < n ? r0 + ROWS : n;
        if (g->w[which]->bits == 4)
            avx512_rows_bits(g, which, r0, r1, 4);
        else
            avx512_rows_bits(g, which, r0, r1, 8);
    }
}
#endif

/* ------------------------------------------------------------------ GEMV driver */

static mg_status gemv(const layer *w, uint32_t layers, uint32_t m, const uint16_t *x,
                      const uint16_t *u, const uint16_t *resid, uint16_t *y0, uint16_t *y1,
                      mg_host_range_fn blocks, uint32_t split_4bit) {
    float *act, *xs;
    if (!activations(w, m, x, u, w->bits == 4 ? split_4bit : 0, &act, &xs))
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu kernel mlx_gemv: no host memory");
    gemv_job g = {.w = {w, layers > 1 ? w + 1 : w},
                  .y = {y0, y1},
                  .layers = layers,
                  .m = m,
                  .blocks = (w->n + ROWS - 1) / ROWS,
                  .act = act,
                  .xs = xs,
                  .resid = resid};
    /* parts of at least 2^16 multiply-adds: below that a thread costs more than it saves */
    const uint64_t per_block = (uint64_t)ROWS * w->k * m;
    mg_host_parallel_for((size_t)g.blocks * layers, (size_t)((1u << 16) / per_block + 1), blocks,
                         &g);
    free(act);
    free(xs);
    return MG_OK;
}

/* ------------------------------------------------------------------ dequant */

/* The reference's value of code q in a group (mlx_reference.c): scale * q rounded to the
 * scales' type, plus the bias, rounded again, then to BF16. */
static float round_to_scale_type(float x, uint32_t scale_type) {
    return scale_type == MG_MLX_SCALE_F16 ? mg_f16_to_f32(mg_f32_to_f16(x))
                                          : mg_bf16_to_f32(mg_f32_to_bf16(x));
}

static uint16_t dequant_value(float scale, float bias, uint32_t q, uint32_t scale_type) {
    const float t = round_to_scale_type(scale * (float)q, scale_type);
    return mg_f32_to_bf16(round_to_scale_type(t + bias, scale_type));
}

/* One group, element by element through a table of the 2^bits values when the group has at
 * least that many elements (as the reference). */
static void dequant_group_portable(const layer *w, uint32_t r, uint32_t grp, uint16_t *out) {
    const uint32_t gs = w->group_size, values = 1u << w->bits, groups = w->k / gs;
    const uint32_t *row = w->weight + (size_t)r * (w->k / (32 / w->bits));
    const size_t gi = (size_t)r * groups + grp;
    const float scale = scale_value(w, w->scales, gi), bias = scale_value(w, w->biases, gi);
    uint16_t table[256];
    const bool use_table = gs >= values;
    for (uint32_t q = 0; use_table && q < values; q++)
        table[q] = dequant_value(scale, bias, q, w->scale_type);
    for (uint32_t j = grp * gs; j < (grp + 1) * gs; j++) {
        const uint32_t q = code_at(row, w->bits, j);
        out[j] = use_table ? table[q] : dequant_value(scale, bias, q, w->scale_type);
    }
}

typedef struct dequant_job {
    const layer *w;
    uint16_t *out;
} dequant_job;

static void dequant_portable_rows(void *ctx, size_t first, size_t count) {
    const dequant_job *d = ctx;
    for (size_t r = first; r < first + count; r++)
        for (uint32_t grp = 0; grp < d->w->k / d->w->group_size; grp++)
            dequant_group_portable(d->w, (uint32_t)r, grp, d->out + r * d->w->k);
}

#ifdef HAVE_X86_TARGETS
/* x rounded to the scales' type: F16 by the F16C conversions (IEEE round to nearest even, as
 * the reference's), BF16 by rounding the bits to nearest even. Finite or infinite x only. */
AVX2_INLINE static __m256 round_avx2(__m256 x, uint32_t scale_type) {
    if (scale_type == MG_MLX_SCALE_F16)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    b = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Eight FP32 values (finite or infinite) to BF16 bits, rounded to nearest even. */
AVX2_INLINE static __m128i to_bf16_avx2(__m256 x) {
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                          16);
    b = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);
    return _mm256_castsi256_si128(b);
}

/* Eight elements at a time when the group's scale and bias are finite: then every
 * intermediate is finite or infinite (never NaN), which the vector roundings handle exactly
 * as the reference's; otherwise the portable path. */
AVX2_INLINE static void dequant_rows_avx2_bits(const dequant_job *d, size_t first, size_t count,
                                               const uint32_t bits) {
    const layer *w = d->w;
    const uint32_t gs = w->group_size, groups = w->k / gs;
    for (size_t r = first; r < first + count; r++) {
        const uint32_t *row = w->weight + r * (w->k / (32 / bits));
        uint16_t *out = d->out + r * w->k;
        for (uint32_t grp = 0; grp < groups; grp++) {
            const size_t gi = r * groups + grp;
            const float scale = scale_avx2(w->scale_type, w->scales, gi);
            const float bias = scale_avx2(w->scale_type, w->biases, gi);
            if (!isfinite(scale) || !isfinite(bias)) {
                dequant_group_portable(w, (uint32_t)r, grp, out);
                continue;
            }
            const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
            for (uint32_t j = grp * gs; j < (grp + 1) * gs; j += 8) {
                __m256 t = round_avx2(_mm256_mul_ps(s, codes8(row, j, bits)), w->scale_type);
                t = round_avx2(_mm256_add_ps(t, b), w->scale_type);
                _mm_storeu_si128((__m128i *)(out + j), to_bf16_avx2(t));
            }
        }
    }
}

AVX2 static void dequant_avx2_rows(void *ctx, size_t first, size_t count) {
    const dequant_job *d = ctx;
    if (d->w->bits == 4)
        dequant_rows_avx2_bits(d, first, count, 4);
    else
        dequant_rows_avx2_bits(d, first, count, 8);
}
#endif

static void dequant(const layer *w, uint16_t *out, mg_host_range_fn rows) {
    dequant_job d = {.w = w, .out = out};
    mg_host_parallel_for(w->n, (size_t)((1u << 16) / w->k + 1), rows, &d);
}

/* ------------------------------------------------------------------ CPU kernels */

/* The kernels' arguments are the reference's, unpacked and checked by its functions
 * (mlx_reference.h). */
static mg_status run_dequant(const mg_launch *l, const char *name, mg_host_range_fn rows) {
    layer w;
    uint16_t *out;
    mg_status st = mg_mlx_cpu_dequant_args(l, name, &w, &out);
    if (!st)
        dequant(&w, out, rows);
    return st;
}

/* split_4bit: the chunk of the split layout in which the kernel reads 4-bit layers'
 * activations (SPLIT, SPLIT_AVX512), 0 for none. */
static mg_status run_gemv(const mg_launch *l, const char *name, mg_host_range_fn blocks,
                          uint32_t split_4bit) {
    layer w;
    uint32_t m;
    const uint16_t *x, *u, *resid;
    uint16_t *y;
    mg_status st = mg_mlx_cpu_gemv_args(l, name, &w, &m, &x, &u, &resid, &y);
    return st ? st : gemv(&w, 1, m, x, u, resid, y, NULL, blocks, split_4bit);
}

static mg_status run_gate_up(const mg_launch *l, const char *name, mg_host_range_fn blocks,
                             uint32_t split_4bit) {
    layer w[2]; /* gate and up: one shape */
    uint32_t m;
    const uint16_t *x;
    uint16_t *y1, *y2;
    uint32_t epilogue;
    mg_status st = mg_mlx_cpu_gate_up_args(l, name, w, &m, &x, &y1, &y2, &epilogue);
    if (st)
        return st;
    st = gemv(w, 2, m, x, NULL, NULL, y1, y2, blocks, split_4bit);
    return mg_mlx_cpu_gate_up_finish(st, epilogue, m, w[0].n, y1, y2);
}

#define NAME(kernel) "metrale:" kernel

static mg_status dequant_portable(const mg_launch *l) {
    return run_dequant(l, NAME(MG_MLX_KERNEL_DEQUANT_PORTABLE), dequant_portable_rows);
}
static mg_status gemv_portable(const mg_launch *l) {
    return run_gemv(l, NAME(MG_MLX_KERNEL_GEMV_PORTABLE), portable_blocks, 0);
}
static mg_status gate_up_portable(const mg_launch *l) {
    return run_gate_up(l, NAME(MG_MLX_KERNEL_GEMV_GATE_UP_PORTABLE), portable_blocks, 0);
}

#ifdef HAVE_X86_TARGETS
/* A launch by name on a CPU without AVX2 is an error, not an illegal instruction. */
static mg_status check_avx2(const char *name) {
    return mg_cpu_has_avx2() ? MG_OK : MG_ERROR(MG_ERR_UNSUPPORTED, "cpu kernel %s: no AVX2", name);
}
static mg_status dequant_avx2(const mg_launch *l) {
    const char *name = NAME(MG_MLX_KERNEL_DEQUANT_AVX2);
    mg_status st = check_avx2(name);
    return st ? st : run_dequant(l, name, dequant_avx2_rows);
}
static mg_status gemv_avx2(const mg_launch *l) {
    const char *name = NAME(MG_MLX_KERNEL_GEMV_AVX2);
    mg_status st = check_avx2(name);
    return st ? st : run_gemv(l, name, avx2_blocks, SPLIT);
}
static mg_status gate_up_avx2(const mg_launch *l) {
    const char *name = NAME(MG_MLX_KERNEL_GEMV_GATE_UP_AVX2);
    mg_status st = check_avx2(name);
    return st ? st : run_gate_up(l, name, avx2_blocks, SPLIT);
}
static mg_status check_avx512(const char *name) {
    return mg_cpu_has_avx512() ? MG_OK
                               : MG_ERROR(MG_ERR_UNSUPPORTED, "cpu kernel %s: no AVX-512", name);
}
static mg_status gemv_avx512(const mg_launch *l) {
    const char *name = NAME(MG_MLX_KERNEL_GEMV_AVX512);
    mg_status st = check_avx512(name);
    return st ? st : run_gemv(l, name, avx512_blocks, SPLIT_AVX512);
}
static mg_status gate_up_avx512(const mg_launch *l) {
    const char *name = NAME(MG_MLX_KERNEL_GEMV_GATE_UP_AVX512);
    mg_status st = check_avx512(name);
    return st ? st : run_gate_up(l, name, avx512_blocks, SPLIT_AVX512);
}
#endif

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookups then report NOT_FOUND. */
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_DEQUANT_PORTABLE, dequant_portable);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_PORTABLE, gemv_portable);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_GATE_UP_PORTABLE, gate_up_portable);
#ifdef HAVE_X86_TARGETS
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_DEQUANT_AVX2, dequant_avx2);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_AVX2, gemv_avx2);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_GATE_UP_AVX2, gate_up_avx2);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_AVX512, gemv_avx512);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_GATE_UP_AVX512, gate_up_avx512);
#endif
}

void mg_mlx_cpu_fast_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
