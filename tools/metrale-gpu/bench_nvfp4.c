/* bench_nvfp4.c - `metrale-gpu bench nvfp4`: the NVFP4 GEMMs of metrale/ops_nvfp4.h.
 *  - "dense": M in {1, 2, 4, 8, 16, 64, 256, 4096} x (N, K) in {(4096, 4096), (14336, 4096),
 *    (4096, 14336), (6144, 4096)}; graph replay of one GEMM per prepared weight of a rotation
 *    larger than L2 (M <= 256), events on one weight at M = 4096. GB/s counts the prepared
 *    weight bytes (codes + scales) and the note gives them as a fraction of the copy
 *    bandwidth measured in the same run.
 *  - "dense_kernels": from MG_NVFP4_BF16_PATH_MIN_M rows, where the automatic choice may expand
 *    the weight to BF16, our kernels forced (provider "kernels") on the same shapes.
 *  - "bf16": our BF16 GEMM (cuBLASLt) on the same shapes and timing, the in-run yardstick.
 *  - "moe8": 8 experts of N=14336, K=4096 with 1, 8, 64 and 512 rows each (identity gather).
 *  - "moe128": 128 experts of a 30B-A3B layer (hidden 2048, intermediate 768): the fused
 *    gate_up (silu) GEMM, then down, with 1, 8, 64 and 512 rows per expert.
 *  - "moe_step": a whole decode step's routed MLP of that layer at batch 1, 8 and 64: top-8
 *    over random router logits, the expert sort, gate_up (silu), down and the weighted combine
 *    into the residual, one graph. GB/s counts the prepared bytes of the experts the routing
 *    touched (read back once after the first call).
 * Options: --m LIST (dense token counts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_moe.h"
#include "metrale/ops_nvfp4.h"

typedef struct nvfp4_case {
    uint32_t m, n, k;
    bool bf16;
    mg_devptr act, out, global, workspace;
    size_t workspace_bytes;
    size_t value_bytes; /* the scales follow the values in each rotated buffer */
    mg_bench_rotation weights;
    int per_iteration;
} nvfp4_case;

static mg_nvfp4_weight weight_at(const nvfp4_case *c, mg_devptr base) {
    return (mg_nvfp4_weight){base, base + c->value_bytes, c->global};
}

static mg_status body_dense(mg_bench *b, void *arg, int iteration) {
    nvfp4_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->per_iteration; i++) {
        mg_devptr w = mg_bench_rotation_get(&c->weights, iteration * c->per_iteration + i);
        if (c->bf16) {
            st = mg_gemm_bf16(b->backend, b->stream, c->m, c->n, c->k, c->act, w, c->out,
                              MG_DTYPE_BF16, c->n);
        } else {
            mg_nvfp4_weight nw = weight_at(c, w);
            st = mg_nvfp4_gemm_with_workspace(b->backend, b->stream, c->m, c->n, c->k, c->act, c->k,
                                              &nw, c->out, c->n, c->workspace, c->workspace_bytes);
        }
    }
    return st;
}

/* Global scales of 1/256 for up to 256 experts: values stay finite with random codes. */
static mg_status upload_globals(mg_bench *b, mg_devptr *out) {
    float g[256];
    for (int i = 0; i < 256; i++)
        g[i] = 1.0f / 256;
    mg_status st = mg_alloc(b->backend, sizeof g, out);
    return st ? st : mg_copy_h2d(b->backend, *out, g, sizeof g);
}

/* Random prepared weights would decode to huge values; scale bytes of one keep them small. */
static mg_status fill_weights(mg_bench *b, const mg_bench_rotation *r, size_t value_bytes,
                              size_t scale_bytes) {
    mg_status st = MG_OK;
    for (int i = 0; !st && i < r->count; i++)
        st = mg_memset(b->backend, r->buffers[i] + value_bytes, 0x78, scale_bytes);
    return st;
}

static void free_case(mg_bench *b, nvfp4_case *c) {
    if (c->weights.buffers)
        mg_bench_rotation_destroy(b, &c->weights);
    mg_free(b->backend, c->act);
    mg_free(b->backend, c->out);
    mg_free(b->backend, c->global);
    mg_free(b->backend, c->workspace);
}

