/* check_kv_cache.c - the paged KV cache (metrale/ops_kv_cache.h) on the backend under test
 * against the CPU reference backend: the same random batch (requests with cached prefixes on
 * shuffled, non-contiguous pages; decode tokens, prefill chunks, empty requests, partial last
 * pages, one long request) appended with RoPE into a randomly filled pool, then attention over
 * the pages; outputs poisoned first.
 *
 * Bounds: the pool must match bitwise except the new keys, which went through FP32 RoPE (sincos
 * and powf may differ by an ulp between CUDA and the host libm, so a key may differ by one BF16
 * ulp: |diff| <= |x| / 128 + 1e-3); values exactly. Attention outputs as the ragged op's checks
 * (check_attention.c): max |diff| <= 2e-2, relative L2 <= 1e-2, LSE within 5e-3 base-2 units
 * scaled by its size. On the CPU backend (reference against itself) lengths shrink eightfold.
 *
 * Cases with an impl ask CUDA for that path (the CPU backend ignores it) and check the plan
 * reports running it; FA3 cases (the Hopper paged prefill kernel) skip where the device is not
 * compute capability 9.0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops.h"
#include "metrale/ops_kv_cache.h"

#define MAX_ABS_ERROR 2e-2
#define MAX_REL_L2_ERROR 1e-2
#define MAX_LSE_ERROR 5e-3

typedef struct kv_case {
    const char *name;
    uint32_t batch, hq, hkv, page_size, max_prefix, max_new;
    int32_t window_left;
    float soft_cap;
    bool positions;
    uint32_t long_prefix; /* request 0's cached prefix (0: none) */
    uint32_t head_dim;
    mg_attention_impl impl; /* 0: AUTO */
} kv_case;

static uint32_t rng_range(uint64_t *r, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)(mg_check_rng_next(r) % ((uint64_t)hi - lo + 1));
}

static uint16_t rng_bf16(uint64_t *r, float scale) {
    return mg_f32_to_bf16(scale * ((float)rng_range(r, 0, 2000) / 1000.0f - 1.0f));
}

/* The host side of a case: page table, inputs, initial pool. */
typedef struct kv_batch {
    mg_kv_cache_desc cache;
    int32_t *qo_indptr, *kv_indptr, *kv_indices, *last, *positions;
    uint32_t tokens, pages_used;
    uint16_t *q, *k, *v, *pool;
    size_t pool_elems; /* per pool (K or V) */
} kv_batch;

static void free_batch(kv_batch *b) {
    free(b->qo_indptr), free(b->kv_indptr), free(b->kv_indices), free(b->last);
    free(b->positions), free(b->q), free(b->k), free(b->v), free(b->pool);
    *b = (kv_batch){0};
}

