/* check_gemm_fusion.c - the fused GEMMs of the "gemm" check group: every prologue and epilogue
 * of metrale/ops_gemm.h against the composition of the unfused calls on the backend under test
 * (mg_rmsnorm_bf16, the host FP8 row quantizer, mg_gemm, mg_silu_mul_bf16, mg_argmax_*, and
 * the residual add on the host), on random inputs of awkward shapes with poisoned outputs; and
 * the fusion's argument errors. A backend whose providers run no fusion must refuse each with
 * MG_ERR_UNSUPPORTED naming it (the check is then skipped, saying so); the CPU backend must run
 * them all, bit for bit equal to the composition. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops.h"
#include "metrale/ops_activation.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_kv_cache.h"
#include "metrale/status.h"

/* Off the CPU a fused kernel may sum in another order than the unfused GEMM and round its
 * intermediates elsewhere (the decode GEMV applies the norm's scale after the dot product), so
 * an intermediate may differ by a BF16 spacing of its own size; the epilogue then carries that
 * into an output that may be much smaller (a residual add that cancels, SiLU-mul near zero).
 * The bound is the BF16 one of check_gemm.c, relative to max(1, the largest |ref| of the
 * output row), the scale of the row's intermediates. */
#define FUSED_BOUND 2e-2

/* The sizes of each case: small shapes at every M; a mid one (K over several of a kernel's K
 * steps) and a large one (that K, and N past a device's resident blocks, so that blocks walk
 * several tiles). */
enum { SHAPE_SMALL, SHAPE_MID, SHAPE_LARGE };
typedef struct fusion_size {
    uint32_t m;
    int shape;
} fusion_size;
static const fusion_size fusion_sizes[] = {
    {1, SHAPE_SMALL},  {2, SHAPE_SMALL},  {3, SHAPE_SMALL}, {5, SHAPE_SMALL}, {16, SHAPE_SMALL},
    {17, SHAPE_SMALL}, {33, SHAPE_SMALL}, {16, SHAPE_MID},  {1, SHAPE_LARGE}, {16, SHAPE_LARGE}};
#define FUSION_SIZE_COUNT (sizeof fusion_sizes / sizeof fusion_sizes[0])

typedef struct fusion_case {
    mg_gemm_kind kind; /* MG_GEMM_BF16 or MG_GEMM_FP8_ROWWISE */
    mg_gemm_prologue prologue;
    mg_gemm_epilogue epilogue;
    mg_dtype out_type;
    bool in_place; /* RESIDUAL_ADD: the residual is out itself */
} fusion_case;

/* Device buffers of one M; 0 where unused. */
typedef struct fusion_buffers {
    mg_devptr act, act_scale, weight, weight_scale, norm_weight, residual;
    mg_devptr out, ids;                /* the fused call's */
    mg_devptr act_copy, normed, q, qs; /* the composition's input (prologue) */
    mg_devptr y, out2, ids2;           /* the composition's product and results */
    /* KV_APPEND: the page table, and one pool per side */
    mg_devptr qo_indptr, kv_indptr, kv_indices, last_page_len, pool, pool2;
    mg_devptr rope_inv_freq; /* KV_APPEND at odd M: Llama 3.1's scaled RoPE as a table */
} fusion_buffers;

/* The KV_APPEND cases' cache: 4 query heads, 2 KV heads of 32, pages of 16 tokens. */
#define KV_QO_HEADS 4u
static const mg_kv_cache_desc kv_cache = {
    .num_kv_heads = 2, .head_dim = 32, .page_size = 16, .num_pages = 128, .kv_dtype = MG_KV_BF16};

/* The composition's side of a KV_APPEND case: the caller's append arguments with pages of
 * `pool2`. */
typedef struct kv_side {
    const mg_kv_append_args *args; /* NULL: no KV_APPEND */
    mg_devptr k_pages2, v_pages2;
} kv_side;

static void free_buffers(mg_backend *b, fusion_buffers *d) {
    mg_devptr *all = (mg_devptr *)d;
    for (size_t i = 0; i < sizeof *d / sizeof(mg_devptr); i++)
        mg_free(b, all[i]);
    memset(d, 0, sizeof *d);
}

static uint16_t *random_bf16(uint64_t *rng, size_t count, float offset, float magnitude) {
    uint16_t *v = malloc(count * 2 + 2);
    for (size_t i = 0; v && i < count; i++) {
        double u = (double)(mg_check_rng_next(rng) >> 11) * 0x1p-53 * 2.0 - 1.0;
        v[i] = mg_f32_to_bf16(offset + (float)u * magnitude);
    }
    return v;
}

/* The shape of a case at M: K never a multiple of 16 for BF16 (a multiple of 8, which
 * mg_rmsnorm_bf16 needs for the composition), N odd where the fusion allows it, ldc past the
 * output columns (a multiple of 8 where the composition's argmax needs it). FP8 needs K and N
 * multiples of 16 and ldc of 8. Mid and large: K 1544 (3088 bytes of BF16 a row); N about 1200,
 * or about 4500 (more 8-row tiles than 132 SMs hold blocks). */
