/* test_nvfp4_gemm.c - the NVFP4 GEMMs (metrale/ops_nvfp4.h) on every usable backend against a
 * float64 computation written here from the canonical weights (codes, E4M3 scales, global
 * scale), on random data of awkward sizes with outputs poisoned first: dense and fused gate_up
 * at M = 1, 3, 17, 130 and K not a multiple of the layout's 256; grouped with skewed, empty and
 * single-row experts and a random gather; on CUDA a captured grouped call replayed with a new
 * routing equals the eager call; the fused calls (mg_nvfp4_gemm_fused: RMSNorm prologue, residual
 * add, gate_up with the norm) against the float64 composition; and bad input rejected before any
 * launch. On the CPU backend both providers run: the reference ("kernels") and the fast kernel
 * ("cpu_avx2"). */
#include <math.h>
#include <stdbool.h>

#include "metrale/ops.h"
#include "metrale/ops_nvfp4.h"
#include "test_util.h"

#define POISON 0xffffu /* a BF16 NaN */

static double e2m1(unsigned code) {
    static const double magnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8) ? -magnitude[code & 7] : magnitude[code & 7];
}

/* E4M3 decoded here (not through the library): sign ignored as the op documents; NaN -> 0. */
static double e4m3(unsigned code) {
    unsigned e = (code >> 3) & 15, m = code & 7;
    if ((code & 0x7f) == 0x7f)
        return 0;
    return e ? ldexp(1 + m / 8.0, (int)e - 7) : ldexp(m / 8.0, -6);
}

static double bf16(uint16_t v) {
    union {
        uint32_t u;
        float f;
    } x = {.u = (uint32_t)v << 16};
    return x.f;
}

static uint16_t to_bf16(double v) {
    union {
        float f;
        uint32_t u;
    } x = {.f = (float)v};
    return (uint16_t)((x.u + 0x7fff + ((x.u >> 16) & 1)) >> 16);
}

/* A random canonical weight set of `experts` x n x k. */
typedef struct weights {
    uint32_t experts, n, k;
    uint8_t *codes, *scales;
    float *global;
    double *w; /* decoded, [experts * n, k] */
    mg_devptr d_codes, d_scales, values, pscales, d_global;
} weights;

static unsigned random_scale(void) {
    uint64_t r = test_rand() % 64;
    if (r == 0)
        return 0; /* zero block */
    if (r == 1)
        return (unsigned)test_rand_range(1, 7); /* subnormal */
    if (r == 2)
        return 0x7f;                              /* NaN: zero block */
    return (unsigned)test_rand_range(0x28, 0x48); /* ~0.06 .. 1 */
}

static bool make_weights(mg_backend *b, weights *W, uint32_t experts, uint32_t n, uint32_t k) {
    memset(W, 0, sizeof *W);
    W->experts = experts, W->n = n, W->k = k;
    size_t rows = (size_t)experts * n;
    W->codes = malloc(rows * k / 2);
    W->scales = malloc(rows * k / 16);
    W->global = malloc(experts * sizeof(float));
    W->w = malloc(rows * k * sizeof(double));
    test_fill_random(W->codes, rows * k / 2);
    for (size_t i = 0; i < rows * k / 16; i++)
        W->scales[i] = (uint8_t)random_scale();
    for (uint32_t e = 0; e < experts; e++)
        W->global[e] = (float)ldexp(1.0 + (double)(test_rand() % 1000) / 1000.0, -3);
    for (size_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < k; i++) {
            unsigned code = (W->codes[r * k / 2 + i / 2] >> (4 * (i % 2))) & 15;
            W->w[r * k + i] = e2m1(code) * e4m3(W->scales[r * k / 16 + i / 16]) * W->global[r / n];
        }
    size_t vb = mg_nvfp4_prepared_value_bytes(n, k) * experts;
    size_t sb = mg_nvfp4_prepared_scale_bytes(n, k) * experts;
    bool ok =
        mg_alloc(b, rows * k / 2, &W->d_codes) == MG_OK &&
        mg_alloc(b, rows * k / 16, &W->d_scales) == MG_OK && mg_alloc(b, vb, &W->values) == MG_OK &&
        mg_alloc(b, sb, &W->pscales) == MG_OK && mg_alloc(b, experts * 4, &W->d_global) == MG_OK &&
        mg_copy_h2d(b, W->d_codes, W->codes, rows * k / 2) == MG_OK &&
        mg_copy_h2d(b, W->d_scales, W->scales, rows * k / 16) == MG_OK &&
        mg_copy_h2d(b, W->d_global, W->global, experts * 4) == MG_OK &&
        mg_memset(b, W->values, 0xa5, vb) == MG_OK && mg_memset(b, W->pscales, 0xa5, sb) == MG_OK;
    CHECK(ok);
    CHECK_OK(
        mg_nvfp4_prepare(b, NULL, n, k, experts, W->d_codes, W->d_scales, W->values, W->pscales));
    return ok;
}

