/* bench_paged_prefill.c - `metrale-gpu bench paged_prefill`: causal prefill chunks over a cached
 * prefix on the paged KV cache (metrale/ops_kv_cache.h), Hq=32, Hkv=8, D=128, BF16 pools, pages
 * of 16 tokens scattered over the pool (a shuffled page table), for the two CUDA paths side by
 * side: each case as "<case>" (AUTO: the path the plan chooses, named in the note),
 * "<case>.fa2" and "<case>.fa3" (forced; FA3 runs on Hopper only). Cases are B requests of C new
 * tokens over P cached ones, named b<B>_c<C>_p<P>: a fresh 8k prompt, long and short chunks
 * over long prefixes, and small chunks around AUTO's FA3 threshold (128 query rows per request:
 * 128, 64 and 16 here), where the rows show whether the threshold sits where the paths cross. Eager
 * plans, event-timed; FLOPs as mg_attention_plan_flops counts them. Options: --only as every bench.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops_kv_cache.h"

#define HQ 32
#define HKV 8
#define HEAD_DIM 128
#define PAGE 16

typedef struct prefill_run {
    mg_attention_plan *plan;
    mg_paged_attention_tensors tensors;
} prefill_run;

static mg_status body_prefill(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    prefill_run *r = arg;
    return mg_paged_attention_run(r->plan, &r->tensors, b->stream);
}

/* Device state of one case, shared by its rows. */
typedef struct prefill_case {
    mg_bench_page_table t; /* `batch` requests of prefix + chunk tokens, shuffled pages */
    uint32_t chunk, prefix;
    mg_devptr pool, q, o, idx, k_pages, v_pages;
} prefill_case;

