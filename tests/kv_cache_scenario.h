/*
 * kv_cache_scenario.h - what the paged KV cache tests share (public API only): random batches
 * over shuffled pages, the float64 references of append (RoPE) and of attention over pages,
 * and the two scenarios every backend must pass: one step of append then attention (decode
 * and prefill chunks, empty requests, partial last pages, long requests), a prefill-heavy step
 * (chunks over cached prefixes, as CUDA's FA3 path takes them), and steps of a captured graph
 * replayed while contexts grow and the batch composition changes (decode tokens, or chunks:
 * kv_shape.graph_chunk). Pools are BF16 or FP8 E4M3 with per-head scales (kv_shape.fp8).
 */
#ifndef METRALE_KV_CACHE_SCENARIO_H
#define METRALE_KV_CACHE_SCENARIO_H

#include <math.h>
#include <stdbool.h>

#include "metrale/dtype.h"
#include "metrale/ops_kv_cache.h"
#include "test_util.h"

typedef struct kv_shape {
    uint32_t hq, hkv, d, page_size, num_pages;
    int32_t window_left;
    float soft_cap;
    bool rope, positions;
    bool llama3; /* rope through a table: Llama 3.1's scaling (KV_LLAMA3_*), mg_rope_inv_freq_llama3
                  */
    bool fp8;    /* FP8 E4M3 pools with the per-head scales kv_scale */
    mg_attention_impl impl;        /* the path the plans ask for (0: AUTO) */
    mg_attention_impl expect_impl; /* AUTO: not checked; else what plans must report running */
    uint32_t graph_chunk;          /* graph steps: 0 decode; else up to this many tokens each */
} kv_shape;

/* One step's batch on the host: the page table after the step's tokens were added, the new
 * tokens' inputs, and the requests' page lists (kept across steps). */
typedef struct kv_step {
    uint32_t batch;
    int32_t *qo_indptr, *kv_indptr, *kv_indices, *last;
    uint32_t tokens, kv_stride; /* rows of q / kv; kv row: k heads, v heads, padding */
    uint16_t *q, *kv;
    int32_t *pos;
} kv_step;

static inline uint16_t kv_random_bf16(void) {
    return mg_f32_to_bf16((float)((double)test_rand_range(0, 2000) / 1000.0 - 1.0));
}

static inline size_t kv_pool_elems(const kv_shape *sh) {
    return (size_t)sh->num_pages * sh->page_size * sh->hkv * sh->d;
}

#define KV_MAX_TEST_HEADS 64

/* Bytes of both pools (K then V). */
static inline size_t kv_pool_bytes(const kv_shape *sh) {
    return 2 * kv_pool_elems(sh) * (sh->fp8 ? 1 : 2);
}

static inline double kv_bf16(uint16_t x) {
    return mg_bf16_to_f32(x);
}

/* FP8 pools: the scale of KV head h for K (v false) or V (v true). Keys and values are within
 * [-1, 1] (rotated keys within sqrt 2), so codes reach 180-360 of E4M3's 448; head 3's key scale
 * is small enough that rotated keys saturate. */
static inline float kv_scale(uint32_t h, bool v) {
    static const float k_scales[4] = {1.0f / 128, 1.0f / 256, 1.0f / 160, 1.0f / 400};
    static const float v_scales[4] = {1.0f / 256, 1.0f / 128, 1.0f / 200, 1.0f / 300};
    return v ? v_scales[h % 4] : k_scales[h % 4];
}

/* Element e of the K (v false) or V pool of a host image of both pools, as the value it
 * stands for (FP8: code * scale of its head). */
static inline double kv_pool_value(const kv_shape *sh, const void *pool, bool v, size_t e) {
    const size_t half = kv_pool_elems(sh);
    if (!sh->fp8)
        return kv_bf16(((const uint16_t *)pool)[(v ? half : 0) + e]);
    const uint32_t h = (uint32_t)(e / sh->d % sh->hkv);
    return (double)mg_fp8_e4m3_to_f32(((const uint8_t *)pool)[(v ? half : 0) + e]) * kv_scale(h, v);
}

/* A random host image of both pools (values within [-1, 1]; no NaN codes). */
static inline void *kv_random_pool(const kv_shape *sh) {
    const size_t elems = 2 * kv_pool_elems(sh);
    void *pool = malloc(kv_pool_bytes(sh));
    for (size_t i = 0; i < elems; i++) {
        const uint16_t x = kv_random_bf16();
        if (!sh->fp8) {
            ((uint16_t *)pool)[i] = x;
            continue;
        }
        const bool v = i >= elems / 2;
        const uint32_t h = (uint32_t)(i % (elems / 2) / sh->d % sh->hkv);
        ((uint8_t *)pool)[i] = mg_f32_to_fp8_e4m3(mg_bf16_to_f32(x) / kv_scale(h, v));
    }
    return pool;
}

/* Bytes of pool element e (K or V) differ between two host images. */
static inline bool kv_pool_changed(const kv_shape *sh, const void *a, const void *b, size_t e) {
    return sh->fp8 ? ((const uint8_t *)a)[e] != ((const uint8_t *)b)[e]
                   : ((const uint16_t *)a)[e] != ((const uint16_t *)b)[e];
}

