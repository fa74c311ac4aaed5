/* bench_nvfp4_format.c - `metrale-gpu bench nvfp4_format`: the NVFP4 format tools of
 * metrale/nvfp4.h and the MoE routing helpers of metrale/ops_moe.h.
 *
 *  - quantize / dequantize_bf16 of a 14336x4096 weight (4096x4096 with --quick): bytes moved
 *    (BF16 read + nibbles and scales written, or the reverse) per second, and as a fraction of
 *    the copy bandwidth measured first. Where the backend has graphs each timed replay runs one
 *    call per input of a rotation larger than L2.
 *  - route_T: top-k (E=128, k=8, BF16 logits, renormalized) + the expert sort for T = 1, 16,
 *    4096 tokens, captured once and replayed: the latency a decode step pays for routing.
 *  - combine_T: the weighted combine of T*8 BF16 rows of 4096 into T tokens with a residual;
 *    bytes moved per second. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "metrale/ops_moe.h"

typedef struct format_case {
    bool dequantize;
    uint32_t n, k;
    mg_bench_rotation inputs; /* BF16 weights, or packed weights (scales beside them) */
    mg_devptr global, scales, out;
    int per_iteration;
} format_case;

static mg_status body_format(mg_bench *b, void *arg, int iteration) {
    format_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->per_iteration; i++) {
        mg_devptr in = mg_bench_rotation_get(&c->inputs, iteration * c->per_iteration + i);
        st = c->dequantize ? mg_nvfp4_dequantize(b->backend, b->stream, c->n, c->k, in, c->scales,
                                                 c->global, MG_DTYPE_BF16, c->out)
                           : mg_nvfp4_quantize(b->backend, b->stream, c->n, c->k, 0, in, c->global,
                                               c->out, c->scales);
    }
    return st;
}

/* Rows of BF16 values uniform in [-4, 4) (the quantize input), or random packed bytes. */
static mg_status fill_inputs(mg_bench *b, const mg_bench_rotation *r, bool bf16) {
    uint16_t *host = malloc(r->bytes);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    mg_bench_fill_random(host, r->bytes, 7);
    for (size_t i = 0; bf16 && i < r->bytes / 2; i++)
        host[i] = mg_f32_to_bf16((float)host[i] * 0x1p-13f - 4.0f);
    mg_status st = MG_OK;
    for (int i = 0; !st && i < r->count; i++)
        st = mg_copy_h2d(b->backend, r->buffers[i], host, r->bytes);
    free(host);
    return st;
}

