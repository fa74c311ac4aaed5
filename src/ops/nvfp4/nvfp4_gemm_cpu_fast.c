/* nvfp4_gemm_cpu_fast.c - the fast CPU kernel of the NVFP4 GEMMs (nvfp4_gemm_reference.h:
 * "nvfp4_gemm_avx2", behind the provider "cpu_avx2" of nvfp4_gemm.c), for every problem the
 * reference takes: dense, gate_up, grouped per expert with a gather.
 *
 * Each row block of 16 weight rows (nvfp4_hopper_layout.h) is decoded once per call into FP32
 * rows [16][k] on the thread that owns it: a 32-bit word of the layout holds codes of rows g and
 * g + 8 at four consecutive k, so one word becomes one vector of 8 values (a shift per lane, a
 * table lookup of the E2M1 magnitude, the sign bit), times the two rows' block scales (exact:
 * an E2M1 value times a ue5m3 scale has at most 6 significant bits). Then every token of the
 * group is a dot product of its FP32 activations (converted once per call, exact) with each
 * row, by FMA in eight lanes; the sum times the global scale, rounded to BF16 once (gate_up:
 * silu(g) * u of the two sums first). Row blocks are shared out over the cores; the result
 * does not depend on the thread count. The bound against the reference is in the header. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_isa.h"
#include "cpu_kernels.h"
#include "error.h"
#include "host_parallel.h"
#include "metrale/dtype.h"
#include "nvfp4_gemm_reference.h"
#include "nvfp4_hopper_layout.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define HAVE_X86_TARGETS 1
#include <immintrin.h>
#endif

int mg_nvfp4_cpu_avx2_built(void) {
#ifdef HAVE_X86_TARGETS
    return 1;
#else
    return 0;
#endif
}

#ifdef HAVE_X86_TARGETS
#define AVX2 __attribute__((target("avx2,fma")))

typedef struct fast_job {
    const mg_nvfp4_cpu_gemm_call *c;
    const float *act;           /* [rows][k_pad]: row r is the activation of routed row r */
    uint32_t k_pad, begin, end; /* the group's routed rows */
    const uint8_t *values[2], *scales[2];
    float global[2];
    int parts;          /* 1, or 2 for gate_up */
    _Atomic int failed; /* a part had no memory for its decoded rows */
} fast_job;

/* ue5m3 byte u as FP32: (1 + (u & 7) / 8) * 2^((u >> 3) - 15), exactly as the reference. */
static float ue5m3_value(uint32_t u) {
    return ldexpf(1.0f + (float)(u & 7u) / 8.0f, (int)(u >> 3) - 15);
}

/* Row block rb of one matrix decoded into rows[16][k_pad] (k past k: zero codes). */
AVX2 static void decode_block(const uint8_t *values, const uint8_t *scales, uint32_t rb,
                              uint32_t k_pad, float *rows) {
    const uint32_t supers = k_pad / MG_NVFP4_SUPER_K;
    /* a word's nibbles, lanes 0-3 row g at e = 0..3, lanes 4-7 row g + 8 (the layout's pairs) */
    const __m256i shifts = _mm256_setr_epi32(12, 28, 4, 20, 8, 24, 0, 16);
    const __m256 magnitude = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    for (uint32_t s = 0; s < supers; s++) {
        const uint8_t *sv = values + ((uint64_t)rb * supers + s) * MG_NVFP4_SUPER_BYTES;
        const uint8_t *ss = scales + ((uint64_t)rb * supers + s) * MG_NVFP4_SUPER_SCALE_BYTES;
        for (uint32_t c = 0; c < 4; c++)
            for (uint32_t lane = 0; lane < 32; lane++) {
                const uint32_t g = lane / 4, t = lane % 4;
                const float lo = ue5m3_value(ss[lane * 8 + c * 2]);
                const float hi = ue5m3_value(ss[lane * 8 + c * 2 + 1]);
                const __m256 scale = _mm256_setr_ps(lo, lo, lo, lo, hi, hi, hi, hi);
                const uint8_t *words = sv + c * MG_NVFP4_CHUNK_BYTES + lane * 16;
                float *row_g = rows + (size_t)g * k_pad, *row_h = rows + (size_t)(g + 8) * k_pad;
                for (uint32_t kt = 0; kt < 4; kt++) {
                    uint32_t w;
                    memcpy(&w, words + kt * 4, 4);
                    const __m256i code =
                        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts),
                                         _mm256_set1_epi32(15));
                    const __m256 sign = _mm256_castsi256_ps(
                        _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28));
                    const __m256 v = _mm256_mul_ps(
                        _mm256_xor_ps(_mm256_permutevar8x32_ps(magnitude, code), sign), scale);
                    const uint32_t k0 =
                        s * MG_NVFP4_SUPER_K + c * MG_NVFP4_CHUNK_K + t * 16 + kt * 4;
                    _mm_storeu_ps(row_g + k0, _mm256_castps256_ps128(v));
                    _mm_storeu_ps(row_h + k0, _mm256_extractf128_ps(v, 1));
                }
            }
    }
}

