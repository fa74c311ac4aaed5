/* bench_decode.c - `metrale-gpu bench decode`: decode attention over the paged KV cache
 * (metrale/ops_kv_cache.h), Hq=32, Hkv=8, D=128, pages of 16 tokens scattered over the pool
 * (a shuffled page table), one query per request, batch {1, 8, 32, 128} x context {512, 2048,
 * 8192, 32768} (cases of more than 2^20 cached tokens are skipped, as the peers script does),
 * each timed as a CUDA-graph replay of a fixed-grid plan. Reported as KV bytes read per
 * second (row bytes = K and V of every cached token) and, in the note, as a fraction of the
 * measured device copy bandwidth. Two more rows per case:
 *   ragged_<case>  our ragged prefill op with one query per request on contiguous keys (the
 *                  same attention without a page table: what paging costs);
 *   fp8_<case>     the paged op over FP8 E4M3 pools with per-head scales (KV bytes read are
 *                  half the BF16 case's);
 * and the append op: append_<tokens> writes that many tokens' K and V (from a strided QKV
 * output, RoPE on q and k) into shuffled pages; bytes = read + written, against copy bandwidth;
 * append_fp8_<tokens> the same into FP8 pools (K and V written as one byte per element).
 * Every paged row has a twin skv_<row>: the same plan with the split-KV decode kernels forced
 * (the automatic choice on this shape is FlashInfer's paged FA2 kernels).
 * Like the peers (SDPA under graph replay), a replay reads the same keys every time, so the
 * smallest cases run from L2. Options: --batch N and --context N restrict the grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops.h"
#include "metrale/ops_kv_cache.h"

#define HQ 32
#define HKV 8
#define HEAD_DIM 128
#define PAGE 16
#define MAX_TOKENS (1u << 20)

typedef struct decode_run {
    mg_attention_plan *plan;
    mg_paged_attention_tensors paged;
    mg_attention_tensors ragged;
    mg_kv_cache_desc cache;
    mg_kv_append_args append;
} decode_run;

static mg_status body_paged(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    decode_run *r = arg;
    return mg_paged_attention_run(r->plan, &r->paged, b->stream);
}

static mg_status body_ragged(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    decode_run *r = arg;
    return mg_attention_run(r->plan, &r->ragged, b->stream);
}

static mg_status body_append(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    decode_run *r = arg;
    return mg_kv_append(b->backend, b->stream, &r->cache, &r->append);
}

/* Per-head FP32 scales (K then V, HKV each) for the FP8 cases: codes of about 100 stand for
 * values of about 1. */
static mg_status make_scales(mg_bench *b, mg_devptr *scales) {
    float host[2 * HKV];
    for (int i = 0; i < 2 * HKV; i++)
        host[i] = 0.01f * (1.0f + 0.125f * (float)(i % HKV));
    mg_status st = mg_alloc(b->backend, sizeof host, scales);
    return st ? st : mg_copy_h2d(b->backend, *scales, host, sizeof host);
}

static void note_fraction(mg_bench_row *row, double copy_gbps, const char *what) {
    const double gbps = row->bytes / row->stats.median_us / 1e3;
    snprintf(row->note, sizeof row->note, "%s; %.2f of copy bw (%.0f GB/s)", what,
             copy_gbps > 0 ? gbps / copy_gbps : 0.0, copy_gbps);
}

/* One grid point's device state: a shuffled page table of `batch` requests of `context` tokens,
 * pools of that many pages (BF16 or FP8, filled with random values), one query row per request
 * and an output, and for FP8 the per-head scales. */
typedef struct paged_case {
    mg_bench_page_table t;
    mg_kv_cache_desc cache;
    mg_devptr pool, q, o, idx, scales, k_pages, v_pages;
} paged_case;

static void paged_case_destroy(mg_bench *b, paged_case *c) {
    mg_bench_page_table_free(&c->t);
    mg_devptr all[] = {c->pool, c->q, c->o, c->idx, c->scales};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        mg_free(b->backend, all[i]);
}

