/* bench_gemm_decode.c - `metrale-gpu bench gemm_decode`: the GEMM providers at decode sizes side
 * by side, to set the decode GEMV's automatic choice (src/ops/gemm/gemm_decode_gemv_cuda.c). For
 * each kind (BF16, FP8 row-wise, FP8 per-tensor), shape and M it times every GPU provider forced by
 * name ("decode_gemv", "cublaslt") and the automatic choice ("auto"), under graph replay of one
 * GEMM per weight of a rotation larger than L2, as a model's decode step streams its layers.
 * GB/s count weight bytes; the note gives them as a fraction of the device-to-device copy
 * bandwidth measured in the same run.
 *
 * Shapes (N x K): the Llama-3-8B projections (fused QKV 6144x4096, O 4096x4096, fused gate+up
 * 28672x4096, down 4096x14336), its K/V projection alone (1024x4096) and LM head
 * (128256x4096), and SmolLM2-135M's (576x576, 3072x576, 576x1536). Options: --m LIST (default
 * 1,2,4,8,16), --only SUBSTRING on the case name, --quick (M 1 and 16, two shapes). */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"

typedef struct decode_case {
    mg_gemm_kind kind;
    uint32_t m, n, k;
    mg_devptr act, out, act_scale, weight_scale;
    mg_bench_rotation weights;
} decode_case;

static mg_status body(mg_bench *b, void *arg, int iteration) {
    decode_case *c = arg;
    mg_gemm_plan plan = {
        .kind = c->kind, .m = c->m, .n = c->n, .k = c->k, .ldc = c->n, .out_type = MG_DTYPE_BF16};
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->weights.count; i++) {
        mg_gemm_tensors t = {
            .act = c->act,
            .weight = mg_bench_rotation_get(&c->weights, iteration * c->weights.count + i),
            .out = c->out,
            .act_scale = c->act_scale,
            .weight_scale = c->weight_scale};
        st = mg_gemm(b->backend, b->stream, &plan, &t);
    }
    return st;
}

/* Times one provider ("auto": the automatic choice) on `c`; 1 on failure. */
static int time_one(mg_bench *b, decode_case *c, const char *provider, double copy_gbps) {
    const mg_gemm_kind_info *kind = mg_gemm_kind_describe(c->kind);
    char name[48], shape[64];
    snprintf(name, sizeof name, "%s_%s", kind->name, provider);
    snprintf(shape, sizeof shape, "%ux%ux%u", c->m, c->n, c->k);
    if (!mg_bench_selected(b, name))
        return 0;
    mg_status st = mg_op_force_provider(b->backend, kind->op, provider);
    if (!st)
        st = body(b, c, 0); /* plans the shape outside the capture */
    if (!st)
        st = mg_stream_synchronize(b->stream);
    mg_bench_row row = mg_bench_row_make("gemm_decode", name, shape);
    if (!st)
        st = mg_bench_time_graph(b, body, c, b->warmup, b->iters, &row.stats);
    mg_op_stats stats;
    if (!st)
        st = mg_op_stats_get(b->backend, kind->op, &stats);
    mg_op_force_provider(b->backend, kind->op, NULL);
    if (st) {
        char what[128];
        snprintf(what, sizeof what, "gemm_decode %s %s", name, shape);
        return mg_bench_fail(b, what);
    }
    double weight_bytes = (double)c->n * c->k * mg_dtype_bytes(kind->input_type);
    snprintf(row.timing, sizeof row.timing, "graph");
    row.bytes = c->weights.count * weight_bytes;
    row.flops = c->weights.count * 2.0 * c->m * c->n * c->k;
    row.items = c->weights.count;
    snprintf(row.item_unit, sizeof row.item_unit, "gemm");
    char suffix[48];
    snprintf(suffix, sizeof suffix, "; ran %s", stats.provider);
    mg_bench_note_weights(&row, copy_gbps, suffix);
    mg_bench_add(b, &row);
    return 0;
}

