/* bench_cpu_fast.c - `metrale-gpu --backend cpu bench cpu_fast`: each CPU provider of the MLX
 * ops and of the BF16 GEMM (the references "kernels" / "reference", "cpu_avx512" and "cpu_avx2"
 * where the CPU has them, "cpu_portable"), forced by name, on SmolLM2-135M's shapes: the 4-bit
 * group-32 FP16 GEMVs at M = 1 (q and o 576x576, k+v 384x576, gate_up 2 x 1536x576, down 576x1536)
 * and the same layers through mg_mlx_gemm at M = 37 (a prompt), and the BF16 LM head 49152x576 with
 * FP32 logits at M = 1 and 37. Reported as bytes moved per second (packed weights + scales +
 * biases, or the BF16 weights, plus activations and outputs) and as a fraction of the measured
 * copy bandwidth. The references run fewer iterations (they are up to a hundred times slower).
 * --quick: the 576x576 shapes only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/mlx.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"

typedef enum { KIND_GEMV, KIND_GATE_UP, KIND_MLX_GEMM, KIND_LM_HEAD } fast_kind;

typedef struct fast_case {
    fast_kind kind;
    uint32_t m, n, k;
    mg_mlx_linear w[2]; /* the MLX layers (gate and up for KIND_GATE_UP) */
    mg_devptr weight, x, y, y2, scratch;
} fast_case;

static mg_status body(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    fast_case *c = arg;
    switch (c->kind) {
    case KIND_GEMV:
        return mg_mlx_gemv(b->backend, b->stream, &c->w[0], 0, c->m, c->x, c->y);
    case KIND_GATE_UP:
        return mg_mlx_gemv_gate_up(b->backend, b->stream, &c->w[0], &c->w[1], 0, c->m, c->x, c->y,
                                   c->y2);
    case KIND_MLX_GEMM:
        return mg_mlx_gemm(b->backend, b->stream, &c->w[0], 0, c->m, c->x, c->y, c->scratch);
    case KIND_LM_HEAD:
        return mg_gemm_bf16(b->backend, b->stream, c->m, c->n, c->k, c->x, c->weight, c->y,
                            MG_DTYPE_F32, c->n);
    }
    return MG_ERR_INVALID_ARGUMENT;
}

/* A 4-bit group-32 layer with finite FP16 scales and biases (random codes). */
static mg_status make_layer(mg_bench *b, uint32_t n, uint32_t k, mg_mlx_linear *w) {
    *w = (mg_mlx_linear){
        .experts = 1, .n = n, .k = k, .bits = 4, .group_size = 32, .scale_type = MG_DTYPE_F16};
    size_t words = (size_t)n * k / 2, groups = (size_t)n * (k / 32) * 2;
    uint16_t *h = malloc(groups);
    if (!h)
        return MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < groups / 2; i++)
        h[i] = (uint16_t)(0x2000 + (i * 2654435761u >> 22)); /* about 0.008 .. 0.06 */
    mg_status st;
    if (!(st = mg_alloc(b->backend, words, &w->weight)) &&
        !(st = mg_bench_fill_random_device(b, w->weight, words, n)) &&
        !(st = mg_alloc(b->backend, groups, &w->scales)) &&
        !(st = mg_alloc(b->backend, groups, &w->biases)) &&
        !(st = mg_copy_h2d(b->backend, w->scales, h, groups)))
        st = mg_copy_h2d(b->backend, w->biases, h, groups);
    free(h);
    return st;
}