/* `force`: a provider of the NVFP4 GEMM forced for the row (named "dense_<provider>"), or NULL
 * for the automatic choice. */
static int run_dense(mg_bench *b, uint32_t m, uint32_t n, uint32_t k, bool bf16, const char *force,
                     double copy_gbps) {
    char shape[64], forced_name[48];
    snprintf(forced_name, sizeof forced_name, "dense_%s", force ? force : "");
    const char *name = bf16 ? "bf16" : force ? forced_name : "dense";
    snprintf(shape, sizeof shape, "%ux%ux%u", m, n, k);
    if (!mg_bench_selected(b, name))
        return 0;
    bool graph = m <= 256;
    nvfp4_case c = {.m = m, .n = n, .k = k, .bf16 = bf16, .per_iteration = 1};
    c.value_bytes = mg_nvfp4_prepared_value_bytes(n, k);
    size_t scale_bytes = mg_nvfp4_prepared_scale_bytes(n, k);
    size_t weight_bytes = bf16 ? (size_t)n * k * 2 : c.value_bytes + scale_bytes;
    mg_status st;
    if ((st = mg_alloc(b->backend, (size_t)m * k * 2, &c.act)) ||
        (st = mg_bench_fill_random_device(b, c.act, (size_t)m * k * 2, 7)) ||
        (st = mg_alloc(b->backend, (size_t)m * n * 2, &c.out)) ||
        (st = upload_globals(b, &c.global)) ||
        (st = mg_bench_rotation_create(b, weight_bytes, graph ? 8 : 1, &c.weights)) ||
        (!bf16 && (st = fill_weights(b, &c.weights, c.value_bytes, scale_bytes))))
        goto fail;
    /* From MG_NVFP4_BF16_PATH_MIN_M rows the op may expand the weight into a workspace. */
    c.workspace_bytes = bf16 ? 0 : mg_nvfp4_gemm_workspace_bytes(m, n, k);
    if (c.workspace_bytes && (st = mg_alloc(b->backend, c.workspace_bytes, &c.workspace)))
        goto fail;
    c.per_iteration = graph ? c.weights.count : 1;
    if ((force && (st = mg_op_force_provider(b->backend, MG_OP_NVFP4_GEMM, force))) ||
        (st = body_dense(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto fail;
    mg_bench_row row = mg_bench_row_make("nvfp4", name, shape);
    st = graph ? mg_bench_time_graph(b, body_dense, &c, b->warmup, b->iters, &row.stats)
               : mg_bench_time_events(b, body_dense, &c, b->warmup, b->iters, &row.stats);
    if (st)
        goto fail;
    double gemms = c.per_iteration;
    snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
    row.flops = gemms * 2.0 * m * n * k;
    row.bytes = gemms * (double)weight_bytes;
    row.items = gemms;
    snprintf(row.item_unit, sizeof row.item_unit, "gemm");
    double gbps = row.bytes / (row.stats.median_us * 1e3);
    mg_op_stats stats = {0};
    mg_op_stats_get(b->backend, MG_OP_NVFP4_GEMM, &stats);
    snprintf(row.note, sizeof row.note, "weights %.2f of copy bw%s%s%s",
             copy_gbps > 0 ? gbps / copy_gbps : 0, graph ? "; rotated" : "", bf16 ? "" : "; ",
             bf16 ? "" : stats.provider);
    mg_bench_add(b, &row);
    if (force)
        mg_op_force_provider(b->backend, MG_OP_NVFP4_GEMM, NULL);
    free_case(b, &c);
    return 0;
fail:;
    if (force)
        mg_op_force_provider(b->backend, MG_OP_NVFP4_GEMM, NULL);
    char what[128];
    snprintf(what, sizeof what, "%s %s", name, shape);
    int failed = mg_bench_fail(b, what);
    free_case(b, &c);
    return failed;
}

/* ------------------------------------------------------------------ grouped */

typedef struct moe_case {
    mg_nvfp4_moe_desc gate_up, down;
    mg_devptr act, mid, out, offsets, global;
    size_t gu_values, gu_scales, d_values, d_scales; /* bytes of all experts */
    mg_bench_rotation weights;                       /* gate | up | down, values then scales each */
    bool fused; /* 128-expert layer: gate_up (silu) then down */
} moe_case;

static mg_status body_moe(mg_bench *b, void *arg, int iteration) {
    moe_case *c = arg;
    mg_devptr base = mg_bench_rotation_get(&c->weights, iteration);
    mg_nvfp4_weight gate = {base, base + c->gu_values, c->global};
    mg_devptr up_base = base + c->gu_values + c->gu_scales;
    mg_nvfp4_weight up = {up_base, up_base + c->gu_values, c->global};
    mg_nvfp4_moe_tensors t = {.act = c->act,
                              .expert_offsets = c->offsets,
                              .w = gate,
                              .up = c->fused ? &up : NULL,
                              .out = c->fused ? c->mid : c->out};
    mg_status st = mg_nvfp4_moe_gemm(b->backend, b->stream, &c->gate_up, &t);
    if (st || !c->fused)
        return st;
    mg_devptr down_base = up_base + c->gu_values + c->gu_scales;
    mg_nvfp4_moe_tensors d = {.act = c->mid,
                              .expert_offsets = c->offsets,
                              .w = {down_base, down_base + c->d_values, c->global},
                              .out = c->out};
    return mg_nvfp4_moe_gemm(b->backend, b->stream, &c->down, &d);
}

static void free_moe(mg_bench *b, moe_case *c) {
    if (c->weights.buffers)
        mg_bench_rotation_destroy(b, &c->weights);
    mg_devptr *p[] = {&c->act, &c->mid, &c->out, &c->offsets, &c->global};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        mg_free(b->backend, *p[i]);
}

static int run_moe(mg_bench *b, uint32_t experts, uint32_t per_expert, uint32_t n, uint32_t k,
                   bool fused, double copy_gbps) {
    const char *name = fused ? "moe128" : "moe8";
    char shape[64];
    snprintf(shape, sizeof shape, "E%u x %u rows, %ux%u", experts, per_expert, n, k);
    if (!mg_bench_selected(b, name))
        return 0;
    uint32_t rows = experts * per_expert;
    moe_case c = {.fused = fused};
    c.gate_up =
        (mg_nvfp4_moe_desc){.experts = experts, .rows = rows, .act_rows = rows, .n = n, .k = k};
    c.down =
        (mg_nvfp4_moe_desc){.experts = experts, .rows = rows, .act_rows = rows, .n = k, .k = n};
    c.gu_values = mg_nvfp4_prepared_value_bytes(n, k) * experts;
    c.gu_scales = mg_nvfp4_prepared_scale_bytes(n, k) * experts;
    c.d_values = mg_nvfp4_prepared_value_bytes(k, n) * experts;
    c.d_scales = mg_nvfp4_prepared_scale_bytes(k, n) * experts;
    size_t bytes = fused ? 2 * (c.gu_values + c.gu_scales) + c.d_values + c.d_scales
                         : c.gu_values + c.gu_scales;
    int32_t *offsets = malloc((experts + 1) * sizeof *offsets);
    for (uint32_t e = 0; e <= experts; e++)
        offsets[e] = (int32_t)(e * per_expert);
    mg_status st;
    if ((st = mg_alloc(b->backend, (size_t)rows * k * 2, &c.act)) ||
        (st = mg_bench_fill_random_device(b, c.act, (size_t)rows * k * 2, 9)) ||
        (st = mg_alloc(b->backend, (size_t)rows * n * 2, &c.mid)) ||
        (st = mg_alloc(b->backend, (size_t)rows * (fused ? k : n) * 2, &c.out)) ||
        (st = mg_alloc(b->backend, (experts + 1) * 4, &c.offsets)) ||
        (st = mg_copy_h2d(b->backend, c.offsets, offsets, (experts + 1) * 4)) ||
        (st = upload_globals(b, &c.global)) ||
        (st = mg_bench_rotation_create(b, bytes, 2, &c.weights)))
        goto fail;
    for (int i = 0; !st && i < c.weights.count; i++) { /* small scale bytes everywhere */
        mg_devptr base = c.weights.buffers[i];
        st = mg_memset(b->backend, base + c.gu_values, 0x60, c.gu_scales);
        if (!st && fused)
            st = mg_memset(b->backend, base + 2 * c.gu_values + c.gu_scales, 0x60, c.gu_scales);
        if (!st && fused)
            st = mg_memset(b->backend, base + 2 * (c.gu_values + c.gu_scales) + c.d_values, 0x60,
                           c.d_scales);
    }
    if (st || (st = body_moe(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto fail;
    mg_bench_row row = mg_bench_row_make("nvfp4", name, shape);
    if ((st = mg_bench_time_graph(b, body_moe, &c, b->warmup, b->iters, &row.stats)))
        goto fail;
    snprintf(row.timing, sizeof row.timing, "graph");
    row.bytes = (double)bytes;
    row.flops = 2.0 * rows * (double)n * k * (fused ? 3 : 1);
    mg_bench_note_weights(&row, copy_gbps, fused ? "; gate_up(silu)+down" : "");
    mg_bench_add(b, &row);
    free(offsets);
    free_moe(b, &c);
    return 0;
fail:;
    char what[128];
    snprintf(what, sizeof what, "%s %s", name, shape);
    free(offsets);
    int failed = mg_bench_fail(b, what);
    free_moe(b, &c);
    return failed;
}

/* ------------------------------------------------------------------ a routed MLP step */

typedef struct step_case {
    uint32_t tokens, experts, top_k, hidden, inter;
    mg_devptr logits, ids, weights, sort_ws, offsets, sorted, positions, x, mid, rows, y, global;
    size_t sort_ws_bytes, gu_values, gu_scales, d_values, d_scales;
    mg_bench_rotation layers; /* gate | up | down of all experts, values then scales each */
} step_case;

static mg_status body_step(mg_bench *b, void *arg, int iteration) {
    step_case *c = arg;
    mg_backend *be = b->backend;
    mg_stream *s = b->stream;
    uint32_t rows = c->tokens * c->top_k;
    mg_devptr base = mg_bench_rotation_get(&c->layers, iteration);
    mg_devptr up_base = base + c->gu_values + c->gu_scales;
    mg_devptr down_base = up_base + c->gu_values + c->gu_scales;
    mg_nvfp4_weight gate = {base, base + c->gu_values, c->global};
    mg_nvfp4_weight up = {up_base, up_base + c->gu_values, c->global};
    mg_moe_topk_desc topk = {c->tokens, c->experts, c->top_k, MG_DTYPE_BF16, 0, true};
    mg_moe_sort_desc sort = {c->tokens, c->experts, c->top_k};
    mg_nvfp4_moe_desc gu = {
        .experts = c->experts, .rows = rows, .act_rows = c->tokens, .n = c->inter, .k = c->hidden};
    mg_nvfp4_moe_desc down = {
        .experts = c->experts, .rows = rows, .act_rows = rows, .n = c->hidden, .k = c->inter};
    mg_nvfp4_moe_tensors tgu = {.act = c->x,
                                .sorted_token_ids = c->sorted,
                                .expert_offsets = c->offsets,
                                .w = gate,
                                .up = &up,
                                .out = c->mid};
    mg_nvfp4_moe_tensors td = {.act = c->mid,
                               .expert_offsets = c->offsets,
                               .w = {down_base, down_base + c->d_values, c->global},
                               .out = c->rows};
    mg_moe_combine_desc comb = {c->tokens, c->top_k, c->hidden};
    mg_status st;
    if ((st = mg_moe_topk(be, s, &topk, c->logits, c->ids, c->weights)) ||
        (st = mg_moe_sort(be, s, &sort, c->ids, c->sort_ws, c->sort_ws_bytes, c->offsets, c->sorted,
                          c->positions)) ||
        (st = mg_nvfp4_moe_gemm(be, s, &gu, &tgu)) || (st = mg_nvfp4_moe_gemm(be, s, &down, &td)))
        return st;
    return mg_moe_combine(be, s, &comb, c->rows, c->positions, c->weights, c->y, c->y);
}

static void free_step(mg_bench *b, step_case *c) {
    mg_devptr *p[] = {&c->logits,    &c->ids, &c->weights, &c->sort_ws, &c->offsets, &c->sorted,
                      &c->positions, &c->x,   &c->mid,     &c->rows,    &c->y,       &c->global};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        mg_free(b->backend, *p[i]);
    if (c->layers.buffers)
        mg_bench_rotation_destroy(b, &c->layers);
}

static int run_step(mg_bench *b, uint32_t tokens, double copy_gbps) {
    char shape[64];
    snprintf(shape, sizeof shape, "batch %u, E128 top8, 2048/768", tokens);
    if (!mg_bench_selected(b, "moe_step"))
        return 0;
    step_case c = {.tokens = tokens, .experts = 128, .top_k = 8, .hidden = 2048, .inter = 768};
    uint32_t rows = tokens * c.top_k;
    mg_moe_sort_desc sort = {tokens, c.experts, c.top_k};
    c.sort_ws_bytes = mg_moe_sort_workspace_bytes(&sort);
    c.gu_values = mg_nvfp4_prepared_value_bytes(c.inter, c.hidden) * c.experts;
    c.gu_scales = mg_nvfp4_prepared_scale_bytes(c.inter, c.hidden) * c.experts;
    c.d_values = mg_nvfp4_prepared_value_bytes(c.hidden, c.inter) * c.experts;
    c.d_scales = mg_nvfp4_prepared_scale_bytes(c.hidden, c.inter) * c.experts;
    size_t layer = 2 * (c.gu_values + c.gu_scales) + c.d_values + c.d_scales;
    int32_t *ids = malloc((size_t)rows * 4);
    mg_status st = ids ? MG_OK : MG_ERR_OUT_OF_MEMORY;
    if (st || (st = mg_alloc(b->backend, (size_t)tokens * c.experts * 2, &c.logits)) ||
        (st = mg_bench_fill_random_device(b, c.logits, (size_t)tokens * c.experts * 2, 11)) ||
        (st = mg_alloc(b->backend, (size_t)rows * 4, &c.ids)) ||
        (st = mg_alloc(b->backend, (size_t)rows * 4, &c.weights)) ||
        (st = mg_alloc(b->backend, c.sort_ws_bytes, &c.sort_ws)) ||
        (st = mg_alloc(b->backend, (c.experts + 1) * 4, &c.offsets)) ||
        (st = mg_alloc(b->backend, (size_t)rows * 4, &c.sorted)) ||
        (st = mg_alloc(b->backend, (size_t)rows * 4, &c.positions)) ||
        (st = mg_alloc(b->backend, (size_t)tokens * c.hidden * 2, &c.x)) ||
        (st = mg_memset(b->backend, c.x, 0x3c, (size_t)tokens * c.hidden * 2)) ||
        (st = mg_alloc(b->backend, (size_t)rows * c.inter * 2, &c.mid)) ||
        (st = mg_alloc(b->backend, (size_t)rows * c.hidden * 2, &c.rows)) ||
        (st = mg_alloc(b->backend, (size_t)tokens * c.hidden * 2, &c.y)) ||
        (st = mg_memset(b->backend, c.y, 0, (size_t)tokens * c.hidden * 2)) ||
        (st = upload_globals(b, &c.global)) ||
        (st = mg_bench_rotation_create(b, layer, 2, &c.layers)))
        goto fail;
    for (int i = 0; !st && i < c.layers.count; i++) {
        mg_devptr base = c.layers.buffers[i];
        st = mg_memset(b->backend, base + c.gu_values, 0x60, c.gu_scales);
        if (!st)
            st = mg_memset(b->backend, base + 2 * c.gu_values + c.gu_scales, 0x60, c.gu_scales);
        if (!st)
            st = mg_memset(b->backend, base + 2 * (c.gu_values + c.gu_scales) + c.d_values, 0x60,
                           c.d_scales);
    }
    if (st || (st = body_step(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)) ||
        (st = mg_copy_d2h(b->backend, ids, c.ids, (size_t)rows * 4)))
        goto fail;
    bool touched[128] = {false};
    uint32_t distinct = 0;
    for (uint32_t i = 0; i < rows; i++)
        if (ids[i] >= 0 && ids[i] < 128 && !touched[ids[i]]) {
            touched[ids[i]] = true;
            distinct++;
        }
    mg_bench_row row = mg_bench_row_make("nvfp4", "moe_step", shape);
    if ((st = mg_bench_time_graph(b, body_step, &c, b->warmup, b->iters, &row.stats)))
        goto fail;
    snprintf(row.timing, sizeof row.timing, "graph");
    row.bytes = (double)layer / c.experts * distinct;
    row.flops = 2.0 * rows * 3.0 * c.hidden * c.inter;
    double gbps = row.bytes / (row.stats.median_us * 1e3);
    snprintf(row.note, sizeof row.note,
             "%u experts touched: %.2f of copy bw; topk+sort+2 GEMMs+combine", distinct,
             copy_gbps > 0 ? gbps / copy_gbps : 0);
    mg_bench_add(b, &row);
    free(ids);
    free_step(b, &c);
    return 0;
fail:;
    free(ids);
    char what[96];
    snprintf(what, sizeof what, "moe_step %s", shape);
    int failed = mg_bench_fail(b, what);
    free_step(b, &c);
    return failed;
}

static int bench_nvfp4(mg_bench *b, int argc, char **argv) {
    static const uint32_t default_m[] = {1, 2, 4, 8, 16, 64, 256, 4096};
    static const uint32_t nk[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {6144, 4096}};
    uint32_t ms[16];
    size_t m_count = mg_bench_option_u32_list(argc, argv, "--m", ms, 16);
    if (!m_count) {
        m_count = b->quick ? 2 : sizeof default_m / sizeof default_m[0];
        memcpy(ms, default_m, m_count * sizeof *ms);
    }
    if (mg_backend_get_kind(b->backend) == MG_BACKEND_CPU && !b->quick) {
        /* The CPU reference decodes every weight in FP64: minutes per shape, no information. */
        fprintf(stderr, "bench nvfp4: the CPU backend runs the reference; use --quick for a smoke "
                        "run\n");
        return 0;
    }
    double copy_gbps = 0;
    if (mg_bench_copy_bandwidth(b, (size_t)256 << 20, &copy_gbps))
        copy_gbps = 0;
    int failures = 0;
    if (b->quick) { /* a smoke run: one small shape of each kind */
        failures += run_dense(b, 3, 256, 512, false, NULL, copy_gbps);
        failures += run_moe(b, 4, 2, 128, 256, true, copy_gbps);
        return failures + run_step(b, 1, copy_gbps);
    }
    size_t shapes = sizeof nk / sizeof nk[0];
    for (size_t s = 0; s < shapes; s++)
        for (size_t i = 0; i < m_count; i++) {
            failures += run_dense(b, ms[i], nk[s][0], nk[s][1], false, NULL, copy_gbps);
            failures += run_dense(b, ms[i], nk[s][0], nk[s][1], true, NULL, copy_gbps);
            /* where the automatic choice may expand the weight, our kernels as well */
            if (ms[i] >= MG_NVFP4_BF16_PATH_MIN_M)
                failures += run_dense(b, ms[i], nk[s][0], nk[s][1], false, "kernels", copy_gbps);
        }
    static const uint32_t per_expert[] = {1, 8, 64, 512};
    for (size_t i = 0; i < 4; i++) {
        failures += run_moe(b, 8, per_expert[i], 14336, 4096, false, copy_gbps);
        failures += run_moe(b, 128, per_expert[i], 768, 2048, true, copy_gbps);
    }
    static const uint32_t batches[] = {1, 8, 64};
    for (size_t i = 0; i < 3; i++)
        failures += run_step(b, batches[i], copy_gbps);
    return failures;
}

MG_BENCH_REGISTER(nvfp4, "nvfp4",
                  "NVFP4 weight-only GEMMs (dense, grouped MoE) under graph replay with rotated "
                  "weights, against our BF16 GEMM",
                  bench_nvfp4)
