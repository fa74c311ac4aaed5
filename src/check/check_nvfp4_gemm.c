/* check_nvfp4_gemm.c - the "nvfp4_gemm" checks: the NVFP4 GEMMs of metrale/ops_nvfp4.h on the
 * backend under test against the CPU reference backend (weights decoded exactly, FP64 sums),
 * on random canonical weights of awkward shapes, outputs poisoned first: the re-layout bit for
 * bit, dense and fused gate_up at several M, the grouped GEMM with skewed and empty experts
 * and a random gather, its graph replayed with a new routing, and refused arguments; and
 * shapes the native Blackwell FP4 provider takes, against a reference whose activation is
 * quantized the same way when that provider runs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "metrale/ops.h"
#include "metrale/ops_nvfp4.h"

typedef struct nv_weight {
    uint32_t experts, n, k;
    mg_devptr values[2], scales[2], global[2]; /* [0] backend under test, [1] reference */
} nv_weight;

typedef struct nv_state {
    uint64_t rng;
} nv_state;

static uint32_t rnd(nv_state *st, uint32_t bound) {
    return (uint32_t)(mg_check_rng_next(&st->rng) % bound);
}

/* Random canonical weights, prepared on both backends. Scales: mostly normal E4M3 in
 * [2^-4, 1], some zero and subnormal. */
static mg_status make_weight(mg_check_ctx *ctx, nv_state *st, uint32_t experts, uint32_t n,
                             uint32_t k, nv_weight *w) {
    memset(w, 0, sizeof *w);
    w->experts = experts, w->n = n, w->k = k;
    size_t rows = (size_t)experts * n, code_bytes = rows * k / 2, scale_bytes = rows * k / 16;
    uint8_t *codes = malloc(code_bytes), *scales = malloc(scale_bytes);
    float *global = malloc(experts * sizeof *global);
    mg_status s = codes && scales && global ? MG_OK : MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; !s && i < code_bytes; i++)
        codes[i] = (uint8_t)rnd(st, 256);
    for (size_t i = 0; !s && i < scale_bytes; i++) {
        uint32_t r = rnd(st, 40);
        scales[i] = (uint8_t)(r == 0 ? 0 : r == 1 ? 1 + rnd(st, 7) : 0x28 + rnd(st, 0x20));
    }
    for (uint32_t e = 0; !s && e < experts; e++)
        global[e] = (float)ldexp(1.0 + rnd(st, 100) / 100.0, -3);
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    size_t vb = mg_nvfp4_prepared_value_bytes(n, k) * experts;
    size_t sb = mg_nvfp4_prepared_scale_bytes(n, k) * experts;
    for (int i = 0; i < 2 && !s; i++) {
        mg_devptr dc = 0, ds = 0;
        if (!(s = mg_check_upload(bs[i], codes, code_bytes, &dc)) &&
            !(s = mg_check_upload(bs[i], scales, scale_bytes, &ds)) &&
            !(s = mg_check_upload(bs[i], global, experts * 4, &w->global[i])) &&
            !(s = mg_check_alloc_poisoned(bs[i], vb, &w->values[i])) &&
            !(s = mg_check_alloc_poisoned(bs[i], sb, &w->scales[i])))
            s = mg_nvfp4_prepare(bs[i], NULL, n, k, experts, dc, ds, w->values[i], w->scales[i]);
        mg_free(bs[i], dc);
        mg_free(bs[i], ds);
    }
    free(codes);
    free(scales);
    free(global);
    return s;
}

/* Frees buffers held on both backends: pairs[j][0] on the one under test, [1] on the reference. */
static void free_pairs(mg_check_ctx *ctx, mg_devptr *const pairs[], size_t count) {
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    for (size_t j = 0; j < count; j++)
        for (int i = 0; i < 2; i++)
            mg_free(bs[i], pairs[j][i]);
}

static void free_weight(mg_check_ctx *ctx, nv_weight *w) {
    mg_devptr *const pairs[] = {w->values, w->scales, w->global};
    free_pairs(ctx, pairs, 3);
}

static mg_nvfp4_weight weight_on(const nv_weight *w, int i) {
    return (mg_nvfp4_weight){w->values[i], w->scales[i], w->global[i]};
}

/* Both outputs [rows, ldc] read back; columns past n must keep the poison; values within BF16
 * rounding plus FP32 accumulation of the reference. Returns the worst relative error, or -1
 * with `why` written on a mismatch. */
