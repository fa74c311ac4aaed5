/* gemm_cpu_fast.c - fast providers of the BF16 GEMM on the CPU backend: "cpu_avx2" (AVX2, chosen
 * when the CPU has it) and "cpu_portable" (plain C, any CPU, only when forced). Both come before
 * "reference" in gemm.c's list; FP8 GEMMs are left to the reference.
 *
 * What a caller may rely on.
 * - cpu_avx2 gives the reference's bits (gemm_reference.c) for finite inputs: each output is the
 *   FP32 sum of the exact products act[t, i] * weight[j, i] (a BF16 product is exact in FP32)
 *   added one by one in the order i = 0, 1, ..., k - 1, each addition rounded, as the
 *   reference adds them; only the work is vectorised across 8 outputs (8 weight rows in the
 *   lanes, 4 such groups interleaved to hide the addition latency). NaN payloads may differ.
 * - cpu_portable adds in another order (eight or sixteen lanes, then the lanes), so
 *       |portable - reference| <= 2 * (k + 16) * 2^-24 * sum_i |act[t, i] * weight[j, i]|
 *   before the output is rounded: each side is within (k + 16) * u * sum|terms| of the exact
 *   sum (u = 2^-24, the summation bound for any order of at most k + 16 additions). A BF16
 *   output adds at most one BF16 spacing of the result.
 * Neither result depends on the thread count, the blocking or M (batch-invariant): every
 * output is summed by one thread in one fixed order.
 *
 * Layouts. cpu_portable converts the activation rows to FP32 once per call, in chunks of 16
 * elements stored as [the 8 even elements][the 8 odd ones], zero-padded to a multiple of 16; a
 * 32-byte load of 16 BF16 weights then gives both halves as FP32 with one shift and one mask.
 * cpu_avx2 packs each block of 32 weight rows as FP32 [k][32] (8 x 8 transposes of the
 * rows' BF16 codes) in a per-part buffer, then streams it once per token; for one token (a
 * decode GEMV) it consumes the transposes from registers instead, packing nothing. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked_math.h"
#include "cpu_isa.h"
#include "cpu_kernels.h"
#include "error.h"
#include "gemm_provider.h"
#include "gemm_reference.h"
#include "host_parallel.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define HAVE_X86_TARGETS 1
#include <immintrin.h>
#endif

#define ROWS 4   /* cpu_portable: weight rows per block, the unit the threads share out */
#define CHUNK 16 /* elements per split chunk */

typedef struct fast_gemm {
    uint32_t m, n, k, k_pad, ldc;
    const float *act;         /* cpu_portable: [m][k_pad], split chunks (above) */
    const uint16_t *act_bf16; /* cpu_avx2: the activations as they are, [m][k] */
    const uint16_t *weight;
    void *out;
    mg_dtype out_type;
} fast_gemm;

static float bf16_value(uint16_t bits) {
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void store(const fast_gemm *g, uint32_t t, uint32_t j, float v) {
    size_t i = (size_t)t * g->ldc + j;
    if (g->out_type == MG_DTYPE_F32)
        ((float *)g->out)[i] = v;
    else
        ((uint16_t *)g->out)[i] = mg_f32_to_bf16(v);
}

/* Row `r` of the activations into the split layout, zero-padded. */
static void split_row(const uint16_t *x, uint32_t k, uint32_t k_pad, float *out) {
    for (uint32_t c = 0; c < k_pad; c += CHUNK)
        for (uint32_t e = 0; e < CHUNK; e++) {
            uint32_t i = c + e;
            out[c + (e % 2) * (CHUNK / 2) + e / 2] = i < k ? bf16_value(x[i]) : 0.0f;
        }
}

/* The k % 16 tail of a weight row, zero-padded, so every chunk is a whole 16-element load. */
static const uint16_t *tail_chunk(const uint16_t *w, uint32_t k, uint16_t buf[CHUNK]) {
    uint32_t c = k / CHUNK * CHUNK;
    memset(buf, 0, CHUNK * sizeof *buf);
    memcpy(buf, w + c, (size_t)(k - c) * sizeof *buf);
    return buf;
}

/* ------------------------------------------------------------------ portable */

/* One output: eight partial sums over the split chunk lanes, then the lanes in order. */
static void portable_blocks(void *ctx, size_t first, size_t count) {
    const fast_gemm *g = ctx;
    uint16_t buf[CHUNK];
    for (size_t blk = first; blk < first + count; blk++)
        for (uint32_t j = (uint32_t)blk * ROWS; j < g->n && j < (blk + 1) * ROWS; j++) {
            const uint16_t *w = g->weight + (size_t)j * g->k;
            for (uint32_t t = 0; t < g->m; t++) {
                const float *a = g->act + (size_t)t * g->k_pad;
                float lane[CHUNK / 2] = {0};
                for (uint32_t c = 0; c < g->k_pad; c += CHUNK) {
                    const uint16_t *wc = c + CHUNK <= g->k ? w + c : tail_chunk(w, g->k, buf);
                    for (uint32_t e = 0; e < CHUNK / 2; e++)
                        lane[e] += a[c + e] * bf16_value(wc[2 * e]) +
                                   a[c + CHUNK / 2 + e] * bf16_value(wc[2 * e + 1]);
                }
                float sum = 0.0f;
                for (uint32_t e = 0; e < CHUNK / 2; e++)
                    sum += lane[e];
                store(g, t, j, sum);
            }
        }
}

/* ------------------------------------------------------------------ AVX2 */

#ifdef HAVE_X86_TARGETS
#define AVX2 __attribute__((target("avx2")))
#define PACK_ROWS 32 /* weight rows per packed block: 4 groups of 8 lanes */

/* 8 BF16 codes as 8 FP32 (a BF16 is the top half of an FP32). */
AVX2 static inline __m256 bf16x8_to_f32(__m128i codes) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(codes), 16));
}