static void free_weights(mg_backend *b, weights *W) {
    mg_free(b, W->d_codes);
    mg_free(b, W->d_scales);
    mg_free(b, W->values);
    mg_free(b, W->pscales);
    mg_free(b, W->d_global);
    free(W->codes);
    free(W->scales);
    free(W->global);
    free(W->w);
}

static mg_nvfp4_weight weight_of(const weights *W) {
    return (mg_nvfp4_weight){W->values, W->pscales, W->d_global};
}

static bool is_cuda_backend(mg_backend *b) {
    return mg_backend_get_kind(b) == MG_BACKEND_CUDA;
}

static double silu(double x) {
    return x / (1 + exp(-x));
}

/* What a fused call adds to the comparison (mg_nvfp4_gemm_fused): `residual` [rows, ldc] added
 * to each expected output (one more BF16 rounding of the product and one of the sum), and
 * `norm_slack`: the activations are normed values (RMSNorm's BF16 rounding done here), which a
 * device may round at another point (the norm weight's product first, 1 / rms after the sum:
 * each operand one BF16 rounding from the exact value, so at most 2^-8 apart); the slack is a
 * multiple of sqrt(sum (x w)^2), the spread of such independent per-term errors. */
typedef struct fused_expect {
    const uint16_t *residual;
    double norm_slack;
} fused_expect;

/* Compares out[rows, ldc] with the float64 result; columns past n must keep the poison. */
/* `bf16_weights`: the call multiplied BF16 copies of the weights (the workspace path): each
 * weight rounded once (relative error <= 2^-9), so the sum may be off by 2^-9 of sum |x w|. */
static int compare(const char *what, const uint16_t *out, uint32_t rows, uint32_t n, uint32_t ldc,
                   const uint16_t *act, uint32_t act_pitch, const int32_t *token_of_row,
                   const int32_t *expert_of_row, const weights *gate, const weights *up,
                   bool bf16_weights, const fused_expect *fx) {
    int bad = 0;
    uint32_t k = gate->k;
    for (uint32_t r = 0; r < rows; r++) {
        const uint16_t *x = act + (size_t)(token_of_row ? token_of_row[r] : (int32_t)r) * act_pitch;
        uint32_t e = expert_of_row ? (uint32_t)expert_of_row[r] : 0;
        for (uint32_t j = 0; j < ldc; j++) {
            uint16_t got = out[(size_t)r * ldc + j];
            if (j >= n) {
                if (got != POISON && bad++ < 5)
                    fprintf(stderr, "%s: row %u column %u past n was written\n", what, r, j);
                continue;
            }
            const double *wg = gate->w + ((size_t)e * gate->n + j) * k;
            double sum = 0, mag = 0, sq = 0;
            for (uint32_t i = 0; i < k; i++) {
                sum += bf16(x[i]) * wg[i];
                mag += fabs(bf16(x[i]) * wg[i]);
                sq += bf16(x[i]) * wg[i] * bf16(x[i]) * wg[i];
            }
            const double slack = fx ? fx->norm_slack : 0.0, g_slack = slack * sqrt(sq);
            double ref = sum, extra = g_slack;
            if (up) {
                const double *wu = up->w + ((size_t)e * up->n + j) * k;
                double u = 0, umag = 0, usq = 0;
                for (uint32_t i = 0; i < k; i++) {
                    u += bf16(x[i]) * wu[i];
                    umag += fabs(bf16(x[i]) * wu[i]);
                    usq += bf16(x[i]) * wu[i] * bf16(x[i]) * wu[i];
                }
                ref = silu(sum) * u;
                mag = (mag + fabs(sum)) * (umag + fabs(u)) + 1e-30;
                const double u_slack = slack * sqrt(usq); /* silu' <= 1.1 */
                extra = (fabs(u) + u_slack) * g_slack * 1.1 + (fabs(silu(sum)) + g_slack) * u_slack;
            }
            double tol = fabs(ref) * 0.0079 + mag * (bf16_weights ? 0.002 : 5e-5) + extra + 1e-30;
            if (fx && fx->residual) { /* bf16(bf16(y) + r): two more roundings */
                const double res = bf16(fx->residual[(size_t)r * ldc + j]);
                tol += (fabs(ref) + fabs(ref + res)) * 0.0079;
                ref += res;
            }
            if (!(fabs(bf16(got) - ref) <= tol) && bad++ < 5)
                fprintf(stderr, "%s: out[%u, %u] = %g, expected %g (tol %g)\n", what, r, j,
                        bf16(got), ref, tol);
        }
    }
    CHECK(bad == 0);
    return bad;
}