static mg_status paged_case_create(mg_bench *b, uint32_t batch, uint32_t context,
                                   mg_kv_dtype kv_dtype, paged_case *c) {
    *c = (paged_case){.cache = {HKV, HEAD_DIM, PAGE, 0, kv_dtype}};
    const bool fp8 = kv_dtype == MG_KV_FP8_E4M3;
    size_t pool_bytes = 0;
    mg_status st =
        mg_bench_page_table_make(&c->t, batch, 1, context, PAGE, 7u + batch * 31u + context)
            ? MG_OK
            : MG_ERR_OUT_OF_MEMORY;
    if (!st) {
        c->cache.num_pages = c->t.pages;
        st = mg_kv_cache_bytes(&c->cache, &pool_bytes);
    }
    if (!st)
        st = mg_alloc(b->backend, pool_bytes, &c->pool);
    if (!st)
        st = mg_kv_cache_pools(&c->cache, c->pool, &c->k_pages, &c->v_pages);
    if (!st)
        st = mg_alloc(b->backend, 2ull * batch * HQ * HEAD_DIM, &c->q);
    if (!st)
        st = mg_alloc(b->backend, 2ull * batch * HQ * HEAD_DIM, &c->o);
    if (!st)
        st = mg_alloc(b->backend, 4ull * c->t.pages, &c->idx);
    if (!st)
        st = mg_copy_h2d(b->backend, c->idx, c->t.idx, 4ull * c->t.pages);
    if (!st)
        st = mg_bench_fill_unit(b, c->pool, fp8 ? pool_bytes : pool_bytes / 2, fp8, 11);
    if (!st)
        st = mg_bench_fill_unit(b, c->q, (size_t)batch * HQ * HEAD_DIM, false, 12);
    if (!st && fp8)
        st = make_scales(b, &c->scales);
    if (st)
        paged_case_destroy(b, c);
    return st;
}

/* The paged op on `c` under graph replay, one row named `name` (bytes: the KV bytes read), run
 * by `provider` (NULL: the automatic choice). */
static int time_paged_by(mg_bench *b, paged_case *c, uint32_t context, const char *name,
                         const char *shape, double kv_bytes, double copy_gbps, const char *what,
                         const char *provider) {
    if (!mg_bench_selected(b, name))
        return 0;
    const uint32_t batch = c->t.batch;
    const mg_paged_attention_desc d = {.num_qo_heads = HQ,
                                       .num_kv_heads = HKV,
                                       .head_dim = HEAD_DIM,
                                       .page_size = PAGE,
                                       .window_left = -1,
                                       .sm_scale = 1.0f / sqrtf((float)HEAD_DIM),
                                       .graph_qo_rows = batch,
                                       .graph_kv_tokens = batch * context,
                                       .kv_dtype = c->cache.kv_dtype};
    const mg_kv_page_table table = {batch, c->t.qo, c->t.kv, c->t.idx, c->t.last};
    decode_run r = {0};
    r.paged = (mg_paged_attention_tensors){.q = c->q,
                                           .o = c->o,
                                           .qo_rows = batch,
                                           .k_pages = c->k_pages,
                                           .v_pages = c->v_pages,
                                           .num_pages = c->t.pages,
                                           .kv_indices = c->idx,
                                           .num_kv_indices = c->t.pages,
                                           .k_scale = c->scales,
                                           .v_scale = c->scales ? c->scales + 4 * HKV : 0};
    mg_bench_row row = mg_bench_row_make("decode", name, shape);
    mg_status st = mg_op_force_provider(b->backend, MG_OP_ATTENTION_PAGED, provider);
    if (!st)
        st = mg_paged_attention_plan_create(b->backend, &d, &table, b->stream, &r.plan);
    if (!st)
        st = mg_bench_time_graph(b, body_paged, &r, b->warmup, b->quick ? 3 : b->iters, &row.stats);
    mg_attention_plan_destroy(r.plan);
    mg_op_force_provider(b->backend, MG_OP_ATTENTION_PAGED, NULL);
    if (st)
        return mg_bench_fail(b, name);
    row.bytes = kv_bytes;
    snprintf(row.timing, sizeof row.timing, "graph");
    note_fraction(&row, copy_gbps, what);
    mg_bench_add(b, &row);
    return 0;
}