/* Rows w[0..7] at k = i .. i + 7, transposed: out[e] holds element i + e of rows 0-7 (lane =
 * the row), as FP32. */
AVX2 static inline void transpose8x8(const uint16_t *const w[8], uint32_t i, __m256 out[8]) {
    __m256 r[8], t[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++)
        r[l] = bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(w[l] + i)));
#pragma GCC unroll 4
    for (int l = 0; l < 8; l += 2) {
        t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]);
        t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
    }
#pragma GCC unroll 2
    for (int l = 0; l < 8; l += 4) {
        r[l] = _mm256_shuffle_ps(t[l], t[l + 2], 0x44);
        r[l + 1] = _mm256_shuffle_ps(t[l], t[l + 2], 0xee);
        r[l + 2] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0x44);
        r[l + 3] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0xee);
    }
    /* r[0..3]: elements 0, 1, 2, 3 of rows 0-3 (low half) and 4, 5, 6, 7 (high half);
     * r[4..7]: the same for rows 4-7 */
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        out[e] = _mm256_permute2f128_ps(r[e], r[e + 4], 0x20);
        out[e + 4] = _mm256_permute2f128_ps(r[e], r[e + 4], 0x31);
    }
}

/* Rows w[0..7] at k = i .. i + 7 into packed[(i + e) * PACK_ROWS + lane], lane = the row. */
AVX2 static inline void pack8x8(const uint16_t *const w[8], uint32_t i, float *packed) {
    __m256 v[8];
    transpose8x8(w, i, v);
#pragma GCC unroll 8
    for (int e = 0; e < 8; e++)
        _mm256_storeu_ps(packed + (size_t)(i + e) * PACK_ROWS, v[e]);
}

/* The rows of block j0 (PACK_ROWS from j0; rows past n repeat row j0 and are not stored). */
AVX2 static inline void block_rows(const fast_gemm *g, uint32_t j0, const uint16_t *w[PACK_ROWS]) {
    for (uint32_t r = 0; r < PACK_ROWS; r++)
        w[r] = g->weight + (size_t)(j0 + r < g->n ? j0 + r : j0) * g->k;
}

/* One token (m = 1): the block's rows transposed in registers and consumed at once, so nothing
 * is packed. The same additions as avx2_block, in the same order, so the same bits. */
AVX2 static void avx2_block_one_token(const fast_gemm *g, uint32_t j0) {
    const uint32_t k = g->k, k8 = k / 8 * 8;
    const uint16_t *w[PACK_ROWS];
    block_rows(g, j0, w);
    __m256 acc[PACK_ROWS / 8];
    for (int q = 0; q < PACK_ROWS / 8; q++)
        acc[q] = _mm256_setzero_ps();
    const uint16_t *x = g->act_bf16;
    for (uint32_t i = 0; i < k8; i += 8) {
#pragma GCC unroll 4
        for (int q = 0; q < PACK_ROWS / 8; q++) {
            __m256 v[8];
            transpose8x8(w + q * 8, i, v);
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) /* acc += a * w: the product exact, the addition rounded */
                acc[q] = _mm256_add_ps(acc[q],
                                       _mm256_mul_ps(_mm256_set1_ps(bf16_value(x[i + e])), v[e]));
        }
    }
    float sums[PACK_ROWS];
    for (int q = 0; q < PACK_ROWS / 8; q++)
        _mm256_storeu_ps(sums + q * 8, acc[q]);
    for (uint32_t i = k8; i < k; i++)
        for (uint32_t r = 0; r < PACK_ROWS; r++)
            sums[r] += bf16_value(x[i]) * bf16_value(w[r][i]);
    for (uint32_t r = 0; r < PACK_ROWS && j0 + r < g->n; r++)
        store(g, 0, j0 + r, sums[r]);
}

