/* check_attention.c - the ragged prefill attention (metrale/ops_attention.h) on the backend
 * under test against the CPU reference backend: fresh random ragged batches (lengths 0, 1, odd,
 * up to a few thousand; kv longer than qo; causal or not; GQA groups 1, 4, 8; causal sliding
 * windows; head_dim 128, 64 and 256 through every path built for them, and 40, 48, 80, 96),
 * outputs poisoned first, both FlashInfer paths where the device has them, graph capture then
 * replay after a re-plan with new data (and after a refused re-plan), eager plans refused while
 * capturing, a fixed-grid plan in a caller-owned workspace matching one with library-owned
 * workspaces bitwise, and the validation errors on this backend.
 *
 * Error bounds: the reference computes in FP32 from the same BF16 inputs and rounds once; a
 * GPU kernel also rounds the softmax weights to BF16 before P.V. Both roundings are 2^-9
 * relative, so an output may differ by a couple of BF16 ulps: max |diff| <= 2e-2 for outputs of
 * magnitude <= 1, relative L2 error <= 1e-2. FlashInfer's FA2 sums the softmax denominator with
 * tensor-core row sums of those BF16 weights (measured up to 1.6e-3 off in log2 units on an
 * H200), so the LSE bound is 5e-3 base-2 units, scaled by its size.
 * On the CPU backend (reference against itself) sizes shrink eightfold to keep CI fast. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops_attention.h"

#define POISON_BF16 0x7fc1u
#define MAX_ABS_ERROR 2e-2
#define MAX_REL_L2_ERROR 1e-2
#define MAX_LSE_ERROR 5e-3

/* A draw uniform in [lo, hi]. */
static uint32_t rng_range(uint64_t *r, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)(mg_check_rng_next(r) % ((uint64_t)hi - lo + 1));
}

/* ------------------------------------------------------------------ batches */

typedef struct attn_case {
    const char *name;
    uint32_t batch_size, hq, hkv, max_len;
    bool causal;
    int32_t window_left;
    mg_attention_impl impl;
    bool one_long; /* one request of max_len, the rest short */
    uint32_t head_dim;
} attn_case;

typedef struct attn_batch {
    mg_attention_desc desc;
    uint32_t batch_size;
    int32_t *qo_indptr, *kv_indptr;
    uint32_t qo_rows, kv_rows;
    uint16_t *q, *k, *v;
} attn_batch;

static bool is_reference(const mg_check_ctx *ctx) {
    return ctx->backend == ctx->reference;
}

static void free_batch(attn_batch *b) {
    free(b->qo_indptr);
    free(b->kv_indptr);
    free(b->q);
    free(b->k);
    free(b->v);
    *b = (attn_batch){0};
}

/* Random lengths: 0, 1, odd and long; a random prefix makes kv longer than qo. */
static bool make_batch(const mg_check_ctx *ctx, uint64_t *r, const attn_case *c, attn_batch *b) {
    const uint32_t max_len = is_reference(ctx) ? (c->max_len + 7) / 8 : c->max_len;
    const uint32_t d = c->head_dim;
    *b = (attn_batch){.batch_size = c->batch_size};
    b->desc = (mg_attention_desc){.num_qo_heads = c->hq,
                                  .num_kv_heads = c->hkv,
                                  .head_dim = d,
                                  .causal = c->causal,
                                  .window_left = c->window_left,
                                  .sm_scale = 1.0f / sqrtf((float)d),
                                  .impl = c->impl};
    b->qo_indptr = calloc(c->batch_size + 1, sizeof(int32_t));
    b->kv_indptr = calloc(c->batch_size + 1, sizeof(int32_t));
    if (!b->qo_indptr || !b->kv_indptr)
        return false;
    for (uint32_t i = 0; i < c->batch_size; i++) {
        uint32_t pick = rng_range(r, 0, 6), lq;
        if (c->one_long && i == c->batch_size / 2)
            lq = max_len;
        else
            lq = pick == 0 ? 0 : pick == 1 ? 1 : rng_range(r, 2, max_len) | 1u;
        uint32_t lk = lq + (rng_range(r, 0, 1) ? rng_range(r, 0, max_len) : 0);
        if (!c->causal && pick == 6 && !(c->one_long && i == c->batch_size / 2))
            lk = rng_range(r, 0, 2) ? rng_range(r, 1, max_len) : 0; /* shorter, or none */
        b->qo_indptr[i + 1] = b->qo_indptr[i] + (int32_t)lq;
        b->kv_indptr[i + 1] = b->kv_indptr[i] + (int32_t)lk;
    }
    b->qo_rows = (uint32_t)b->qo_indptr[c->batch_size];
    b->kv_rows = (uint32_t)b->kv_indptr[c->batch_size];
    size_t nq = (size_t)b->qo_rows * c->hq * d, nk = (size_t)b->kv_rows * c->hkv * d;
    b->q = malloc(2 * (nq + 1));
    b->k = malloc(2 * (nk + 1));
    b->v = malloc(2 * (nk + 1));
    if (!b->q || !b->k || !b->v)
        return false;
    for (size_t i = 0; i < nq; i++)
        b->q[i] = mg_f32_to_bf16((float)((double)(mg_check_rng_next(r) >> 11) / 0x1p52 - 1.0));
    for (size_t i = 0; i < nk; i++) {
        b->k[i] = mg_f32_to_bf16((float)((double)(mg_check_rng_next(r) >> 11) / 0x1p52 - 1.0));
        b->v[i] = mg_f32_to_bf16((float)((double)(mg_check_rng_next(r) >> 11) / 0x1p52 - 1.0));
    }
    return true;
}