static bool make_batch(uint64_t *r, const kv_case *c, bool small, kv_batch *b) {
    const uint32_t d = c->head_dim, shrink = small ? 8 : 1, n = c->batch;
    b->qo_indptr = calloc(n + 1, 4);
    b->kv_indptr = calloc(n + 1, 4);
    b->last = calloc(n, 4);
    uint32_t *len = calloc(n, 4);
    if (!b->qo_indptr || !b->kv_indptr || !b->last || !len) {
        free(len);
        return false;
    }
    const uint32_t ps = c->page_size;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t kind = rng_range(r, 0, 5); /* 0: empty request, else active */
        uint32_t prefix = rng_range(r, 0, c->max_prefix / shrink + 1);
        if (i == 0 && c->long_prefix)
            prefix = c->long_prefix / shrink;
        const uint32_t most_new = c->max_new / shrink ? c->max_new / shrink : 1;
        const uint32_t add = kind == 0 && i ? 0 : rng_range(r, 1, most_new);
        len[i] = (kind == 0 && i ? 0 : prefix) + add;
        b->qo_indptr[i + 1] = b->qo_indptr[i] + (int32_t)add;
        const uint32_t pages = (len[i] + ps - 1) / ps;
        b->kv_indptr[i + 1] = b->kv_indptr[i] + (int32_t)pages;
        b->last[i] = pages ? (int32_t)(len[i] - (pages - 1) * ps) : 0;
    }
    free(len);
    b->pages_used = (uint32_t)b->kv_indptr[n];
    b->tokens = (uint32_t)b->qo_indptr[n];
    b->cache = (mg_kv_cache_desc){c->hkv, d, ps, b->pages_used + rng_range(r, 1, 9), MG_KV_BF16};
    /* Page ids: a shuffled permutation of the pool, so pages are scattered. */
    const uint32_t np = b->cache.num_pages;
    int32_t *perm = malloc(4ull * np);
    b->kv_indices = malloc(4ull * np);
    b->pool_elems = (size_t)np * ps * c->hkv * d;
    b->pool = malloc(4 * b->pool_elems);
    const size_t t = b->tokens ? b->tokens : 1;
    b->q = malloc(2 * t * c->hq * d);
    b->k = malloc(2 * t * c->hkv * d);
    b->v = malloc(2 * t * c->hkv * d);
    b->positions = malloc(4 * t);
    if (!perm || !b->kv_indices || !b->pool || !b->q || !b->k || !b->v || !b->positions) {
        free(perm);
        return false;
    }
    for (uint32_t i = 0; i < np; i++)
        perm[i] = (int32_t)i;
    for (uint32_t i = np - 1; i > 0; i--) {
        uint32_t j = rng_range(r, 0, i);
        int32_t x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    memcpy(b->kv_indices, perm, 4ull * np);
    free(perm);
    for (size_t i = 0; i < 2 * b->pool_elems; i++)
        b->pool[i] = rng_bf16(r, 1.0f);
    for (size_t i = 0; i < t * c->hq * d; i++)
        b->q[i] = rng_bf16(r, 4.0f); /* peaked softmaxes, so a wrong score shows */
    for (size_t i = 0; i < t * c->hkv * d; i++) {
        b->k[i] = rng_bf16(r, 1.0f);
        b->v[i] = rng_bf16(r, 1.0f);
    }
    for (size_t i = 0; i < t; i++)
        b->positions[i] = (int32_t)rng_range(r, 0, 100000);
    return true;
}

typedef struct kv_buffers {
    mg_backend *be;
    mg_devptr pool, q, k, v, positions, qo, kv, idx, last, o, lse;
} kv_buffers;

static void free_buffers(kv_buffers *g) {
    mg_devptr *all[] = {&g->pool, &g->q,   &g->k,    &g->v, &g->positions, &g->qo,
                        &g->kv,   &g->idx, &g->last, &g->o, &g->lse};
    for (size_t i = 0; g->be && i < sizeof all / sizeof all[0]; i++)
        if (*all[i])
            mg_free(g->be, *all[i]);
}

/* Uploads the batch to `be`, appends (RoPE on q and k) and runs the attention; *ran: the path
 * the plan reports. */