static mg_gemm_plan case_plan(const fusion_case *c, uint32_t m, int shape) {
    bool fp8 = c->kind != MG_GEMM_BF16, silu = c->epilogue == MG_GEMM_EPILOGUE_SILU_MUL;
    bool kv = c->epilogue == MG_GEMM_EPILOGUE_KV_APPEND;
    uint32_t k = fp8 ? 80 : 40, n = fp8 ? (silu ? 96 : 48) : (silu ? 38 : 37);
    if (shape != SHAPE_SMALL)
        k = fp8 ? 1552 : 1544;
    if (shape == SHAPE_MID)
        n = fp8 ? (silu ? 2416 : 1200) : (silu ? 2402 : 1201);
    if (shape == SHAPE_LARGE)
        n = fp8 ? (silu ? 9024 : 4512) : (silu ? 9002 : 4501);
    if (kv)
        n = (KV_QO_HEADS + 2 * kv_cache.num_kv_heads) * kv_cache.head_dim;
    uint32_t cols = silu ? n / 2 : n;
    uint32_t ldc =
        fp8 || kv || c->epilogue == MG_GEMM_EPILOGUE_ARGMAX ? (cols + 7) / 8 * 8 + 8 : cols + 3;
    return (mg_gemm_plan){.kind = c->kind,
                          .m = m,
                          .n = n,
                          .k = k,
                          .ldc = ldc,
                          .out_type = c->out_type,
                          .fusion = {c->prologue, c->epilogue, 1e-5f}};
}