static int run_format(mg_bench *b, bool dequantize, uint32_t n, uint32_t k, double copy_gbps) {
    const char *name = dequantize ? "dequantize_bf16" : "quantize";
    char shape[48];
    snprintf(shape, sizeof shape, "%ux%u", n, k);
    if (!mg_bench_selected(b, name))
        return 0;
    format_case c = {.dequantize = dequantize, .n = n, .k = k, .per_iteration = 1};
    size_t bf16_bytes = (size_t)n * k * 2, packed = mg_nvfp4_packed_bytes(n, k);
    size_t scale_bytes = mg_nvfp4_scale_bytes(n, k);
    bool graph = mg_backend_supports(b->backend, MG_CAP_GRAPHS);
    float global = 4.0f / 2688.0f;
    mg_bench_row row = mg_bench_row_make("nvfp4_format", name, shape);
    mg_status st;
    if ((st = mg_bench_rotation_create(b, dequantize ? packed : bf16_bytes, 1, &c.inputs)) ||
        (st = fill_inputs(b, &c.inputs, !dequantize)) ||
        (st = mg_alloc(b->backend, 16, &c.global)) ||
        (st = mg_copy_h2d(b->backend, c.global, &global, 4)) ||
        (st = mg_alloc(b->backend, scale_bytes, &c.scales)) ||
        (st = mg_bench_fill_random_device(b, c.scales, scale_bytes, 3)) ||
        (st = mg_alloc(b->backend, dequantize ? bf16_bytes : packed, &c.out)))
        goto done;
    if (graph)
        c.per_iteration = c.inputs.count;
    if ((st = body_format(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto done;
    st = graph ? mg_bench_time_graph(b, body_format, &c, b->warmup, b->iters, &row.stats)
               : mg_bench_time_events(b, body_format, &c, b->warmup, b->iters, &row.stats);
    if (st)
        goto done;
    snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
    row.bytes = c.per_iteration * (double)(bf16_bytes + packed + scale_bytes);
    row.items = c.per_iteration;
    snprintf(row.item_unit, sizeof row.item_unit, "call");
    double gbps = row.stats.median_us > 0 ? row.bytes / (row.stats.median_us * 1e3) : 0;
    snprintf(row.note, sizeof row.note, "%.2f of copy bw (%.0f GB/s)%s",
             copy_gbps > 0 ? gbps / copy_gbps : 0, copy_gbps, graph ? "; inputs rotated" : "");
    mg_bench_add(b, &row);
done:
    mg_bench_rotation_destroy(b, &c.inputs);
    mg_free(b->backend, c.global);
    mg_free(b->backend, c.scales);
    mg_free(b->backend, c.out);
    if (!st)
        return 0;
    char what[96];
    snprintf(what, sizeof what, "nvfp4_format %s %s", name, shape);
    return mg_bench_fail(b, what);
}

enum { EXPERTS = 128, TOPK = 8, HIDDEN = 4096 };

typedef struct route_case {
    mg_moe_topk_desc topk;
    mg_moe_sort_desc sort;
    mg_moe_combine_desc combine;
    bool combine_only;
    size_t workspace_bytes;
    mg_devptr logits, ids, weights, workspace, offsets, sorted, positions, rows, out;
} route_case;

static mg_status body_route(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    route_case *c = arg;
    mg_backend *be = b->backend;
    mg_status st;
    if (c->combine_only)
        return mg_moe_combine(be, b->stream, &c->combine, c->rows, c->positions, c->weights, c->out,
                              c->out);
    if ((st = mg_moe_topk(be, b->stream, &c->topk, c->logits, c->ids, c->weights)))
        return st;
    return mg_moe_sort(be, b->stream, &c->sort, c->ids, c->workspace, c->workspace_bytes,
                       c->offsets, c->sorted, c->positions);
}

static int run_route(mg_bench *b, bool combine_only, uint32_t tokens) {
    char name[32], shape[48];
    snprintf(name, sizeof name, "%s_%u", combine_only ? "combine" : "route", tokens);
    snprintf(shape, sizeof shape, combine_only ? "T=%u k=%d H=%d" : "T=%u E=%d k=%d", tokens,
             combine_only ? TOPK : EXPERTS, combine_only ? HIDDEN : TOPK);
    if (!mg_bench_selected(b, name))
        return 0;
    route_case c = {.topk = {tokens, EXPERTS, TOPK, MG_DTYPE_BF16, 0, true},
                    .sort = {tokens, EXPERTS, TOPK},
                    .combine = {tokens, TOPK, HIDDEN},
                    .combine_only = combine_only};
    c.workspace_bytes = mg_moe_sort_workspace_bytes(&c.sort);
    size_t pairs = (size_t)tokens * TOPK;
    bool graph = mg_backend_supports(b->backend, MG_CAP_GRAPHS);
    mg_bench_row row = mg_bench_row_make("nvfp4_format", name, shape);
    mg_backend *be = b->backend;
    mg_status st;
    if ((st = mg_alloc(be, (size_t)tokens * EXPERTS * 2, &c.logits)) ||
        (st = mg_bench_fill_random_device(b, c.logits, (size_t)tokens * EXPERTS * 2, 5)) ||
        (st = mg_alloc(be, pairs * 4, &c.ids)) || (st = mg_alloc(be, pairs * 4, &c.weights)) ||
        (st = mg_alloc(be, c.workspace_bytes, &c.workspace)) ||
        (st = mg_alloc(be, (EXPERTS + 1) * 4, &c.offsets)) ||
        (st = mg_alloc(be, pairs * 4, &c.sorted)) || (st = mg_alloc(be, pairs * 4, &c.positions)))
        goto done;
    /* The combine reads real positions and weights: one routing first. */
    c.combine_only = false;
    if ((st = body_route(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto done;
    c.combine_only = combine_only;
    if (combine_only && ((st = mg_alloc(be, pairs * HIDDEN * 2, &c.rows)) ||
                         (st = mg_bench_fill_random_device(b, c.rows, pairs * HIDDEN * 2, 9)) ||
                         (st = mg_alloc(be, (size_t)tokens * HIDDEN * 2, &c.out)) ||
                         (st = mg_memset(be, c.out, 0, (size_t)tokens * HIDDEN * 2))))
        goto done;
    if ((st = body_route(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto done;
    st = graph ? mg_bench_time_graph(b, body_route, &c, b->warmup, b->iters, &row.stats)
               : mg_bench_time_events(b, body_route, &c, b->warmup, b->iters, &row.stats);
    if (st)
        goto done;
    snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
    if (combine_only)
        row.bytes = (double)pairs * HIDDEN * 2 + 2.0 * tokens * HIDDEN * 2 + pairs * 8.0;
    snprintf(row.note, sizeof row.note, "%s",
             combine_only ? "rows + residual read, out written (in place)"
                          : "top-k + sort: 4 launches, no host sync");
    mg_bench_add(b, &row);
done:
    mg_free(be, c.logits), mg_free(be, c.ids), mg_free(be, c.weights);
    mg_free(be, c.workspace), mg_free(be, c.offsets), mg_free(be, c.sorted);
    mg_free(be, c.positions), mg_free(be, c.rows), mg_free(be, c.out);
    if (!st)
        return 0;
    char what[96];
    snprintf(what, sizeof what, "nvfp4_format %s", name);
    return mg_bench_fail(b, what);
}

static int bench_nvfp4(mg_bench *b, int argc, char **argv) {
    (void)argc;
    (void)argv;
    double copy_gbps = 0;
    size_t copy_bytes = (size_t)(b->quick ? 64 : 256) << 20;
    if (mg_bench_copy_bandwidth(b, copy_bytes, &copy_gbps))
        return mg_bench_fail(b, "nvfp4_format: copy bandwidth");
    uint32_t n = b->quick ? 4096 : 14336, k = 4096;
    int failures = run_format(b, false, n, k, copy_gbps) + run_format(b, true, n, k, copy_gbps);
    static const uint32_t tokens[] = {1, 16, 4096};
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
        uint32_t t = b->quick && tokens[i] > 256 ? 256 : tokens[i];
        failures += run_route(b, false, t) + run_route(b, true, t);
    }
    return failures;
}

MG_BENCH_REGISTER(nvfp4_format, "nvfp4_format",
                  "NVFP4 weight quantize/dequantize (GB/s, fraction of copy bandwidth) and MoE "
                  "routing (top-k + sort latency, combine GB/s) under graph replay",
                  bench_nvfp4)