/* Device buffers on one backend: q/k/v of `rows` capacity, o and lse poisoned. */
typedef struct attn_buffers {
    mg_backend *backend;
    mg_devptr q, k, v, o, lse;
    size_t q_elems, kv_elems, lse_elems;
} attn_buffers;

static void free_buffers(attn_buffers *t) {
    if (t->backend) {
        mg_free(t->backend, t->q);
        mg_free(t->backend, t->k);
        mg_free(t->backend, t->v);
        mg_free(t->backend, t->o);
        mg_free(t->backend, t->lse);
    }
    *t = (attn_buffers){0};
}

static mg_status poison_outputs(attn_buffers *t) {
    uint16_t *o = malloc(2 * (t->q_elems + 1));
    float *lse = malloc(4 * (t->lse_elems + 1));
    mg_status st = o && lse ? MG_OK : MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; !st && i < t->q_elems; i++)
        o[i] = POISON_BF16;
    for (size_t i = 0; !st && i < t->lse_elems; i++)
        lse[i] = NAN;
    if (!st)
        st = mg_copy_h2d(t->backend, t->o, o, 2 * t->q_elems);
    if (!st)
        st = mg_copy_h2d(t->backend, t->lse, lse, 4 * t->lse_elems);
    free(o);
    free(lse);
    return st;
}

static mg_status alloc_buffers(mg_backend *be, const attn_batch *b, uint32_t qo_rows,
                               uint32_t kv_rows, attn_buffers *t) {
    *t = (attn_buffers){.backend = be};
    const uint32_t hq = b->desc.num_qo_heads, hkv = b->desc.num_kv_heads, d = b->desc.head_dim;
    t->q_elems = (size_t)qo_rows * hq * d;
    t->kv_elems = (size_t)kv_rows * hkv * d;
    t->lse_elems = (size_t)qo_rows * hq;
    /* At least one element, so empty batches still have valid pointers. */
    mg_status st = mg_alloc(be, 2 * t->q_elems + 256, &t->q);
    if (!st)
        st = mg_alloc(be, 2 * t->kv_elems + 256, &t->k);
    if (!st)
        st = mg_alloc(be, 2 * t->kv_elems + 256, &t->v);
    if (!st)
        st = mg_alloc(be, 2 * t->q_elems + 256, &t->o);
    if (!st)
        st = mg_alloc(be, 4 * t->lse_elems + 256, &t->lse);
    if (!st)
        st = poison_outputs(t);
    return st;
}

static mg_status upload_inputs(const attn_batch *b, attn_buffers *t) {
    const size_t nq = (size_t)b->qo_rows * b->desc.num_qo_heads * b->desc.head_dim;
    const size_t nk = (size_t)b->kv_rows * b->desc.num_kv_heads * b->desc.head_dim;
    mg_status st = nq ? mg_copy_h2d(t->backend, t->q, b->q, 2 * nq) : MG_OK;
    if (!st && nk)
        st = mg_copy_h2d(t->backend, t->k, b->k, 2 * nk);
    if (!st && nk)
        st = mg_copy_h2d(t->backend, t->v, b->v, 2 * nk);
    return st;
}

static mg_attention_tensors tensors_of(const attn_buffers *t, uint32_t qo_rows, uint32_t kv_rows) {
    return (mg_attention_tensors){.q = t->q,
                                  .k = t->k,
                                  .v = t->v,
                                  .o = t->o,
                                  .lse = t->lse,
                                  .qo_rows = qo_rows,
                                  .kv_rows = kv_rows};
}

/* Eager plan + run of `b` on `t`'s backend, synchronized. */
static mg_status run_eager(const attn_batch *b, attn_buffers *t, mg_attention_impl *impl_out) {
    mg_attention_plan *p = NULL;
    mg_status st = mg_attention_plan_create(t->backend, &b->desc, b->qo_indptr, b->kv_indptr,
                                            b->batch_size, NULL, &p);
    mg_attention_tensors at = tensors_of(t, b->qo_rows, b->kv_rows);
    if (!st)
        st = mg_attention_run(p, &at, NULL);
    if (!st)
        st = mg_stream_synchronize(mg_stream_default(t->backend));
    mg_attention_plan_info info;
    if (!st && impl_out && !(st = mg_attention_plan_get_info(p, &info)))
        *impl_out = info.impl;
    mg_attention_plan_destroy(p);
    return st;
}

/* Compares o and lse of the first `qo_rows` rows of `got` with `want`, and requires rows
 * [qo_rows, capacity) of `got` to be still poisoned. Returns false with `why` on mismatch. */