/* The CPU provider a run of the CPU backend forces: the reference ("kernels") or the fast one. */
static const char *cpu_provider = "kernels";

static uint16_t *random_act(uint32_t rows, uint32_t pitch) {
    uint16_t *a = malloc((size_t)rows * pitch * 2);
    for (size_t i = 0; i < (size_t)rows * pitch; i++)
        a[i] = to_bf16(((double)(test_rand() % 20001) - 10000) / 5000.0);
    return a;
}

static void test_dense(mg_backend *b, const char *backend, uint32_t m, uint32_t n, uint32_t k,
                       bool gate_up, bool workspace) {
    char what[96];
    snprintf(what, sizeof what, "%s dense%s%s m=%u n=%u k=%u", backend, gate_up ? " gate_up" : "",
             workspace ? " workspace" : "", m, n, k);
    weights g, u;
    if (!make_weights(b, &g, 1, n, k))
        return;
    if (gate_up && !make_weights(b, &u, 1, n, k)) {
        free_weights(b, &g);
        return;
    }
    uint32_t pitch = workspace ? k : k + 8 * (uint32_t)test_rand_range(0, 2),
             ldc = n + (uint32_t)test_rand_range(0, 3);
    uint16_t *act = random_act(m, pitch);
    uint16_t *out = malloc((size_t)m * ldc * 2);
    mg_devptr d_act = 0, d_out = 0;
    CHECK_OK(mg_alloc(b, (size_t)m * pitch * 2, &d_act));
    CHECK_OK(mg_alloc(b, (size_t)m * ldc * 2, &d_out));
    CHECK_OK(mg_copy_h2d(b, d_act, act, (size_t)m * pitch * 2));
    CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)m * ldc * 2));
    mg_nvfp4_weight wg = weight_of(&g), wu;
    if (gate_up) {
        wu = weight_of(&u);
        CHECK_OK(mg_nvfp4_gemm_gate_up(b, NULL, m, n, k, d_act, pitch, &wg, &wu, d_out, ldc));
    } else if (workspace) {
        size_t bytes = mg_nvfp4_gemm_workspace_bytes(m, n, k);
        mg_devptr ws = 0;
        CHECK(bytes == (size_t)n * k * 2);
        CHECK_OK(mg_alloc(b, bytes, &ws));
        CHECK_OK(mg_nvfp4_gemm_with_workspace(b, NULL, m, n, k, d_act, pitch, &wg, d_out, ldc, ws,
                                              bytes));
        mg_op_stats st;
        CHECK_OK(mg_op_stats_get(b, MG_OP_NVFP4_GEMM, &st));
        printf("%s: provider %s\n", what, st.provider);
        CHECK(strcmp(st.provider, is_cuda_backend(b) ? "dequant_bf16_gemm" : cpu_provider) == 0);
        mg_free(b, ws);
    } else {
        CHECK_OK(mg_nvfp4_gemm(b, NULL, m, n, k, d_act, pitch, &wg, d_out, ldc));
    }
    CHECK_OK(mg_copy_d2h(b, out, d_out, (size_t)m * ldc * 2));
    compare(what, out, m, n, ldc, act, pitch, NULL, NULL, &g, gate_up ? &u : NULL,
            workspace && is_cuda_backend(b), NULL);
    /* Captured and replayed into a poisoned output: equal to the eager call, bit for bit. */
    if (is_cuda_backend(b) && !workspace) {
        mg_stream *s = NULL;
        mg_graph *graph = NULL;
        CHECK_OK(mg_stream_create(b, &s));
        CHECK_OK(mg_graph_begin_capture(s));
        if (gate_up)
            CHECK_OK(mg_nvfp4_gemm_gate_up(b, s, m, n, k, d_act, pitch, &wg, &wu, d_out, ldc));
        else
            CHECK_OK(mg_nvfp4_gemm(b, s, m, n, k, d_act, pitch, &wg, d_out, ldc));
        CHECK_OK(mg_graph_end_capture(s, &graph));
        CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)m * ldc * 2));
        CHECK_OK(mg_graph_launch(graph, s));
        CHECK_OK(mg_stream_synchronize(s));
        uint16_t *replayed = malloc((size_t)m * ldc * 2);
        CHECK_OK(mg_copy_d2h(b, replayed, d_out, (size_t)m * ldc * 2));
        CHECK(memcmp(replayed, out, (size_t)m * ldc * 2) == 0);
        free(replayed);
        mg_graph_destroy(graph);
        mg_stream_destroy(s);
    }
    mg_free(b, d_act);
    mg_free(b, d_out);
    free(act);
    free(out);
    free_weights(b, &g);
    if (gate_up)
        free_weights(b, &u);
}

/* Residual modes of test_fused. */
enum { NO_RESIDUAL, RESIDUAL_APART, RESIDUAL_IN_PLACE };