static mg_status run_on(mg_backend *be, const kv_case *c, const kv_batch *b, kv_buffers *g,
                        mg_attention_impl *ran) {
    const uint32_t d = c->head_dim;
    const size_t t = b->tokens ? b->tokens : 1;
    g->be = be;
    mg_status st;
    if ((st = mg_check_upload(be, b->pool, 4 * b->pool_elems, &g->pool)) ||
        (st = mg_check_upload(be, b->q, 2 * t * c->hq * d, &g->q)) ||
        (st = mg_check_upload(be, b->k, 2 * t * c->hkv * d, &g->k)) ||
        (st = mg_check_upload(be, b->v, 2 * t * c->hkv * d, &g->v)) ||
        (st = mg_check_upload(be, b->positions, 4 * t, &g->positions)) ||
        (st = mg_check_upload(be, b->qo_indptr, 4ull * (c->batch + 1), &g->qo)) ||
        (st = mg_check_upload(be, b->kv_indptr, 4ull * (c->batch + 1), &g->kv)) ||
        (st = mg_check_upload(be, b->kv_indices, 4ull * b->cache.num_pages, &g->idx)) ||
        (st = mg_check_upload(be, b->last, 4ull * c->batch, &g->last)) ||
        (st = mg_check_alloc_poisoned(be, 2 * t * c->hq * d, &g->o)) ||
        (st = mg_check_alloc_poisoned(be, 4 * t * c->hq, &g->lse)))
        return st;
    mg_devptr k_pages, v_pages;
    if ((st = mg_kv_cache_pools(&b->cache, g->pool, &k_pages, &v_pages)))
        return st;
    const mg_kv_append_args a = {.batch_size = c->batch,
                                 .num_tokens = b->tokens,
                                 .num_kv_indices = b->cache.num_pages,
                                 .k = g->k,
                                 .v = g->v,
                                 .q = g->q,
                                 .num_qo_heads = c->hq,
                                 .positions = c->positions ? g->positions : 0,
                                 .rope = true,
                                 .rope_theta = 500000.0f,
                                 .qo_indptr = g->qo,
                                 .kv_indptr = g->kv,
                                 .kv_indices = g->idx,
                                 .kv_last_page_len = g->last,
                                 .k_pages = k_pages,
                                 .v_pages = v_pages};
    if ((st = mg_kv_append(be, NULL, &b->cache, &a)))
        return st;
    const mg_paged_attention_desc d_ = {.num_qo_heads = c->hq,
                                        .num_kv_heads = c->hkv,
                                        .head_dim = d,
                                        .page_size = c->page_size,
                                        .window_left = c->window_left,
                                        .sm_scale = 1.0f / sqrtf((float)d),
                                        .logits_soft_cap = c->soft_cap,
                                        .impl = c->impl};
    const mg_kv_page_table table = {c->batch, b->qo_indptr, b->kv_indptr, b->kv_indices, b->last};
    mg_attention_plan *p = NULL;
    if ((st = mg_paged_attention_plan_create(be, &d_, &table, NULL, &p)))
        return st;
    mg_attention_plan_info info;
    if ((st = mg_attention_plan_get_info(p, &info))) {
        mg_attention_plan_destroy(p);
        return st;
    }
    *ran = info.impl;
    const mg_paged_attention_tensors at = {.q = g->q,
                                           .o = g->o,
                                           .lse = g->lse,
                                           .qo_rows = b->tokens,
                                           .k_pages = k_pages,
                                           .v_pages = v_pages,
                                           .num_pages = b->cache.num_pages,
                                           .kv_indices = g->idx,
                                           .num_kv_indices = b->cache.num_pages};
    st = mg_paged_attention_run(p, &at, NULL);
    if (!st)
        st = mg_stream_synchronize(mg_stream_default(be));
    mg_attention_plan_destroy(p);
    return st;
}

/* Compares what both backends hold after the run; fills `why` on a mismatch. */
static bool compare(const kv_case *c, const kv_batch *b, const kv_buffers *got,
                    const kv_buffers *want, double *error, char *why, size_t why_bytes) {
    const size_t t = b->tokens, o_elems = t * c->hq * c->head_dim, pool = 2 * b->pool_elems;
    uint16_t *gp = malloc(2 * pool), *wp = malloc(2 * pool);
    uint16_t *go = malloc(2 * o_elems + 2), *wo = malloc(2 * o_elems + 2);
    uint16_t *gq = malloc(2 * o_elems + 2), *wq = malloc(2 * o_elems + 2);
    float *gl = malloc(4 * t * c->hq + 4), *wl = malloc(4 * t * c->hq + 4);
    bool ok = gp && wp && go && wo && gq && wq && gl && wl;
    if (!ok)
        snprintf(why, why_bytes, "out of host memory");
    ok = ok && !mg_copy_d2h(got->be, gp, got->pool, 2 * pool) &&
         !mg_copy_d2h(want->be, wp, want->pool, 2 * pool) &&
         !mg_copy_d2h(got->be, go, got->o, 2 * o_elems) &&
         !mg_copy_d2h(want->be, wo, want->o, 2 * o_elems) &&
         !mg_copy_d2h(got->be, gq, got->q, 2 * o_elems) &&
         !mg_copy_d2h(want->be, wq, want->q, 2 * o_elems) &&
         !mg_copy_d2h(got->be, gl, got->lse, 4 * t * c->hq) &&
         !mg_copy_d2h(want->be, wl, want->lse, 4 * t * c->hq);
    if (!ok && !why[0])
        snprintf(why, why_bytes, "read back failed: %s", mg_last_error());
    for (size_t i = 0; ok && i < pool; i++) {
        const double g = mg_bf16_to_f32(gp[i]), w = mg_bf16_to_f32(wp[i]);
        const bool key = i < b->pool_elems;
        if (key ? !(fabs(g - w) <= fabs(w) / 128.0 + 1e-3) : gp[i] != wp[i]) {
            snprintf(why, why_bytes, "%s pool element %zu: %g, reference %g", key ? "K" : "V",
                     key ? i : i - b->pool_elems, g, w);
            ok = false;
        }
    }
    for (size_t i = 0; ok && i < o_elems; i++) {
        const double g = mg_bf16_to_f32(gq[i]), w = mg_bf16_to_f32(wq[i]);
        if (!(fabs(g - w) <= fabs(w) / 128.0 + 1e-3)) {
            snprintf(why, why_bytes, "rotated q element %zu: %g, reference %g", i, g, w);
            ok = false;
        }
    }
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; ok && i < o_elems; i++) {
        const double g = mg_bf16_to_f32(go[i]), w = mg_bf16_to_f32(wo[i]);
        diff2 += (g - w) * (g - w);
        ref2 += w * w;
        if (!(fabs(g - w) <= MAX_ABS_ERROR)) {
            snprintf(why, why_bytes, "o element %zu (row %zu): %g, reference %g", i,
                     i / (c->hq * c->head_dim), g, w);
            ok = false;
        }
    }
    *error = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    if (ok && *error > MAX_REL_L2_ERROR) {
        snprintf(why, why_bytes, "relative L2 error %.3g > %g", *error, MAX_REL_L2_ERROR);
        ok = false;
    }
    for (size_t i = 0; ok && i < t * c->hq; i++)
        if (!(fabs(gl[i] - wl[i]) <= MAX_LSE_ERROR * (1.0 + fabs(wl[i])))) {
            snprintf(why, why_bytes, "lse %zu: %g, reference %g", i, gl[i], wl[i]);
            ok = false;
        }
    free(gp), free(wp), free(go), free(wo), free(gq), free(wq), free(gl), free(wl);
    return ok;
}