static double compare_outputs(mg_check_ctx *ctx, mg_devptr got, mg_devptr want, uint32_t rows,
                              uint32_t n, uint32_t ldc, char *why, size_t why_bytes) {
    size_t count = (size_t)rows * ldc;
    uint16_t *a = malloc(count * 2), *b = malloc(count * 2);
    double worst = 0;
    if (!a || !b || mg_copy_d2h(ctx->backend, a, got, count * 2) ||
        mg_copy_d2h(ctx->reference, b, want, count * 2)) {
        snprintf(why, why_bytes, "reading the outputs back: %s", mg_last_error());
        worst = -1;
        goto out;
    }
    double scale = 1e-30;
    for (size_t i = 0; i < count; i++)
        if (i % ldc < n)
            scale = fmax(scale, fabs(mg_bf16_to_f32(b[i])));
    for (size_t i = 0; i < count; i++) {
        uint32_t r = (uint32_t)(i / ldc), j = (uint32_t)(i % ldc);
        if (j >= n) {
            if (a[i] != (uint16_t)(MG_CHECK_POISON | MG_CHECK_POISON << 8)) {
                snprintf(why, why_bytes, "out[%u, %u] past n=%u was written", r, j, n);
                worst = -1;
                goto out;
            }
            continue;
        }
        double x = mg_bf16_to_f32(a[i]), y = mg_bf16_to_f32(b[i]);
        double err = fabs(x - y) / (fabs(y) + 0.02 * scale);
        if (!(err <= 0.02)) {
            snprintf(why, why_bytes, "out[%u, %u] = %g, reference %g", r, j, x, y);
            worst = -1;
            goto out;
        }
        worst = fmax(worst, err);
    }
out:
    free(a);
    free(b);
    return worst;
}

static uint16_t *random_act(nv_state *st, size_t count) {
    uint16_t *a = malloc(count * 2);
    for (size_t i = 0; a && i < count; i++)
        a[i] = mg_f32_to_bf16(((float)rnd(st, 2001) - 1000.0f) / 500.0f);
    return a;
}

static void check_prepare(mg_check_ctx *ctx, mg_check_result *result) {
    nv_state st = {mg_check_rng_seed(ctx, "nvfp4_gemm/prepare")};
    nv_weight w = {0};
    uint8_t *a = NULL, *b = NULL;
    OK(make_weight(ctx, &st, 3, 37, 272, &w));
    size_t vb = mg_nvfp4_prepared_value_bytes(37, 272) * 3;
    a = malloc(vb);
    b = malloc(vb);
    EXPECT(a && b, "no host memory");
    OK(mg_copy_d2h(ctx->backend, a, w.values[0], vb));
    OK(mg_copy_d2h(ctx->reference, b, w.values[1], vb));
    EXPECT(memcmp(a, b, vb) == 0, "prepared codes differ from the CPU reference");
    size_t sb = mg_nvfp4_prepared_scale_bytes(37, 272) * 3;
    OK(mg_copy_d2h(ctx->backend, a, w.scales[0], sb));
    OK(mg_copy_d2h(ctx->reference, b, w.scales[1], sb));
    EXPECT(memcmp(a, b, sb) == 0, "prepared scales differ from the CPU reference");
    snprintf(result->detail, sizeof result->detail, "3 experts of 37x272: bit-identical");
    PASS();
done:
    free(a);
    free(b);
    free_weight(ctx, &w);
}