/* Requests' state across steps: tokens held and pages owned. */
typedef struct kv_requests {
    uint32_t count;
    int64_t *len;
    int32_t **pages;
    uint32_t *page_count;
} kv_requests;

static inline void kv_requests_init(kv_requests *r, uint32_t count, uint32_t max_pages) {
    r->count = count;
    r->len = calloc(count, sizeof *r->len);
    r->pages = calloc(count, sizeof *r->pages);
    r->page_count = calloc(count, sizeof *r->page_count);
    for (uint32_t i = 0; i < count; i++)
        r->pages[i] = calloc(max_pages, sizeof(int32_t));
}

static inline void kv_requests_free(kv_requests *r) {
    for (uint32_t i = 0; i < r->count; i++)
        free(r->pages[i]);
    free(r->len), free(r->pages), free(r->page_count);
}

/* An allocator whose free list is shuffled, so requests get scattered, non-contiguous pages. */
static inline mg_kv_page_allocator *kv_shuffled_allocator(uint32_t num_pages) {
    mg_kv_page_allocator *a = NULL;
    CHECK_OK(mg_kv_page_allocator_create(num_pages, &a));
    int32_t *all = malloc(sizeof(int32_t) * num_pages);
    CHECK_OK(mg_kv_page_alloc(a, num_pages, all));
    for (uint32_t i = num_pages - 1; i > 0; i--) {
        uint32_t j = (uint32_t)test_rand_range(0, i);
        int32_t t = all[i];
        all[i] = all[j], all[j] = t;
    }
    CHECK_OK(mg_kv_page_free(a, num_pages, all));
    free(all);
    return a;
}

/* Grows every request by add[i] tokens (taking pages from `a`) and builds the step: page table
 * and fresh random inputs for the new tokens. */
static inline void kv_step_build(kv_step *st, const kv_shape *sh, kv_requests *r,
                                 mg_kv_page_allocator *a, const uint32_t *add) {
    memset(st, 0, sizeof *st);
    st->batch = r->count;
    st->qo_indptr = calloc(r->count + 1, sizeof(int32_t));
    st->kv_indptr = calloc(r->count + 1, sizeof(int32_t));
    st->last = calloc(r->count, sizeof(int32_t));
    for (uint32_t i = 0; i < r->count; i++) {
        r->len[i] += add[i];
        uint32_t need = (uint32_t)((r->len[i] + sh->page_size - 1) / sh->page_size);
        if (need > r->page_count[i]) {
            CHECK_OK(mg_kv_page_alloc(a, need - r->page_count[i], r->pages[i] + r->page_count[i]));
            r->page_count[i] = need;
        }
        st->qo_indptr[i + 1] = st->qo_indptr[i] + (int32_t)add[i];
        st->kv_indptr[i + 1] = st->kv_indptr[i] + (int32_t)r->page_count[i];
        st->last[i] = r->page_count[i]
                          ? (int32_t)(r->len[i] - (int64_t)(r->page_count[i] - 1) * sh->page_size)
                          : 0;
    }
    st->kv_indices = calloc((size_t)st->kv_indptr[r->count] + 1, sizeof(int32_t));
    for (uint32_t i = 0; i < r->count; i++)
        memcpy(st->kv_indices + st->kv_indptr[i], r->pages[i], sizeof(int32_t) * r->page_count[i]);
    st->tokens = (uint32_t)st->qo_indptr[r->count];
    st->kv_stride = 2 * sh->hkv * sh->d + 8; /* padded rows: a stride of its own */
    st->q = malloc(2 * ((size_t)st->tokens * sh->hq * sh->d + 1));
    st->kv = malloc(2 * ((size_t)st->tokens * st->kv_stride + 1));
    st->pos = malloc(sizeof(int32_t) * (st->tokens + 1));
    /* Queries of a larger scale than keys: peaked softmaxes, so a wrong score shows. */
    for (size_t i = 0; i < (size_t)st->tokens * sh->hq * sh->d; i++)
        st->q[i] = mg_f32_to_bf16(4.0f * mg_bf16_to_f32(kv_random_bf16()));
    for (size_t i = 0; i < (size_t)st->tokens * st->kv_stride; i++)
        st->kv[i] = kv_random_bf16();
    for (uint32_t t = 0; t < st->tokens; t++)
        st->pos[t] = (int32_t)test_rand_range(0, 40000);
}

static inline void kv_step_free(kv_step *st) {
    free(st->qo_indptr), free(st->kv_indptr), free(st->kv_indices), free(st->last);
    free(st->q), free(st->kv), free(st->pos);
}

static inline mg_kv_page_table kv_table_of(const kv_step *st) {
    return (mg_kv_page_table){st->batch, st->qo_indptr, st->kv_indptr, st->kv_indices, st->last};
}

#define KV_THETA 10000.0f
/* Llama 3.1's scaling with a short original context, so that heads of 32-64 have pairs in all
 * three bands (kept, divided by the factor, smoothed between). */
#define KV_LLAMA3_FACTOR 8.0
#define KV_LLAMA3_LOW 1.0
#define KV_LLAMA3_HIGH 4.0
#define KV_LLAMA3_ORIGINAL 64u

