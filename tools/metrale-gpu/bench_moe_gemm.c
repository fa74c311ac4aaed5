/* bench_moe_gemm.c - `metrale-gpu bench moe_gemm`: the grouped MoE GEMM (metrale/ops_moe_gemm.h)
 * in BF16, FP8 row-wise and FP8 128x128 block-scaled, under graph replay with the weights
 * rotated past L2 (one set of all experts' weights per replay):
 *  - "moe8_<kind>_t<T>": 8 experts of N=14336, K=4096 at T = 64, 512, 2048 rows each;
 *  - "moe128_<kind>_t<T>": 128 experts of a 30B-A3B layer (hidden 2048, intermediate 768): the
 *    gate_up call (silu·mul fused after it) then the down call, at T = 64, 512 rows each.
 * Rows are in expert order with an identity gather of distinct tokens. TFLOP/s counts 2·M·N·K
 * of every call; the note gives the weight bytes per replay as a fraction of the measured copy
 * bandwidth. bench/peers/peers_moe_gemm.py measures torch._grouped_mm (and FBGEMM's FP8
 * row-wise grouped GEMM where installed) on the same shapes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops_moe_gemm.h"

typedef struct moe_bench {
    mg_moe_gemm_desc first, down; /* down used by the 128-expert layer only */
    bool layer;
    size_t first_weight, first_scale, down_weight, down_scale; /* bytes of all experts */
    mg_devptr act, mid, out, offsets, workspace;
    size_t workspace_bytes;
    mg_bench_rotation weights; /* first weight | its scales | down weight | its scales */
} moe_bench;

static mg_status body(mg_bench *b, void *arg, int iteration) {
    moe_bench *c = arg;
    mg_devptr base = mg_bench_rotation_get(&c->weights, iteration);
    bool fp8 = c->first.kind != MG_MOE_GEMM_BF16;
    mg_moe_gemm_tensors t = {.act = c->act,
                             .expert_offsets = c->offsets,
                             .weight = base,
                             .weight_scale = fp8 ? base + c->first_weight : 0,
                             .out = c->layer ? c->mid : c->out,
                             .workspace = c->workspace,
                             .workspace_bytes = c->workspace_bytes};
    mg_status st = mg_moe_gemm(b->backend, b->stream, &c->first, &t);
    if (st || !c->layer)
        return st;
    mg_devptr down = base + c->first_weight + c->first_scale;
    mg_moe_gemm_tensors d = {.act = c->mid,
                             .expert_offsets = c->offsets,
                             .weight = down,
                             .weight_scale = fp8 ? down + c->down_weight : 0,
                             .out = c->out,
                             .workspace = c->workspace,
                             .workspace_bytes = c->workspace_bytes};
    return mg_moe_gemm(b->backend, b->stream, &c->down, &d);
}

static size_t scale_bytes(const mg_moe_gemm_desc *d) {
    uint32_t n_w = d->gate_up ? 2 * d->n : d->n;
    if (d->kind == MG_MOE_GEMM_BF16)
        return 0;
    if (d->kind == MG_MOE_GEMM_FP8_ROWWISE)
        return (size_t)d->experts * n_w * 4;
    return (size_t)d->experts * ((n_w + 127) / 128) * ((d->k + 127) / 128) * 4;
}

static size_t weight_bytes(const mg_moe_gemm_desc *d) {
    uint32_t n_w = d->gate_up ? 2 * d->n : d->n;
    return (size_t)d->experts * n_w * d->k * (d->kind == MG_MOE_GEMM_BF16 ? 2 : 1);
}

static void free_case(mg_bench *b, moe_bench *c) {
    if (c->weights.buffers)
        mg_bench_rotation_destroy(b, &c->weights);
    mg_devptr *p[] = {&c->act, &c->mid, &c->out, &c->offsets, &c->workspace};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (*p[i])
            mg_free(b->backend, *p[i]);
}

static const char *kind_tag(mg_moe_gemm_kind kind) {
    return kind == MG_MOE_GEMM_BF16          ? "bf16"
           : kind == MG_MOE_GEMM_FP8_ROWWISE ? "fp8_rowwise"
                                             : "fp8_block";
}

/* One case: `experts` experts, `per_expert` rows each; n x k for the single GEMM, or the
 * layer (gate_up to n = intermediate, then down back to k = hidden). */