/* mg_nvfp4_gemm_fused: the RMSNorm prologue (`norm`) and/or the residual add (dense), or the
 * gate_up form with the norm, against the float64 composition written here: RMSNorm of the raw
 * rows (rms far from 1, so a missing 1 / rms shows), the GEMM of the normed BF16 rows, then the
 * residual. On CUDA a captured call replays bit for bit (the residual restored first when it is
 * the output). */
static void test_fused(mg_backend *b, const char *backend, uint32_t m, uint32_t n, uint32_t k,
                       bool gate_up, bool norm, int residual) {
    char what[128];
    snprintf(what, sizeof what, "%s fused%s%s%s m=%u n=%u k=%u", backend, gate_up ? " gate_up" : "",
             norm ? " rmsnorm" : "",
             residual == RESIDUAL_APART      ? " residual"
             : residual == RESIDUAL_IN_PLACE ? " residual in place"
                                             : "",
             m, n, k);
    weights g, u;
    if (!make_weights(b, &g, 1, n, k))
        return;
    if (gate_up && !make_weights(b, &u, 1, n, k)) {
        free_weights(b, &g);
        return;
    }
    const uint32_t pitch = k + 8 * (uint32_t)test_rand_range(0, 2),
                   ldc = n + (uint32_t)test_rand_range(0, 3);
    const float eps = test_rand() % 2 ? 1e-5f : 1e-6f;
    const double spread = 2.0 + (double)(test_rand() % 5); /* the rows' rms, about 1.2 spread */
    uint16_t *act = random_act(m, pitch), *nw = random_act(1, k), *normed = act;
    for (size_t i = 0; i < (size_t)m * pitch; i++)
        act[i] = to_bf16(bf16(act[i]) * spread);
    if (norm) { /* mg_rmsnorm_bf16: bf16((x / rms) * w), rms = sqrt(mean(x^2) + eps) */
        normed = malloc((size_t)m * k * 2);
        for (uint32_t r = 0; r < m; r++) {
            double sq = 0;
            for (uint32_t i = 0; i < k; i++)
                sq += bf16(act[(size_t)r * pitch + i]) * bf16(act[(size_t)r * pitch + i]);
            const double inv = 1.0 / sqrt(sq / k + eps);
            for (uint32_t i = 0; i < k; i++)
                normed[(size_t)r * k + i] =
                    to_bf16(bf16(act[(size_t)r * pitch + i]) * inv * bf16(nw[i]));
        }
    }
    /* the residual, NaN past n (those columns are not the op's) */
    uint16_t *res = residual ? random_act(m, ldc) : NULL;
    for (uint32_t r = 0; res && r < m; r++)
        for (uint32_t j = n; j < ldc; j++)
            res[(size_t)r * ldc + j] = POISON;
    uint16_t *out = malloc((size_t)m * ldc * 2);
    mg_devptr d_act = 0, d_out = 0, d_nw = 0, d_res = 0;
    CHECK_OK(mg_alloc(b, (size_t)m * pitch * 2, &d_act));
    CHECK_OK(mg_alloc(b, (size_t)m * ldc * 2, &d_out));
    CHECK_OK(mg_alloc(b, (size_t)k * 2, &d_nw));
    CHECK_OK(mg_copy_h2d(b, d_act, act, (size_t)m * pitch * 2));
    CHECK_OK(mg_copy_h2d(b, d_nw, nw, (size_t)k * 2));
    CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)m * ldc * 2));
    if (residual == RESIDUAL_APART) {
        CHECK_OK(mg_alloc(b, (size_t)m * ldc * 2, &d_res));
        CHECK_OK(mg_copy_h2d(b, d_res, res, (size_t)m * ldc * 2));
    } else if (residual == RESIDUAL_IN_PLACE) {
        d_res = d_out;
        CHECK_OK(mg_copy_h2d(b, d_out, res, (size_t)m * ldc * 2));
    }
    const mg_gemm_fusion f = {norm ? MG_GEMM_PROLOGUE_RMSNORM : MG_GEMM_PROLOGUE_NONE,
                              gate_up    ? MG_GEMM_EPILOGUE_SILU_MUL
                              : residual ? MG_GEMM_EPILOGUE_RESIDUAL_ADD
                                         : MG_GEMM_EPILOGUE_NONE,
                              eps};
    const mg_gemm_fusion_tensors ft = {.norm_weight = norm ? d_nw : 0, .residual = d_res};
    mg_nvfp4_weight wg = weight_of(&g), wu = gate_up ? weight_of(&u) : (mg_nvfp4_weight){0};
    CHECK_OK(mg_nvfp4_gemm_fusion_supported(b, m, n, k, gate_up, &f));
    CHECK_OK(mg_nvfp4_gemm_fused(b, NULL, m, n, k, d_act, pitch, &wg, gate_up ? &wu : NULL, d_out,
                                 ldc, &f, &ft));
    mg_op_stats st;
    CHECK_OK(mg_op_stats_get(b, MG_OP_NVFP4_GEMM, &st));
    CHECK(strcmp(st.provider, is_cuda_backend(b) ? "kernels" : cpu_provider) == 0);
    CHECK_OK(mg_copy_d2h(b, out, d_out, (size_t)m * ldc * 2));
    const fused_expect fx = {.residual = res, .norm_slack = norm ? 4.0 / 256.0 : 0.0};
    compare(what, out, m, n, ldc, normed, norm ? k : pitch, NULL, NULL, &g, gate_up ? &u : NULL,
            false, &fx);
    if (is_cuda_backend(b)) {
        mg_stream *s = NULL;
        mg_graph *graph = NULL;
        CHECK_OK(mg_stream_create(b, &s));
        CHECK_OK(mg_graph_begin_capture(s));
        CHECK_OK(mg_nvfp4_gemm_fused(b, s, m, n, k, d_act, pitch, &wg, gate_up ? &wu : NULL, d_out,
                                     ldc, &f, &ft));
        CHECK_OK(mg_graph_end_capture(s, &graph));
        if (residual == RESIDUAL_IN_PLACE)
            CHECK_OK(mg_copy_h2d(b, d_out, res, (size_t)m * ldc * 2));
        else
            CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)m * ldc * 2));
        CHECK_OK(mg_graph_launch(graph, s));
        CHECK_OK(mg_stream_synchronize(s));
        uint16_t *replayed = malloc((size_t)m * ldc * 2);
        CHECK_OK(mg_copy_d2h(b, replayed, d_out, (size_t)m * ldc * 2));
        CHECK(memcmp(replayed, out, (size_t)m * ldc * 2) == 0);
        free(replayed);
        mg_graph_destroy(graph);
        mg_stream_destroy(s);
    }
    mg_free(b, d_act);
    mg_free(b, d_out);
    mg_free(b, d_nw);
    if (residual == RESIDUAL_APART)
        mg_free(b, d_res);
    if (normed != act)
        free(normed);
    free(act);
    free(nw);
    free(res);
    free(out);
    free_weights(b, &g);
    if (gate_up)
        free_weights(b, &u);
}