/* Dense (and gate_up) at M = 1, 3, 17, 130 against the reference. */
static void run_dense(mg_check_ctx *ctx, mg_check_result *result, bool gate_up) {
    nv_state st = {mg_check_rng_seed(ctx, gate_up ? "nvfp4_gemm/gate_up" : "nvfp4_gemm/dense")};
    static const uint32_t ms[] = {1, 3, 17, 130};
    const uint32_t n = 136, k = 528, ldc = 139;
    nv_weight g = {0}, u = {0};
    mg_devptr act[2] = {0}, out[2] = {0};
    uint16_t *host = NULL;
    double worst = 0;
    char why[160];
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    OK(make_weight(ctx, &st, 1, n, k, &g));
    if (gate_up)
        OK(make_weight(ctx, &st, 1, n, k, &u));
    host = random_act(&st, (size_t)130 * k);
    EXPECT(host, "no host memory");
    for (int i = 0; i < 2; i++) {
        OK(mg_check_upload(bs[i], host, (size_t)130 * k * 2, &act[i]));
        OK(mg_check_alloc_poisoned(bs[i], (size_t)130 * ldc * 2, &out[i]));
    }
    for (size_t c = 0; c < sizeof ms / sizeof ms[0]; c++) {
        for (int i = 0; i < 2; i++) {
            OK(mg_memset(bs[i], out[i], MG_CHECK_POISON, (size_t)130 * ldc * 2));
            mg_nvfp4_weight wg = weight_on(&g, i), wu = gate_up ? weight_on(&u, i) : wg;
            if (gate_up)
                OK(mg_nvfp4_gemm_gate_up(bs[i], NULL, ms[c], n, k, act[i], k, &wg, &wu, out[i],
                                         ldc));
            else
                OK(mg_nvfp4_gemm(bs[i], NULL, ms[c], n, k, act[i], k, &wg, out[i], ldc));
        }
        double err = compare_outputs(ctx, out[0], out[1], ms[c], n, ldc, why, sizeof why);
        EXPECT(err >= 0, "m=%u: %s", ms[c], why);
        worst = fmax(worst, err);
    }
    result->error = worst;
    snprintf(result->detail, sizeof result->detail, "m = 1, 3, 17, 130 of %ux%u (ldc %u)", n, k,
             ldc);
    PASS();
done:
    free(host);
    for (int i = 0; i < 2; i++) {
        mg_free(bs[i], act[i]);
        mg_free(bs[i], out[i]);
    }
    free_weight(ctx, &g);
    if (gate_up)
        free_weight(ctx, &u);
}

static void check_dense(mg_check_ctx *ctx, mg_check_result *result) {
    run_dense(ctx, result, false);
}

static void check_gate_up(mg_check_ctx *ctx, mg_check_result *result) {
    run_dense(ctx, result, true);
}

/* A skewed routing: expert 0 hot, expert 1 empty, the rest random; a random gather. */
static void routing(nv_state *st, uint32_t experts, uint32_t rows, uint32_t tokens,
                    int32_t *offsets, int32_t *ids) {
    uint32_t count[16] = {0};
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t e = rnd(st, 2) ? 0 : rnd(st, experts);
        count[e == 1 ? 2 : e]++;
    }
    offsets[0] = 0;
    for (uint32_t e = 0; e < experts; e++)
        offsets[e + 1] = offsets[e] + (int32_t)count[e];
    for (uint32_t r = 0; r < rows; r++)
        ids[r] = (int32_t)rnd(st, tokens);
}

/* The buffers of a grouped check on both backends, and the host routing they are filled from. */
typedef struct nv_moe_io {
    mg_devptr act[2], out[2], off[2], ids[2];
    int32_t *offsets, *token_ids;
} nv_moe_io;

/* Captures the plain grouped GEMM on `s` (backend under test), uploads a new routing to both
 * backends, replays the graph and compares with the reference; false (result failed) if not. */
static bool replay_new_routing(mg_check_ctx *ctx, mg_check_result *result, nv_state *st,
                               mg_stream *s, const mg_nvfp4_moe_desc *d, const nv_weight *g,
                               nv_moe_io *io, double *worst) {
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    mg_graph *graph = NULL;
    char why[160];
    bool ok = false;
    mg_nvfp4_moe_tensors t = {io->act[0],      io->ids[0], io->off[0],
                              weight_on(g, 0), NULL,       io->out[0]};
    mg_nvfp4_moe_tensors r = {io->act[1],      io->ids[1], io->off[1],
                              weight_on(g, 1), NULL,       io->out[1]};
    OK(mg_graph_begin_capture(s));
    mg_status cs = mg_nvfp4_moe_gemm(ctx->backend, s, d, &t);
    mg_status es = mg_graph_end_capture(s, &graph);
    OK(cs);
    OK(es);
    routing(st, d->experts, d->rows, d->act_rows, io->offsets, io->token_ids);
    for (int i = 0; i < 2; i++) {
        OK(mg_copy_h2d(bs[i], io->off[i], io->offsets, ((size_t)d->experts + 1) * 4));
        OK(mg_copy_h2d(bs[i], io->ids[i], io->token_ids, (size_t)d->rows * 4));
        OK(mg_memset(bs[i], io->out[i], MG_CHECK_POISON, (size_t)d->rows * d->n * 2));
    }
    OK(mg_graph_launch(graph, s));
    OK(mg_stream_synchronize(s));
    OK(mg_nvfp4_moe_gemm(ctx->reference, NULL, d, &r));
    double err = compare_outputs(ctx, io->out[0], io->out[1], d->rows, d->n, d->n, why, sizeof why);
    EXPECT(err >= 0, "graph replay with a new routing: %s", why);
    *worst = fmax(*worst, err);
    ok = true;
done:
    if (graph)
        mg_graph_destroy(graph);
    return ok;
}