/* The row `name` (the automatic choice: FlashInfer's paged FA2 kernels on this shape) and
 * skv_<name> (the split-KV decode kernels forced, in the same process). */
static int time_paged(mg_bench *b, paged_case *c, uint32_t context, const char *name,
                      const char *shape, double kv_bytes, double copy_gbps, const char *what) {
    char skv_name[64], skv_what[160];
    snprintf(skv_name, sizeof skv_name, "skv_%s", name);
    snprintf(skv_what, sizeof skv_what, "%s; split_kv_decode forced", what);
    return time_paged_by(b, c, context, name, shape, kv_bytes, copy_gbps, what, NULL) +
           time_paged_by(b, c, context, skv_name, shape, kv_bytes, copy_gbps, skv_what,
                         "split_kv_decode");
}

static int bench_point(mg_bench *b, uint32_t batch, uint32_t context, double copy_gbps) {
    char name[48], shape[64];
    snprintf(name, sizeof name, "b%u_L%u", batch, context);
    snprintf(shape, sizeof shape, "B=%u L=%u", batch, context);
    char ragged_name[48], skv_name[64];
    snprintf(ragged_name, sizeof ragged_name, "ragged_b%u_L%u", batch, context);
    snprintf(skv_name, sizeof skv_name, "skv_%s", name);
    const bool want_paged = mg_bench_selected(b, name) || mg_bench_selected(b, skv_name),
               want_ragged = mg_bench_selected(b, ragged_name);
    if (!want_paged && !want_ragged)
        return 0;
    const double kv_bytes = 2.0 * batch * context * HKV * HEAD_DIM * 2;
    paged_case c;
    if (paged_case_create(b, batch, context, MG_KV_BF16, &c))
        return mg_bench_fail(b, name);
    int failures = 0;
    if (want_paged)
        failures += time_paged(b, &c, context, name, shape, kv_bytes, copy_gbps,
                               "paged, pages of 16 shuffled, KV bytes read");
    if (want_ragged) {
        /* The same keys read as contiguous rows: the pool's first batch*context token rows. */
        decode_run r = {0};
        int32_t *qo = malloc(4 * (batch + 1ull)), *kv = malloc(4 * (batch + 1ull));
        mg_status st = qo && kv ? MG_OK : MG_ERR_OUT_OF_MEMORY;
        for (uint32_t i = 0; !st && i <= batch; i++)
            qo[i] = (int32_t)i, kv[i] = (int32_t)(i * context);
        const mg_attention_desc d = {.num_qo_heads = HQ,
                                     .num_kv_heads = HKV,
                                     .head_dim = HEAD_DIM,
                                     .causal = true,
                                     .window_left = -1,
                                     .sm_scale = 1.0f / sqrtf((float)HEAD_DIM),
                                     .graph_qo_rows = batch,
                                     .graph_kv_rows = batch * context};
        r.ragged = (mg_attention_tensors){.q = c.q,
                                          .k = c.k_pages,
                                          .v = c.v_pages,
                                          .o = c.o,
                                          .qo_rows = batch,
                                          .kv_rows = batch * context};
        mg_bench_row row = mg_bench_row_make("decode", ragged_name, shape);
        if (!st)
            st = mg_attention_plan_create(b->backend, &d, qo, kv, batch, b->stream, &r.plan);
        if (!st)
            st = mg_bench_time_graph(b, body_ragged, &r, b->warmup, b->quick ? 3 : b->iters,
                                     &row.stats);
        mg_attention_plan_info info = {0};
        if (!st)
            mg_attention_plan_get_info(r.plan, &info);
        mg_attention_plan_destroy(r.plan);
        free(qo), free(kv);
        if (st) {
            failures += mg_bench_fail(b, ragged_name);
        } else {
            row.bytes = kv_bytes;
            snprintf(row.timing, sizeof row.timing, "graph");
            char what[48];
            snprintf(what, sizeof what, "ragged %s, contiguous keys",
                     mg_attention_impl_name(info.impl));
            note_fraction(&row, copy_gbps, what);
            mg_bench_add(b, &row);
        }
    }
    paged_case_destroy(b, &c);
    return failures;
}