/* The fusion's refusals, each before anything is written. */
static void test_fused_bad_input(mg_backend *b) {
    weights g;
    if (!make_weights(b, &g, 1, 32, 64))
        return;
    mg_nvfp4_weight w = weight_of(&g);
    mg_devptr act = 0, out = 0, nw = 0;
    CHECK_OK(mg_alloc(b, 20 * 64 * 2, &act));
    CHECK_OK(mg_alloc(b, 20 * 32 * 2, &out));
    CHECK_OK(mg_alloc(b, 64 * 2, &nw));
    const mg_gemm_fusion norm = {MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_NONE, 1e-5f};
    const mg_gemm_fusion add = {MG_GEMM_PROLOGUE_NONE, MG_GEMM_EPILOGUE_RESIDUAL_ADD, 0};
    const mg_gemm_fusion argmax = {MG_GEMM_PROLOGUE_NONE, MG_GEMM_EPILOGUE_ARGMAX, 0};
    const mg_gemm_fusion silu_mul = {MG_GEMM_PROLOGUE_NONE, MG_GEMM_EPILOGUE_SILU_MUL, 0};
    const mg_gemm_fusion no_eps = {MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_NONE, 0.0f};
    const mg_gemm_fusion_tensors with_norm = {.norm_weight = nw}, none = {0};
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 17, 32, 64, act, 64, &w, NULL, out, 32, &norm, &with_norm),
        MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("16 rows");
    CHECK_STATUS(mg_nvfp4_gemm_fusion_supported(b, 17, 32, 64, false, &norm), MG_ERR_UNSUPPORTED);
    CHECK_OK(mg_nvfp4_gemm_fusion_supported(b, 16, 32, 64, false, &norm));
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, NULL, out, 32, &argmax, &none),
        MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("argmax");
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, NULL, out, 32, &silu_mul, &none),
        MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("up weight");
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, &w, out, 32, &norm, &with_norm),
        MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("silu_mul");
    CHECK_STATUS(mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, NULL, out, 32, &norm, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("norm_weight");
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, NULL, out, 32, &no_eps, &with_norm),
        MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("eps");
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, NULL, out, 32, &add, &with_norm),
        MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("residual");
    /* a residual overlapping out without being it; a norm weight inside out */
    const mg_gemm_fusion_tensors shifted = {.residual = out + 64};
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 4, 32, 64, act, 64, &w, NULL, out, 32, &add, &shifted),
        MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    const mg_gemm_fusion_tensors inside = {.norm_weight = out + 32};
    CHECK_STATUS(
        mg_nvfp4_gemm_fused(b, NULL, 1, 32, 64, act, 64, &w, NULL, out, 32, &norm, &inside),
        MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    mg_free(b, act);
    mg_free(b, out);
    mg_free(b, nw);
    free_weights(b, &g);
}