static void case_destroy(mg_bench *b, prefill_case *c) {
    mg_bench_page_table_free(&c->t);
    mg_devptr all[] = {c->pool, c->q, c->o, c->idx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        mg_free(b->backend, all[i]);
}

static mg_status case_create(mg_bench *b, uint32_t batch, uint32_t chunk, uint32_t prefix,
                             prefill_case *c) {
    *c = (prefill_case){.chunk = chunk, .prefix = prefix};
    if (!mg_bench_page_table_make(&c->t, batch, chunk, prefix + chunk, PAGE,
                                  (uint64_t)batch << 32 | chunk)) {
        case_destroy(b, c);
        return MG_ERR_OUT_OF_MEMORY;
    }
    const mg_kv_cache_desc cache = {HKV, HEAD_DIM, PAGE, c->t.pages, MG_KV_BF16};
    const size_t rows = (size_t)batch * chunk * HQ * HEAD_DIM;
    size_t pool_bytes = 0;
    mg_status st = mg_kv_cache_bytes(&cache, &pool_bytes);
    if (!st)
        st = mg_alloc(b->backend, pool_bytes, &c->pool);
    if (!st)
        st = mg_kv_cache_pools(&cache, c->pool, &c->k_pages, &c->v_pages);
    if (!st)
        st = mg_alloc(b->backend, 2 * rows, &c->q);
    if (!st)
        st = mg_alloc(b->backend, 2 * rows, &c->o);
    if (!st)
        st = mg_alloc(b->backend, 4ull * c->t.pages, &c->idx);
    if (!st)
        st = mg_copy_h2d(b->backend, c->idx, c->t.idx, 4ull * c->t.pages);
    if (!st)
        st = mg_bench_fill_unit(b, c->pool, pool_bytes / 2, false, 21);
    if (!st)
        st = mg_bench_fill_unit(b, c->q, rows, false, 22);
    if (st)
        case_destroy(b, c);
    return st;
}

/* The row of case `name` on `impl` (the case's name for AUTO, else with ".fa2" or ".fa3"), and
 * whether the mg_bench_row name field holds it whole. */
static bool row_name_of(char *out, size_t bytes, const char *name, mg_attention_impl impl) {
    const int n = snprintf(out, bytes, "%s%s%s", name, impl ? "." : "",
                           impl ? mg_attention_impl_name(impl) : "");
    return n > 0 && (size_t)n < bytes;
}

/* One row: the case on the path `impl` asks for. A forced path the device cannot run (FA3 off
 * Hopper) is skipped, not failed. */
static int time_case(mg_bench *b, prefill_case *c, const char *name, mg_attention_impl impl) {
    char row_name[48], shape[64];
    if (!row_name_of(row_name, sizeof row_name, name, impl) || !mg_bench_selected(b, row_name))
        return 0;
    const uint32_t batch = c->t.batch, rows = batch * c->chunk;
    const mg_paged_attention_desc d = {.num_qo_heads = HQ,
                                       .num_kv_heads = HKV,
                                       .head_dim = HEAD_DIM,
                                       .page_size = PAGE,
                                       .window_left = -1,
                                       .sm_scale = 1.0f / sqrtf((float)HEAD_DIM),
                                       .kv_dtype = MG_KV_BF16,
                                       .impl = impl};
    const mg_kv_page_table table = {batch, c->t.qo, c->t.kv, c->t.idx, c->t.last};
    prefill_run r = {.tensors = {.q = c->q,
                                 .o = c->o,
                                 .qo_rows = rows,
                                 .k_pages = c->k_pages,
                                 .v_pages = c->v_pages,
                                 .num_pages = c->t.pages,
                                 .kv_indices = c->idx,
                                 .num_kv_indices = c->t.pages}};
    mg_status st = mg_paged_attention_plan_create(b->backend, &d, &table, b->stream, &r.plan);
    if (st == MG_ERR_UNSUPPORTED && impl == MG_ATTENTION_IMPL_FA3) {
        printf("bench paged_prefill: %s skipped: %s\n", row_name, mg_last_error());
        return 0;
    }
    snprintf(shape, sizeof shape, "B=%u C=%u P=%u, pages of %u", batch, c->chunk, c->prefix, PAGE);
    mg_bench_row row = mg_bench_row_make("paged_prefill", row_name, shape);
    if (!st)
        st = mg_bench_time_events(b, body_prefill, &r, b->warmup, b->quick ? 3 : b->iters,
                                  &row.stats);
    mg_attention_plan_info info = {0};
    if (!st)
        st = mg_attention_plan_get_info(r.plan, &info);
    if (!st)
        row.flops = mg_attention_plan_flops(r.plan);
    mg_attention_plan_destroy(r.plan);
    if (st)
        return mg_bench_fail(b, row_name);
    snprintf(row.timing, sizeof row.timing, "events");
    snprintf(row.note, sizeof row.note, "%s, Hq=%d Hkv=%d D=%d, %u q rows over %u cached",
             mg_attention_impl_name(info.impl), HQ, HKV, HEAD_DIM, rows,
             batch * (c->prefix + c->chunk));
    mg_bench_add(b, &row);
    return 0;
}

static int bench_paged_prefill(mg_bench *b, int argc, char **argv) {
    if (argc > 1) {
        fprintf(stderr, "bench paged_prefill: unknown option %s (only the common ones)\n", argv[1]);
        return 1;
    }
    /* batch, chunk, prefix; --quick: the first two, shrunk. */
    static const uint32_t cases[][3] = {{1, 8192, 0},    {4, 2048, 2048}, {8, 512, 4096},
                                        {32, 128, 1024}, {64, 64, 2048},  {64, 16, 2048}};
    const size_t count = b->quick ? 2 : sizeof cases / sizeof cases[0];
    static const mg_attention_impl impls[] = {MG_ATTENTION_IMPL_AUTO, MG_ATTENTION_IMPL_FA2,
                                              MG_ATTENTION_IMPL_FA3};
    int failures = 0;
    for (size_t i = 0; i < count; i++) {
        const uint32_t shrink = b->quick ? 8 : 1, batch = cases[i][0];
        const uint32_t chunk = cases[i][1] / shrink, prefix = cases[i][2] / shrink;
        char name[48];
        snprintf(name, sizeof name, "b%u_c%u_p%u", batch, chunk, prefix);
        bool wanted = false;
        for (size_t j = 0; j < 3; j++) {
            char row_name[48];
            wanted = wanted || (row_name_of(row_name, sizeof row_name, name, impls[j]) &&
                                mg_bench_selected(b, row_name));
        }
        if (!wanted)
            continue;
        prefill_case c;
        if (case_create(b, batch, chunk, prefix, &c)) {
            failures += mg_bench_fail(b, name);
            continue;
        }
        for (size_t j = 0; j < 3; j++)
            failures += time_case(b, &c, name, impls[j]);
        case_destroy(b, &c);
    }
    return failures;
}

MG_BENCH_REGISTER(paged_prefill, "paged_prefill",
                  "causal prefill chunks over cached prefixes on the paged KV cache, FA2 vs FA3 "
                  "(and AUTO's choice), Hq=32 Hkv=8 D=128, BF16 pages of 16",
                  bench_paged_prefill)