/* The paged op over FP8 E4M3 pools: fp8_b<batch>_L<context>. */
static int bench_fp8_point(mg_bench *b, uint32_t batch, uint32_t context, double copy_gbps) {
    char name[48], shape[64];
    char skv_name[64];
    snprintf(name, sizeof name, "fp8_b%u_L%u", batch, context);
    snprintf(skv_name, sizeof skv_name, "skv_%s", name);
    if (!mg_bench_selected(b, name) && !mg_bench_selected(b, skv_name))
        return 0;
    snprintf(shape, sizeof shape, "B=%u L=%u FP8 KV", batch, context);
    paged_case c;
    if (paged_case_create(b, batch, context, MG_KV_FP8_E4M3, &c))
        return mg_bench_fail(b, name);
    int failures = time_paged(b, &c, context, name, shape,
                              2.0 * batch * context * HKV * HEAD_DIM, /* a byte per element */
                              copy_gbps, "paged FP8 E4M3, pages of 16 shuffled, KV bytes read");
    paged_case_destroy(b, &c);
    return failures;
}

/* Appends `tokens` tokens, spread over 8 requests, from a QKV GEMM output (rows of q, k, v). */
static int bench_append(mg_bench *b, uint32_t tokens, bool fp8, double copy_gbps) {
    char name[48], shape[64];
    snprintf(name, sizeof name, "append_%s%u", fp8 ? "fp8_" : "", tokens);
    if (!mg_bench_selected(b, name))
        return 0;
    snprintf(shape, sizeof shape, "%u tokens, 8 requests, RoPE%s", tokens,
             fp8 ? ", FP8 pools" : "");
    const uint32_t batch = 8, per = tokens / batch, row_elems = (HQ + 2 * HKV) * HEAD_DIM;
    mg_bench_page_table t = {0};
    decode_run r = {0};
    mg_devptr pool = 0, qkv = 0, qo = 0, kv = 0, last = 0, idx = 0, scales = 0;
    size_t pool_bytes = 0;
    mg_devptr k_pages = 0, v_pages = 0;
    /* Every token of each request is new. */
    mg_status st =
        mg_bench_page_table_make(&t, batch, per, per, PAGE, 99) ? MG_OK : MG_ERR_OUT_OF_MEMORY;
    r.cache = (mg_kv_cache_desc){HKV, HEAD_DIM, PAGE, t.pages, fp8 ? MG_KV_FP8_E4M3 : MG_KV_BF16};
    if (!st && fp8)
        st = make_scales(b, &scales);
    if (!st)
        st = mg_kv_cache_bytes(&r.cache, &pool_bytes);
    if (!st)
        st = mg_alloc(b->backend, pool_bytes, &pool);
    if (!st)
        st = mg_kv_cache_pools(&r.cache, pool, &k_pages, &v_pages);
    if (!st)
        st = mg_alloc(b->backend, 2ull * batch * per * row_elems, &qkv);
    if (!st)
        st = mg_bench_fill_unit(b, qkv, (size_t)batch * per * row_elems, false, 5);
    if (!st)
        st = mg_alloc(b->backend, 4 * (batch + 1ull), &qo);
    if (!st)
        st = mg_alloc(b->backend, 4 * (batch + 1ull), &kv);
    if (!st)
        st = mg_alloc(b->backend, 4ull * batch, &last);
    if (!st)
        st = mg_alloc(b->backend, 4ull * t.pages, &idx);
    if (!st)
        st = mg_copy_h2d(b->backend, qo, t.qo, 4 * (batch + 1ull));
    if (!st)
        st = mg_copy_h2d(b->backend, kv, t.kv, 4 * (batch + 1ull));
    if (!st)
        st = mg_copy_h2d(b->backend, last, t.last, 4ull * batch);
    if (!st)
        st = mg_copy_h2d(b->backend, idx, t.idx, 4ull * t.pages);
    r.append = (mg_kv_append_args){.batch_size = batch,
                                   .num_tokens = batch * per,
                                   .num_kv_indices = t.pages,
                                   .q = qkv,
                                   .q_stride = row_elems,
                                   .num_qo_heads = HQ,
                                   .k = qkv + 2ull * HQ * HEAD_DIM,
                                   .v = qkv + 2ull * (HQ + HKV) * HEAD_DIM,
                                   .k_stride = row_elems,
                                   .v_stride = row_elems,
                                   .rope = true,
                                   .rope_theta = 500000.0f,
                                   .qo_indptr = qo,
                                   .kv_indptr = kv,
                                   .kv_indices = idx,
                                   .kv_last_page_len = last,
                                   .k_pages = k_pages,
                                   .v_pages = v_pages,
                                   .k_scale = fp8 ? scales : 0,
                                   .v_scale = fp8 ? scales + 4 * HKV : 0};
    mg_bench_row row = mg_bench_row_make("decode", name, shape);
    if (!st)
        st =
            mg_bench_time_graph(b, body_append, &r, b->warmup, b->quick ? 3 : b->iters, &row.stats);
    int failures = 0;
    if (st) {
        failures = mg_bench_fail(b, name);
    } else {
        /* k and v read and written (FP8: one byte each written), q read and written in place
         * (RoPE). */
        row.bytes = fp8 ? (double)batch * per * (2.0 * row_elems * 2 - 2.0 * HKV * HEAD_DIM)
                        : 2.0 * (double)batch * per * row_elems * 2;
        snprintf(row.timing, sizeof row.timing, "graph");
        note_fraction(&row, copy_gbps, "bytes read + written (q, k, v)");
        mg_bench_add(b, &row);
    }
    mg_bench_page_table_free(&t);
    mg_devptr all[] = {pool, qkv, qo, kv, last, idx, scales};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        mg_free(b->backend, all[i]);
    return failures;
}