/* A routing of `rows` rows over `experts` experts: skewed counts with empty and single-row
 * experts, and a random gather from `tokens` activation rows. */
static void make_routing(uint32_t experts, uint32_t rows, uint32_t tokens, int32_t *offsets,
                         int32_t *token_ids, int32_t *expert_of_row) {
    uint32_t *count = calloc(experts, sizeof *count);
    for (uint32_t r = 0; r < rows; r++) {
        uint64_t pick = test_rand() % 8;
        uint32_t e = pick < 4 ? 0 : (uint32_t)(test_rand() % experts); /* expert 0 is hot */
        if (experts > 2 && e == 1)
            e = 2; /* expert 1 stays empty */
        count[e]++;
    }
    offsets[0] = 0;
    for (uint32_t e = 0; e < experts; e++)
        offsets[e + 1] = offsets[e] + (int32_t)count[e];
    for (uint32_t e = 0; e < experts; e++)
        for (int32_t r = offsets[e]; r < offsets[e + 1]; r++)
            expert_of_row[r] = (int32_t)e;
    for (uint32_t r = 0; r < rows; r++)
        token_ids[r] = (int32_t)(test_rand() % tokens);
    free(count);
}

static void test_moe(mg_backend *b, const char *backend, bool is_cuda, uint32_t experts,
                     uint32_t tokens, uint32_t top_k, uint32_t n, uint32_t k, bool gate_up) {
    char what[112];
    uint32_t rows = tokens * top_k;
    snprintf(what, sizeof what, "%s moe%s E=%u rows=%u n=%u k=%u", backend,
             gate_up ? " gate_up" : "", experts, rows, n, k);
    weights g, u;
    if (!make_weights(b, &g, experts, n, k))
        return;
    if (gate_up && !make_weights(b, &u, experts, n, k)) {
        free_weights(b, &g);
        return;
    }
    uint16_t *act = random_act(tokens, k);
    int32_t *offsets = malloc((experts + 1) * 4), *ids = malloc(rows * 4), *eor = malloc(rows * 4);
    make_routing(experts, rows, tokens, offsets, ids, eor);
    uint16_t *out = malloc((size_t)rows * n * 2);
    mg_devptr d_act = 0, d_out = 0, d_off = 0, d_ids = 0;
    CHECK_OK(mg_alloc(b, (size_t)tokens * k * 2, &d_act));
    CHECK_OK(mg_alloc(b, (size_t)rows * n * 2, &d_out));
    CHECK_OK(mg_alloc(b, (experts + 1) * 4, &d_off));
    CHECK_OK(mg_alloc(b, rows * 4, &d_ids));
    CHECK_OK(mg_copy_h2d(b, d_act, act, (size_t)tokens * k * 2));
    CHECK_OK(mg_copy_h2d(b, d_off, offsets, (experts + 1) * 4));
    CHECK_OK(mg_copy_h2d(b, d_ids, ids, rows * 4));
    CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)rows * n * 2));
    mg_nvfp4_weight wu = gate_up ? weight_of(&u) : (mg_nvfp4_weight){0};
    mg_nvfp4_moe_desc d = {.experts = experts, .rows = rows, .act_rows = tokens, .n = n, .k = k};
    mg_nvfp4_moe_tensors t = {.act = d_act,
                              .sorted_token_ids = d_ids,
                              .expert_offsets = d_off,
                              .w = weight_of(&g),
                              .up = gate_up ? &wu : NULL,
                              .out = d_out};
    CHECK_OK(mg_nvfp4_moe_gemm(b, NULL, &d, &t));
    CHECK_OK(mg_copy_d2h(b, out, d_out, (size_t)rows * n * 2));
    compare(what, out, rows, n, n, act, k, ids, eor, &g, gate_up ? &u : NULL, false, NULL);

    /* Captured once, replayed with another routing: equals the eager call, bit for bit. */
    if (is_cuda) {
        mg_stream *s = NULL;
        mg_graph *graph = NULL;
        CHECK_OK(mg_stream_create(b, &s));
        CHECK_OK(mg_graph_begin_capture(s));
        CHECK_OK(mg_nvfp4_moe_gemm(b, s, &d, &t));
        CHECK_OK(mg_graph_end_capture(s, &graph));
        make_routing(experts, rows, tokens, offsets, ids, eor);
        CHECK_OK(mg_copy_h2d(b, d_off, offsets, (experts + 1) * 4));
        CHECK_OK(mg_copy_h2d(b, d_ids, ids, rows * 4));
        CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)rows * n * 2));
        CHECK_OK(mg_nvfp4_moe_gemm(b, s, &d, &t));
        CHECK_OK(mg_stream_synchronize(s));
        uint16_t *eager = malloc((size_t)rows * n * 2);
        CHECK_OK(mg_copy_d2h(b, eager, d_out, (size_t)rows * n * 2));
        CHECK_OK(mg_memset(b, d_out, 0xff, (size_t)rows * n * 2));
        CHECK_OK(mg_graph_launch(graph, s));
        CHECK_OK(mg_stream_synchronize(s));
        CHECK_OK(mg_copy_d2h(b, out, d_out, (size_t)rows * n * 2));
        CHECK(memcmp(eager, out, (size_t)rows * n * 2) == 0);
        compare(what, out, rows, n, n, act, k, ids, eor, &g, gate_up ? &u : NULL, false, NULL);
        free(eager);
        mg_graph_destroy(graph);
        mg_stream_destroy(s);
    }
    mg_free(b, d_act);
    mg_free(b, d_out);
    mg_free(b, d_off);
    mg_free(b, d_ids);
    free(act);
    free(out);
    free(offsets);
    free(ids);
    free(eor);
    free_weights(b, &g);
    if (gate_up)
        free_weights(b, &u);
}

