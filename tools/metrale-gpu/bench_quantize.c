/* bench_quantize.c - `metrale-gpu bench quantize`: the device FP8 quantizers of
 * metrale/ops_quantize.h on BF16 activations of 1x4096, 16x4096 and 8192x4096, every mode
 * ("tensor", "row", "1x128", "1x128_gemm"), as bytes moved per second and as a fraction of
 * the device's copy bandwidth, measured first the way `bench copy`'s d2d case does.
 *
 * Bytes moved per call: the BF16 input read (twice per tensor: once for the amax, once for the
 * codes), the codes and the scales written. Where the backend has graphs, each timed replay
 * quantizes every input of a rotation that together exceeds L2 (launch gaps removed, inputs
 * from memory); otherwise one call is timed with events. Inputs are uniform in [-4, 4), like
 * activations, so no value takes the division's slow path. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"
#include "metrale/dtype.h"
#include "metrale/ops_quantize.h"

typedef struct quant_case {
    mg_fp8_quant_desc desc;
    mg_bench_rotation inputs;
    mg_devptr out, scales;
    int per_iteration; /* calls per body, one per input of the rotation */
} quant_case;

static mg_status body_quantize(mg_bench *b, void *arg, int iteration) {
    quant_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->per_iteration; i++)
        st = mg_fp8_quantize(b->backend, b->stream, &c->desc,
                             mg_bench_rotation_get(&c->inputs, iteration * c->per_iteration + i),
                             c->out, c->scales);
    return st;
}

static const char *mode_case_name(mg_fp8_quant_mode mode) {
    switch (mode) {
    case MG_FP8_QUANT_TENSOR:
        return "tensor";
    case MG_FP8_QUANT_ROW:
        return "row";
    case MG_FP8_QUANT_1X128:
        return "1x128";
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT:
        return "1x128_gemm";
    }
    return "?";
}

/* Overwrites every input of the rotation with BF16 values uniform in [-4, 4). */
static mg_status fill_activations(mg_bench *b, const mg_bench_rotation *r) {
    size_t count = r->bytes / 2;
    uint16_t *host = malloc(r->bytes);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    mg_bench_fill_random(host, r->bytes, 21);
    for (size_t i = 0; i < count; i++)
        host[i] = mg_f32_to_bf16((float)host[i] * 0x1p-13f - 4.0f);
    mg_status st = MG_OK;
    for (int i = 0; !st && i < r->count; i++)
        st = mg_copy_h2d(b->backend, r->buffers[i], host, r->bytes);
    free(host);
    return st;
}

static int run_case(mg_bench *b, mg_fp8_quant_mode mode, uint32_t rows, uint32_t cols,
                    double copy_gbps) {
    const char *name = mode_case_name(mode);
    char shape[48];
    snprintf(shape, sizeof shape, "%ux%u", rows, cols);
    if (!mg_bench_selected(b, name))
        return 0;
    quant_case c = {.desc = {.mode = mode, .rows = rows, .cols = cols}, .per_iteration = 1};
    if (mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT)
        c.desc.rows_pad = mg_fp8_rows_padded(rows);
    size_t in_bytes = (size_t)rows * cols * 2;
    size_t scale_bytes = mg_fp8_quant_scale_count(&c.desc) * sizeof(float);
    bool graph = mg_backend_supports(b->backend, MG_CAP_GRAPHS);
    mg_bench_row row = mg_bench_row_make("quantize", name, shape);
    mg_status st;
    if ((st = mg_bench_rotation_create(b, in_bytes, 1, &c.inputs)) ||
        (st = fill_activations(b, &c.inputs)) ||
        (st = mg_alloc(b->backend, mg_fp8_quant_output_bytes(&c.desc), &c.out)) ||
        (st = mg_alloc(b->backend, scale_bytes, &c.scales)))
        goto done;
    if (graph)
        c.per_iteration = c.inputs.count;
    /* The first call looks the kernels up, outside any capture and any timing. */
    if ((st = body_quantize(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto done;
    st = graph ? mg_bench_time_graph(b, body_quantize, &c, b->warmup, b->iters, &row.stats)
               : mg_bench_time_events(b, body_quantize, &c, b->warmup, b->iters, &row.stats);
    if (st)
        goto done;
    double reads = mode == MG_FP8_QUANT_TENSOR ? 2.0 : 1.0;
    double bytes_per_call =
        reads * (double)in_bytes + (double)mg_fp8_quant_output_bytes(&c.desc) + (double)scale_bytes;
    snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
    row.bytes = c.per_iteration * bytes_per_call;
    row.items = c.per_iteration;
    snprintf(row.item_unit, sizeof row.item_unit, "call");
    double gbps = row.stats.median_us > 0 ? row.bytes / (row.stats.median_us * 1e3) : 0;
    snprintf(row.note, sizeof row.note, "%.2f of copy bw (%.0f GB/s)%s%s",
             copy_gbps > 0 ? gbps / copy_gbps : 0, copy_gbps, reads > 1 ? "; input read twice" : "",
             graph ? "; inputs rotated" : "");
    mg_bench_add(b, &row);
done:
    mg_bench_rotation_destroy(b, &c.inputs);
    mg_free(b->backend, c.out);
    mg_free(b->backend, c.scales);
    if (!st)
        return 0;
    char what[96];
    snprintf(what, sizeof what, "quantize %s %s", name, shape);
    return mg_bench_fail(b, what);
}

static int bench_quantize(mg_bench *b, int argc, char **argv) {
    (void)argc;
    (void)argv;
    static const uint32_t rows[] = {1, 16, 8192};
    static const mg_fp8_quant_mode modes[] = {MG_FP8_QUANT_TENSOR, MG_FP8_QUANT_ROW,
                                              MG_FP8_QUANT_1X128, MG_FP8_QUANT_1X128_GEMM_LAYOUT};
    const uint32_t cols = 4096;
    double copy_gbps = 0;
    size_t copy_bytes = (size_t)(b->quick ? 64 : 256) << 20; /* well past any L2 */
    if (mg_bench_copy_bandwidth(b, copy_bytes, &copy_gbps))
        return mg_bench_fail(b, "quantize: copy bandwidth");
    int failures = 0;
    /* --quick: the largest shape at 256 rows, small enough for the CPU backend. */
    size_t shapes = sizeof rows / sizeof rows[0];
    for (size_t i = 0; i < shapes; i++)
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
            failures +=
                run_case(b, modes[m], b->quick && rows[i] > 256 ? 256 : rows[i], cols, copy_gbps);
    return failures;
}

MG_BENCH_REGISTER(quantize, "quantize",
                  "FP8 activation quantizers (per tensor, row, 1x128, 1x128 in the GEMM layout) "
                  "at 1/16/8192 x 4096: GB/s and fraction of copy bandwidth",
                  bench_quantize)