static void run_case(mg_check_ctx *ctx, mg_check_result *result, const kv_case *c) {
    uint64_t r = mg_check_rng_seed(ctx, c->name);
    kv_batch b = {0};
    kv_buffers got = {0}, want = {0};
    char why[400] = "";
    if (!ctx->reference)
        FAIL("no CPU reference backend");
    if (!make_batch(&r, c, mg_backend_get_kind(ctx->backend) == MG_BACKEND_CPU, &b))
        FAIL("out of host memory");
    const bool cuda = mg_backend_get_kind(ctx->backend) == MG_BACKEND_CUDA;
    mg_device_info info;
    if (cuda && c->impl == MG_ATTENTION_IMPL_FA3 &&
        (mg_device_get_info(ctx->backend, &info) || info.cc_major != 9 || info.cc_minor != 0)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail,
                 "FA3 paged prefill needs compute capability 9.0");
        goto done;
    }
    /* A case that demands a FlashInfer path cannot run while another provider is forced
     * (`check --provider attention_paged=kernels`): skipped, naming it. */
    mg_op_stats stats;
    if (c->impl != MG_ATTENTION_IMPL_AUTO &&
        !mg_op_stats_get(ctx->backend, MG_OP_ATTENTION_PAGED, &stats) && stats.forced[0] &&
        strcmp(stats.forced, "flashinfer")) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "asks for %s, and provider %s is forced",
                 mg_attention_impl_name(c->impl), stats.forced);
        goto done;
    }
    mg_attention_impl ran = MG_ATTENTION_IMPL_AUTO, ref_ran;
    mg_status st = run_on(ctx->backend, c, &b, &got, &ran);
    if (st == MG_ERR_UNAVAILABLE) { /* built without the FlashInfer plugin */
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    if (st)
        FAIL("run on the backend under test: %s: %s", mg_status_name(st), mg_last_error());
    if (cuda && c->impl != MG_ATTENTION_IMPL_AUTO && ran != c->impl)
        FAIL("the plan runs %s, asked for %s", mg_attention_impl_name(ran),
             mg_attention_impl_name(c->impl));
    OK(run_on(ctx->reference, c, &b, &want, &ref_ran));
    if (!compare(c, &b, &got, &want, &result->error, why, sizeof why))
        FAIL("%s", why);
    PASS();
    snprintf(result->detail, sizeof result->detail, "B=%u, %u new tokens, %u pages of %u, %s",
             c->batch, b.tokens, b.pages_used, c->page_size, mg_attention_impl_name(ran));
done:
    free_buffers(&got);
    free_buffers(&want);
    free_batch(&b);
}