static void free_moe_io(mg_check_ctx *ctx, nv_moe_io *io) {
    mg_devptr *const pairs[] = {io->act, io->out, io->off, io->ids};
    free_pairs(ctx, pairs, 4);
}

/* The grouped GEMM, plain then gate_up, on both backends (the one under test on `s`; NULL: its
 * default stream), compared; false (result failed) on a mismatch. */
static bool grouped_both(mg_check_ctx *ctx, mg_check_result *result, mg_stream *s,
                         const mg_nvfp4_moe_desc *d, const nv_weight *g, const nv_weight *u,
                         nv_moe_io *io, double *worst) {
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    const size_t out_bytes = (size_t)d->rows * d->n * 2;
    char why[160];
    for (int fused = 0; fused < 2; fused++) {
        for (int i = 0; i < 2; i++) {
            mg_nvfp4_weight wu = weight_on(u, i);
            mg_nvfp4_moe_tensors t = {io->act[i],      io->ids[i],         io->off[i],
                                      weight_on(g, i), fused ? &wu : NULL, io->out[i]};
            OK(mg_memset(bs[i], io->out[i], MG_CHECK_POISON, out_bytes));
            OK(mg_nvfp4_moe_gemm(bs[i], i ? NULL : s, d, &t));
        }
        if (s)
            OK(mg_stream_synchronize(s));
        double err =
            compare_outputs(ctx, io->out[0], io->out[1], d->rows, d->n, d->n, why, sizeof why);
        EXPECT(err >= 0, "grouped %s: %s", fused ? "gate_up" : "plain", why);
        *worst = fmax(*worst, err);
    }
    return true;
done:
    return false;
}

static void check_moe(mg_check_ctx *ctx, mg_check_result *result) {
    nv_state st = {mg_check_rng_seed(ctx, "nvfp4_gemm/moe")};
    const uint32_t experts = 6, tokens = 23, rows = 46, n = 40, k = 288;
    nv_weight g = {0}, u = {0};
    int32_t offsets[7], token_ids[46];
    nv_moe_io io = {.offsets = offsets, .token_ids = token_ids};
    uint16_t *host = NULL;
    mg_stream *s = NULL;
    double worst = 0;
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    OK(make_weight(ctx, &st, experts, n, k, &g));
    OK(make_weight(ctx, &st, experts, n, k, &u));
    host = random_act(&st, (size_t)tokens * k);
    EXPECT(host, "no host memory");
    routing(&st, experts, rows, tokens, offsets, token_ids);
    for (int i = 0; i < 2; i++) {
        OK(mg_check_upload(bs[i], host, (size_t)tokens * k * 2, &io.act[i]));
        OK(mg_check_alloc_poisoned(bs[i], (size_t)rows * n * 2, &io.out[i]));
        OK(mg_check_upload(bs[i], offsets, sizeof offsets, &io.off[i]));
        OK(mg_check_upload(bs[i], token_ids, sizeof token_ids, &io.ids[i]));
    }
    mg_nvfp4_moe_desc d = {.experts = experts, .rows = rows, .act_rows = tokens, .n = n, .k = k};
    if (!grouped_both(ctx, result, NULL, &d, &g, &u, &io, &worst))
        goto done;
    /* Captured on the backend under test, replayed after a new routing was uploaded. */
    OK(mg_stream_create(ctx->backend, &s));
    if (!replay_new_routing(ctx, result, &st, s, &d, &g, &io, &worst))
        goto done;
    result->error = worst;
    snprintf(result->detail, sizeof result->detail,
             "%u experts (one empty, one hot), %u rows gathered from %u tokens, plain and gate_up, "
             "graph replay with a new routing",
             experts, rows, tokens);
    PASS();
done:
    if (s)
        mg_stream_destroy(s);
    free(host);
    free_moe_io(ctx, &io);
    free_weight(ctx, &g);
    free_weight(ctx, &u);
}

/* ------------------------------------------------------------------ the Blackwell path */

/* Whether this backend runs the native FP4 provider (a device of compute capability 10.0 or
 * 12.0 with the CUTLASS plugin's Blackwell kernels): there the activation is quantized to NVFP4
 * per call (metrale/ops_nvfp4.h). */
