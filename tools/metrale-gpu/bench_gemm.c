/* bench_gemm.c - `metrale-gpu bench gemm`: the GEMMs of metrale/ops_gemm.h on the shapes of
 * an 8B-class model's linear layers, M in {1, 16, 64, 128, 256, 4096, 8192} x (N, K) in
 * {(4096, 4096), (14336, 4096), (4096, 14336)}, plus 8192^3 and 16384x8192x8192:
 *  - "bf16", "fp8_tensor", "fp8_row", "fp8_block": one GEMM per iteration timed with device
 *    events, fixed inputs (as PyTorch is timed in bench/peers/peers_gemm.py);
 *  - "*_decode_graph" (M <= 16): graph replay of one GEMM per weight of a rotation larger
 *    than L2, so each GEMM streams its weights from memory with no launch gaps; GB/s counts
 *    weight bytes.
 * Options: --m LIST (comma-separated token counts), --decode-only, --no-decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops_gemm.h"

typedef struct gemm_case {
    mg_gemm_kind kind;
    uint32_t m, n, k;
    mg_devptr act, out, act_scale, weight_scale;
    mg_bench_rotation weights;
    int per_iteration; /* GEMMs issued per body call */
} gemm_case;

static mg_status body_gemm(mg_bench *b, void *arg, int iteration) {
    gemm_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->per_iteration; i++) {
        mg_devptr w = mg_bench_rotation_get(&c->weights, iteration * c->per_iteration + i);
        mg_gemm_plan plan = {.kind = c->kind,
                             .m = c->m,
                             .n = c->n,
                             .k = c->k,
                             .ldc = c->n,
                             .out_type = MG_DTYPE_BF16,
                             .act_mode = MG_FP8_BLOCK_1X128, /* 0: what other kinds hold */
                             .weight_mode = c->kind == MG_GEMM_FP8_BLOCKSCALED
                                                ? MG_FP8_BLOCK_128X128
                                                : MG_FP8_BLOCK_1X128};
        mg_gemm_tensors t = {.act = c->act,
                             .weight = w,
                             .out = c->out,
                             .act_scale = c->act_scale,
                             .weight_scale = c->weight_scale};
        st = mg_gemm(b->backend, b->stream, &plan, &t);
    }
    return st;
}

/* Device buffer of `count` FP32 ones: scales that leave the values as they are. */
static mg_status upload_ones(mg_bench *b, size_t count, mg_devptr *out) {
    float *ones = malloc(count * sizeof *ones);
    if (!ones)
        return MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < count; i++)
        ones[i] = 1.0f;
    mg_status st = mg_alloc(b->backend, count * sizeof *ones, out);
    if (!st)
        st = mg_copy_h2d(b->backend, *out, ones, count * sizeof *ones);
    free(ones);
    return st;
}

static void free_case(mg_bench *b, gemm_case *c, bool graph, mg_devptr single_weight) {
    if (graph && c->weights.buffers)
        mg_bench_rotation_destroy(b, &c->weights);
    mg_free(b->backend, single_weight);
    mg_free(b->backend, c->act);
    mg_free(b->backend, c->out);
    mg_free(b->backend, c->act_scale);
    mg_free(b->backend, c->weight_scale);
}

