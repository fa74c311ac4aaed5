/* bench_mlx.c - `metrale-gpu bench mlx`: the MLX affine-quantized ops (metrale/mlx.h) at
 * (N, K) in {4096x4096, 14336x4096, 4096x14336}, M in {1, 2, 4, 8, 16, 512, 4096}, bits 8 and 4
 * (group 64, BF16 scales): the GEMV for M <= 8, two GEMVs of 8 rows for M = 16 ("gemv_2x8"),
 * the GEMM (dequantize + BF16 GEMM) for M >= 16; and at M = 1 and 8 the fused silu_gate (on the
 * down shape 4096x14336), gate_up and gate_up with the SiLU-mul epilogue ("gate_up_silu", on
 * 14336x4096). The GEMV rows run on the automatic choice
 * (src/ops/mlx/mlx.c: on CUDA the tensor-core GEMVs where it takes them) and again with provider
 * "kernels" forced (the SIMT GEMVs; rows named "*_simt_*"); each row's note names the provider that
 * ran. Each case is a CUDA-graph replay of one call per layer of a rotation of layers larger than
 * the L2 cache, so the weights come from memory. Reported as bytes moved (packed weights + scales +
 * biases, activations and outputs) per second and as a fraction of the measured device copy
 * bandwidth, and as TFLOP/s (2 M N K).
 * --quick: 1024x1024 at M 1 and 16 only (for the CPU backend). The PyTorch peer is
 * bench/peers/peers_mlx.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/mlx.h"
#include "metrale/ops.h"

typedef enum mlx_bench_kind {
    KIND_GEMV,
    KIND_GEMV_2X8,
    KIND_SILU,
    KIND_GATE_UP,
    KIND_GATE_UP_SILU, /* gate_up with the SiLU-mul epilogue (mg_mlx_gemv_fused) */
    KIND_GEMM
} mlx_bench_kind;

static const char *const kind_names[] = {"gemv",    "gemv_2x8",     "silu_gate",
                                         "gate_up", "gate_up_silu", "gemm"};

typedef struct mlx_case {
    mlx_bench_kind kind;
    mg_mlx_linear shape; /* no buffers */
    uint32_t m;
    size_t scales_offset, biases_offset;
    mg_bench_rotation layers; /* each buffer: words | scales | biases */
    mg_devptr x, u, y, y2, scratch;
    int per_iteration;
} mlx_case;

static size_t align256(size_t v) {
    return (v + 255) & ~(size_t)255;
}

static mg_mlx_linear layer_at(const mlx_case *c, int index) {
    mg_mlx_linear w = c->shape;
    mg_devptr base = mg_bench_rotation_get(&c->layers, index);
    w.weight = base;
    w.scales = base + c->scales_offset;
    w.biases = base + c->biases_offset;
    return w;
}

static mg_status body_mlx(mg_bench *b, void *arg, int iteration) {
    mlx_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->per_iteration; i++) {
        int index = iteration * c->per_iteration + i;
        mg_mlx_linear w = layer_at(c, index);
        switch (c->kind) {
        case KIND_GEMV:
            st = mg_mlx_gemv(b->backend, b->stream, &w, 0, c->m, c->x, c->y);
            break;
        case KIND_GEMV_2X8:
            for (uint32_t r = 0; !st && r < c->m; r += 8)
                st = mg_mlx_gemv(b->backend, b->stream, &w, 0, 8, c->x + (size_t)r * w.k * 2,
                                 c->y + (size_t)r * w.n * 2);
            break;
        case KIND_SILU:
            st = mg_mlx_gemv_silu_gate(b->backend, b->stream, &w, 0, c->m, c->x, c->u, c->y);
            break;
        case KIND_GATE_UP:
        case KIND_GATE_UP_SILU: {
            /* Gate and up are two layers of the rotation: both come from memory. */
            mg_mlx_linear up = layer_at(c, index + c->layers.count / 2);
            const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
            const mg_gemm_fusion_tensors none = {0};
            st = c->kind == KIND_GATE_UP ? mg_mlx_gemv_gate_up(b->backend, b->stream, &w, &up, 0,
                                                               c->m, c->x, c->y, c->y2)
                                         : mg_mlx_gemv_fused(b->backend, b->stream, &w, &up, 0,
                                                             c->m, c->x, c->y, &silu_mul, &none);
            break;
        }
        case KIND_GEMM:
            st = mg_mlx_gemm(b->backend, b->stream, &w, 0, c->m, c->x, c->y, c->scratch);
            break;
        }
    }
    return st;
}