/* Pair i's frequency in float64: theta^(-2i/d), or with Llama 3.1's scaling as its Hugging Face
 * definition states it (the wavelength bands of _compute_llama3_parameters). */
static inline double kv_inv_freq_f64(uint32_t i, uint32_t d, bool llama3) {
    const double f = pow(KV_THETA, -(double)(2 * i) / d);
    if (!llama3)
        return f;
    const double w = 6.283185307179586 / f, old = KV_LLAMA3_ORIGINAL;
    if (w < old / KV_LLAMA3_HIGH)
        return f;
    if (w > old / KV_LLAMA3_LOW)
        return f / KV_LLAMA3_FACTOR;
    const double s = (old / w - KV_LLAMA3_LOW) / (KV_LLAMA3_HIGH - KV_LLAMA3_LOW);
    return (1 - s) * f / KV_LLAMA3_FACTOR + s * f;
}

/* Rotate-half RoPE of one head in float64. */
static inline void kv_rope_f64(double *x, uint32_t d, double position, bool llama3) {
    for (uint32_t i = 0; i < d / 2; i++) {
        double a = position * kv_inv_freq_f64(i, d, llama3);
        double x0 = x[i], x1 = x[i + d / 2];
        x[i] = x0 * cos(a) - x1 * sin(a);
        x[i + d / 2] = x1 * cos(a) + x0 * sin(a);
    }
}

/* Within a BF16 rounding of the float64 value, plus the error of an FP32 angle: position *
 * frequency rounded to FP32 is off by up to a few ulps of the angle, which grows with the
 * position (as in every FP32 RoPE). */
static inline bool kv_close_rope(uint16_t got, double want, double position) {
    return fabs(kv_bf16(got) - want) <= fabs(want) / 128.0 + 4e-3 + 2e-6 * position;
}

/* The token's kv position within its request. */
static inline int64_t kv_token_pos(const kv_step *st, const kv_shape *sh, uint32_t r, uint32_t t) {
    int64_t pages = st->kv_indptr[r + 1] - st->kv_indptr[r];
    int64_t kv_len = pages ? (pages - 1) * sh->page_size + st->last[r] : 0;
    return kv_len - (st->qo_indptr[r + 1] - st->qo_indptr[r]) + (t - st->qo_indptr[r]);
}

/* Checks the pool and q after an append against float64: the new tokens' slots hold their
 * (rotated) keys and values, every other element is unchanged. Returns failures. */
/* FP8 pools: a stored key (code * scale) against the float64 value: within half an E4M3 step
 * (2^-4 relative, 2^-10 * scale below the normal range) of the value saturated to 448 * scale,
 * plus kv_close_rope's allowance for the FP32 angle. */
static inline bool kv_close_fp8(double got, double want, double scale, double position) {
    const double limit = 448.0 * scale;
    const double clamped = want > limit ? limit : want < -limit ? -limit : want;
    return fabs(got - clamped) <=
           fabs(clamped) / 16.0 + scale / 1024.0 + 1e-3 * fabs(want) + 2e-6 * position;
}

static inline int kv_verify_append(const kv_shape *sh, const kv_step *st, const void *pool_before,
                                   const void *pool_after, const uint16_t *q_after,
                                   const char *what) {
    const size_t half = kv_pool_elems(sh), token = (size_t)sh->hkv * sh->d;
    unsigned char *written = calloc(half, 1);
    int bad = 0;
    double x[512];
    for (uint32_t r = 0; r < st->batch; r++)
        for (int32_t t = st->qo_indptr[r]; t < st->qo_indptr[r + 1]; t++) {
            const int64_t pos = kv_token_pos(st, sh, r, (uint32_t)t);
            const int32_t page = st->kv_indices[st->kv_indptr[r] + pos / sh->page_size];
            const size_t slot =
                ((size_t)page * sh->page_size + (size_t)(pos % sh->page_size)) * token;
            const double position = sh->positions ? st->pos[t] : (double)pos;
            for (uint32_t h = 0; h < sh->hkv; h++) {
                const uint16_t *k = st->kv + (size_t)t * st->kv_stride + (size_t)h * sh->d;
                const uint16_t *v = k + token;
                for (uint32_t c = 0; c < sh->d; c++)
                    x[c] = kv_bf16(k[c]);
                if (sh->rope)
                    kv_rope_f64(x, sh->d, position, sh->llama3);
                for (uint32_t c = 0; c < sh->d; c++) {
                    const size_t e = slot + (size_t)h * sh->d + c;
                    written[e] = 1;
                    if (sh->fp8) {
                        /* V: exactly e4m3(v / scale) in FP32; K: close to float64. */
                        const uint8_t v_code =
                            mg_f32_to_fp8_e4m3(mg_bf16_to_f32(v[c]) / kv_scale(h, true));
                        bad += !kv_close_fp8(kv_pool_value(sh, pool_after, false, e), x[c],
                                             kv_scale(h, false), position) +
                               (((const uint8_t *)pool_after)[half + e] != v_code);
                        continue;
                    }
                    const uint16_t *after = pool_after;
                    if (!(sh->rope ? kv_close_rope(after[e], x[c], position) : after[e] == k[c]) ||
                        after[half + e] != v[c])
                        bad++;
                }
            }
            for (uint32_t h = 0; sh->rope && h < sh->hq; h++) {
                const size_t row = ((size_t)t * sh->hq + h) * sh->d;
                for (uint32_t c = 0; c < sh->d; c++)
                    x[c] = kv_bf16(st->q[row + c]);
                kv_rope_f64(x, sh->d, position, sh->llama3);
                for (uint32_t c = 0; c < sh->d; c++)
                    bad += !kv_close_rope(q_after[row + c], x[c], position);
            }
        }
    for (size_t e = 0; e < half; e++)
        if (!written[e])
            bad += kv_pool_changed(sh, pool_after, pool_before, e) +
                   kv_pool_changed(sh, pool_after, pool_before, half + e);
    free(written);
    if (bad)
        fprintf(stderr, "FAIL %s: %d elements of the appended pool or q differ\n", what, bad);
    return bad;
}