static bool compare_outputs(const attn_buffers *got, const attn_buffers *want, uint32_t qo_rows,
                            uint32_t hq, uint32_t head_dim, double *rel_l2_out, char *why,
                            size_t why_bytes) {
    const size_t n = (size_t)qo_rows * hq * head_dim, nl = (size_t)qo_rows * hq;
    uint16_t *go = malloc(2 * (got->q_elems + 1)), *wo = malloc(2 * (n + 1));
    float *gl = malloc(4 * (got->lse_elems + 1)), *wl = malloc(4 * (nl + 1));
    bool ok = go && wo && gl && wl;
    if (!ok)
        snprintf(why, why_bytes, "out of host memory");
    mg_status st = MG_OK;
    if (ok && got->q_elems && (st = mg_copy_d2h(got->backend, go, got->o, 2 * got->q_elems)))
        ok = false;
    if (ok && got->lse_elems && (st = mg_copy_d2h(got->backend, gl, got->lse, 4 * got->lse_elems)))
        ok = false;
    if (ok && n && (st = mg_copy_d2h(want->backend, wo, want->o, 2 * n)))
        ok = false;
    if (ok && nl && (st = mg_copy_d2h(want->backend, wl, want->lse, 4 * nl)))
        ok = false;
    if (st)
        snprintf(why, why_bytes, "read-back: %s: %s", mg_status_name(st), mg_last_error());
    double diff2 = 0.0, ref2 = 0.0, worst = 0.0;
    size_t worst_at = 0;
    for (size_t i = 0; ok && i < n; i++) {
        double g = mg_bf16_to_f32(go[i]), w = mg_bf16_to_f32(wo[i]), d = fabs(g - w);
        if (!(d <= worst)) { /* also catches NaN: poison left in place */
            worst = isnan(d) ? INFINITY : d;
            worst_at = i;
        }
        diff2 += isnan(d) ? INFINITY : d * d;
        ref2 += w * w;
    }
    const double rel_l2 = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    *rel_l2_out = rel_l2;
    if (ok && (worst > MAX_ABS_ERROR || rel_l2 > MAX_REL_L2_ERROR)) {
        size_t row = worst_at / (hq * head_dim);
        snprintf(why, why_bytes,
                 "o: max |diff| %.3g at row %zu head %zu dim %zu (got %g, want %g), rel L2 %.3g "
                 "(bounds %.0e, %.0e)",
                 worst, row, worst_at / head_dim % hq, worst_at % head_dim,
                 (double)mg_bf16_to_f32(go[worst_at]), (double)mg_bf16_to_f32(wo[worst_at]), rel_l2,
                 MAX_ABS_ERROR, MAX_REL_L2_ERROR);
        ok = false;
    }
    for (size_t i = 0; ok && i < nl; i++) {
        bool both_empty = isinf(gl[i]) && gl[i] < 0 && isinf(wl[i]) && wl[i] < 0;
        if (!both_empty && !(fabs(gl[i] - wl[i]) <= MAX_LSE_ERROR * fmax(1.0, fabs(wl[i])))) {
            snprintf(why, why_bytes, "lse row %zu head %zu: got %g, want %g", i / hq, i % hq,
                     (double)gl[i], (double)wl[i]);
            ok = false;
        }
    }
    for (size_t i = n; ok && i < got->q_elems; i++)
        if (go[i] != POISON_BF16) {
            snprintf(why, why_bytes, "o element %zu past the batch's %u rows was written", i,
                     qo_rows);
            ok = false;
        }
    for (size_t i = nl; ok && i < got->lse_elems; i++)
        if (!isnan(gl[i])) {
            snprintf(why, why_bytes, "lse element %zu past the batch's rows was written", i);
            ok = false;
        }
    free(go);
    free(wo);
    free(gl);
    free(wl);
    return ok;
}

/* ------------------------------------------------------------------ numeric checks */