static int run_shape(mg_bench *b, mg_gemm_kind kind, uint32_t m, uint32_t n, uint32_t k,
                     double copy_gbps) {
    size_t in_bytes = mg_dtype_bytes(mg_gemm_kind_describe(kind)->input_type);
    decode_case c = {.kind = kind, .m = m, .n = n, .k = k};
    mg_status st;
    int failures = 0;
    if ((st = mg_alloc(b->backend, (size_t)m * k * in_bytes, &c.act)) ||
        (st = mg_bench_fill_unit(b, c.act, (size_t)m * k, kind != MG_GEMM_BF16, 7)) ||
        (st = mg_alloc(b->backend, (size_t)m * n * 2, &c.out)) ||
        (st = mg_bench_rotation_create(b, (size_t)n * k * in_bytes, 4, &c.weights)))
        goto done;
    for (int i = 0; !st && i < c.weights.count; i++)
        st =
            mg_bench_fill_unit(b, c.weights.buffers[i], (size_t)n * k, kind != MG_GEMM_BF16, 8 + i);
    if (!st && kind != MG_GEMM_BF16) {
        size_t count = kind == MG_GEMM_FP8_ROWWISE ? (m > n ? m : n) : 1;
        float ones[4] = {1, 1, 1, 1};
        if ((st = mg_alloc(b->backend, count * 4 < 16 ? 16 : count * 4, &c.act_scale)) ||
            (st = mg_alloc(b->backend, count * 4 < 16 ? 16 : count * 4, &c.weight_scale)))
            goto done;
        for (size_t i = 0; !st && i < count; i += 4) {
            size_t bytes = (count - i < 4 ? count - i : 4) * 4;
            if (!(st = mg_copy_h2d(b->backend, c.act_scale + i * 4, ones, bytes)))
                st = mg_copy_h2d(b->backend, c.weight_scale + i * 4, ones, bytes);
        }
    }
    if (st)
        goto done;
    static const char *const providers[] = {"decode_gemv", "cublaslt", "auto"};
    for (size_t p = 0; p < 3; p++)
        failures += time_one(b, &c, providers[p], copy_gbps);
done:
    if (st) {
        char what[96];
        snprintf(what, sizeof what, "gemm_decode %s %ux%ux%u setup",
                 mg_gemm_kind_describe(kind)->name, m, n, k);
        failures += mg_bench_fail(b, what);
    }
    mg_free(b->backend, c.act);
    mg_free(b->backend, c.out);
    mg_free(b->backend, c.act_scale);
    mg_free(b->backend, c.weight_scale);
    mg_bench_rotation_destroy(b, &c.weights);
    return failures;
}

static int bench_gemm_decode(mg_bench *b, int argc, char **argv) {
    static const uint32_t shapes[][2] = {{6144, 4096},  {4096, 4096}, {28672, 4096},
                                         {4096, 14336}, {1024, 4096}, {128256, 4096},
                                         {576, 576},    {3072, 576},  {576, 1536}};
    static const mg_gemm_kind kinds[] = {MG_GEMM_BF16, MG_GEMM_FP8_ROWWISE, MG_GEMM_FP8_TENSORWISE};
    if (!mg_backend_supports(b->backend, MG_CAP_GRAPHS) ||
        !mg_op_provider_available(b->backend, MG_OP_GEMM_BF16, "decode_gemv", NULL, 0)) {
        fprintf(stderr, "bench gemm_decode: needs the decode GEMV (a CUDA device); skipped\n");
        return 0;
    }
    uint32_t ms[16];
    size_t m_count = mg_bench_option_u32_list(argc, argv, "--m", ms, 16);
    if (m_count == 0) {
        m_count = b->quick ? 2 : 5;
        memcpy(ms, b->quick ? (const uint32_t[]){1, 16} : (const uint32_t[]){1, 2, 4, 8, 16},
               m_count * sizeof *ms);
    }
    double copy_gbps = 0;
    if (mg_bench_copy_bandwidth(b, (size_t)256 << 20, &copy_gbps))
        copy_gbps = 0;
    int failures = 0;
    size_t shape_count = b->quick ? 2 : sizeof shapes / sizeof shapes[0];
    for (size_t s = 0; s < shape_count; s++)
        for (size_t i = 0; i < m_count; i++)
            for (size_t v = 0; v < sizeof kinds / sizeof kinds[0]; v++)
                if (ms[i] <= 16)
                    failures +=
                        run_shape(b, kinds[v], ms[i], shapes[s][0], shapes[s][1], copy_gbps);
    return failures;
}

MG_BENCH_REGISTER(gemm_decode, "gemm_decode",
                  "GEMM providers at decode sizes (M <= 16, BF16 and FP8): decode GEMV vs "
                  "cuBLASLt vs the automatic choice, graph replay, fraction of copy bandwidth",
                  bench_gemm_decode)