/* Float64 causal attention over pages for every new token, compared with o and lse (rows of
 * requests with tokens; others must stay poisoned: o 0xFFFF, lse NaN bits). */
static inline int kv_verify_attention(const kv_shape *sh, const kv_step *st, const uint16_t *q,
                                      const void *pool, const uint16_t *o, const float *lse,
                                      uint32_t qo_rows, const char *what) {
    const size_t token = (size_t)sh->hkv * sh->d;
    const uint32_t group = sh->hq / sh->hkv;
    const double scale = 1.0 / sqrt((double)sh->d);
    int bad = 0;
    double acc[512];
    for (uint32_t r = 0; r < st->batch; r++) {
        const int64_t qo_len = st->qo_indptr[r + 1] - st->qo_indptr[r];
        const int64_t kv_len = kv_token_pos(st, sh, r, (uint32_t)st->qo_indptr[r + 1]);
        double *scores = malloc(sizeof(double) * (size_t)(kv_len + 1));
        for (int64_t j = 0; j < qo_len; j++) {
            const uint32_t t = (uint32_t)(st->qo_indptr[r] + j);
            const int64_t p = kv_len - qo_len + j;
            const int64_t begin =
                sh->window_left >= 0 && p - sh->window_left > 0 ? p - sh->window_left : 0;
            for (uint32_t h = 0; h < sh->hq; h++) {
                const uint16_t *qr = q + ((size_t)t * sh->hq + h) * sh->d;
                double mx = -INFINITY, sum = 0;
                for (int64_t k = begin; k <= p; k++) {
                    const int32_t page = st->kv_indices[st->kv_indptr[r] + k / sh->page_size];
                    const size_t kr =
                        ((size_t)page * sh->page_size + (size_t)(k % sh->page_size)) * token +
                        (size_t)(h / group) * sh->d;
                    double dot = 0;
                    for (uint32_t c = 0; c < sh->d; c++)
                        dot += kv_bf16(qr[c]) * kv_pool_value(sh, pool, false, kr + c);
                    double s = dot * scale;
                    if (sh->soft_cap > 0)
                        s = sh->soft_cap * tanh(s / sh->soft_cap);
                    scores[k] = s;
                    mx = s > mx ? s : mx;
                }
                for (uint32_t c = 0; c < sh->d; c++)
                    acc[c] = 0;
                for (int64_t k = begin; k <= p; k++) {
                    const int32_t page = st->kv_indices[st->kv_indptr[r] + k / sh->page_size];
                    const size_t vr =
                        ((size_t)page * sh->page_size + (size_t)(k % sh->page_size)) * token +
                        (size_t)(h / group) * sh->d;
                    double e = exp(scores[k] - mx);
                    sum += e;
                    for (uint32_t c = 0; c < sh->d; c++)
                        acc[c] += e * kv_pool_value(sh, pool, true, vr + c);
                }
                const uint16_t *orow = o + ((size_t)t * sh->hq + h) * sh->d;
                for (uint32_t c = 0; c < sh->d; c++) {
                    double want = acc[c] / sum, got = kv_bf16(orow[c]);
                    if (!(fabs(got - want) <= 1e-2 + 1e-2 * fabs(want)))
                        bad++;
                }
                if (lse) {
                    double want = (mx + log(sum)) / log(2.0);
                    double got = lse[(size_t)t * sh->hq + h];
                    if (!(fabs(got - want) <= 1e-2 + 1e-3 * fabs(want)))
                        bad++;
                }
            }
        }
        free(scores);
    }
    /* Rows past the batch's tokens stay poisoned. */
    for (size_t e = (size_t)st->tokens * sh->hq * sh->d; e < (size_t)qo_rows * sh->hq * sh->d; e++)
        bad += o[e] != 0xFFFF;
    if (bad)
        fprintf(stderr, "FAIL %s: %d outputs differ from the float64 reference\n", what, bad);
    return bad;
}

/* Device buffers of a scenario. */
typedef struct kv_device {
    mg_devptr pool, k_pages, v_pages, q, kv, pos, o, lse;
    mg_devptr k_scale, v_scale; /* FP8 pools only */
    mg_devptr rope_inv_freq;    /* llama3 shapes only */
    mg_devptr qo_indptr, kv_indptr, kv_indices, last;
    uint32_t token_capacity, index_capacity, batch_capacity;
} kv_device;