static double out_value(mg_dtype t, const void *p, size_t i) {
    return t == MG_DTYPE_F32 ? ((const float *)p)[i] : mg_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* The unfused composition of `p` on `b`, into d->out2 / d->ids2 (or, for the residual add, on
 * the host into `want`, which otherwise receives out2). */
static mg_status compose(mg_backend *b, const mg_gemm_plan *p, fusion_buffers *d,
                         const uint16_t *residual_host, void *want, int32_t *want_ids,
                         const kv_side *kv) {
    bool fp8 = p->kind != MG_GEMM_BF16;
    size_t ob = mg_dtype_bytes(p->out_type), out_bytes = (size_t)p->m * p->ldc * ob;
    mg_gemm_plan plain = *p;
    plain.fusion = (mg_gemm_fusion){0};
    mg_gemm_tensors t = {.act = d->act, .weight = d->weight, .weight_scale = d->weight_scale};
    t.act_scale = d->act_scale;
    mg_status st = MG_OK;
    uint16_t *normed = NULL;
    uint8_t *codes = NULL;
    float *scales = NULL;
    if (p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM) {
        size_t e = (size_t)p->m * p->k;
        if ((st = mg_check_alloc_poisoned(b, e * 2, &d->normed)) ||
            (st = mg_check_alloc_poisoned(b, e * 2, &d->act_copy)) ||
            (st = mg_copy_d2d(b, d->act_copy, d->act, e * 2)) ||
            (st = mg_rmsnorm_bf16(b, NULL, p->m, p->k, p->fusion.eps, d->act_copy, 0,
                                  d->norm_weight, d->normed)))
            goto done;
        t.act = d->normed;
        if (fp8) {
            normed = malloc(e * 2);
            codes = malloc(e);
            scales = malloc((size_t)p->m * 4);
            if (!normed || !codes || !scales) {
                st = MG_ERR_OUT_OF_MEMORY;
                goto done;
            }
            if ((st = mg_stream_synchronize(mg_stream_default(b))) ||
                (st = mg_copy_d2h(b, normed, d->normed, e * 2)) ||
                (st = mg_fp8_quantize_rowwise(normed, p->m, p->k, codes, scales)) ||
                (st = mg_check_upload(b, codes, e, &d->q)) ||
                (st = mg_check_upload(b, scales, (size_t)p->m * 4, &d->qs)))
                goto done;
            t.act = d->q;
            t.act_scale = d->qs;
        }
    }
    bool silu = p->fusion.epilogue == MG_GEMM_EPILOGUE_SILU_MUL;
    if (silu) {
        plain.ldc = fp8 ? p->n : p->n; /* the product packed: [M, N] */
        if ((st = mg_check_alloc_poisoned(b, (size_t)p->m * p->n * 2, &d->y)) ||
            (st = mg_check_alloc_poisoned(b, out_bytes, &d->out2)))
            goto done;
        t.out = d->y;
    } else {
        if ((st = mg_check_alloc_poisoned(b, out_bytes, &d->out2)))
            goto done;
        t.out = d->out2;
    }
    if ((st = mg_gemm(b, NULL, &plain, &t)))
        goto done;
    if (silu && (st = mg_silu_mul_bf16(b, NULL, p->m, p->n / 2, d->y, p->n, d->out2, p->ldc)))
        goto done;
    if (kv->args) { /* the QKV rows [q | k | v] of out2, appended as mg_kv_append documents */
        mg_kv_append_args a = *kv->args;
        uint64_t d_bytes = kv_cache.head_dim * 2ull;
        a.num_tokens = p->m;
        a.q = a.rope ? d->out2 : 0;
        a.q_stride = a.rope ? p->ldc : 0;
        a.k = d->out2 + KV_QO_HEADS * d_bytes;
        a.v = a.k + kv_cache.num_kv_heads * d_bytes;
        a.k_stride = a.v_stride = p->ldc;
        a.k_pages = kv->k_pages2;
        a.v_pages = kv->v_pages2;
        if ((st = mg_kv_append(b, NULL, &kv_cache, &a)))
            goto done;
    }
    if (p->fusion.epilogue == MG_GEMM_EPILOGUE_ARGMAX) {
        if ((st = mg_check_alloc_poisoned(b, (size_t)p->m * 4, &d->ids2)))
            goto done;
        st = p->out_type == MG_DTYPE_F32
                 ? mg_argmax_f32(b, NULL, p->m, p->n, d->out2, p->ldc, d->ids2)
                 : mg_argmax_bf16(b, NULL, p->m, p->n, d->out2, p->ldc, d->ids2);
        if (st || (st = mg_stream_synchronize(mg_stream_default(b))) ||
            (st = mg_copy_d2h(b, want_ids, d->ids2, (size_t)p->m * 4)))
            goto done;
    }
    if ((st = mg_stream_synchronize(mg_stream_default(b))) ||
        (st = mg_copy_d2h(b, want, d->out2, out_bytes)))
        goto done;
    if (p->fusion.epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD) {
        uint16_t *w = want;
        for (uint32_t r = 0; r < p->m; r++)
            for (uint32_t j = 0; j < p->n; j++) {
                size_t i = (size_t)r * p->ldc + j;
                w[i] = mg_f32_to_bf16(mg_bf16_to_f32(w[i]) + mg_bf16_to_f32(residual_host[i]));
            }
    }
done:
    free(normed);
    free(codes);
    free(scales);
    return st;
}

/* One M of a case: uploads random inputs, runs the fused call and the composition, compares.
 * Returns false when the backend refused the fusion (r->detail then says how). */
static bool run_case_m(mg_check_ctx *ctx, mg_check_result *r, const fusion_case *c, uint32_t m,
                       int shape, uint64_t *rng, double *worst) {
    mg_backend *b = ctx->backend;
    mg_gemm_plan p = case_plan(c, m, shape);
    bool fp8 = c->kind != MG_GEMM_BF16, norm = c->prologue == MG_GEMM_PROLOGUE_RMSNORM;
    bool silu = c->epilogue == MG_GEMM_EPILOGUE_SILU_MUL;
    uint32_t cols = silu ? p.n / 2 : p.n;
    size_t ob = mg_dtype_bytes(p.out_type), out_bytes = (size_t)m * p.ldc * ob;
    fusion_buffers d = {0};
    bool ran = true;
    /* The residual stream of a decoder is O(1..10); the weights O(0.1). */
    uint16_t *act = random_bf16(rng, (size_t)m * p.k, 0.0f, 3.0f);
    uint16_t *weight = random_bf16(rng, (size_t)p.n * p.k, 0.0f, 0.25f);
    uint16_t *norm_w = random_bf16(rng, p.k, 1.0f, 0.5f);
    uint16_t *residual = random_bf16(rng, (size_t)m * p.ldc, 0.0f, 2.0f);
    uint8_t *acodes = malloc((size_t)m * p.k), *wcodes = malloc((size_t)p.n * p.k);
    float *ascales = malloc((size_t)m * 4), *wscales = malloc((size_t)p.n * 4);
    void *got = malloc(out_bytes), *want = malloc(out_bytes);
    int32_t *ids = malloc((size_t)m * 4), *want_ids = malloc((size_t)m * 4);
    mg_status st;
    if (!act || !weight || !norm_w || !residual || !acodes || !wcodes || !ascales || !wscales ||
        !got || !want || !ids || !want_ids) {
        MG_CHECK_FAIL(r, "out of host memory");
        goto done;
    }
    if (fp8) {
        if ((st = mg_fp8_quantize_rowwise(weight, p.n, p.k, wcodes, wscales)) ||
            (st = mg_fp8_quantize_rowwise(act, m, p.k, acodes, ascales)) ||
            (st = mg_check_upload(b, wcodes, (size_t)p.n * p.k, &d.weight)) ||
            (st = mg_check_upload(b, wscales, (size_t)p.n * 4, &d.weight_scale)))
            goto setup_failed;
        if (norm)
            st = mg_check_upload(b, act, (size_t)m * p.k * 2, &d.act);
        else if (!(st = mg_check_upload(b, acodes, (size_t)m * p.k, &d.act)))
            st = mg_check_upload(b, ascales, (size_t)m * 4, &d.act_scale);
    } else if (!(st = mg_check_upload(b, weight, (size_t)p.n * p.k * 2, &d.weight))) {
        st = mg_check_upload(b, act, (size_t)m * p.k * 2, &d.act);
    }
    if (st || (st = mg_check_upload(b, norm_w, (size_t)p.k * 2, &d.norm_weight)) ||
        (st = mg_check_upload(b, residual, (size_t)m * p.ldc * 2, &d.residual)) ||
        (st = c->in_place ? mg_check_upload(b, residual, out_bytes, &d.out)
                          : mg_check_alloc_poisoned(b, out_bytes, &d.out)) ||
        (st = mg_check_alloc_poisoned(b, (size_t)m * 4, &d.ids)))
        goto setup_failed;
    mg_gemm_tensors t = {.act = d.act,
                         .weight = d.weight,
                         .out = d.out,
                         .act_scale = d.act_scale,
                         .weight_scale = d.weight_scale};
    /* KV_APPEND: M decode requests, one new token each, at random lengths 1..40 over pages
     * handed out in a shuffled order */
    mg_kv_append_args kv_args = {0};
    kv_side kv = {0};
    size_t pool_bytes = 0;
    if (c->epilogue == MG_GEMM_EPILOGUE_KV_APPEND) {
        int32_t qo[34], kvp[34], last[33], indices[128];
        uint32_t used = 0;
        qo[0] = kvp[0] = 0;
        for (uint32_t i = 0; i < kv_cache.num_pages; i++)
            indices[i] = (int32_t)i;
        for (uint32_t i = kv_cache.num_pages - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(mg_check_rng_next(rng) % (i + 1));
            int32_t x = indices[i];
            indices[i] = indices[j];
            indices[j] = x;
        }
        for (uint32_t req = 0; req < m; req++) {
            uint32_t len = 1 + (uint32_t)(mg_check_rng_next(rng) % 40);
            uint32_t pages = (len + 15) / 16;
            qo[req + 1] = (int32_t)req + 1;
            kvp[req + 1] = kvp[req] + (int32_t)pages;
            last[req] = (int32_t)(len - (pages - 1) * 16);
            used += pages;
        }
        mg_devptr k2, v2;
        if ((st = mg_kv_cache_bytes(&kv_cache, &pool_bytes)) ||
            (st = mg_check_upload(b, qo, (m + 1) * 4, &d.qo_indptr)) ||
            (st = mg_check_upload(b, kvp, (m + 1) * 4, &d.kv_indptr)) ||
            (st = mg_check_upload(b, indices, used * 4, &d.kv_indices)) ||
            (st = mg_check_upload(b, last, m * 4, &d.last_page_len)) ||
            (st = mg_check_alloc_poisoned(b, pool_bytes, &d.pool)) ||
            (st = mg_check_alloc_poisoned(b, pool_bytes, &d.pool2)) ||
            (st = mg_kv_cache_pools(&kv_cache, d.pool, &kv_args.k_pages, &kv_args.v_pages)) ||
            (st = mg_kv_cache_pools(&kv_cache, d.pool2, &k2, &v2)))
            goto setup_failed;
        kv_args.batch_size = m;
        kv_args.num_kv_indices = used;
        kv_args.num_qo_heads = KV_QO_HEADS;
        kv_args.rope = true;
        kv_args.rope_theta = 10000.0f;
        if (m % 2) { /* odd M: the frequencies from a table (Llama 3.1's scaling) */
            float table[64];
            const uint32_t half = kv_cache.head_dim / 2;
            if (half > 64 ||
                (st = mg_rope_inv_freq_llama3(kv_cache.head_dim, 10000.0f, 8.0f, 1.0f, 4.0f, 64,
                                              table)) ||
                (st = mg_check_upload(b, table, half * 4, &d.rope_inv_freq)))
                goto setup_failed;
            kv_args.rope_inv_freq = d.rope_inv_freq;
        }
        kv_args.qo_indptr = d.qo_indptr;
        kv_args.kv_indptr = d.kv_indptr;
        kv_args.kv_indices = d.kv_indices;
        kv_args.kv_last_page_len = d.last_page_len;
        t.fusion.kv_cache = &kv_cache;
        t.fusion.kv_append = &kv_args;
        kv = (kv_side){&kv_args, k2, v2};
    }
    if (norm)
        t.fusion.norm_weight = d.norm_weight;
    if (c->epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD)
        t.fusion.residual = c->in_place ? d.out : d.residual;
    if (c->epilogue == MG_GEMM_EPILOGUE_ARGMAX)
        t.fusion.argmax_ids = d.ids;
    st = mg_gemm(b, NULL, &p, &t);
    if (st == MG_ERR_UNSUPPORTED && mg_backend_get_kind(b) != MG_BACKEND_CPU) {
        /* Allowed off the CPU (for some shapes or all of them), but only as a whole refusal
         * naming the fusion. */
        const char *name =
            norm ? mg_gemm_prologue_name(c->prologue) : mg_gemm_epilogue_name(c->epilogue);
        if (!strstr(mg_last_error(), name))
            MG_CHECK_FAIL(r, "the refusal does not name the fusion %s: %s", name, mg_last_error());
        else
            snprintf(r->detail, sizeof r->detail, "refused as a whole: %s", mg_last_error());
        ran = false;
        goto done;
    }
    if (st || (st = mg_stream_synchronize(mg_stream_default(b))) ||
        (st = mg_copy_d2h(b, got, d.out, out_bytes)) ||
        (st = mg_copy_d2h(b, ids, d.ids, (size_t)m * 4))) {
        MG_CHECK_FAIL(r, "M=%u: the fused call: %s: %s", m, mg_status_name(st), mg_last_error());
        goto done;
    }
    if ((st = compose(b, &p, &d, residual, want, want_ids, &kv))) {
        MG_CHECK_FAIL(r, "M=%u: the composition: %s: %s", m, mg_status_name(st), mg_last_error());
        goto done;
    }
    bool exact = mg_backend_get_kind(b) == MG_BACKEND_CPU;
    if (kv.args) { /* the pools: the same slots written with the same values */
        uint16_t *pool = malloc(pool_bytes), *pool2 = malloc(pool_bytes);
        if (!pool || !pool2 || mg_copy_d2h(b, pool, d.pool, pool_bytes) ||
            mg_copy_d2h(b, pool2, d.pool2, pool_bytes)) {
            MG_CHECK_FAIL(r, "M=%u: reading the pools back: %s", m, mg_last_error());
        } else {
            /* off the CPU within the bound of out's elements: relative to the largest value
             * of the pool row (one token's keys or values), at least 1 */
            const size_t row_elements = (size_t)kv_cache.num_kv_heads * kv_cache.head_dim;
            for (size_t i = 0; i < pool_bytes / 2 && r->passed; i++) {
                double gv = mg_bf16_to_f32(pool[i]), wv = mg_bf16_to_f32(pool2[i]);
                double scale = 1.0;
                for (size_t e = i / row_elements * row_elements;
                     !exact && e < (i / row_elements + 1) * row_elements; e++)
                    scale = fmax(scale, fabs(mg_bf16_to_f32(pool2[e])));
                bool same = pool[i] == pool2[i];
                if (exact ? !same : !(same || fabs(gv - wv) <= FUSED_BOUND * scale))
                    MG_CHECK_FAIL(r, "M=%u: pool element %zu is %.6g, the composition's %.6g", m, i,
                                  gv, wv);
            }
        }
        free(pool);
        free(pool2);
    }
    for (uint32_t row = 0; row < m && r->passed; row++) {
        double row_scale = 1.0;
        for (uint32_t j = 0; j < cols; j++)
            row_scale = fmax(row_scale, fabs(out_value(p.out_type, want, (size_t)row * p.ldc + j)));
        for (uint32_t j = 0; j < p.ldc && r->passed; j++) {
            size_t i = (size_t)row * p.ldc + j;
            const unsigned char *g = (const unsigned char *)got + i * ob;
            if (j >= cols) { /* padding columns: never written (in place: still the residual) */
                for (size_t byte = 0; byte < ob; byte++)
                    if (c->in_place ? g[byte] != ((const unsigned char *)residual)[i * ob + byte]
                                    : g[byte] != MG_CHECK_POISON)
                        MG_CHECK_FAIL(r, "M=%u: padding column %u of row %u was written", m, j,
                                      row);
                continue;
            }
            double gv = out_value(p.out_type, got, i), wv = out_value(p.out_type, want, i);
            double err = fabs(gv - wv) / row_scale;
            if (!isfinite(gv) || (exact && memcmp(g, (const char *)want + i * ob, ob)) ||
                !(err <= FUSED_BOUND))
                MG_CHECK_FAIL(r, "M=%u N=%u K=%u: out[%u, %u] = %.6g, the composition %.6g", m, p.n,
                              p.k, row, j, gv, wv);
            if (err > *worst)
                *worst = err;
        }
        if (c->epilogue == MG_GEMM_EPILOGUE_ARGMAX && ids[row] != want_ids[row]) {
            /* off the CPU a near-tie may go either way: the fused choice must be as large */
            double a = (unsigned)ids[row] < p.n
                           ? out_value(p.out_type, want, (size_t)row * p.ldc + (uint32_t)ids[row])
                           : -INFINITY;
            double best =
                out_value(p.out_type, want, (size_t)row * p.ldc + (uint32_t)want_ids[row]);
            if (exact || !(best - a <= FUSED_BOUND * fmax(1.0, fabs(best))))
                MG_CHECK_FAIL(r, "M=%u: argmax of row %u is %d, the composition's %d", m, row,
                              ids[row], want_ids[row]);
        }
    }
    goto done;
setup_failed:
    MG_CHECK_FAIL(r, "setup: %s: %s", mg_status_name(st), mg_last_error());
done:
    free_buffers(b, &d);
    free(act);
    free(weight);
    free(norm_w);
    free(residual);
    free(acodes);
    free(wcodes);
    free(ascales);
    free(wscales);
    free(got);
    free(want);
    free(ids);
    free(want_ids);
    return ran;
}

static void check_case(mg_check_ctx *ctx, mg_check_result *r, const fusion_case *c,
                       const char *name) {
    mg_op op = c->kind == MG_GEMM_BF16 ? MG_OP_GEMM_BF16 : MG_OP_GEMM_FP8;
    if (!mg_op_supported(ctx->backend, op)) {
        r->skipped = true;
        snprintf(r->detail, sizeof r->detail, "the backend has no %s GEMMs",
                 c->kind == MG_GEMM_BF16 ? "BF16" : "FP8");
        return;
    }
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    uint64_t rng = mg_check_rng_seed(ctx, name);
    double worst = 0;
    /* the sizes a device refused as a whole (e.g. a decode kernel's M <= 16), and why */
    char refused[96] = "", why[sizeof r->detail] = "";
    size_t ran = 0;
    for (size_t i = 0; i < FUSION_SIZE_COUNT && r->passed; i++) {
        const fusion_size *z = &fusion_sizes[i];
        if (run_case_m(ctx, r, c, z->m, z->shape, &rng, &worst)) {
            ran++;
            continue;
        }
        if (!r->passed)
            return;
        size_t used = strlen(refused);
        snprintf(refused + used, sizeof refused - used, "%s%u%s", used ? "," : "", z->m,
                 z->shape == SHAPE_LARGE ? "L"
                 : z->shape == SHAPE_MID ? "M"
                                         : "");
        snprintf(why, sizeof why, "%s", r->detail);
    }
    if (!ran) {
        r->skipped = r->passed;
        r->passed = false;
        return;
    }
    r->error = worst;
    if (r->passed) {
        mg_gemm_plan p = case_plan(c, 1, SHAPE_SMALL), o = case_plan(c, 1, SHAPE_MID),
                     q = case_plan(c, 1, SHAPE_LARGE);
        snprintf(r->detail, sizeof r->detail,
                 "M in {1,2,3,5,16,17,33} at N=%u K=%u, 16 at N=%u K=%u, {1,16} at N=%u K=%u: "
                 "worst error %.2e (of the row's largest) against the unfused calls%s%s%s%s%.160s",
                 p.n, p.k, o.n, o.k, q.n, q.k, worst,
                 mg_backend_get_kind(ctx->backend) == MG_BACKEND_CPU ? " (bit for bit)" : "",
                 refused[0] ? "; refused at M=" : "", refused, refused[0] ? ": " : "", why);
    }
}

#define FUSION_CHECK_WITH(fn, kind, pro, epi, out, in_place)                                       \
    static void fn(mg_check_ctx *ctx, mg_check_result *r) {                                        \
        static const fusion_case c = {kind, pro, epi, out, in_place};                              \
        check_case(ctx, r, &c, #fn);                                                               \
    }
#define FUSION_CHECK(fn, kind, pro, epi, out) FUSION_CHECK_WITH(fn, kind, pro, epi, out, false)
#define P_NORM MG_GEMM_PROLOGUE_RMSNORM
#define P_NONE MG_GEMM_PROLOGUE_NONE
FUSION_CHECK(rmsnorm_bf16, MG_GEMM_BF16, P_NORM, MG_GEMM_EPILOGUE_NONE, MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_bf16_f32, MG_GEMM_BF16, P_NORM, MG_GEMM_EPILOGUE_NONE, MG_DTYPE_F32)
FUSION_CHECK(rmsnorm_fp8_row, MG_GEMM_FP8_ROWWISE, P_NORM, MG_GEMM_EPILOGUE_NONE, MG_DTYPE_BF16)
FUSION_CHECK(residual_bf16, MG_GEMM_BF16, P_NONE, MG_GEMM_EPILOGUE_RESIDUAL_ADD, MG_DTYPE_BF16)
FUSION_CHECK_WITH(residual_in_place_bf16, MG_GEMM_BF16, P_NONE, MG_GEMM_EPILOGUE_RESIDUAL_ADD,
                  MG_DTYPE_BF16, true)
FUSION_CHECK(residual_fp8_row, MG_GEMM_FP8_ROWWISE, P_NONE, MG_GEMM_EPILOGUE_RESIDUAL_ADD,
             MG_DTYPE_BF16)
FUSION_CHECK(silu_mul_bf16, MG_GEMM_BF16, P_NONE, MG_GEMM_EPILOGUE_SILU_MUL, MG_DTYPE_BF16)
FUSION_CHECK(silu_mul_fp8_row, MG_GEMM_FP8_ROWWISE, P_NONE, MG_GEMM_EPILOGUE_SILU_MUL,
             MG_DTYPE_BF16)
FUSION_CHECK(argmax_bf16, MG_GEMM_BF16, P_NONE, MG_GEMM_EPILOGUE_ARGMAX, MG_DTYPE_BF16)
FUSION_CHECK(argmax_bf16_f32, MG_GEMM_BF16, P_NONE, MG_GEMM_EPILOGUE_ARGMAX, MG_DTYPE_F32)
FUSION_CHECK(argmax_fp8_row, MG_GEMM_FP8_ROWWISE, P_NONE, MG_GEMM_EPILOGUE_ARGMAX, MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_silu_mul_bf16, MG_GEMM_BF16, P_NORM, MG_GEMM_EPILOGUE_SILU_MUL, MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_silu_mul_fp8_row, MG_GEMM_FP8_ROWWISE, P_NORM, MG_GEMM_EPILOGUE_SILU_MUL,
             MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_residual_bf16, MG_GEMM_BF16, P_NORM, MG_GEMM_EPILOGUE_RESIDUAL_ADD,
             MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_argmax_bf16, MG_GEMM_BF16, P_NORM, MG_GEMM_EPILOGUE_ARGMAX, MG_DTYPE_BF16)
FUSION_CHECK(kv_append_bf16, MG_GEMM_BF16, P_NONE, MG_GEMM_EPILOGUE_KV_APPEND, MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_kv_append_bf16, MG_GEMM_BF16, P_NORM, MG_GEMM_EPILOGUE_KV_APPEND,
             MG_DTYPE_BF16)
FUSION_CHECK(rmsnorm_kv_append_fp8_row, MG_GEMM_FP8_ROWWISE, P_NORM, MG_GEMM_EPILOGUE_KV_APPEND,
             MG_DTYPE_BF16)

/* ------------------------------------------------------------------ argument errors */

static void check_fusion_bad_arguments(mg_check_ctx *ctx, mg_check_result *r) {
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    mg_backend *b = ctx->backend;
    const uint32_t m = 4, n = 64, k = 48;
    size_t out_bytes = 4096; /* >= M x N f32, and room for a KV pool half */
    mg_devptr act = 0, weight = 0, norm_w = 0, resid = 0, out = 0, ids = 0, scales = 0, pool = 0;
    mg_status st;
    if ((st = mg_check_alloc_poisoned(b, (size_t)m * k * 2, &act)) ||
        (st = mg_check_alloc_poisoned(b, (size_t)n * k * 2, &weight)) ||
        (st = mg_check_alloc_poisoned(b, (size_t)k * 2, &norm_w)) ||
        (st = mg_check_alloc_poisoned(b, (size_t)m * n * 2, &resid)) ||
        (st = mg_check_alloc_poisoned(b, 4096, &scales)) ||
        (st = mg_check_alloc_poisoned(b, (size_t)m * 4, &ids)) ||
        (st = mg_check_alloc_poisoned(b, 4096, &pool)) ||
        (st = mg_check_alloc_poisoned(b, out_bytes, &out))) {
        MG_CHECK_FAIL(r, "setup: %s", mg_last_error());
        goto done;
    }
    const mg_gemm_plan base = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_BF16};
    const mg_gemm_tensors tb = {.act = act, .weight = weight, .out = out};
    struct {
        const char *what;
        mg_gemm_plan p;
        mg_gemm_tensors t;
        mg_status status;
        const char *needle;
    } cases[24];
    /* KV_APPEND: 2 query heads, 1 KV head of 16 (N = 64), one request of 4 new tokens; the
     * page table's contents are not read before a call is accepted */
    const mg_kv_cache_desc cache = {
        .num_kv_heads = 1, .head_dim = 16, .page_size = 16, .num_pages = 4};
    const mg_kv_append_args ka = {.batch_size = 1,
                                  .num_kv_indices = 1,
                                  .num_qo_heads = 2,
                                  .rope = true,
                                  .rope_theta = 10000.0f,
                                  .qo_indptr = scales,
                                  .kv_indptr = scales,
                                  .kv_indices = scales,
                                  .kv_last_page_len = scales,
                                  .k_pages = pool,
                                  .v_pages = pool + 2048};
    mg_kv_append_args ka_k = ka, ka_theta = ka, ka_pages = ka;
    ka_k.k = act;
    ka_theta.rope_theta = 0.0f;
    ka_pages.v_pages = out;
    size_t count = 0;
#define CASE(what_, status_, needle_, ...)                                                         \
    do {                                                                                           \
        mg_gemm_plan p = base;                                                                     \
        mg_gemm_tensors t = tb;                                                                    \
        __VA_ARGS__;                                                                               \
        cases[count++] = (__typeof__(cases[0])){what_, p, t, status_, needle_};                    \
    } while (0)
    CASE("unknown epilogue", MG_ERR_INVALID_ARGUMENT, "unknown fusion",
         p.fusion.epilogue = (mg_gemm_epilogue)9);
    CASE("rmsnorm without norm_weight", MG_ERR_INVALID_ARGUMENT, "norm_weight",
         p.fusion = (mg_gemm_fusion){MG_GEMM_PROLOGUE_RMSNORM, 0, 1e-5f});
    CASE("rmsnorm eps = 0", MG_ERR_INVALID_ARGUMENT, "eps",
         p.fusion = (mg_gemm_fusion){MG_GEMM_PROLOGUE_RMSNORM, 0, 0.0f};
         t.fusion.norm_weight = norm_w);
    CASE("norm_weight without the prologue", MG_ERR_INVALID_ARGUMENT, "norm_weight is given",
         t.fusion.norm_weight = norm_w);
    CASE("residual add without residual", MG_ERR_INVALID_ARGUMENT, "residual",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_RESIDUAL_ADD);
    CASE("residual overlapping out (not exactly out)", MG_ERR_INVALID_ARGUMENT, "overlap",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_RESIDUAL_ADD;
         t.fusion.residual = out + 2);
    CASE("residual add into f32", MG_ERR_INVALID_ARGUMENT, "writes bf16",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_RESIDUAL_ADD;
         p.out_type = MG_DTYPE_F32; t.fusion.residual = resid);
    CASE("silu_mul odd N", MG_ERR_INVALID_ARGUMENT, "even N",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_SILU_MUL;
         p.n = 63);
    CASE("argmax without ids", MG_ERR_INVALID_ARGUMENT, "argmax_ids",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_ARGMAX);
    CASE("argmax ids overlapping out", MG_ERR_INVALID_ARGUMENT, "overlap",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_ARGMAX;
         t.fusion.argmax_ids = out + 64);
    CASE("argmax ids misaligned", MG_ERR_INVALID_ARGUMENT, "argmax_ids",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_ARGMAX;
         t.fusion.argmax_ids = ids + 2);
    CASE("fusion on block-scaled FP8", MG_ERR_UNSUPPORTED, "argmax",
         p.kind = MG_GEMM_FP8_BLOCKSCALED;
         p.fusion.epilogue = MG_GEMM_EPILOGUE_ARGMAX; t.fusion.argmax_ids = ids);
    CASE("fp8 rmsnorm with act_scale", MG_ERR_INVALID_ARGUMENT, "act_scale is given",
         p.kind = MG_GEMM_FP8_ROWWISE;
         p.fusion = (mg_gemm_fusion){MG_GEMM_PROLOGUE_RMSNORM, 0, 1e-5f};
         t.fusion.norm_weight = norm_w; t.act_scale = scales; t.weight_scale = scales);
    CASE("kv_append without kv_cache", MG_ERR_INVALID_ARGUMENT, "needs kv_cache",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
         t.fusion.kv_append = &ka);
    CASE("kv_append with k given", MG_ERR_INVALID_ARGUMENT, "pass them 0",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
         t.fusion.kv_cache = &cache; t.fusion.kv_append = &ka_k);
    CASE("kv_append N not the heads", MG_ERR_INVALID_ARGUMENT, "num_qo_heads + 2 num_kv_heads",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
         p.n = 48; t.fusion.kv_cache = &cache; t.fusion.kv_append = &ka);
    CASE("kv_append rope_theta 0", MG_ERR_INVALID_ARGUMENT, "mg_kv_append: rope_theta",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
         t.fusion.kv_cache = &cache; t.fusion.kv_append = &ka_theta);
    CASE("kv_append pages overlapping out", MG_ERR_INVALID_ARGUMENT, "overlap",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
         t.fusion.kv_cache = &cache; t.fusion.kv_append = &ka_pages);
    CASE("kv_append into f32", MG_ERR_INVALID_ARGUMENT, "bf16 output rows",
         p.fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
         p.out_type = MG_DTYPE_F32; t.fusion.kv_cache = &cache; t.fusion.kv_append = &ka);
    CASE("kv_cache without the epilogue", MG_ERR_INVALID_ARGUMENT, "kv_cache is given",
         t.fusion.kv_cache = &cache);
#undef CASE
    for (size_t i = 0; i < count && r->passed; i++) {
        mg_status got = mg_gemm(b, NULL, &cases[i].p, &cases[i].t);
        const char *msg = mg_last_error();
        if (got != cases[i].status || !strstr(msg, cases[i].needle))
            MG_CHECK_FAIL(r, "%s: got %s \"%s\", expected %s mentioning \"%s\"", cases[i].what,
                          mg_status_name(got), msg, mg_status_name(cases[i].status),
                          cases[i].needle);
    }
    unsigned char *host = malloc(out_bytes);
    int32_t host_ids[4];
    if (r->passed && host && mg_copy_d2h(b, host, out, out_bytes) == MG_OK &&
        mg_copy_d2h(b, host_ids, ids, sizeof host_ids) == MG_OK) {
        for (size_t j = 0; j < out_bytes && r->passed; j++)
            if (host[j] != MG_CHECK_POISON)
                MG_CHECK_FAIL(r, "a rejected call wrote the output (byte %zu)", j);
        for (size_t j = 0; j < sizeof host_ids && r->passed; j++)
            if (((unsigned char *)host_ids)[j] != MG_CHECK_POISON)
                MG_CHECK_FAIL(r, "a rejected call wrote argmax_ids (byte %zu)", j);
    } else if (r->passed) {
        MG_CHECK_FAIL(r, "reading the output back: %s", mg_last_error());
    }
    free(host);
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "%zu bad fused calls rejected with the documented status and message; outputs "
                 "untouched",
                 count);
done:
    mg_free(b, act);
    mg_free(b, weight);
    mg_free(b, norm_w);
    mg_free(b, resid);
    mg_free(b, out);
    mg_free(b, ids);
    mg_free(b, scales);
    mg_free(b, pool);
}