static int run_case(mg_bench *b, mg_moe_gemm_kind kind, uint32_t experts, uint32_t per_expert,
                    uint32_t n, uint32_t k, bool layer, double copy_gbps) {
    char name[48], shape[64];
    snprintf(name, sizeof name, "%s_%s_t%u", layer ? "moe128" : "moe8", kind_tag(kind), per_expert);
    snprintf(shape, sizeof shape, "E%u x %u rows, %ux%u", experts, per_expert, n, k);
    if (!mg_bench_selected(b, name))
        return 0;
    uint32_t rows = experts * per_expert;
    moe_bench c = {.layer = layer};
    c.first = (mg_moe_gemm_desc){.kind = kind,
                                 .experts = experts,
                                 .rows = rows,
                                 .act_rows = rows,
                                 .n = n,
                                 .k = k,
                                 .gate_up = layer};
    c.down = (mg_moe_gemm_desc){
        .kind = kind, .experts = experts, .rows = rows, .act_rows = rows, .n = k, .k = n};
    c.first_weight = weight_bytes(&c.first);
    c.first_scale = scale_bytes(&c.first);
    c.down_weight = layer ? weight_bytes(&c.down) : 0;
    c.down_scale = layer ? scale_bytes(&c.down) : 0;
    size_t set = c.first_weight + c.first_scale + c.down_weight + c.down_scale;
    size_t ws_down = 0;
    int32_t *offsets = malloc((experts + 1) * sizeof *offsets);
    for (uint32_t e = 0; e <= experts; e++)
        offsets[e] = (int32_t)(e * per_expert);
    mg_status st;
    st = mg_moe_gemm_workspace_bytes(b->backend, &c.first, &c.workspace_bytes);
    if (st == MG_ERR_UNSUPPORTED) { /* a kind this backend has no kernel for: no row */
        fprintf(stderr, "bench moe_gemm: %s skipped: %s\n", name, mg_last_error());
        free(offsets);
        return 0;
    }
    if (st || (layer && (st = mg_moe_gemm_workspace_bytes(b->backend, &c.down, &ws_down))))
        goto fail;
    if (ws_down > c.workspace_bytes)
        c.workspace_bytes = ws_down;
    if ((st = mg_alloc(b->backend, (size_t)rows * k * 2, &c.act)) ||
        (st = mg_bench_fill_random_device(b, c.act, (size_t)rows * k * 2, 11)) ||
        (layer && (st = mg_alloc(b->backend, (size_t)rows * n * 2, &c.mid))) ||
        (st = mg_alloc(b->backend, (size_t)rows * (layer ? k : n) * 2, &c.out)) ||
        (st = mg_alloc(b->backend, (experts + 1) * 4, &c.offsets)) ||
        (st = mg_copy_h2d(b->backend, c.offsets, offsets, (experts + 1) * 4)) ||
        (c.workspace_bytes && (st = mg_alloc(b->backend, c.workspace_bytes, &c.workspace))) ||
        (st = mg_bench_rotation_create(b, set, 2, &c.weights)))
        goto fail;
    /* Small finite scales (0x3c3c3c3c is about 0.0115). */
    for (int i = 0; !st && i < c.weights.count && kind != MG_MOE_GEMM_BF16; i++) {
        mg_devptr base = c.weights.buffers[i];
        st = mg_memset(b->backend, base + c.first_weight, 0x3c, c.first_scale);
        if (!st && layer)
            st = mg_memset(b->backend, base + c.first_weight + c.first_scale + c.down_weight, 0x3c,
                           c.down_scale);
    }
    if (st || (st = body(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto fail;
    mg_bench_row row = mg_bench_row_make("moe_gemm", name, shape);
    if ((st = mg_bench_time_graph(b, body, &c, b->warmup, b->iters, &row.stats)))
        goto fail;
    snprintf(row.timing, sizeof row.timing, "graph");
    row.bytes = (double)set;
    row.flops = 2.0 * rows * (double)n * k * (layer ? 3 : 1);
    mg_bench_note_weights(&row, copy_gbps, layer ? "; gate_up(silu)+down" : "");
    mg_bench_add(b, &row);
    free(offsets);
    free_case(b, &c);
    return 0;
fail:;
    char what[128];
    snprintf(what, sizeof what, "%s %s", name, shape);
    free(offsets);
    int failed = mg_bench_fail(b, what);
    free_case(b, &c);
    return failed;
}

static int bench_moe_gemm(mg_bench *b, int argc, char **argv) {
    (void)argc;
    (void)argv;
    static const mg_moe_gemm_kind kinds[] = {MG_MOE_GEMM_BF16, MG_MOE_GEMM_FP8_ROWWISE,
                                             MG_MOE_GEMM_FP8_BLOCKSCALED};
    if (mg_backend_get_kind(b->backend) == MG_BACKEND_CPU && !b->quick) {
        fprintf(stderr, "bench moe_gemm: the CPU backend runs the reference; use --quick for a "
                        "smoke run\n");
        return 0;
    }
    double copy_gbps = 0;
    if (mg_bench_copy_bandwidth(b, (size_t)256 << 20, &copy_gbps))
        copy_gbps = 0;
    int failures = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (b->quick) { /* a smoke run: one small shape of each form */
            failures += run_case(b, kinds[i], 4, 3, 128, 256, false, copy_gbps);
            failures += run_case(b, kinds[i], 4, 3, 64, 128, true, copy_gbps);
            continue;
        }
        static const uint32_t moe8_rows[] = {64, 512, 2048}, moe128_rows[] = {64, 512};
        for (size_t t = 0; t < 3; t++)
            failures += run_case(b, kinds[i], 8, moe8_rows[t], 14336, 4096, false, copy_gbps);
        for (size_t t = 0; t < 2; t++)
            failures += run_case(b, kinds[i], 128, moe128_rows[t], 768, 2048, true, copy_gbps);
    }
    return failures;
}

MG_BENCH_REGISTER(moe_gemm, "moe_gemm",
                  "grouped MoE GEMMs (BF16, FP8 row-wise, FP8 128x128 block-scaled) under graph "
                  "replay with rotated weights",
                  bench_moe_gemm)