static inline void kv_device_alloc(mg_backend *be, const kv_shape *sh, kv_device *dv,
                                   uint32_t tokens, uint32_t kv_stride, uint32_t batch) {
    memset(dv, 0, sizeof *dv);
    mg_kv_cache_desc c = {sh->hkv, sh->d, sh->page_size, sh->num_pages,
                          sh->fp8 ? MG_KV_FP8_E4M3 : MG_KV_BF16};
    size_t bytes = 0;
    CHECK_OK(mg_kv_cache_bytes(&c, &bytes));
    CHECK(bytes == kv_pool_bytes(sh));
    if (sh->fp8) {
        float scales[2][KV_MAX_TEST_HEADS];
        CHECK(sh->hkv <= KV_MAX_TEST_HEADS);
        for (uint32_t h = 0; h < sh->hkv && h < KV_MAX_TEST_HEADS; h++)
            scales[0][h] = kv_scale(h, false), scales[1][h] = kv_scale(h, true);
        CHECK_OK(mg_alloc(be, 4 * sh->hkv, &dv->k_scale));
        CHECK_OK(mg_alloc(be, 4 * sh->hkv, &dv->v_scale));
        CHECK_OK(mg_copy_h2d(be, dv->k_scale, scales[0], 4 * sh->hkv));
        CHECK_OK(mg_copy_h2d(be, dv->v_scale, scales[1], 4 * sh->hkv));
    }
    if (sh->llama3) {
        float table[256];
        CHECK(sh->d / 2 <= 256);
        CHECK_OK(mg_rope_inv_freq_llama3(sh->d, KV_THETA, (float)KV_LLAMA3_FACTOR,
                                         (float)KV_LLAMA3_LOW, (float)KV_LLAMA3_HIGH,
                                         KV_LLAMA3_ORIGINAL, table));
        CHECK_OK(mg_alloc(be, 4 * (size_t)(sh->d / 2), &dv->rope_inv_freq));
        CHECK_OK(mg_copy_h2d(be, dv->rope_inv_freq, table, 4 * (size_t)(sh->d / 2)));
    }
    CHECK_OK(mg_alloc(be, bytes, &dv->pool));
    CHECK_OK(mg_kv_cache_pools(&c, dv->pool, &dv->k_pages, &dv->v_pages));
    const size_t t = tokens ? tokens : 1;
    CHECK_OK(mg_alloc(be, 2 * t * sh->hq * sh->d, &dv->q));
    CHECK_OK(mg_alloc(be, 2 * t * kv_stride, &dv->kv));
    CHECK_OK(mg_alloc(be, 4 * t, &dv->pos));
    CHECK_OK(mg_alloc(be, 2 * t * sh->hq * sh->d, &dv->o));
    CHECK_OK(mg_alloc(be, 4 * t * sh->hq, &dv->lse));
    CHECK_OK(mg_alloc(be, 4 * (batch + 1), &dv->qo_indptr));
    CHECK_OK(mg_alloc(be, 4 * (batch + 1), &dv->kv_indptr));
    CHECK_OK(mg_alloc(be, 4 * batch, &dv->last));
    CHECK_OK(mg_alloc(be, 4 * (size_t)sh->num_pages, &dv->kv_indices));
    dv->token_capacity = (uint32_t)t;
    dv->index_capacity = sh->num_pages;
    dv->batch_capacity = batch;
}

static inline void kv_device_free(mg_backend *be, kv_device *dv) {
    mg_devptr *all[] = {&dv->pool,    &dv->q,         &dv->kv,           &dv->pos,  &dv->o,
                        &dv->lse,     &dv->qo_indptr, &dv->kv_indptr,    &dv->last, &dv->kv_indices,
                        &dv->k_scale, &dv->v_scale,   &dv->rope_inv_freq};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        mg_free(be, *all[i]);
}

/* Uploads a step's tables and inputs (synchronous copies) and poisons o and lse. */
static inline void kv_device_upload(mg_backend *be, const kv_shape *sh, kv_device *dv,
                                    const kv_step *st) {
    CHECK_OK(mg_copy_h2d(be, dv->qo_indptr, st->qo_indptr, 4 * (st->batch + 1)));
    CHECK_OK(mg_copy_h2d(be, dv->kv_indptr, st->kv_indptr, 4 * (st->batch + 1)));
    CHECK_OK(mg_copy_h2d(be, dv->last, st->last, 4 * st->batch));
    if (st->kv_indptr[st->batch])
        CHECK_OK(
            mg_copy_h2d(be, dv->kv_indices, st->kv_indices, 4 * (size_t)st->kv_indptr[st->batch]));
    if (st->tokens) {
        CHECK_OK(mg_copy_h2d(be, dv->q, st->q, 2 * (size_t)st->tokens * sh->hq * sh->d));
        CHECK_OK(mg_copy_h2d(be, dv->kv, st->kv, 2 * (size_t)st->tokens * st->kv_stride));
        CHECK_OK(mg_copy_h2d(be, dv->pos, st->pos, 4 * (size_t)st->tokens));
    }
    CHECK_OK(mg_memset(be, dv->o, 0xFF, 2 * (size_t)dv->token_capacity * sh->hq * sh->d));
    CHECK_OK(mg_memset(be, dv->lse, 0xFF, 4 * (size_t)dv->token_capacity * sh->hq));
}