/* One block of PACK_ROWS rows from j0 (rows past n repeat row j0 and are not stored). */
AVX2 static void avx2_block(const fast_gemm *g, uint32_t j0, float *packed) {
    const uint32_t k = g->k, k8 = k / 8 * 8;
    const uint16_t *w[PACK_ROWS];
    block_rows(g, j0, w);
    for (int q = 0; q < PACK_ROWS / 8; q++) {
        for (uint32_t i = 0; i < k8; i += 8)
            pack8x8(w + q * 8, i, packed + q * 8);
        for (uint32_t i = k8; i < k; i++)
            for (int l = 0; l < 8; l++)
                packed[(size_t)i * PACK_ROWS + q * 8 + l] = bf16_value(w[q * 8 + l][i]);
    }
    for (uint32_t t = 0; t < g->m; t++) {
        const uint16_t *x = g->act_bf16 + (size_t)t * k;
        /* four named accumulators, so that they stay in registers */
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        const float *p = packed;
        for (uint32_t i = 0; i < k; i++, p += PACK_ROWS) {
            /* the reference's step: acc += a * w, the product exact, the addition rounded */
            const __m256 a = _mm256_set1_ps(bf16_value(x[i]));
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(a, _mm256_loadu_ps(p)));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(a, _mm256_loadu_ps(p + 8)));
            acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(a, _mm256_loadu_ps(p + 16)));
            acc3 = _mm256_add_ps(acc3, _mm256_mul_ps(a, _mm256_loadu_ps(p + 24)));
        }
        float sums[PACK_ROWS];
        _mm256_storeu_ps(sums, acc0);
        _mm256_storeu_ps(sums + 8, acc1);
        _mm256_storeu_ps(sums + 16, acc2);
        _mm256_storeu_ps(sums + 24, acc3);
        for (uint32_t r = 0; r < PACK_ROWS && j0 + r < g->n; r++)
            store(g, t, j0 + r, sums[r]);
    }
}

AVX2 static void avx2_blocks(void *ctx, size_t first, size_t count) {
    const fast_gemm *g = ctx;
    if (g->m == 1) {
        for (size_t blk = first; blk < first + count; blk++)
            avx2_block_one_token(g, (uint32_t)blk * PACK_ROWS);
        return;
    }
    float *packed = malloc((size_t)g->k * PACK_ROWS * sizeof *packed);
    for (size_t blk = first; blk < first + count; blk++) {
        const uint32_t j0 = (uint32_t)blk * PACK_ROWS;
        if (packed) {
            avx2_block(g, j0, packed);
        } else { /* no memory for the packed block: the reference itself, the same sums */
            const uint32_t rows = g->n - j0 < PACK_ROWS ? g->n - j0 : PACK_ROWS;
            mg_gemm_bf16_cpu(g->m, rows, g->k, g->act_bf16, g->weight + (size_t)j0 * g->k,
                             (char *)g->out + (size_t)j0 * mg_dtype_bytes(g->out_type), g->out_type,
                             g->ldc);
        }
    }
    free(packed);
}
#endif

/* ------------------------------------------------------------------ the kernels */

/* out (row pitch ldc) = act[m, k] · weight[n, k]ᵀ on the calling thread and the other cores, in
 * parts of `rows` weight rows; `split`: the activations converted to the split layout first.
 * False when the host has no memory for them. */
static bool gemm_bf16_fast(uint32_t m, uint32_t n, uint32_t k, const uint16_t *act,
                           const uint16_t *weight, void *out, mg_dtype out_type, uint32_t ldc,
                           mg_host_range_fn blocks, uint32_t rows, bool split) {
    const uint32_t k_pad = (k + CHUNK - 1) / CHUNK * CHUNK;
    float *a = NULL;
    if (split) {
        if (!(a = malloc((size_t)m * k_pad * sizeof *a)))
            return false;
        for (uint32_t t = 0; t < m; t++)
            split_row(act + (size_t)t * k, k, k_pad, a + (size_t)t * k_pad);
    }
    fast_gemm g = {.m = m,
                   .n = n,
                   .k = k,
                   .k_pad = k_pad,
                   .ldc = ldc,
                   .act = a,
                   .act_bf16 = act,
                   .weight = weight,
                   .out = out,
                   .out_type = out_type};
    /* at least 2^16 multiply-adds per part: below that another thread costs more than it saves */
    const uint64_t per_block = (uint64_t)rows * k_pad * m;
    mg_host_parallel_for((n + rows - 1) / rows, (size_t)((1u << 16) / per_block + 1), blocks, &g);
    free(a);
    return true;
}

