/* bench_attention.c - `metrale-gpu bench attention`: ragged BF16 prefill attention, Hq=32,
 * Hkv=8, D=128, causal and not, on the shapes of bench/peers/peers_attention.py: B x S in
 * {1x8192, 4x4096, 8x2048, 32x512}, a ragged mix of 16 requests with lengths 1..4096 (the same
 * generator as the peers script), and a prefix case (4 requests of 1024 queries over 4096 keys).
 * Each case runs with the automatic choice (FA3 on Hopper) and, as "<case>.fa2", with FA2
 * forced. FLOPs as mg_attention_plan_flops counts them. Options:
 *   --impl auto|fa2|both (default both)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/dtype.h"
#include "metrale/ops_attention.h"

#define HQ 32
#define HKV 8
#define HEAD_DIM 128
#define RAGGED_REQUESTS 16
#define RAGGED_MAX_LEN 4096

typedef struct attention_case {
    char name[32];
    char shape[64];
    uint32_t batch_size;
    int32_t *qo_indptr, *kv_indptr;
} attention_case;

typedef struct attention_run {
    mg_attention_plan *plan;
    mg_attention_tensors tensors;
} attention_run;

static mg_status body_run(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    attention_run *r = arg;
    return mg_attention_run(r->plan, &r->tensors, b->stream);
}

/* The peers script draws the same lengths: x = x * 6364136223846793005 + 1442695040888963407
 * (mod 2^64) from x = 2026, length = 1 + (x >> 33) % max_len. */
static uint32_t next_length(uint64_t *x, uint32_t max_len) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return 1 + (uint32_t)((*x >> 33) % max_len);
}

static bool make_case(attention_case *c, const char *name, uint32_t batch_size,
                      const uint32_t *qo_lens, const uint32_t *kv_lens) {
    snprintf(c->name, sizeof c->name, "%s", name);
    c->batch_size = batch_size;
    c->qo_indptr = calloc(batch_size + 1, sizeof(int32_t));
    c->kv_indptr = calloc(batch_size + 1, sizeof(int32_t));
    if (!c->qo_indptr || !c->kv_indptr)
        return false;
    for (uint32_t i = 0; i < batch_size; i++) {
        c->qo_indptr[i + 1] = c->qo_indptr[i] + (int32_t)qo_lens[i];
        c->kv_indptr[i + 1] = c->kv_indptr[i] + (int32_t)kv_lens[i];
    }
    return true;
}

static void free_case(attention_case *c) {
    free(c->qo_indptr);
    free(c->kv_indptr);
}

/* Fills a device buffer with BF16 values uniform in [-1, 1] (never raw random bits: NaNs and
 * huge values would make the softmax take other paths). */
static mg_status fill_bf16(mg_bench *b, mg_devptr dst, size_t elems, uint64_t seed) {
    uint16_t *host = malloc(2 * elems);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    uint64_t x = seed | 1;
    for (size_t i = 0; i < elems; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        host[i] =
            mg_f32_to_bf16((float)((double)((x * 0x2545f4914f6cdd1dull) >> 11) / 0x1p52 - 1.0));
    }
    mg_status st = mg_copy_h2d(b->backend, dst, host, 2 * elems);
    free(host);
    return st;
}

static int bench_case(mg_bench *b, const attention_case *c, bool causal, mg_attention_impl impl) {
    char name[48];
    snprintf(name, sizeof name, "%s_%s%s", causal ? "causal" : "full", c->name,
             impl == MG_ATTENTION_IMPL_FA2 ? ".fa2" : "");
    if (!mg_bench_selected(b, name))
        return 0;
    const uint32_t qo_rows = (uint32_t)c->qo_indptr[c->batch_size];
    const uint32_t kv_rows = (uint32_t)c->kv_indptr[c->batch_size];
    const size_t q_elems = (size_t)qo_rows * HQ * HEAD_DIM,
                 kv_elems = (size_t)kv_rows * HKV * HEAD_DIM;
    mg_devptr q = 0, k = 0, v = 0, o = 0;
    attention_run r = {0};
    const mg_attention_desc desc = {.num_qo_heads = HQ,
                                    .num_kv_heads = HKV,
                                    .head_dim = HEAD_DIM,
                                    .causal = causal,
                                    .window_left = -1,
                                    .sm_scale = 1.0f / sqrtf((float)HEAD_DIM),
                                    .impl = impl};
    mg_status st = mg_alloc(b->backend, 2 * q_elems, &q);
    if (!st)
        st = mg_alloc(b->backend, 2 * kv_elems, &k);
    if (!st)
        st = mg_alloc(b->backend, 2 * kv_elems, &v);
    if (!st)
        st = mg_alloc(b->backend, 2 * q_elems, &o);
    if (!st)
        st = fill_bf16(b, q, q_elems, 1);
    if (!st)
        st = fill_bf16(b, k, kv_elems, 2);
    if (!st)
        st = fill_bf16(b, v, kv_elems, 3);
    if (!st)
        st = mg_attention_plan_create(b->backend, &desc, c->qo_indptr, c->kv_indptr, c->batch_size,
                                      b->stream, &r.plan);
    r.tensors = (mg_attention_tensors){
        .q = q, .k = k, .v = v, .o = o, .qo_rows = qo_rows, .kv_rows = kv_rows};
    mg_bench_row row = mg_bench_row_make("attention", name, c->shape);
    if (!st)
        st = mg_bench_time_events(b, body_run, &r, b->warmup, b->quick ? 3 : b->iters, &row.stats);
    int failures = 0;
    if (st) {
        failures = mg_bench_fail(b, name);
    } else {
        mg_attention_plan_info info;
        mg_attention_plan_get_info(r.plan, &info);
        row.flops = mg_attention_plan_flops(r.plan);
        snprintf(row.timing, sizeof row.timing, "events");
        snprintf(row.note, sizeof row.note, "%s, Hq=%d Hkv=%d D=%d, %u q / %u kv rows, ws %.1f MiB",
                 mg_attention_impl_name(info.impl), HQ, HKV, HEAD_DIM, qo_rows, kv_rows,
                 (double)info.workspace_bytes / (1 << 20));
        mg_bench_add(b, &row);
    }
    mg_attention_plan_destroy(r.plan);
    mg_free(b->backend, q);
    mg_free(b->backend, k);
    mg_free(b->backend, v);
    mg_free(b->backend, o);
    return failures;
}