static inline mg_kv_append_args kv_append_args_of(const kv_shape *sh, const kv_device *dv,
                                                  const kv_step *st) {
    return (mg_kv_append_args){
        .batch_size = st->batch,
        .num_tokens = dv->token_capacity,
        .num_kv_indices = dv->index_capacity,
        .k = dv->kv,
        .v = dv->kv + 2ull * sh->hkv * sh->d,
        .k_stride = st->kv_stride,
        .v_stride = st->kv_stride,
        .q = sh->rope ? dv->q : 0,
        .q_stride = sh->hq * sh->d,
        .num_qo_heads = sh->hq,
        .positions = sh->positions ? dv->pos : 0,
        .rope = sh->rope,
        .rope_theta = KV_THETA,
        .rope_inv_freq = dv->rope_inv_freq,
        .qo_indptr = dv->qo_indptr,
        .kv_indptr = dv->kv_indptr,
        .kv_indices = dv->kv_indices,
        .kv_last_page_len = dv->last,
        .k_pages = dv->k_pages,
        .v_pages = dv->v_pages,
        .k_scale = dv->k_scale,
        .v_scale = dv->v_scale,
    };
}

static inline mg_paged_attention_desc kv_attention_desc(const kv_shape *sh) {
    return (mg_paged_attention_desc){.num_qo_heads = sh->hq,
                                     .num_kv_heads = sh->hkv,
                                     .head_dim = sh->d,
                                     .page_size = sh->page_size,
                                     .window_left = sh->window_left,
                                     .sm_scale = (float)(1.0 / sqrt((double)sh->d)),
                                     .logits_soft_cap = sh->soft_cap,
                                     .kv_dtype = sh->fp8 ? MG_KV_FP8_E4M3 : MG_KV_BF16,
                                     .impl = sh->impl};
}

/* The plan runs the path the shape expects (kv_shape.expect_impl), when it expects one. */
static inline void kv_check_impl(const mg_attention_plan *p, const kv_shape *sh, const char *what) {
    if (!p || sh->expect_impl == MG_ATTENTION_IMPL_AUTO)
        return;
    mg_attention_plan_info info;
    CHECK_OK(mg_attention_plan_get_info(p, &info));
    test_checks++;
    if (info.impl != sh->expect_impl) {
        fprintf(stderr, "FAIL %s: the plan runs %s, expected %s\n", what,
                mg_attention_impl_name(info.impl), mg_attention_impl_name(sh->expect_impl));
        test_failures++;
    }
}

static inline mg_paged_attention_tensors
kv_attention_tensors(const kv_shape *sh, const kv_device *dv, uint32_t qo_rows) {
    return (mg_paged_attention_tensors){.q = dv->q,
                                        .o = dv->o,
                                        .lse = dv->lse,
                                        .qo_rows = qo_rows,
                                        .k_pages = dv->k_pages,
                                        .v_pages = dv->v_pages,
                                        .num_pages = sh->num_pages,
                                        .kv_indices = dv->kv_indices,
                                        .num_kv_indices = dv->index_capacity,
                                        .k_scale = dv->k_scale,
                                        .v_scale = dv->v_scale};
}

/* Host images of the device state after a step. */
typedef struct kv_host_images {
    void *pool;
    uint16_t *q, *o;
    float *lse;
} kv_host_images;

static inline void kv_read_back(mg_backend *be, const kv_shape *sh, const kv_device *dv,
                                kv_host_images *im) {
    const size_t t = dv->token_capacity;
    im->pool = malloc(kv_pool_bytes(sh));
    im->q = malloc(2 * t * sh->hq * sh->d);
    im->o = malloc(2 * t * sh->hq * sh->d);
    im->lse = malloc(4 * t * sh->hq);
    CHECK_OK(mg_copy_d2h(be, im->pool, dv->pool, kv_pool_bytes(sh)));
    CHECK_OK(mg_copy_d2h(be, im->q, dv->q, 2 * t * sh->hq * sh->d));
    CHECK_OK(mg_copy_d2h(be, im->o, dv->o, 2 * t * sh->hq * sh->d));
    CHECK_OK(mg_copy_d2h(be, im->lse, dv->lse, 4 * t * sh->hq));
}

static inline void kv_images_free(kv_host_images *im) {
    free(im->pool), free(im->q), free(im->o), free(im->lse);
}

/* Runs one eager step on `be` and checks it against float64: uploads the step, appends its
 * tokens, plans the attention (creating *plan, which must run the path the shape expects, or
 * updating it), runs it, reads back. `pool` holds the pool's host image before the step and is
 * replaced by the image after it. */