static int bench_decode(mg_bench *b, int argc, char **argv) {
    uint32_t only_batch = 0, only_context = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            only_batch = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc) {
            only_context = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "bench decode: unknown option %s (--batch N, --context N)\n", argv[i]);
            return 1;
        }
    }
    double copy_gbps = 0;
    if (mg_bench_copy_bandwidth(b, (size_t)1 << 30, &copy_gbps))
        return mg_bench_fail(b, "copy bandwidth");
    static const uint32_t batches[] = {1, 8, 32, 128}, contexts[] = {512, 2048, 8192, 32768};
    int failures = 0;
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++) {
            const uint32_t batch = batches[i], context = b->quick ? 512 : contexts[j];
            if ((only_batch && batch != only_batch) || (only_context && context != only_context) ||
                (uint64_t)batch * context > MAX_TOKENS || (b->quick && j))
                continue;
            failures += bench_point(b, batch, context, copy_gbps);
            failures += bench_fp8_point(b, batch, context, copy_gbps);
        }
    if (!only_batch && !only_context) {
        for (int fp8 = 0; fp8 < 2; fp8++) {
            failures += bench_append(b, 128, fp8, copy_gbps);
            failures += bench_append(b, b->quick ? 1024 : 16384, fp8, copy_gbps);
        }
    }
    return failures;
}

MG_BENCH_REGISTER(decode, "decode",
                  "decode attention over the paged KV cache (FlashInfer paged FA2, split-KV; our "
                  "split-KV decode kernels as skv_*), "
                  "Hq=32 Hkv=8 D=128, pages of 16, graph replay; ragged op on contiguous keys; "
                  "FP8 E4M3 pools; append with RoPE (BF16 and FP8)",
                  bench_decode)