static int bench_attention(mg_bench *b, int argc, char **argv) {
    bool run_auto = true, run_fa2 = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--impl") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            run_auto = strcmp(v, "auto") == 0 || strcmp(v, "both") == 0;
            run_fa2 = strcmp(v, "fa2") == 0 || strcmp(v, "both") == 0;
        } else {
            fprintf(stderr, "bench attention: unknown option %s (--impl auto|fa2|both)\n", argv[i]);
            return 1;
        }
    }
    static const uint32_t fixed[][2] = {{1, 8192}, {4, 4096}, {8, 2048}, {32, 512}};
    const size_t fixed_count = b->quick ? 1 : sizeof fixed / sizeof fixed[0];
    attention_case cases[8] = {0};
    size_t count = 0;
    uint32_t qo_lens[RAGGED_REQUESTS > 32 ? RAGGED_REQUESTS : 32], kv_lens[32];
    bool ok = true;
    for (size_t i = 0; ok && i < fixed_count; i++) {
        const uint32_t batch = fixed[i][0], len = b->quick ? 512 : fixed[i][1];
        for (uint32_t j = 0; j < batch; j++)
            qo_lens[j] = kv_lens[j] = len;
        char name[32];
        snprintf(name, sizeof name, "%ux%u", batch, len);
        ok = make_case(&cases[count], name, batch, qo_lens, kv_lens);
        snprintf(cases[count].shape, sizeof cases[count].shape, "B=%u S=%u", batch, len);
        count++;
    }
    uint64_t x = 2026;
    uint32_t total = 0;
    for (uint32_t j = 0; j < RAGGED_REQUESTS; j++) {
        qo_lens[j] = kv_lens[j] = next_length(&x, b->quick ? 512 : RAGGED_MAX_LEN);
        total += qo_lens[j];
    }
    if (ok && (ok = make_case(&cases[count], "ragged16", RAGGED_REQUESTS, qo_lens, kv_lens)))
        snprintf(cases[count++].shape, sizeof cases[0].shape, "16 reqs, len 1..%u, %u tokens",
                 b->quick ? 512 : RAGGED_MAX_LEN, total);
    for (uint32_t j = 0; j < 4; j++) {
        qo_lens[j] = b->quick ? 128 : 1024;
        kv_lens[j] = b->quick ? 512 : 4096;
    }
    if (ok && (ok = make_case(&cases[count], "prefix4", 4, qo_lens, kv_lens)))
        snprintf(cases[count++].shape, sizeof cases[0].shape, "B=4 q=%u kv=%u", qo_lens[0],
                 kv_lens[0]);
    int failures = ok ? 0 : mg_bench_fail(b, "attention setup");
    for (size_t i = 0; ok && i < count; i++)
        for (int causal = 1; causal >= 0; causal--) {
            if (run_auto)
                failures += bench_case(b, &cases[i], causal, MG_ATTENTION_IMPL_AUTO);
            if (run_fa2)
                failures += bench_case(b, &cases[i], causal, MG_ATTENTION_IMPL_FA2);
        }
    for (size_t i = 0; i < count; i++)
        free_case(&cases[i]);
    return failures;
}

MG_BENCH_REGISTER(attention, "attention",
                  "ragged BF16 prefill attention (FlashInfer FA3/FA2), Hq=32 Hkv=8 D=128, "
                  "causal and full, fixed, ragged and prefix batches",
                  bench_attention)