/* Random BF16 activations in [-1, 1) (the layers keep the rotation's random bytes: the speed of
 * these kernels does not depend on the values). */
static mg_status fill_bf16(mg_bench *b, mg_devptr p, size_t count, uint64_t seed) {
    uint16_t *h = malloc(count * 2);
    if (!h)
        return MG_ERR_OUT_OF_MEMORY;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float v = (float)((s >> 40) & 0xffff) / 32768.0f - 1.0f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        h[i] = (uint16_t)(bits >> 16);
    }
    mg_status st = mg_copy_h2d(b->backend, p, h, count * 2);
    free(h);
    return st;
}

/* One case; `forced` (or NULL: the automatic choice) is the MLX op's provider for it. */
static int run_case(mg_bench *b, mlx_bench_kind kind, uint32_t n, uint32_t k, uint32_t m,
                    uint32_t bits, double copy_gbps, const char *forced) {
    char name[64], shape[24];
    /* The shape is in the case name too: the report keys rows by "bench/case". */
    snprintf(shape, sizeof shape, "%ux%ux%u", m, n, k);
    snprintf(name, sizeof name, "%s%s_%ubit.%s", kind_names[kind], forced ? "_simt" : "", bits,
             shape);
    if (!mg_bench_selected(b, name))
        return 0;
    mg_status st = mg_op_force_provider(b->backend, MG_OP_MLX_QUANT, forced);
    if (st)
        return mg_bench_fail(b, name);
    mlx_case c = {.kind = kind, .m = m, .per_iteration = 1};
    c.shape = (mg_mlx_linear){
        .experts = 1, .n = n, .k = k, .bits = bits, .group_size = 64, .scale_type = MG_DTYPE_BF16};
    size_t word_bytes = (size_t)n * k * bits / 8, group_bytes = (size_t)n * (k / 64) * 2;
    c.scales_offset = align256(word_bytes);
    c.biases_offset = c.scales_offset + align256(group_bytes);
    size_t layer_bytes = c.biases_offset + group_bytes;
    bool graph = mg_backend_supports(b->backend, MG_CAP_GRAPHS);
    mg_bench_row row = mg_bench_row_make("mlx", name, shape);
    size_t act = (size_t)m * k * 2, out = (size_t)m * n * 2;
    const bool pair = kind == KIND_GATE_UP || kind == KIND_GATE_UP_SILU;
    if ((st = mg_bench_rotation_create(b, layer_bytes, pair ? 4 : 2, &c.layers)) ||
        (st = mg_alloc(b->backend, act, &c.x)) || (st = mg_alloc(b->backend, act, &c.u)) ||
        (st = mg_alloc(b->backend, out, &c.y)) || (st = mg_alloc(b->backend, out, &c.y2)) ||
        (st = fill_bf16(b, c.x, act / 2, 1)) || (st = fill_bf16(b, c.u, act / 2, 2)))
        goto done;
    if (kind == KIND_GEMM &&
        (st = mg_alloc(b->backend, mg_mlx_gemm_scratch_bytes(&c.shape), &c.scratch)))
        goto done;
    if (graph)
        c.per_iteration = pair ? c.layers.count / 2 : c.layers.count;
    /* The first call looks the kernels up and plans the GEMM, outside capture and timing. */
    if ((st = body_mlx(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
        goto done;
    st = graph ? mg_bench_time_graph(b, body_mlx, &c, b->warmup, b->iters, &row.stats)
               : mg_bench_time_events(b, body_mlx, &c, b->warmup, b->iters, &row.stats);
    if (st)
        goto done;
    double layers = pair ? 2 : 1, outs = kind == KIND_GATE_UP ? 2 : 1;
    double weight_reads = kind == KIND_GEMV_2X8 ? m / 8.0 : 1;
    double acts = kind == KIND_SILU ? 2 : 1;
    double bytes_per_call = layers * weight_reads * (double)(word_bytes + 2 * group_bytes) +
                            acts * (double)act + outs * (double)out;
    if (kind == KIND_GEMM) /* the dequant writes and the GEMM reads the BF16 weights */
        bytes_per_call += 2.0 * n * k * 2;
    snprintf(row.timing, sizeof row.timing, "%s", graph ? "graph" : "events");
    row.bytes = c.per_iteration * bytes_per_call;
    row.flops = c.per_iteration * layers * 2.0 * m * n * k;
    row.items = c.per_iteration;
    snprintf(row.item_unit, sizeof row.item_unit, "call");
    double gbps = row.stats.median_us > 0 ? row.bytes / (row.stats.median_us * 1e3) : 0;
    mg_op_stats ran;
    if ((st = mg_op_stats_get(b->backend, MG_OP_MLX_QUANT, &ran)))
        goto done;
    snprintf(row.note, sizeof row.note, "%.2f of copy bw (%.0f GB/s)%s; %s",
             copy_gbps > 0 ? gbps / copy_gbps : 0, copy_gbps, graph ? "; weights rotated" : "",
             ran.provider);
    mg_bench_add(b, &row);
done:
    mg_op_force_provider(b->backend, MG_OP_MLX_QUANT, NULL);
    mg_bench_rotation_destroy(b, &c.layers);
    mg_devptr all[] = {c.x, c.u, c.y, c.y2, c.scratch};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            mg_free(b->backend, all[i]);
    if (!st)
        return 0;
    char what[128];
    snprintf(what, sizeof what, "mlx %s %s: %s", name, shape, mg_last_error());
    return mg_bench_fail(b, what);
}

static int bench_mlx(mg_bench *b, int argc, char **argv) {
    (void)argc;
    (void)argv;
    static const uint32_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    static const uint32_t ms[] = {1, 2, 4, 8, 16, 512, 4096};
    double copy_gbps = 0;
    size_t copy_bytes = (size_t)(b->quick ? 64 : 256) << 20;
    if (mg_bench_copy_bandwidth(b, copy_bytes, &copy_gbps))
        return mg_bench_fail(b, "mlx: copy bandwidth");
    int failures = 0;
    for (uint32_t bits = 8; bits >= 4; bits -= 4) {
        if (b->quick) {
            failures += run_case(b, KIND_GEMV, 1024, 1024, 1, bits, copy_gbps, NULL);
            failures += run_case(b, KIND_GEMM, 1024, 1024, 16, bits, copy_gbps, NULL);
            continue;
        }
        /* The GEMVs twice: the automatic choice, then the SIMT kernels forced. */
        for (int simt = 0; simt < 2; simt++) {
            const char *forced = simt ? "kernels" : NULL;
            for (size_t s = 0; s < 3; s++)
                for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
                    uint32_t n = shapes[s][0], k = shapes[s][1], m = ms[i];
                    if (m <= 8)
                        failures += run_case(b, KIND_GEMV, n, k, m, bits, copy_gbps, forced);
                    if (m == 16)
                        failures += run_case(b, KIND_GEMV_2X8, n, k, m, bits, copy_gbps, forced);
                    if (m >= 16 && !simt)
                        failures += run_case(b, KIND_GEMM, n, k, m, bits, copy_gbps, NULL);
                }
            /* the decode MLP's two forms at 1 and 8 rows: gate_up then silu_gate, or
             * gate_up_silu then the plain down GEMV (the gemv rows of 4096x14336) */
            for (uint32_t m = 1; m <= 8; m += 7) {
                failures += run_case(b, KIND_SILU, 4096, 14336, m, bits, copy_gbps, forced);
                failures += run_case(b, KIND_GATE_UP, 14336, 4096, m, bits, copy_gbps, forced);
                failures += run_case(b, KIND_GATE_UP_SILU, 14336, 4096, m, bits, copy_gbps, forced);
            }
        }
    }
    return failures;
}

MG_BENCH_REGISTER(mlx, "mlx",
                  "MLX 8/4-bit affine GEMV, fused GEMVs and GEMM at 4096/14336 shapes, M 1..4096: "
                  "bytes moved / copy bandwidth, TFLOP/s",
                  bench_mlx)