/* The argument list of the reference's gemm_bf16_ref, unpacked and checked by its function
 * (gemm_reference.h). */
static mg_status run_kernel(const mg_launch *l, const char *name, mg_host_range_fn blocks,
                            uint32_t rows, bool split) {
    mg_gemm_bf16_cpu_args a;
    mg_status st = mg_gemm_bf16_cpu_args_get(l, name, &a);
    if (st || !a.m || !a.n || !a.k)
        return st;
    if (!gemm_bf16_fast(a.m, a.n, a.k, a.act, a.weight, a.out, a.out_type, a.ldc, blocks, rows,
                        split))
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu kernel %s: no host memory", name);
    return MG_OK;
}

#define KERNEL_PORTABLE "gemm_bf16_portable"
#define KERNEL_AVX2 "gemm_bf16_avx2"

static mg_status kernel_portable(const mg_launch *l) {
    return run_kernel(l, "metrale:" KERNEL_PORTABLE, portable_blocks, ROWS, true);
}

#ifdef HAVE_X86_TARGETS
static mg_status kernel_avx2(const mg_launch *l) {
    if (!mg_cpu_has_avx2()) /* a launch by name on a CPU without it */
        return MG_ERROR(MG_ERR_UNSUPPORTED, "cpu kernel metrale:" KERNEL_AVX2 ": no AVX2");
    return run_kernel(l, "metrale:" KERNEL_AVX2, avx2_blocks, PACK_ROWS, false);
}
#endif

static void register_kernels(void) {
    mg_cpu_kernel_register("metrale", KERNEL_PORTABLE, kernel_portable);
#ifdef HAVE_X86_TARGETS
    mg_cpu_kernel_register("metrale", KERNEL_AVX2, kernel_avx2);
#endif
}

static void kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}

/* ------------------------------------------------------------------ providers */

static bool supports_bf16(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    /* Both fast providers declare no fusion (their fusions field is 0). */
    if (!mg_gemm_fusion_declared(&mg_gemm_cpu_portable_provider, call, reason, reason_bytes))
        return false;
    if (((const mg_gemm_plan *)call)->kind == MG_GEMM_BF16)
        return true;
    snprintf(reason, reason_bytes, "BF16 only (FP8 GEMMs run on the reference)");
    return false;
}

static mg_status run_portable(mg_backend *b, mg_stream *s, const mg_gemm_call *c) {
    return mg_gemm_bf16_cpu_launch(b, s, c, KERNEL_PORTABLE);
}

/* The portable code is not yet faster than the reference (measured: bench cpu_fast), so the
 * automatic choice passes it over; forced by name it runs every BF16 GEMM. */
static bool portable_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    if (mg_op_forced(b, MG_OP_GEMM_BF16) != &mg_gemm_cpu_portable_provider.base) {
        snprintf(reason, reason_bytes, "only when forced (not faster than the reference)");
        return false;
    }
    return supports_bf16(b, call, reason, reason_bytes);
}

const mg_gemm_provider mg_gemm_cpu_portable_provider = {
    .base = {.name = "cpu_portable",
             .backend = MG_BACKEND_CPU,
             .supports = portable_supports,
             .register_cpu_kernels = kernels_register},
    .run = run_portable,
};

static bool avx2_available(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
#ifdef HAVE_X86_TARGETS
    return mg_cpu_avx2_available(reason, reason_bytes);
#else
    snprintf(reason, reason_bytes, "built for a CPU without AVX2");
    return false;
#endif
}

static mg_status run_avx2(mg_backend *b, mg_stream *s, const mg_gemm_call *c) {
    return mg_gemm_bf16_cpu_launch(b, s, c, KERNEL_AVX2);
}

/* The AVX2 kernel keeps the reference's bits (above), so the automatic choice takes it on every
 * BF16 GEMM of a CPU with AVX2. */
static bool avx2_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    return supports_bf16(b, call, reason, reason_bytes);
}

const mg_gemm_provider mg_gemm_cpu_avx2_provider = {
    .base = {.name = "cpu_avx2",
             .backend = MG_BACKEND_CPU,
             .available = avx2_available,
             .supports = avx2_supports,
             .register_cpu_kernels = kernels_register},
    .run = run_avx2,
};