static inline void kv_check_eager_step(mg_backend *be, const kv_shape *sh, kv_device *dv,
                                       const kv_step *st, void *pool, mg_attention_plan **plan,
                                       const char *what) {
    CHECK_OK(mg_copy_h2d(be, dv->pool, pool, kv_pool_bytes(sh)));
    kv_device_upload(be, sh, dv, st);
    mg_kv_append_args args = kv_append_args_of(sh, dv, st);
    CHECK_OK(mg_kv_append(be, NULL,
                          &(mg_kv_cache_desc){sh->hkv, sh->d, sh->page_size, sh->num_pages,
                                              sh->fp8 ? MG_KV_FP8_E4M3 : MG_KV_BF16},
                          &args));
    mg_paged_attention_desc d = kv_attention_desc(sh);
    mg_kv_page_table table = kv_table_of(st);
    if (!*plan) {
        CHECK_OK(mg_paged_attention_plan_create(be, &d, &table, NULL, plan));
        kv_check_impl(*plan, sh, what);
    } else {
        CHECK_OK(mg_paged_attention_plan_update(*plan, &table, NULL));
    }
    mg_paged_attention_tensors t = kv_attention_tensors(sh, dv, st->tokens);
    if (*plan)
        CHECK_OK(mg_paged_attention_run(*plan, &t, NULL));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(be)));
    kv_host_images im;
    kv_read_back(be, sh, dv, &im);
    char label[160];
    snprintf(label, sizeof label, "%s: append", what);
    test_failures += kv_verify_append(sh, st, pool, im.pool, im.q, label) != 0;
    snprintf(label, sizeof label, "%s: attention", what);
    test_failures +=
        kv_verify_attention(sh, st, im.q, im.pool, im.o, im.lse, st->tokens, label) != 0;
    test_checks += 2;
    memcpy(pool, im.pool, kv_pool_bytes(sh));
    kv_images_free(&im);
}

/* Eager steps on `be` over B requests whose cached prefixes are `prefix` (0: a request without
 * pages), step k adding add[k * B + i] tokens to request i; one plan serves every step (created
 * on the first, updated after). */
static inline void kv_scenario_steps(mg_backend *be, kv_shape sh, uint32_t B,
                                     const uint32_t *prefix, const uint32_t *add, int steps,
                                     const char *what) {
    uint32_t pages = 0, tokens = 1;
    for (uint32_t i = 0; i < B; i++) {
        uint32_t len = prefix[i];
        for (int k = 0; k < steps; k++)
            len += add[k * B + i];
        pages += (len + sh.page_size - 1) / sh.page_size;
    }
    for (int k = 0; k < steps; k++) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < B; i++)
            n += add[k * B + i];
        tokens = n > tokens ? n : tokens;
    }
    sh.num_pages = pages + 5;
    mg_kv_page_allocator *a = kv_shuffled_allocator(sh.num_pages);
    kv_requests r;
    kv_requests_init(&r, B, sh.num_pages);
    kv_step st;
    kv_step_build(&st, &sh, &r, a, prefix); /* the cached prefixes: only their pages matter */
    kv_step_free(&st);
    kv_device dv;
    kv_device_alloc(be, &sh, &dv, tokens, 2 * sh.hkv * sh.d + 8, B);
    void *pool = kv_random_pool(&sh);
    mg_attention_plan *p = NULL;
    for (int k = 0; k < steps; k++) {
        kv_step_build(&st, &sh, &r, a, add + (size_t)k * B);
        char label[128];
        if (steps > 1)
            snprintf(label, sizeof label, "%s step %d", what, k);
        else
            snprintf(label, sizeof label, "%s", what);
        kv_check_eager_step(be, &sh, &dv, &st, pool, &p, label);
        kv_step_free(&st);
    }
    mg_attention_plan_destroy(p);
    free(pool);
    kv_device_free(be, &dv);
    kv_requests_free(&r);
    mg_kv_page_allocator_destroy(a);
}

/* One step mixing empty requests, decode tokens, prefill chunks over a cached prefix, a fresh
 * prefill and a long request. */
static inline void kv_scenario_one_step(mg_backend *be, kv_shape sh, uint32_t long_len,
                                        const char *what) {
    enum { B = 7 };
    const uint32_t prefix[B] = {0, 37, 5, 0, (uint32_t)test_rand_range(1, 60), long_len, 16};
    const uint32_t add[B] = {0, 1, (uint32_t)test_rand_range(2, 40), 19,
                             1, 1, (uint32_t)test_rand_range(0, 1)};
    kv_scenario_steps(be, sh, B, prefix, add, 1, what);
}

/* A decode step (one new token per request but an empty one; a long request, a fresh one),
 * then, on the same plan, a step mixing prefill chunks with decode tokens and idle requests:
 * a plan created on a decode batch must serve both. */
static inline void kv_scenario_decode_then_mixed(mg_backend *be, kv_shape sh, uint32_t long_len,
                                                 const char *what) {
    enum { B = 7 };
    const uint32_t prefix[B] = {0, 37, 5, 0, (uint32_t)test_rand_range(1, 60), long_len, 16};
    const uint32_t add[2 * B] = {0,  1,
                                 1,  1,
                                 1,  1,
                                 1,  0,
                                 1,  (uint32_t)test_rand_range(2, 40),
                                 19, 1,
                                 0,  (uint32_t)test_rand_range(0, 1)};
    kv_scenario_steps(be, sh, B, prefix, add, 2, what);
}