AVX2 static float dot(const float *a, const float *w, uint32_t k_pad) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (uint32_t i = 0; i < k_pad; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(w + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(w + i + 8), s1);
    }
    __m256 v = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

AVX2 static void row_blocks(void *ctx, size_t first, size_t count) {
    fast_job *j = ctx;
    const mg_nvfp4_cpu_gemm_call *c = j->c;
    float *rows = malloc(sizeof(float) * 16 * j->k_pad * (size_t)j->parts);
    if (!rows) {
        j->failed = 1;
        return;
    }
    for (size_t rb = first; rb < first + count; rb++) {
        for (int p = 0; p < j->parts; p++)
            decode_block(j->values[p], j->scales[p], (uint32_t)rb, j->k_pad,
                         rows + (size_t)p * 16 * j->k_pad);
        for (uint32_t r = j->begin; r < j->end; r++) {
            const float *a = j->act + (size_t)(r - j->begin) * j->k_pad;
            for (uint32_t i = 0; i < 16 && rb * 16 + i < c->n; i++) {
                const uint32_t col = (uint32_t)rb * 16 + i;
                float v = dot(a, rows + (size_t)i * j->k_pad, j->k_pad) * j->global[0];
                if (j->parts == 2) {
                    const float u =
                        dot(a, rows + (size_t)(16 + i) * j->k_pad, j->k_pad) * j->global[1];
                    v = v / (1.0f + expf(-v)) * u;
                }
                c->out[(size_t)r * c->ldc + col] = mg_f32_to_bf16(v);
            }
        }
    }
    free(rows);
}

static mg_status run_fast(const mg_nvfp4_cpu_gemm_call *c, const char *name) {
    const uint32_t k_pad = mg_nvfp4_supers(c->k) * MG_NVFP4_SUPER_K;
    const uint32_t groups = c->offsets ? c->experts : 1, row_blocks_n = mg_nvfp4_row_blocks(c->n);
    uint32_t widest = 0; /* the most routed rows of one group */
    for (uint32_t e = 0; e < groups; e++) {
        const uint32_t rows = c->offsets ? (uint32_t)(c->offsets[e + 1] - c->offsets[e]) : c->rows;
        widest = rows > widest ? rows : widest;
    }
    float *act = calloc((size_t)(widest ? widest : 1) * k_pad, sizeof *act);
    if (!act)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for the activations", name);
    mg_status st = MG_OK;
    for (uint32_t e = 0; e < groups && !st; e++) {
        fast_job j = {.c = c,
                      .act = act,
                      .k_pad = k_pad,
                      .begin = c->offsets ? (uint32_t)c->offsets[e] : 0,
                      .end = c->offsets ? (uint32_t)c->offsets[e + 1] : c->rows,
                      .values = {c->values + e * c->expert_value_bytes,
                                 c->up_values ? c->up_values + e * c->expert_value_bytes : NULL},
                      .scales = {c->scales + e * c->expert_scale_bytes,
                                 c->up_scales ? c->up_scales + e * c->expert_scale_bytes : NULL},
                      .global = {c->global[e], c->up_values ? c->up_global[e] : 0.0f},
                      .parts = c->up_values ? 2 : 1};
        if (j.begin == j.end)
            continue;
        for (uint32_t r = j.begin; r < j.end; r++) {
            const uint32_t src = c->token_ids ? (uint32_t)c->token_ids[r] : r;
            const uint16_t *x = c->act + (size_t)src * c->act_pitch;
            float *a = act + (size_t)(r - j.begin) * k_pad;
            for (uint32_t i = 0; i < c->k; i++)
                a[i] = mg_bf16_to_f32(x[i]);
        }
        /* parts of at least 2^16 multiply-adds: below that a thread costs more than it saves */
        const uint64_t per_block = (uint64_t)16 * k_pad * (j.end - j.begin) * (uint32_t)j.parts;
        mg_host_parallel_for(row_blocks_n, (size_t)((1u << 16) / per_block + 1), row_blocks, &j);
        if (j.failed)
            st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for the decoded rows", name);
    }
    free(act);
    return st;
}

static mg_status kernel_avx2(const mg_launch *l) {
    static const char name[] = "metrale:" MG_NVFP4_KERNEL_GEMM_AVX2;
    if (!mg_cpu_has_avx2()) /* a launch by name on a CPU without it */
        return MG_ERROR(MG_ERR_UNSUPPORTED, "cpu kernel %s: no AVX2", name);
    mg_nvfp4_cpu_gemm_call c;
    mg_status st = mg_nvfp4_cpu_gemm_args(l, name, &c);
    return st || !c.rows ? st : mg_nvfp4_cpu_gemm_run(&c, name, run_fast);
}
#endif

static void register_kernels(void) {
#ifdef HAVE_X86_TARGETS
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_GEMM_AVX2, kernel_avx2);
#endif
}

void mg_nvfp4_cpu_fast_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