#define CASE_PATH(id, impl, ...)                                                                   \
    static void check_##id(mg_check_ctx *ctx, mg_check_result *result) {                           \
        static const kv_case c = {#id, __VA_ARGS__, impl};                                         \
        run_case(ctx, result, &c);                                                                 \
    }
#define CASE(id, ...) CASE_PATH(id, MG_ATTENTION_IMPL_AUTO, __VA_ARGS__)

/* name, batch, Hq, Hkv, page size, longest prefix, most new tokens, window, soft cap, positions,
 * long prefix of request 0, head_dim; CASE_PATH asks for a path first. */
CASE(decode_gqa4, 13, 32, 8, 16, 3000, 1, -1, 0.0f, false, 0, 128)
CASE(decode_long, 3, 32, 8, 16, 200, 1, -1, 0.0f, false, 32768, 128)
CASE(decode_mha_page1, 9, 8, 8, 1, 400, 1, -1, 0.0f, true, 0, 128)
CASE(decode_gqa8_window_cap, 6, 16, 2, 7, 2000, 1, 100, 30.0f, true, 0, 128)
CASE(prefill_chunks, 7, 32, 8, 16, 1500, 300, -1, 0.0f, false, 0, 128)
CASE(prefill_page128_cap, 5, 16, 4, 128, 800, 90, -1, 5.0f, false, 0, 128)
/* The other head_dims with paged kernels: 64 (no soft-cap kernels) and 256 (with). */
CASE(decode_hd64, 11, 32, 8, 16, 2500, 1, -1, 0.0f, false, 0, 64)
CASE(prefill_hd64_window, 5, 12, 3, 32, 900, 200, 300, 0.0f, true, 0, 64)
CASE(decode_hd256_window_cap, 7, 8, 4, 16, 3000, 1, 1000, 50.0f, false, 0, 256)
CASE(prefill_hd256, 4, 16, 16, 7, 700, 150, -1, 0.0f, false, 0, 256)
/* Both paths of BF16 head_dim 128 prefill on CUDA: FA3 (Hopper; any page size, windows) and
 * FA2 forced, over the same kind of batch. */
CASE_PATH(prefill_fa3, MG_ATTENTION_IMPL_FA3, 7, 32, 8, 16, 1500, 300, -1, 0.0f, false, 0, 128)
CASE_PATH(prefill_fa3_window_page7, MG_ATTENTION_IMPL_FA3, 5, 16, 2, 7, 900, 250, 200, 0.0f, true,
          0, 128)
CASE_PATH(prefill_fa3_page1_long, MG_ATTENTION_IMPL_FA3, 4, 8, 8, 1, 400, 200, -1, 0.0f, false,
          9000, 128)
CASE_PATH(prefill_fa2_forced, MG_ATTENTION_IMPL_FA2, 7, 32, 8, 16, 1500, 300, -1, 0.0f, false, 0,
          128)

const mg_check_case mg_checks_kv_cache[] = {
    {"kv_cache", "decode_gqa4", check_decode_gqa4},
    {"kv_cache", "decode_long", check_decode_long},
    {"kv_cache", "decode_mha_page1", check_decode_mha_page1},
    {"kv_cache", "decode_gqa8_window_cap", check_decode_gqa8_window_cap},
    {"kv_cache", "prefill_chunks", check_prefill_chunks},
    {"kv_cache", "prefill_page128_cap", check_prefill_page128_cap},
    {"kv_cache", "decode_hd64", check_decode_hd64},
    {"kv_cache", "prefill_hd64_window", check_prefill_hd64_window},
    {"kv_cache", "decode_hd256_window_cap", check_decode_hd256_window_cap},
    {"kv_cache", "prefill_hd256", check_prefill_hd256},
    {"kv_cache", "prefill_fa3", check_prefill_fa3},
    {"kv_cache", "prefill_fa3_window_page7", check_prefill_fa3_window_page7},
    {"kv_cache", "prefill_fa3_page1_long", check_prefill_fa3_page1_long},
    {"kv_cache", "prefill_fa2_forced", check_prefill_fa2_forced},
    {NULL, NULL, NULL},
};