/* One row: `graph` selects decode-style graph replay over rotating weights. */
static int run_case(mg_bench *b, mg_gemm_kind kind, uint32_t m, uint32_t n, uint32_t k,
                    bool graph) {
    char name[48], shape[64];
    snprintf(name, sizeof name, "%s%s", mg_gemm_kind_describe(kind)->name,
             graph ? "_decode_graph" : "");
    snprintf(shape, sizeof shape, "%ux%ux%u", m, n, k);
    /* Block scaling needs M % 4 == 0; an engine pads its tokens to that. */
    if (!mg_bench_selected(b, name) || (kind == MG_GEMM_FP8_BLOCKSCALED && m % 4))
        return 0;
    size_t in_bytes = mg_dtype_bytes(mg_gemm_kind_describe(kind)->input_type);
    size_t weight_bytes = (size_t)n * k * in_bytes;
    gemm_case c = {.kind = kind, .m = m, .n = n, .k = k, .per_iteration = 1};
    mg_gemm_plan plan = {.kind = kind,
                         .m = m,
                         .n = n,
                         .k = k,
                         .ldc = n,
                         .out_type = MG_DTYPE_BF16,
                         .act_mode = MG_FP8_BLOCK_1X128,
                         .weight_mode = MG_FP8_BLOCK_128X128};
    mg_devptr single_weight = 0;
    mg_status st;
    if ((st = mg_alloc(b->backend, (size_t)m * k * in_bytes, &c.act)) ||
        (st = mg_bench_fill_random_device(b, c.act, (size_t)m * k * in_bytes, 7)) ||
        (st = mg_alloc(b->backend, (size_t)m * n * 2, &c.out)) ||
        (kind != MG_GEMM_BF16 &&
         ((st = upload_ones(b, mg_gemm_scale_count(&plan, true), &c.act_scale)) ||
          (st = upload_ones(b, mg_gemm_scale_count(&plan, false), &c.weight_scale)))))
        goto fail;
    /* Eager rows reuse one weight (as the PyTorch peer does); graph rows rotate through
     * enough weights to defeat L2 and issue one GEMM per weight in each replay. */
    if (graph) {
        if ((st = mg_bench_rotation_create(b, weight_bytes, 8, &c.weights)))
            goto fail;
        c.per_iteration = c.weights.count;
    } else {
        if ((st = mg_alloc(b->backend, weight_bytes, &single_weight)) ||
            (st = mg_bench_fill_random_device(b, single_weight, weight_bytes, 8)))
            goto fail;
        c.weights = (mg_bench_rotation){&single_weight, 1, weight_bytes};
    }
    /* The first call plans the shape (for graphs it must happen outside the capture). */
    if ((st = body_gemm(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto fail;
    mg_bench_row row = mg_bench_row_make("gemm", name, shape);
    double gemms = c.per_iteration;
    st = graph ? mg_bench_time_graph(b, body_gemm, &c, b->warmup, b->iters, &row.stats)
               : mg_bench_time_events(b, body_gemm, &c, b->warmup, b->iters, &row.stats);
    if (st)
        goto fail;
    snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
    row.flops = gemms * 2.0 * m * n * k;
    if (graph) {
        row.bytes = gemms * (double)weight_bytes;
        row.items = gemms;
        snprintf(row.item_unit, sizeof row.item_unit, "gemm");
        snprintf(row.note, sizeof row.note, "GB/s of weights; %d weights rotated", c.weights.count);
    } else {
        row.bytes = (double)weight_bytes + (double)m * k * in_bytes + (double)m * n * 2;
    }
    mg_bench_add(b, &row);
    free_case(b, &c, graph, single_weight);
    return 0;
fail:;
    char what[128];
    snprintf(what, sizeof what, "%s %s", name, shape);
    int failed = mg_bench_fail(b, what);
    free_case(b, &c, graph, single_weight);
    return failed;
}

static bool has_flag(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], flag) == 0)
            return true;
    return false;
}

static int bench_gemm(mg_bench *b, int argc, char **argv) {
    static const uint32_t default_m[] = {1, 16, 64, 128, 256, 4096, 8192};
    static const uint32_t nk[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    static const uint32_t big[][3] = {{8192, 8192, 8192}, {16384, 8192, 8192}};
    static const mg_gemm_kind kinds[] = {MG_GEMM_BF16, MG_GEMM_FP8_TENSORWISE, MG_GEMM_FP8_ROWWISE,
                                         MG_GEMM_FP8_BLOCKSCALED};
    static const mg_gemm_kind decode_kinds[] = {MG_GEMM_BF16, MG_GEMM_FP8_TENSORWISE};
    uint32_t ms[16];
    size_t m_count = mg_bench_option_u32_list(argc, argv, "--m", ms, 16);
    if (m_count == 0) {
        m_count = b->quick ? 2 : sizeof default_m / sizeof default_m[0];
        memcpy(ms, b->quick ? (const uint32_t[]){1, 256} : default_m, m_count * sizeof *ms);
    }
    bool decode_only = has_flag(argc, argv, "--decode-only");
    bool no_decode = has_flag(argc, argv, "--no-decode");
    int failures = 0;
    size_t nk_count = b->quick ? 1 : 3;
    if (!decode_only) {
        for (size_t s = 0; s < nk_count; s++)
            for (size_t i = 0; i < m_count; i++)
                for (size_t v = 0; v < sizeof kinds / sizeof kinds[0]; v++)
                    failures += run_case(b, kinds[v], ms[i], nk[s][0], nk[s][1], false);
        for (size_t s = 0; !b->quick && s < 2; s++)
            for (size_t v = 0; v < sizeof kinds / sizeof kinds[0]; v++)
                failures += run_case(b, kinds[v], big[s][0], big[s][1], big[s][2], false);
    }
    if (!no_decode && mg_backend_supports(b->backend, MG_CAP_GRAPHS)) {
        static const uint32_t decode_m[] = {1, 16};
        for (size_t s = 0; s < nk_count; s++)
            for (size_t i = 0; i < 2; i++)
                for (size_t v = 0; v < sizeof decode_kinds / sizeof decode_kinds[0]; v++)
                    failures += run_case(b, decode_kinds[v], decode_m[i], nk[s][0], nk[s][1], true);
    }
    return failures;
}

MG_BENCH_REGISTER(gemm, "gemm",
                  "BF16 and FP8 GEMMs (cuBLASLt): model shapes with events, decode shapes "
                  "under graph replay",
                  bench_gemm)