static bool native_fp4(mg_check_ctx *ctx) {
    return mg_op_provider_available(ctx->backend, MG_OP_NVFP4_GEMM, "cutlass_blackwell", NULL, 0);
}

/* The activation as the reference multiplies it: uploaded as is, or, on the native FP4 path,
 * quantized by the rule of metrale/nvfp4.h with the global amax / 2688 of the whole tensor and
 * decoded back to BF16 (what the tensor cores read, up to that last rounding). */
static mg_status reference_act(mg_check_ctx *ctx, const uint16_t *host, uint32_t rows, uint32_t k,
                               bool quantized, mg_devptr *out) {
    mg_backend *r = ctx->reference;
    mg_status s = mg_check_upload(r, host, (size_t)rows * k * 2, out);
    if (s || !quantized)
        return s;
    float global = mg_nvfp4_global_scale(host, rows, k, 0);
    mg_devptr g = 0, packed = 0, scales = 0;
    if (!(s = mg_check_upload(r, &global, sizeof global, &g)) &&
        !(s = mg_check_alloc_poisoned(r, mg_nvfp4_packed_bytes(rows, k), &packed)) &&
        !(s = mg_check_alloc_poisoned(r, mg_nvfp4_scale_bytes(rows, k), &scales)) &&
        !(s = mg_nvfp4_quantize(r, NULL, rows, k, 0, *out, g, packed, scales)))
        s = mg_nvfp4_dequantize(r, NULL, rows, k, packed, scales, g, MG_DTYPE_BF16, *out);
    mg_free(r, g);
    mg_free(r, packed);
    mg_free(r, scales);
    return s;
}

/* Shapes the native FP4 provider takes (n a multiple of 128, k of 32; elsewhere the usual
 * providers): dense and gate_up at several M with ldc > n, then the grouped GEMM with an empty
 * expert and a gather, plain and gate_up, and its graph replayed with a new routing. */
static void check_native_shapes(mg_check_ctx *ctx, mg_check_result *result) {
    nv_state st = {mg_check_rng_seed(ctx, "nvfp4_gemm/native_shapes")};
    static const uint32_t ms[] = {1, 37, 130};
    const uint32_t n = 256, k = 544, ldc = 264, experts = 5, tokens = 19, rows = 41;
    const uint32_t mn = 128, mk = 288; /* per expert */
    const bool quantized = native_fp4(ctx);
    nv_weight g = {0}, u = {0}, mg = {0}, mu = {0};
    int32_t offsets[6], token_ids[41];
    nv_moe_io io = {.offsets = offsets, .token_ids = token_ids};
    uint16_t *host = NULL;
    mg_stream *s = NULL;
    char why[160];
    double worst = 0;
    mg_backend *bs[2] = {ctx->backend, ctx->reference};
    OK(make_weight(ctx, &st, 1, n, k, &g));
    OK(make_weight(ctx, &st, 1, n, k, &u));
    host = random_act(&st, (size_t)130 * k);
    EXPECT(host, "no host memory");
    OK(mg_check_upload(bs[0], host, (size_t)130 * k * 2, &io.act[0]));
    for (int i = 0; i < 2; i++)
        OK(mg_check_alloc_poisoned(bs[i], (size_t)130 * ldc * 2, &io.out[i]));
    for (size_t c = 0; c < sizeof ms / sizeof ms[0]; c++) {
        /* The activation's global scale is that of the rows multiplied. */
        OK(reference_act(ctx, host, ms[c], k, quantized, &io.act[1]));
        for (int fused = 0; fused < 2; fused++) {
            for (int i = 0; i < 2; i++) {
                OK(mg_memset(bs[i], io.out[i], MG_CHECK_POISON, (size_t)130 * ldc * 2));
                mg_nvfp4_weight wg = weight_on(&g, i), wu = weight_on(&u, i);
                if (fused)
                    OK(mg_nvfp4_gemm_gate_up(bs[i], NULL, ms[c], n, k, io.act[i], k, &wg, &wu,
                                             io.out[i], ldc));
                else
                    OK(mg_nvfp4_gemm(bs[i], NULL, ms[c], n, k, io.act[i], k, &wg, io.out[i], ldc));
            }
            double err = compare_outputs(ctx, io.out[0], io.out[1], ms[c], n, ldc, why, sizeof why);
            EXPECT(err >= 0, "%s m=%u: %s", fused ? "gate_up" : "dense", ms[c], why);
            worst = fmax(worst, err);
        }
        mg_free(bs[1], io.act[1]);
        io.act[1] = 0;
    }
    free_moe_io(ctx, &io);
    memset(io.act, 0, sizeof io.act);
    memset(io.out, 0, sizeof io.out);

    /* Grouped, on a created stream: the plain and gate_up calls size its workspace, so the
     * capture that follows allocates nothing. */
    OK(make_weight(ctx, &st, experts, mn, mk, &mg));
    OK(make_weight(ctx, &st, experts, mn, mk, &mu));
    routing(&st, experts, rows, tokens, offsets, token_ids);
    OK(mg_check_upload(bs[0], host, (size_t)tokens * mk * 2, &io.act[0]));
    OK(reference_act(ctx, host, tokens, mk, quantized, &io.act[1]));
    for (int i = 0; i < 2; i++) {
        OK(mg_check_alloc_poisoned(bs[i], (size_t)rows * mn * 2, &io.out[i]));
        OK(mg_check_upload(bs[i], offsets, sizeof offsets, &io.off[i]));
        OK(mg_check_upload(bs[i], token_ids, sizeof token_ids, &io.ids[i]));
    }
    mg_nvfp4_moe_desc d = {.experts = experts, .rows = rows, .act_rows = tokens, .n = mn, .k = mk};
    OK(mg_stream_create(ctx->backend, &s));
    if (!grouped_both(ctx, result, s, &d, &mg, &mu, &io, &worst))
        goto done;
    if (!replay_new_routing(ctx, result, &st, s, &d, &mg, &io, &worst))
        goto done;
    result->error = worst;
    snprintf(result->detail, sizeof result->detail,
             "%s: dense and gate_up m = 1, 37, 130 of %ux%u (ldc %u); grouped %u experts of "
             "%ux%u, gather, graph replay",
             quantized ? "native FP4 (activation quantized)" : "BF16 activation", n, k, ldc,
             experts, mn, mk);
    PASS();
done:
    if (s)
        mg_stream_destroy(s);
    free(host);
    free_moe_io(ctx, &io);
    free_weight(ctx, &g);
    free_weight(ctx, &u);
    free_weight(ctx, &mg);
    free_weight(ctx, &mu);
}