static void run_case(mg_check_ctx *ctx, mg_check_result *result, const attn_case *c) {
    uint64_t r = mg_check_rng_seed(ctx, c->name);
    attn_batch b = {0};
    attn_buffers got = {0}, want = {0};
    char why[400];
    mg_attention_impl impl = MG_ATTENTION_IMPL_AUTO;
    if (!ctx->reference)
        FAIL("no CPU reference backend");
    if (!make_batch(ctx, &r, c, &b))
        FAIL("out of host memory");
    OK(alloc_buffers(ctx->backend, &b, b.qo_rows, b.kv_rows, &got));
    OK(alloc_buffers(ctx->reference, &b, b.qo_rows, b.kv_rows, &want));
    OK(upload_inputs(&b, &got));
    OK(upload_inputs(&b, &want));
    mg_status st = run_eager(&b, &got, &impl);
    /* Unavailable: built without the FlashInfer plugin (METRALE_FLASHINFER=OFF) or it was not
     * found; unsupported: a forced path this device lacks. The detail says which. */
    if (st == MG_ERR_UNAVAILABLE ||
        (st == MG_ERR_UNSUPPORTED && c->impl != MG_ATTENTION_IMPL_AUTO)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    if (st)
        FAIL("run on the backend under test: %s: %s", mg_status_name(st), mg_last_error());
    b.desc.impl = MG_ATTENTION_IMPL_AUTO;
    OK(run_eager(&b, &want, NULL));
    if (!compare_outputs(&got, &want, b.qo_rows, b.desc.num_qo_heads, b.desc.head_dim,
                         &result->error, why, sizeof why))
        FAIL("%s", why);
    result->passed = true;
    snprintf(result->detail, sizeof result->detail, "%s, D=%u, B=%u, %u q / %u kv rows",
             mg_backend_get_kind(ctx->backend) == MG_BACKEND_CPU ? "reference"
                                                                 : mg_attention_impl_name(impl),
             b.desc.head_dim, b.batch_size, b.qo_rows, b.kv_rows);
done:
    free_buffers(&got);
    free_buffers(&want);
    free_batch(&b);
}

#define CASE(id, ...)                                                                              \
    static void check_##id(mg_check_ctx *ctx, mg_check_result *result) {                           \
        static const attn_case c = {#id, __VA_ARGS__};                                             \
        run_case(ctx, result, &c);                                                                 \
    }

/* name, batch size, Hq, Hkv, longest request, causal, window_left, path, one request that long,
 * head_dim */
CASE(causal_mha, 6, 8, 8, 700, true, -1, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(causal_gqa8, 5, 32, 4, 600, true, -1, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(causal_long, 3, 8, 8, 3000, true, -1, MG_ATTENTION_IMPL_AUTO, true, 128)
CASE(full_gqa4, 7, 16, 4, 800, false, -1, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(full_long, 2, 8, 8, 2500, false, -1, MG_ATTENTION_IMPL_AUTO, true, 128)
CASE(causal_window, 6, 16, 4, 1200, true, 255, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(causal_window_mha, 5, 8, 8, 700, true, 100, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(window_zero, 4, 8, 1, 300, true, 0, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(fa2_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_FA2, false, 128)
CASE(fa2_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_FA2, false, 128)
CASE(fa3_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_FA3, false, 128)
CASE(fa3_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_FA3, false, 128)
CASE(many_short, 48, 8, 2, 40, true, -1, MG_ATTENTION_IMPL_AUTO, false, 128)
CASE(hd64_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_AUTO, false, 64)
CASE(hd64_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_AUTO, false, 64)
CASE(hd64_causal_long, 3, 8, 8, 3000, true, -1, MG_ATTENTION_IMPL_AUTO, true, 64)
CASE(hd64_causal_window, 6, 16, 4, 1200, true, 255, MG_ATTENTION_IMPL_AUTO, false, 64)
CASE(hd64_fa2_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_FA2, false, 64)
CASE(hd64_fa2_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_FA2, false, 64)
CASE(hd64_fa3_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_FA3, false, 64)
CASE(hd64_fa3_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_FA3, false, 64)
CASE(hd256_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_AUTO, false, 256)
CASE(hd256_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_AUTO, false, 256)
CASE(hd256_causal_long, 3, 8, 8, 2000, true, -1, MG_ATTENTION_IMPL_AUTO, true, 256)
CASE(hd256_causal_window, 6, 16, 4, 1200, true, 255, MG_ATTENTION_IMPL_AUTO, false, 256)
CASE(hd256_fa2_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_FA2, false, 256)
CASE(hd256_fa2_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_FA2, false, 256)
CASE(hd256_fa3_causal_gqa4, 7, 16, 4, 900, true, -1, MG_ATTENTION_IMPL_FA3, false, 256)
CASE(hd256_fa3_full_gqa8, 5, 32, 4, 700, false, -1, MG_ATTENTION_IMPL_FA3, false, 256)
/* Head_dims FlashInfer is not built for: on CUDA the by-row kernels ("kernels") serve them. */
CASE(hd48_causal_gqa3, 7, 9, 3, 600, true, -1, MG_ATTENTION_IMPL_AUTO, false, 48)
CASE(hd80_full_gqa4, 5, 16, 4, 500, false, -1, MG_ATTENTION_IMPL_AUTO, false, 80)
CASE(hd96_causal_window, 6, 12, 4, 900, true, 127, MG_ATTENTION_IMPL_AUTO, false, 96)
CASE(hd40_causal_long, 3, 4, 2, 2000, true, -1, MG_ATTENTION_IMPL_AUTO, true, 40)

/* Fixed-grid plan: capture a run, re-plan a different batch (same batch size) and upload its
 * data into the same buffers, replay; the result must equal an eager reference run of the new
 * batch, and rows past its totals stay poisoned. Once per implementation the device has. */
static void graph_case(mg_check_ctx *ctx, mg_check_result *result, mg_attention_impl impl,
                       const char *name, uint32_t head_dim) {
    uint64_t r = mg_check_rng_seed(ctx, name);
    const attn_case c = {name, 5, 16, 4, 500, true, -1, impl, false, head_dim};
    attn_batch first = {0}, second = {0};
    attn_buffers got = {0}, want = {0};
    mg_attention_plan *p = NULL;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    char why[400];
    if (!ctx->reference)
        FAIL("no CPU reference backend");
    if (!make_batch(ctx, &r, &c, &first) || !make_batch(ctx, &r, &c, &second))
        FAIL("out of host memory");
    const uint32_t cap_q = (first.qo_rows > second.qo_rows ? first.qo_rows : second.qo_rows) + 3;
    const uint32_t cap_k = (first.kv_rows > second.kv_rows ? first.kv_rows : second.kv_rows) + 5;
    OK(alloc_buffers(ctx->backend, &first, cap_q, cap_k, &got));
    OK(alloc_buffers(ctx->reference, &second, second.qo_rows, second.kv_rows, &want));
    OK(upload_inputs(&first, &got));
    OK(upload_inputs(&second, &want));
    OK(mg_stream_create(ctx->backend, &s));
    mg_attention_desc desc = first.desc;
    desc.graph_qo_rows = cap_q;
    desc.graph_kv_rows = cap_k;
    mg_status st = mg_attention_plan_create(ctx->backend, &desc, first.qo_indptr, first.kv_indptr,
                                            first.batch_size, s, &p);
    if (st == MG_ERR_UNAVAILABLE || (st == MG_ERR_UNSUPPORTED && impl != MG_ATTENTION_IMPL_AUTO)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    OK(st);
    mg_attention_tensors at = tensors_of(&got, cap_q, cap_k);
    OK(mg_attention_run(p, &at, s)); /* eager first: the first batch lands in o */
    OK(mg_graph_begin_capture(s));
    st = mg_attention_run(p, &at, s);
    if (st) {
        mg_graph_abort_capture(s);
        FAIL("run while capturing: %s: %s", mg_status_name(st), mg_last_error());
    }
    OK(mg_graph_end_capture(s, &g));
    OK(mg_stream_synchronize(s));
    /* New batch, new data, outputs poisoned again: only the replay can produce them. */
    OK(mg_attention_plan_update(p, second.qo_indptr, second.kv_indptr, second.batch_size, s));
    OK(mg_stream_synchronize(s));
    OK(upload_inputs(&second, &got));
    OK(poison_outputs(&got));
    OK(mg_graph_launch(g, s));
    OK(mg_stream_synchronize(s));
    second.desc.impl = MG_ATTENTION_IMPL_AUTO;
    OK(run_eager(&second, &want, NULL));
    if (!compare_outputs(&got, &want, second.qo_rows, second.desc.num_qo_heads,
                         second.desc.head_dim, &result->error, why, sizeof why))
        FAIL("replay after re-plan: %s", why);
    /* A batch the grid cannot serve (one more query row than the capacity) is refused with
     * nothing uploaded: the plan keeps the second batch, and a replay still computes it. */
    mg_attention_plan_info before, after;
    OK(mg_attention_plan_get_info(p, &before));
    int32_t *over = malloc(sizeof(int32_t) * (second.batch_size + 1));
    if (!over)
        FAIL("out of host memory");
    memcpy(over, second.qo_indptr, sizeof(int32_t) * (second.batch_size + 1));
    over[second.batch_size] = (int32_t)cap_q + 1;
    int32_t *over_kv = malloc(sizeof(int32_t) * (second.batch_size + 1));
    if (!over_kv) {
        free(over);
        FAIL("out of host memory");
    }
    memcpy(over_kv, second.kv_indptr, sizeof(int32_t) * (second.batch_size + 1));
    /* The last request gains as many keys as queries, so the causal rule still holds. */
    over_kv[second.batch_size] += over[second.batch_size] - second.qo_indptr[second.batch_size];
    st = mg_attention_plan_update(p, over, over_kv, second.batch_size, s);
    free(over);
    free(over_kv);
    if (st != MG_ERR_INVALID_ARGUMENT || !strstr(mg_last_error(), "capacities"))
        FAIL("update beyond the capacities: %s \"%s\", expected MG_ERR_INVALID_ARGUMENT naming "
             "the capacities",
             mg_status_name(st), mg_last_error());
    OK(mg_attention_plan_get_info(p, &after));
    if (after.qo_total != before.qo_total || after.kv_total != before.kv_total ||
        after.workspace_bytes != before.workspace_bytes || after.impl != before.impl)
        FAIL("a rejected update changed the plan (q rows %u -> %u, workspace %llu -> %llu)",
             before.qo_total, after.qo_total, (unsigned long long)before.workspace_bytes,
             (unsigned long long)after.workspace_bytes);
    OK(poison_outputs(&got));
    OK(mg_graph_launch(g, s));
    OK(mg_stream_synchronize(s));
    if (!compare_outputs(&got, &want, second.qo_rows, second.desc.num_qo_heads,
                         second.desc.head_dim, &result->error, why, sizeof why))
        FAIL("replay after a rejected update: %s", why);
    result->passed = true;
    snprintf(result->detail, sizeof result->detail,
             "replayed batch of %u q rows in a %u-row grid; a rejected update kept it",
             second.qo_rows, cap_q);
done:
    mg_graph_destroy(g);
    mg_attention_plan_destroy(p);
    mg_stream_destroy(s);
    free_buffers(&got);
    free_buffers(&want);
    free_batch(&first);
    free_batch(&second);
}

static void check_graph_replay(mg_check_ctx *ctx, mg_check_result *result) {
    graph_case(ctx, result, MG_ATTENTION_IMPL_AUTO, "graph_replay", 128);
}
static void check_graph_replay_fa2(mg_check_ctx *ctx, mg_check_result *result) {
    graph_case(ctx, result, MG_ATTENTION_IMPL_FA2, "graph_replay_fa2", 128);
}
static void check_graph_replay_hd256(mg_check_ctx *ctx, mg_check_result *result) {
    graph_case(ctx, result, MG_ATTENTION_IMPL_AUTO, "graph_replay_hd256", 256);
}

/* An eager plan is never captured: its run on a capturing stream returns MG_ERR_CAPTURING and
 * records nothing (replaying the graph leaves the output poisoned), and the plan still runs
 * correctly once the capture is over. */
static void check_eager_capture_refused(mg_check_ctx *ctx, mg_check_result *result) {
    uint64_t r = mg_check_rng_seed(ctx, "eager_capture_refused");
    const attn_case c = {"eager_capture_refused", 4,     16, 4, 300, true, -1,
                         MG_ATTENTION_IMPL_AUTO,  false, 128};
    attn_batch b = {0};
    attn_buffers got = {0}, want = {0};
    mg_attention_plan *p = NULL;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    char why[400];
    if (!ctx->reference)
        FAIL("no CPU reference backend");
    if (!make_batch(ctx, &r, &c, &b))
        FAIL("out of host memory");
    OK(alloc_buffers(ctx->backend, &b, b.qo_rows, b.kv_rows, &got));
    OK(alloc_buffers(ctx->reference, &b, b.qo_rows, b.kv_rows, &want));
    OK(upload_inputs(&b, &got));
    OK(upload_inputs(&b, &want));
    OK(mg_stream_create(ctx->backend, &s));
    mg_status st = mg_attention_plan_create(ctx->backend, &b.desc, b.qo_indptr, b.kv_indptr,
                                            b.batch_size, s, &p);
    if (st == MG_ERR_UNAVAILABLE) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    OK(st);
    mg_attention_tensors at = tensors_of(&got, b.qo_rows, b.kv_rows);
    OK(mg_graph_begin_capture(s));
    st = mg_attention_run(p, &at, s);
    char message[512];
    snprintf(message, sizeof message, "%s", mg_last_error());
    mg_status ended = mg_graph_end_capture(s, &g);
    if (st != MG_ERR_CAPTURING || !strstr(message, "eager plan"))
        FAIL("eager run while capturing: %s \"%s\", expected MG_ERR_CAPTURING naming the eager "
             "plan",
             mg_status_name(st), message);
    OK(ended);
    OK(mg_graph_launch(g, s));
    OK(mg_stream_synchronize(s));
    double unused;
    attn_buffers none = {.backend = ctx->backend};
    if (!compare_outputs(&got, &none, 0, b.desc.num_qo_heads, b.desc.head_dim, &unused, why,
                         sizeof why))
        FAIL("the graph of a refused capture wrote output: %s", why);
    OK(mg_attention_run(p, &at, s));
    OK(mg_stream_synchronize(s));
    OK(run_eager(&b, &want, NULL));
    if (!compare_outputs(&got, &want, b.qo_rows, b.desc.num_qo_heads, b.desc.head_dim,
                         &result->error, why, sizeof why))
        FAIL("eager run after the refused capture: %s", why);
    result->passed = true;
    snprintf(result->detail, sizeof result->detail,
             "capture refused, empty graph, then %u q rows computed", b.qo_rows);
done:
    mg_graph_destroy(g);
    mg_attention_plan_destroy(p);
    mg_stream_destroy(s);
    free_buffers(&got);
    free_buffers(&want);
    free_batch(&b);
}

/* ------------------------------------------------------------------ validation on this backend */

/* Every validation error is rejected before anything runs: status, message, untouched output. */
static void check_validation(mg_check_ctx *ctx, mg_check_result *result) {
    int32_t qo[4] = {0, 2, 3, 6}, kv[4] = {0, 5, 6, 10}, bad_qo[4], bad_kv[4];
    const mg_attention_desc desc = {.num_qo_heads = 8,
                                    .num_kv_heads = 2,
                                    .head_dim = 128,
                                    .causal = true,
                                    .window_left = -1,
                                    .sm_scale = 0.088f};
    attn_batch shape = {.desc = desc};
    attn_buffers t = {0};
    mg_attention_plan *p = NULL;
    char why[400];
    OK(alloc_buffers(ctx->backend, &shape, 6, 10, &t));
    static const struct {
        const char *needle;
        int field; /* which mutation */
    } plan_errors[] = {
        {"qo_indptr[0] = 1", 0}, {"kv_indptr decreases", 1}, {"queries but only", 2},
        {"does not divide", 3},  {"head_dim 100", 4},        {"window_left -5", 5},
        {"sm_scale", 6},         {"capacities", 7},          {"batch_size 0", 8},
        {"needs causal", 9},
    };
    for (size_t i = 0; i < sizeof plan_errors / sizeof plan_errors[0]; i++) {
        mg_attention_desc d = desc;
        memcpy(bad_qo, qo, sizeof qo);
        memcpy(bad_kv, kv, sizeof kv);
        uint32_t batch = 3;
        switch (plan_errors[i].field) {
        case 0:
            bad_qo[0] = 1;
            break;
        case 1:
            bad_kv[2] = 4;
            break;
        case 2:
            bad_kv[1] = 1;
            break;
        case 3:
            d.num_kv_heads = 3;
            break;
        case 4:
            d.head_dim = 100;
            break;
        case 5:
            d.window_left = -5;
            break;
        case 6:
            d.sm_scale = -1.0f;
            break;
        case 7:
            d.graph_qo_rows = 4, d.graph_kv_rows = 10;
            break;
        case 8:
            batch = 0;
            break;
        case 9:
            d.causal = false, d.window_left = 7;
            break;
        }
        mg_status st = mg_attention_plan_create(ctx->backend, &d, bad_qo, bad_kv, batch, NULL, &p);
        if (st != MG_ERR_INVALID_ARGUMENT || !strstr(mg_last_error(), plan_errors[i].needle) || p)
            FAIL("bad plan %zu: %s \"%s\", expected MG_ERR_INVALID_ARGUMENT naming \"%s\"", i,
                 mg_status_name(st), mg_last_error(), plan_errors[i].needle);
    }
    /* FA2 and FA3 name FlashInfer's kernels on CUDA: at a head_dim it is not built for, asking
     * for one is refused, never served by other kernels (the CPU reference ignores impl). */
    if (mg_backend_get_kind(ctx->backend) == MG_BACKEND_CUDA) {
        mg_attention_desc d = desc;
        d.head_dim = 96;
        d.impl = MG_ATTENTION_IMPL_FA2;
        mg_status unsupported = mg_attention_plan_create(ctx->backend, &d, qo, kv, 3, NULL, &p);
        if (unsupported != MG_ERR_UNSUPPORTED ||
            !strstr(mg_last_error(), "asked for FlashInfer's") || p)
            FAIL("FA2 at head_dim 96 on CUDA: %s \"%s\", expected MG_ERR_UNSUPPORTED naming it",
                 mg_status_name(unsupported), mg_last_error());
    }
    mg_status st = mg_attention_plan_create(ctx->backend, &desc, qo, kv, 3, NULL, &p);
    if (st == MG_ERR_UNAVAILABLE) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    OK(st);
    const mg_attention_tensors good = tensors_of(&t, 6, 10);
    for (int i = 0; i < 6; i++) {
        mg_attention_tensors at = good;
        const char *needle = i == 0   ? "qo_rows 5"
                             : i == 1 ? "kv_rows 11"
                             : i == 2 ? "v is null"
                             : i == 3 ? "q 0x"
                             : i == 4 ? "o 0x"
                                      : "lse 0x";
        switch (i) {
        case 0:
            at.qo_rows = 5;
            break;
        case 1:
            at.kv_rows = 11;
            break;
        case 2:
            at.v = 0;
            break;
        case 3:
            at.q += 8;
            break;
        case 4:
            at.o += 2;
            break;
        case 5:
            at.lse += 1;
            break;
        }
        st = mg_attention_run(p, &at, NULL);
        if (st != MG_ERR_INVALID_ARGUMENT || !strstr(mg_last_error(), needle))
            FAIL("bad run %d: %s \"%s\", expected MG_ERR_INVALID_ARGUMENT naming \"%s\"", i,
                 mg_status_name(st), mg_last_error(), needle);
    }
    OK(mg_stream_synchronize(mg_stream_default(ctx->backend)));
    /* Nothing ran: o and lse are still all poison. */
    double unused;
    attn_buffers none = {.backend = ctx->backend};
    if (!compare_outputs(&t, &none, 0, desc.num_qo_heads, desc.head_dim, &unused, why, sizeof why))
        FAIL("a rejected call wrote output: %s", why);
    result->passed = true;
    snprintf(result->detail, sizeof result->detail, "10 plan and 6 run errors rejected");
done:
    mg_attention_plan_destroy(p);
    free_buffers(&t);
}

/* Whether `a` and `b` hold the same o and lse bytes over their whole (equal) capacity. */
static bool same_bytes(const attn_buffers *a, const attn_buffers *b, char *why, size_t why_bytes) {
    size_t n = 2 * a->q_elems > 4 * a->lse_elems ? 2 * a->q_elems : 4 * a->lse_elems;
    uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
    bool same = false;
    if (!x || !y)
        snprintf(why, why_bytes, "out of host memory");
    else if (mg_copy_d2h(a->backend, x, a->o, 2 * a->q_elems) ||
             mg_copy_d2h(b->backend, y, b->o, 2 * b->q_elems))
        snprintf(why, why_bytes, "reading o: %s", mg_last_error());
    else if (memcmp(x, y, 2 * a->q_elems))
        snprintf(why, why_bytes, "o differs");
    else if (mg_copy_d2h(a->backend, x, a->lse, 4 * a->lse_elems) ||
             mg_copy_d2h(b->backend, y, b->lse, 4 * b->lse_elems))
        snprintf(why, why_bytes, "reading lse: %s", mg_last_error());
    else if (memcmp(x, y, 4 * a->lse_elems))
        snprintf(why, why_bytes, "lse differs");
    else
        same = true;
    free(x);
    free(y);
    return same;
}

/* A fixed-grid plan in a caller-owned workspace (mg_attention_workspace_bytes) against the same
 * plan with library-owned workspaces: bitwise equal outputs for the first batch, and after an
 * update to a second batch, replayed from captured graphs where the backend has them. Once
 * created, the caller-workspace plan allocates nothing on the device. */
static void check_caller_workspace(mg_check_ctx *ctx, mg_check_result *result) {
    const char *name = "caller_workspace";
    uint64_t r = mg_check_rng_seed(ctx, name);
    const attn_case c = {name, 5, 16, 4, 500, true, -1, MG_ATTENTION_IMPL_AUTO, false, 128};
    mg_backend *be = ctx->backend;
    attn_batch first = {0}, second = {0};
    attn_buffers lib = {0}, own = {0};
    mg_attention_plan *p_lib = NULL, *p_own = NULL;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_devptr workspace = 0;
    char why[400];
    const bool graphs = mg_backend_supports(be, MG_CAP_GRAPHS);
    if (!make_batch(ctx, &r, &c, &first) || !make_batch(ctx, &r, &c, &second))
        FAIL("out of host memory");
    const uint32_t cap_q = (first.qo_rows > second.qo_rows ? first.qo_rows : second.qo_rows) + 3;
    const uint32_t cap_k = (first.kv_rows > second.kv_rows ? first.kv_rows : second.kv_rows) + 5;
    OK(alloc_buffers(be, &first, cap_q, cap_k, &lib));
    OK(alloc_buffers(be, &first, cap_q, cap_k, &own));
    OK(upload_inputs(&first, &lib));
    OK(upload_inputs(&first, &own));
    OK(mg_stream_create(be, &s));
    mg_attention_desc desc = first.desc;
    desc.graph_qo_rows = cap_q;
    desc.graph_kv_rows = cap_k;
    mg_status st = mg_attention_plan_create(be, &desc, first.qo_indptr, first.kv_indptr,
                                            first.batch_size, s, &p_lib);
    if (st == MG_ERR_UNAVAILABLE) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "%s", mg_last_error());
        goto done;
    }
    OK(st);
    size_t bytes = 0;
    OK(mg_attention_workspace_bytes(be, &desc, first.qo_indptr, first.kv_indptr, first.batch_size,
                                    &bytes));
    OK(mg_alloc(be, bytes, &workspace));
    OK(mg_memset(be, workspace, 0xA5, bytes)); /* nothing may depend on its contents */
    uint64_t live0 = 0, count0 = 0, live1 = 0, count1 = 0;
    OK(mg_stream_synchronize(s));
    OK(mg_ledger_live(be, &live0, &count0));
    mg_attention_desc own_desc = desc;
    own_desc.workspace = workspace;
    own_desc.workspace_bytes = bytes;
    OK(mg_attention_plan_create(be, &own_desc, first.qo_indptr, first.kv_indptr, first.batch_size,
                                s, &p_own));
    mg_attention_tensors at_lib = tensors_of(&lib, cap_q, cap_k);
    mg_attention_tensors at_own = tensors_of(&own, cap_q, cap_k);
    OK(mg_attention_run(p_lib, &at_lib, s));
    OK(mg_attention_run(p_own, &at_own, s));
    OK(mg_stream_synchronize(s));
    if (!same_bytes(&lib, &own, why, sizeof why))
        FAIL("first batch, caller workspace vs library workspace: %s", why);
    if (graphs) {
        OK(mg_graph_begin_capture(s));
        st = mg_attention_run(p_lib, &at_lib, s);
        if (!st)
            st = mg_attention_run(p_own, &at_own, s);
        if (st) {
            mg_graph_abort_capture(s);
            FAIL("run while capturing: %s: %s", mg_status_name(st), mg_last_error());
        }
        OK(mg_graph_end_capture(s, &g)); /* one graph holds both runs */
        OK(mg_stream_synchronize(s));
    }
    OK(mg_attention_plan_update(p_lib, second.qo_indptr, second.kv_indptr, second.batch_size, s));
    OK(mg_attention_plan_update(p_own, second.qo_indptr, second.kv_indptr, second.batch_size, s));
    OK(mg_stream_synchronize(s));
    OK(upload_inputs(&second, &lib));
    OK(upload_inputs(&second, &own));
    OK(poison_outputs(&lib));
    OK(poison_outputs(&own));
    if (graphs) {
        OK(mg_graph_launch(g, s));
    } else {
        OK(mg_attention_run(p_lib, &at_lib, s));
        OK(mg_attention_run(p_own, &at_own, s));
    }
    OK(mg_stream_synchronize(s));
    if (!same_bytes(&lib, &own, why, sizeof why))
        FAIL("second batch (%s), caller workspace vs library workspace: %s",
             graphs ? "graph replay" : "runs", why);
    OK(mg_ledger_live(be, &live1, &count1));
    if (live1 != live0 || count1 != count0)
        FAIL("the caller-workspace plan allocated: ledger %llu bytes / %llu allocations, was "
             "%llu / %llu",
             (unsigned long long)live1, (unsigned long long)count1, (unsigned long long)live0,
             (unsigned long long)count0);
    result->passed = true;
    snprintf(result->detail, sizeof result->detail,
             "%zu-byte caller workspace, %u then %u q rows in a %u-row grid, %s, bitwise equal",
             bytes, first.qo_rows, second.qo_rows, cap_q,
             graphs ? "replayed from a graph" : "eager runs");
done:
    mg_graph_destroy(g);
    mg_attention_plan_destroy(p_own);
    mg_attention_plan_destroy(p_lib);
    if (workspace)
        mg_free(be, workspace);
    mg_stream_destroy(s);
    free_buffers(&lib);
    free_buffers(&own);
    free_batch(&first);
    free_batch(&second);
}

const mg_check_case mg_checks_attention[] = {
    {"attention", "causal_mha", check_causal_mha},
    {"attention", "causal_gqa4", check_causal_gqa4},
    {"attention", "causal_gqa8", check_causal_gqa8},
    {"attention", "causal_long", check_causal_long, MG_CHECK_SLOW},
    {"attention", "full_gqa4", check_full_gqa4},
    {"attention", "full_long", check_full_long, MG_CHECK_SLOW},
    {"attention", "causal_window", check_causal_window},
    {"attention", "causal_window_mha", check_causal_window_mha},
    {"attention", "window_zero", check_window_zero},
    {"attention", "fa2_causal_gqa4", check_fa2_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "fa2_full_gqa8", check_fa2_full_gqa8, MG_CHECK_SLOW},
    {"attention", "fa3_causal_gqa4", check_fa3_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "fa3_full_gqa8", check_fa3_full_gqa8, MG_CHECK_SLOW},
    {"attention", "many_short", check_many_short},
    {"attention", "hd64_causal_gqa4", check_hd64_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "hd64_full_gqa8", check_hd64_full_gqa8, MG_CHECK_SLOW},
    {"attention", "hd64_causal_long", check_hd64_causal_long, MG_CHECK_SLOW},
    {"attention", "hd64_causal_window", check_hd64_causal_window},
    {"attention", "hd64_fa2_causal_gqa4", check_hd64_fa2_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "hd64_fa2_full_gqa8", check_hd64_fa2_full_gqa8, MG_CHECK_SLOW},
    {"attention", "hd64_fa3_causal_gqa4", check_hd64_fa3_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "hd64_fa3_full_gqa8", check_hd64_fa3_full_gqa8, MG_CHECK_SLOW},
    {"attention", "hd256_causal_gqa4", check_hd256_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "hd256_full_gqa8", check_hd256_full_gqa8, MG_CHECK_SLOW},
    {"attention", "hd256_causal_long", check_hd256_causal_long, MG_CHECK_SLOW},
    {"attention", "hd256_causal_window", check_hd256_causal_window},
    {"attention", "hd256_fa2_causal_gqa4", check_hd256_fa2_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "hd256_fa2_full_gqa8", check_hd256_fa2_full_gqa8, MG_CHECK_SLOW},
    {"attention", "hd256_fa3_causal_gqa4", check_hd256_fa3_causal_gqa4, MG_CHECK_SLOW},
    {"attention", "hd256_fa3_full_gqa8", check_hd256_fa3_full_gqa8, MG_CHECK_SLOW},
    {"attention", "hd48_causal_gqa3", check_hd48_causal_gqa3},
    {"attention", "hd80_full_gqa4", check_hd80_full_gqa4},
    {"attention", "hd96_causal_window", check_hd96_causal_window},
    {"attention", "hd40_causal_long", check_hd40_causal_long, MG_CHECK_SLOW},
    {"attention", "graph_replay", check_graph_replay, MG_CHECK_SLOW},
    {"attention", "graph_replay_fa2", check_graph_replay_fa2, MG_CHECK_SLOW},
    {"attention", "graph_replay_hd256", check_graph_replay_hd256, MG_CHECK_SLOW},
    {"attention", "caller_workspace", check_caller_workspace},
    {"attention", "eager_capture_refused", check_eager_capture_refused},
    {"attention", "validation", check_validation},
    {NULL, NULL, NULL},
};