/* One prefill-heavy step (over 128 new tokens per request on average, so CUDA's AUTO takes FA3
 * where it can): a fresh prompt spanning tile and page boundaries, chunks of 257 and of 64..200
 * tokens over cached prefixes ending inside a page, a decode token riding along and an idle
 * request. */
static inline void kv_scenario_prefill_chunks(mg_backend *be, kv_shape sh, const char *what) {
    enum { B = 5 };
    const uint32_t prefix[B] = {0, 333, (uint32_t)test_rand_range(1, 1000), 50, 7};
    const uint32_t add[B] = {300, 257, (uint32_t)test_rand_range(64, 200), 1, 0};
    kv_scenario_steps(be, sh, B, prefix, add, 1, what);
}

/* Steps replayed from one captured graph (append + attention): contexts grow, pages are added,
 * some requests sit idle in some steps (qo_len 0), and each step equals float64. Each active
 * request adds one token (decode), or with kv_shape.graph_chunk up to that many (chunked
 * prefill; the fixed grid holds B * graph_chunk rows). */
static inline void kv_scenario_graph_steps(mg_backend *be, kv_shape sh, const char *what) {
    enum { B = 6, STEPS = 5 };
    const uint32_t chunk = sh.graph_chunk ? sh.graph_chunk : 1, rows = B * chunk;
    sh.num_pages = 0;
    uint32_t start[B];
    for (int i = 0; i < B; i++) {
        start[i] = (uint32_t)test_rand_range(1, 300);
        sh.num_pages += (start[i] + STEPS * chunk + sh.page_size - 1) / sh.page_size;
    }
    sh.num_pages += 3;
    mg_kv_page_allocator *a = kv_shuffled_allocator(sh.num_pages);
    kv_requests r;
    kv_requests_init(&r, B, sh.num_pages);
    kv_step st;
    kv_step_build(&st, &sh, &r, a, start);
    kv_step_free(&st);
    kv_device dv;
    kv_device_alloc(be, &sh, &dv, rows, 2 * sh.hkv * sh.d + 8, B);
    void *pool = kv_random_pool(&sh);
    CHECK_OK(mg_copy_h2d(be, dv.pool, pool, kv_pool_bytes(&sh)));
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(be, &s));
    mg_paged_attention_desc d = kv_attention_desc(&sh);
    d.graph_qo_rows = rows;
    d.graph_kv_tokens = sh.num_pages * sh.page_size;
    mg_kv_cache_desc cache = {sh.hkv, sh.d, sh.page_size, sh.num_pages,
                              sh.fp8 ? MG_KV_FP8_E4M3 : MG_KV_BF16};
    mg_attention_plan *p = NULL;
    mg_graph *g = NULL;
    for (int step = 0; step < STEPS; step++) {
        uint32_t add[B];
        for (int i = 0; i < B; i++) /* some idle from step 1 */
            add[i] = step == 0 || test_rand_range(0, 3)
                         ? (uint32_t)test_rand_range(sh.graph_chunk ? 2 : 1, chunk)
                         : 0;
        kv_step_build(&st, &sh, &r, a, add);
        mg_kv_page_table table = kv_table_of(&st);
        if (!p) {
            CHECK_OK(mg_paged_attention_plan_create(be, &d, &table, s, &p));
            kv_check_impl(p, &sh, what);
        } else
            CHECK_OK(mg_paged_attention_plan_update(p, &table, s));
        CHECK_OK(mg_stream_synchronize(s));
        kv_device_upload(be, &sh, &dv, &st);
        if (!g && p) {
            mg_kv_append_args args = kv_append_args_of(&sh, &dv, &st);
            mg_paged_attention_tensors t = kv_attention_tensors(&sh, &dv, rows);
            CHECK_OK(mg_graph_begin_capture(s));
            CHECK_OK(mg_kv_append(be, s, &cache, &args));
            CHECK_OK(mg_paged_attention_run(p, &t, s));
            CHECK_OK(mg_graph_end_capture(s, &g));
        }
        if (g)
            CHECK_OK(mg_graph_launch(g, s));
        CHECK_OK(mg_stream_synchronize(s));
        kv_host_images im;
        kv_read_back(be, &sh, &dv, &im);
        char label[160];
        snprintf(label, sizeof label, "%s: graph step %d append", what, step);
        test_failures += kv_verify_append(&sh, &st, pool, im.pool, im.q, label) != 0;
        snprintf(label, sizeof label, "%s: graph step %d attention", what, step);
        test_failures +=
            kv_verify_attention(&sh, &st, im.q, im.pool, im.o, im.lse, rows, label) != 0;
        test_checks += 2;
        memcpy(pool, im.pool, kv_pool_bytes(&sh));
        kv_images_free(&im);
        kv_step_free(&st);
    }
    if (g)
        mg_graph_destroy(g);
    mg_attention_plan_destroy(p);
    mg_stream_destroy(s);
    free(pool);
    kv_device_free(be, &dv);
    kv_requests_free(&r);
    mg_kv_page_allocator_destroy(a);
}

#endif