static void check_validation(mg_check_ctx *ctx, mg_check_result *result) {
    nv_state st = {mg_check_rng_seed(ctx, "nvfp4_gemm/validation")};
    mg_backend *b = ctx->backend;
    nv_weight g = {0};
    mg_devptr act = 0, out = 0;
    OK(make_weight(ctx, &st, 1, 32, 64, &g));
    OK(mg_check_alloc_poisoned(b, 4 * 64 * 2 + 16, &act));
    OK(mg_check_alloc_poisoned(b, 4 * 32 * 2, &out));
    mg_nvfp4_weight w = weight_on(&g, 0);
    EXPECT_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 40, act, 40, &w, out, 32), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act + 2, 64, &w, out, 32),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act, 64, &w, out, 16), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_gemm(b, NULL, 5, 32, 64, act, 64, &w, out, 32), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act, 64, NULL, out, 32),
                  MG_ERR_INVALID_ARGUMENT);
    mg_nvfp4_moe_desc d = {.experts = 1, .rows = 4, .act_rows = 4, .n = 32, .k = 64};
    mg_nvfp4_moe_tensors t = {.act = act, .w = w, .out = out};
    EXPECT_STATUS(mg_nvfp4_moe_gemm(b, NULL, &d, &t), MG_ERR_INVALID_ARGUMENT);
    uint16_t probe[4];
    OK(mg_copy_d2h(b, probe, out, sizeof probe));
    EXPECT(probe[0] == (uint16_t)(MG_CHECK_POISON | MG_CHECK_POISON << 8),
           "a refused call wrote its output");
    snprintf(result->detail, sizeof result->detail,
             "K %% 16, misaligned act, ldc < n, act too small, NULL weight, NULL offsets: refused, "
             "nothing written");
    PASS();
done:
    mg_free(b, act);
    mg_free(b, out);
    free_weight(ctx, &g);
}

const mg_check_case mg_checks_nvfp4_gemm[] = {
    {"nvfp4_gemm", "prepare", check_prepare},
    {"nvfp4_gemm", "dense", check_dense},
    {"nvfp4_gemm", "gate_up", check_gate_up},
    {"nvfp4_gemm", "moe", check_moe},
    {"nvfp4_gemm", "native_shapes", check_native_shapes},
    {"nvfp4_gemm", "validation", check_validation},
    {NULL, NULL, NULL},
};