const mg_check_case mg_checks_gemm_fusion[] = {
    {"gemm", "fusion_rmsnorm_bf16", rmsnorm_bf16},
    {"gemm", "fusion_rmsnorm_bf16_f32", rmsnorm_bf16_f32},
    {"gemm", "fusion_rmsnorm_fp8_row", rmsnorm_fp8_row},
    {"gemm", "fusion_residual_bf16", residual_bf16},
    {"gemm", "fusion_residual_in_place_bf16", residual_in_place_bf16},
    {"gemm", "fusion_residual_fp8_row", residual_fp8_row},
    {"gemm", "fusion_silu_mul_bf16", silu_mul_bf16},
    {"gemm", "fusion_silu_mul_fp8_row", silu_mul_fp8_row},
    {"gemm", "fusion_argmax_bf16", argmax_bf16},
    {"gemm", "fusion_argmax_bf16_f32", argmax_bf16_f32},
    {"gemm", "fusion_argmax_fp8_row", argmax_fp8_row},
    {"gemm", "fusion_rmsnorm_silu_mul_bf16", rmsnorm_silu_mul_bf16},
    {"gemm", "fusion_rmsnorm_silu_mul_fp8_row", rmsnorm_silu_mul_fp8_row},
    {"gemm", "fusion_rmsnorm_residual_bf16", rmsnorm_residual_bf16},
    {"gemm", "fusion_rmsnorm_argmax_bf16", rmsnorm_argmax_bf16},
    {"gemm", "fusion_kv_append_bf16", kv_append_bf16},
    {"gemm", "fusion_rmsnorm_kv_append_bf16", rmsnorm_kv_append_bf16},
    {"gemm", "fusion_rmsnorm_kv_append_fp8_row", rmsnorm_kv_append_fp8_row},
    {"gemm", "fusion_bad_arguments", check_fusion_bad_arguments},
    {NULL, NULL, NULL},
};