static void test_bad_input(mg_backend *b, bool is_cpu) {
    weights g;
    if (!make_weights(b, &g, 2, 32, 64))
        return;
    mg_nvfp4_weight w = weight_of(&g);
    mg_devptr act = 0, out = 0, off = 0;
    CHECK_OK(mg_alloc(b, 4 * 64 * 2 + 16, &act));
    CHECK_OK(mg_alloc(b, 8 * 32 * 2, &out));
    CHECK_OK(mg_alloc(b, 3 * 4, &off));
    CHECK_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 40, act, 40, &w, out, 32), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("multiple of 16");
    CHECK_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act + 2, 64, &w, out, 32),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    CHECK_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act, 60, &w, out, 32), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act, 64, &w, out, 16), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_gemm(b, NULL, 9, 32, 64, act, 64, &w, out, 32), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_gemm(b, NULL, 4, 32, 64, act, 64, &w, act, 32), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_prepare(b, NULL, 32, 40, 1, g.d_codes, g.d_scales, g.values, g.pscales),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_prepare(b, NULL, 32, 64, 3, g.d_codes, g.d_scales, g.values, g.pscales),
                 MG_ERR_INVALID_ARGUMENT); /* three experts do not fit buffers of two */
    mg_nvfp4_moe_desc d = {.experts = 2, .rows = 8, .act_rows = 4, .n = 32, .k = 64};
    mg_nvfp4_moe_tensors t = {.act = act, .expert_offsets = 0, .w = w, .out = out};
    CHECK_STATUS(mg_nvfp4_moe_gemm(b, NULL, &d, &t), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("expert_offsets");
    if (is_cpu) {
        int32_t bad[3] = {0, 6, 5};
        CHECK_OK(mg_copy_h2d(b, off, bad, sizeof bad));
        t.expert_offsets = off;
        d.rows = 5;
        CHECK_STATUS(mg_nvfp4_moe_gemm(b, NULL, &d, &t), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("decrease");
    }
    mg_free(b, act);
    mg_free(b, out);
    mg_free(b, off);
    free_weights(b, &g);
}

static void run_backend(mg_backend *b, const char *name, bool is_cuda) {
    static const uint32_t ms[] = {1, 3, 17, 130};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        test_dense(b, name, ms[i], i % 2 ? 130 : 48, i % 2 ? 272 : 64, false, false);
    test_dense(b, name, 1, 4, 16, false, false);
    test_dense(b, name, 5, 37, 528, true, false);
    test_dense(b, name, 24, 19, 96, true, false);
    test_dense(b, name, 130, 24, 64, false, true);
    if (is_cuda) {
        test_dense(b, name, 1, 4096, 4096, false, false);
        test_dense(b, name, 16, 1024, 14336, false, false);
        test_dense(b, name, 1000, 136, 1040, false, false);
        test_dense(b, name, 1000, 136, 1040, false, true);
        /* Both kernel families (the tile family where its grid is large: N of 4100 and more
         * here), its tiles of 32 and 64 tokens, with one and two K groups: K not a multiple of
         * 256, N not one of 16. */
        static const uint32_t tile_ms[] = {2, 5, 16, 17, 33, 64, 100, 256, 257};
        for (size_t i = 0; i < sizeof tile_ms / sizeof tile_ms[0]; i++)
            test_dense(b, name, tile_ms[i], 1000, 1040, i % 2 == 1, false);
        test_dense(b, name, 257, 4100, 1040, false, false); /* 64 tokens, one K group */
        test_dense(b, name, 100, 8200, 528, false, false);  /* 64, two groups */
        test_dense(b, name, 24, 16400, 272, false, false);  /* 32, two groups */
        test_dense(b, name, 100, 4100, 528, true, false);   /* gate_up, 64, two groups */
        test_dense(b, name, 257, 4100, 528, true, false);   /* gate_up, 64, one group */
        test_dense(b, name, 20, 8200, 528, true, false);    /* gate_up, 32, two groups */
    }
    test_moe(b, name, is_cuda, 6, 7, 2, 40, 96, false);
    test_moe(b, name, is_cuda, 5, 33, 3, 24, 272, true);
    test_moe(b, name, is_cuda, 16, 1, 4, 64, 512, false);
    if (is_cuda) {
        test_moe(b, name, is_cuda, 64, 100, 8, 768, 2048, true);
        /* the tile family: 50 and 30 rows per expert on average */
        test_moe(b, name, is_cuda, 8, 100, 4, 1000, 528, false);
        test_moe(b, name, is_cuda, 8, 100, 4, 1000, 1040, true);
        test_moe(b, name, is_cuda, 6, 60, 3, 1400, 272, false);
    }
    /* the fusions: M up to 16 (both tiles, K split 1..8 ways), K not a multiple of 256, N not
     * one of 16, the activation pitch and ldc wider than the rows */
    static const struct {
        uint32_t m, n, k;
        bool gate_up, norm;
        int residual;
    } fused[] = {{1, 48, 64, false, true, NO_RESIDUAL},
                 {3, 130, 272, false, false, RESIDUAL_IN_PLACE},
                 {5, 37, 528, true, true, NO_RESIDUAL},
                 {9, 130, 272, false, true, RESIDUAL_APART},
                 {16, 40, 96, false, true, RESIDUAL_IN_PLACE},
                 {2, 24, 1040, true, true, NO_RESIDUAL},
                 {8, 100, 1040, false, false, RESIDUAL_APART}};
    for (size_t i = 0; i < sizeof fused / sizeof fused[0]; i++)
        test_fused(b, name, fused[i].m, fused[i].n, fused[i].k, fused[i].gate_up, fused[i].norm,
                   fused[i].residual);
    if (is_cuda) { /* decode shapes of an 8B model: grids of 256 to 1792 CTAs */
        test_fused(b, name, 1, 4096, 4096, false, true, NO_RESIDUAL);
        test_fused(b, name, 1, 4096, 14336, false, false, RESIDUAL_IN_PLACE);
        test_fused(b, name, 1, 14336, 4096, true, true, NO_RESIDUAL);
        test_fused(b, name, 7, 1024, 4096, false, true, RESIDUAL_APART);
        test_fused(b, name, 16, 4096, 4096, true, true, NO_RESIDUAL);
        test_fused(b, name, 12, 4096, 14336, false, false, RESIDUAL_IN_PLACE);
    }
    test_bad_input(b, !is_cuda);
    test_fused_bad_input(b);
}

int main(void) {
    test_seed();
    mg_backend *cpu = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &cpu));
    if (cpu) {
        CHECK(mg_op_supported(cpu, MG_OP_NVFP4_GEMM));
        /* the reference, then the fast kernel where the CPU has AVX2 (the automatic choice
         * there: nvfp4_gemm.c), each forced for both ops */
        static const char *const providers[] = {"kernels", "cpu_avx2"};
        for (int p = 0; p < 2; p++) {
            if (mg_op_force_provider(cpu, MG_OP_NVFP4_GEMM, providers[p]) != MG_OK ||
                mg_op_force_provider(cpu, MG_OP_NVFP4_MOE_GEMM, providers[p]) != MG_OK) {
                printf("cpu %s: not tested here: %s\n", providers[p], mg_last_error());
                continue;
            }
            cpu_provider = providers[p];
            char name[32];
            snprintf(name, sizeof name, "cpu %s", providers[p]);
            run_backend(cpu, name, false);
        }
        mg_op_force_provider(cpu, MG_OP_NVFP4_GEMM, NULL);
        mg_op_force_provider(cpu, MG_OP_NVFP4_MOE_GEMM, NULL);
        mg_backend_close(cpu);
    }
    mg_backend_probe probe;
    mg_backend_probe_kind(MG_BACKEND_CUDA, &probe);
    if (probe.compiled_in && probe.usable) {
        mg_backend *cuda = NULL;
        CHECK_OK(mg_backend_open(MG_BACKEND_CUDA, 0, &cuda));
        if (cuda) {
            run_backend(cuda, "cuda", true);
            mg_backend_close(cuda);
        }
    } else {
        printf("cuda: not tested here: %s\n", probe.compiled_in ? probe.reason : "not compiled in");
    }
    return test_finish();
}