static int run_case(mg_bench *b, const char *label, fast_kind kind, uint32_t m, uint32_t n,
                    uint32_t k, double copy_gbps) {
    const bool gemm_op = kind == KIND_LM_HEAD;
    const mg_op op = gemm_op ? MG_OP_GEMM_BF16 : MG_OP_MLX_QUANT;
    const char *names[8];
    size_t count = mg_op_providers(op, MG_BACKEND_CPU, names, 8);
    /* the BF16 GEMM's kernel-by-name provider, after its reference, runs the reference's code
     * on the CPU: not timed twice, and the reference stays the last timed */
    if (gemm_op && count > 1 && count <= 8 && !strcmp(names[count - 1], "kernels"))
        count--;
    int failures = 0;
    for (size_t p = 0; p < count && p < 8; p++) {
        char name[48], shape[24];
        snprintf(shape, sizeof shape, "%ux%ux%u", m, n, k);
        snprintf(name, sizeof name, "%s.%s", label, names[p]);
        if (!mg_bench_selected(b, name) ||
            !mg_op_provider_available(b->backend, op, names[p], NULL, 0))
            continue;
        /* the MLX GEMM's own GEMM runs on the matching GEMM provider, or the automatic one
         * where the GEMM has none of that name (cpu_avx512) */
        const bool reference = p + 1 == count;
        const char *gemm_provider =
            gemm_op     ? names[p]
            : reference ? "reference"
                        : (mg_op_provider_available(b->backend, MG_OP_GEMM_BF16, names[p], NULL, 0)
                               ? names[p]
                               : NULL);
        fast_case c = {.kind = kind, .m = m, .n = n, .k = k};
        mg_bench_row row = mg_bench_row_make("cpu_fast", name, shape);
        const size_t act = (size_t)m * k * 2, out = (size_t)m * n * (gemm_op ? 4 : 2);
        double bytes;
        mg_status st;
        if ((st = mg_op_force_provider(b->backend, op, names[p])) ||
            (st = mg_op_force_provider(b->backend, MG_OP_GEMM_BF16, gemm_provider)) ||
            (st = mg_alloc(b->backend, act, &c.x)) ||
            (st = mg_bench_fill_unit(b, c.x, act / 2, false, 1)) ||
            (st = mg_alloc(b->backend, out, &c.y)) || (st = mg_alloc(b->backend, out, &c.y2)))
            goto done;
        if (gemm_op) {
            if ((st = mg_alloc(b->backend, (size_t)n * k * 2, &c.weight)) ||
                (st = mg_bench_fill_unit(b, c.weight, (size_t)n * k, false, 2)))
                goto done;
            bytes = (double)n * k * 2;
        } else {
            if ((st = make_layer(b, n, k, &c.w[0])) ||
                (kind == KIND_GATE_UP && (st = make_layer(b, n, k, &c.w[1]))))
                goto done;
            bytes = (kind == KIND_GATE_UP ? 2.0 : 1.0) * (mg_mlx_linear_bytes(&c.w[0]));
            if (kind == KIND_MLX_GEMM) {
                if ((st = mg_alloc(b->backend, mg_mlx_gemm_scratch_bytes(&c.w[0]), &c.scratch)))
                    goto done;
                bytes += 2.0 * n * k * 2; /* the dequant writes and the GEMM reads BF16 weights */
            }
        }
        bytes += (double)act + (kind == KIND_GATE_UP ? 2.0 : 1.0) * (double)out;
        if ((st = body(b, &c, 0)) || (st = mg_stream_synchronize(b->stream)))
            goto done;
        int iters = reference ? (b->iters / 20 > 2 ? b->iters / 20 : 2) : b->iters;
        if ((st = mg_bench_time_events(b, body, &c, reference ? 1 : b->warmup, iters, &row.stats)))
            goto done;
        snprintf(row.timing, sizeof row.timing, "events");
        row.bytes = bytes;
        row.flops = (kind == KIND_GATE_UP ? 2.0 : 1.0) * 2.0 * m * n * k;
        double gbps = row.stats.median_us > 0 ? bytes / (row.stats.median_us * 1e3) : 0;
        snprintf(row.note, sizeof row.note, "%.2f of copy bw (%.1f GB/s)",
                 copy_gbps > 0 ? gbps / copy_gbps : 0, copy_gbps);
        mg_bench_add(b, &row);
    done:
        mg_op_force_provider(b->backend, op, NULL);
        mg_op_force_provider(b->backend, MG_OP_GEMM_BF16, NULL);
        mg_devptr all[] = {c.weight,      c.x,           c.y,           c.y2,
                           c.scratch,     c.w[0].weight, c.w[0].scales, c.w[0].biases,
                           c.w[1].weight, c.w[1].scales, c.w[1].biases};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i])
                mg_free(b->backend, all[i]);
        if (st) {
            char what[160];
            snprintf(what, sizeof what, "cpu_fast %s %s: %s", name, shape, mg_last_error());
            failures += mg_bench_fail(b, what);
        }
    }
    return failures;
}

static int bench_cpu_fast(mg_bench *b, int argc, char **argv) {
    (void)argc;
    (void)argv;
    double copy_gbps = 0;
    if (mg_bench_copy_bandwidth(b, (size_t)(b->quick ? 64 : 256) << 20, &copy_gbps))
        return mg_bench_fail(b, "cpu_fast: copy bandwidth");
    static const struct {
        const char *label;
        uint32_t n, k;
    } layers[] = {{"q_o", 576, 576}, {"kv", 384, 576}, {"down", 576, 1536}};
    int failures = 0;
    for (size_t i = 0; i < (b->quick ? 1 : 3); i++) {
        char label[32];
        snprintf(label, sizeof label, "gemv_%s", layers[i].label);
        failures += run_case(b, label, KIND_GEMV, 1, layers[i].n, layers[i].k, copy_gbps);
        snprintf(label, sizeof label, "mlx_gemm_%s", layers[i].label);
        failures += run_case(b, label, KIND_MLX_GEMM, 37, layers[i].n, layers[i].k, copy_gbps);
    }
    if (!b->quick) {
        failures += run_case(b, "gate_up", KIND_GATE_UP, 1, 1536, 576, copy_gbps);
        failures += run_case(b, "mlx_gemm_gate_up", KIND_MLX_GEMM, 37, 3072, 576, copy_gbps);
        failures += run_case(b, "lm_head", KIND_LM_HEAD, 1, 49152, 576, copy_gbps);
        failures += run_case(b, "lm_head", KIND_LM_HEAD, 37, 49152, 576, copy_gbps);
    }
    return failures;
}

MG_BENCH_REGISTER(
    cpu_fast, "cpu_fast",
    "CPU providers (reference, AVX-512, AVX2, portable) of the MLX 4-bit GEMV/GEMM and the "
    "BF16 GEMM on SmolLM2-135M's shapes: GB/s against the copy bandwidth",
    bench_cpu_fast)
