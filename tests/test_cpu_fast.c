/* test_cpu_fast.c - the fast CPU providers (cpu_avx2 where the CPU has it, cpu_portable; for the
 * MLX GEMVs also cpu_avx512 where the CPU has it) of the BF16 GEMM and of the MLX ops against their
 * references on the CPU backend, each forced by name: fresh random inputs of awkward sizes (n and k
 * not multiples of the vector width or of 128; M 1, 2, 3, 17, 64 for the GEMM and 1 to 8 for the
 * GEMVs), outputs poisoned first, every output written, nothing past it, within the bounds the
 * providers state (gemm_cpu_fast.c, mlx_cpu_fast.h); dequant and the AVX2 BF16 GEMM (the
 * reference's order) bit for bit; and the automatic choice of the BF16 GEMM is cpu_avx2 where the
 * CPU has it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/mlx.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "mlx_test_util.h"
#include "test_util.h"

#define POISON 0xFF /* a NaN pattern in BF16 and FP32 */

static const char *const fast_providers[] = {"cpu_avx2", "cpu_portable"};
/* the MLX ops have one more: the AVX-512 GEMVs */
static const char *const mlx_fast_providers[] = {"cpu_avx512", "cpu_avx2", "cpu_portable"};

static float bf16(uint16_t b) {
    return mg_bf16_to_f32(b);
}

static uint16_t random_bf16(void) { /* about N(0, 1)-sized values, some tiny, some large */
    double v = ((double)test_rand_range(0, 1u << 20) / (1u << 19) - 1.0) *
               ldexp(1.0, (int)test_rand_range(0, 6) - 3);
    return mg_f32_to_bf16((float)v);
}

static bool provider_usable(mg_backend *b, mg_op op, const char *name) {
    if (mg_op_provider_available(b, op, name, NULL, 0))
        return true;
    printf("  %s: not available on this CPU, skipped\n", name);
    return false;
}

/* ------------------------------------------------------------------ BF16 GEMM */

static void run_gemm(mg_backend *b, const char *provider, uint32_t m, uint32_t n, uint32_t k,
                     uint32_t ldc, mg_dtype out_type, mg_devptr act, mg_devptr w, mg_devptr out,
                     size_t out_bytes, void *host) {
    CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, provider));
    CHECK_OK(mg_memset(b, out, POISON, out_bytes));
    CHECK_OK(mg_gemm_bf16(b, NULL, m, n, k, act, w, out, out_type, ldc));
    CHECK_OK(mg_copy_d2h(b, host, out, out_bytes));
    mg_op_stats st;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &st));
    CHECK(!strcmp(st.provider, provider));
}

static void gemm_case(mg_backend *b, uint32_t m, uint32_t n, uint32_t k, mg_dtype out_type) {
    const uint32_t ldc = n + (uint32_t)test_rand_range(0, 3),
                   eb = (uint32_t)mg_dtype_bytes(out_type);
    const size_t out_bytes = ((size_t)(m - 1) * ldc + n) * eb + 64; /* 64 bytes past the last */
    uint16_t *ha = malloc((size_t)m * k * 2), *hw = malloc((size_t)n * k * 2);
    unsigned char *ref = malloc(out_bytes), *got = malloc(out_bytes);
    for (size_t i = 0; i < (size_t)m * k; i++)
        ha[i] = random_bf16();
    for (size_t i = 0; i < (size_t)n * k; i++)
        hw[i] = random_bf16();
    mg_devptr act, w, out;
    CHECK_OK(mg_alloc(b, (size_t)m * k * 2, &act));
    CHECK_OK(mg_alloc(b, (size_t)n * k * 2, &w));
    CHECK_OK(mg_alloc(b, out_bytes, &out));
    CHECK_OK(mg_copy_h2d(b, act, ha, (size_t)m * k * 2));
    CHECK_OK(mg_copy_h2d(b, w, hw, (size_t)n * k * 2));
    run_gemm(b, "reference", m, n, k, ldc, out_type, act, w, out, out_bytes, ref);
    for (size_t p = 0; p < 2; p++) {
        if (!provider_usable(b, MG_OP_GEMM_BF16, fast_providers[p]))
            continue;
        run_gemm(b, fast_providers[p], m, n, k, ldc, out_type, act, w, out, out_bytes, got);
        long bad = 0;
        for (uint32_t t = 0; t < m; t++)
            for (uint32_t j = 0; j < ldc && (size_t)t * ldc + j < (out_bytes - 64) / eb; j++) {
                size_t i = (size_t)t * ldc + j;
                if (j >= n) { /* the row padding: untouched */
                    bad += memcmp(got + i * eb, ref + i * eb, eb) != 0;
                    continue;
                }
                double s = 0;
                for (uint32_t x = 0; x < k; x++)
                    s += fabs((double)bf16(ha[(size_t)t * k + x]) * bf16(hw[(size_t)j * k + x]));
                double g, r;
                if (out_type == MG_DTYPE_F32) {
                    float gf, rf;
                    memcpy(&gf, got + i * 4, 4);
                    memcpy(&rf, ref + i * 4, 4);
                    g = gf, r = rf;
                } else {
                    uint16_t gb, rb;
                    memcpy(&gb, got + i * 2, 2);
                    memcpy(&rb, ref + i * 2, 2);
                    g = bf16(gb), r = bf16(rb);
                }
                /* gemm_cpu_fast.c: 2 (k + 16) 2^-24 S, plus a BF16 spacing for BF16 outputs */
                double tol = 2.0 * (k + 16) * ldexp(s, -24) +
                             (out_type == MG_DTYPE_BF16 ? ldexp(fmax(fabs(g), fabs(r)), -7) : 0) +
                             1e-37;
                if (!(fabs(g - r) <= tol)) { /* NaN (unwritten) fails too */
                    if (bad < 3)
                        fprintf(stderr, "  %s m=%u n=%u k=%u: out[%u, %u] = %g, reference %g\n",
                                fast_providers[p], m, n, k, t, j, g, r);
                    bad++;
                }
            }
        /* nothing written past the last output */
        bad += memcmp(got + out_bytes - 64, ref + out_bytes - 64, 64) != 0;
        /* cpu_avx2 adds in the reference's order: its bits, every output */
        if (!strcmp(fast_providers[p], "cpu_avx2") && memcmp(got, ref, out_bytes) != 0) {
            if (bad < 3)
                fprintf(stderr, "  cpu_avx2 m=%u n=%u k=%u: not the reference's bits\n", m, n, k);
            bad++;
        }
        CHECK(bad == 0);
    }
    mg_op_force_provider(b, MG_OP_GEMM_BF16, NULL);
    mg_free(b, act);
    mg_free(b, w);
    mg_free(b, out);
    free(ha);
    free(hw);
    free(ref);
    free(got);
}

static void test_gemm(mg_backend *b) {
    static const uint32_t ms[] = {1, 2, 3, 17, 64};
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
        for (int o = 0; o < 2; o++) {
            uint32_t n = (uint32_t)test_rand_range(1, 300), k = (uint32_t)test_rand_range(1, 700);
            gemm_case(b, ms[i], n, k, o ? MG_DTYPE_BF16 : MG_DTYPE_F32);
        }
    /* whole vectors and SmolLM2's shapes */
    gemm_case(b, 1, 576, 576, MG_DTYPE_F32);
    gemm_case(b, 37, 1536, 576, MG_DTYPE_BF16);
    gemm_case(b, 5, 576, 1536, MG_DTYPE_BF16);
    gemm_case(b, 2, 49152, 576, MG_DTYPE_BF16); /* its LM head */

    /* unforced: cpu_avx2 where the CPU has it, else the reference */
    mg_devptr x, w, out;
    CHECK_OK(mg_alloc(b, 3 * 40 * 2, &x));
    CHECK_OK(mg_alloc(b, 24 * 40 * 2, &w));
    CHECK_OK(mg_alloc(b, 3 * 24 * 4, &out));
    CHECK_OK(mg_memset(b, x, 0x3f, 3 * 40 * 2));
    CHECK_OK(mg_memset(b, w, 0x3f, 24 * 40 * 2));
    CHECK_OK(mg_gemm_bf16(b, NULL, 3, 24, 40, x, w, out, MG_DTYPE_F32, 24));
    mg_op_stats st;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &st));
    bool avx2 = mg_op_provider_available(b, MG_OP_GEMM_BF16, "cpu_avx2", NULL, 0);
    printf("  automatic BF16 GEMM: %s\n", st.provider);
    CHECK(!strcmp(st.provider, avx2 ? "cpu_avx2" : "reference"));
    mg_free(b, x);
    mg_free(b, w);
    mg_free(b, out);
}

/* ------------------------------------------------------------------ MLX */

enum { OP_DEQUANT, OP_GEMV, OP_SILU, OP_SILU_RESID, OP_GATE_UP, OP_GEMM, OP_COUNT };
static const char *const op_names[] = {"dequant",         "gemv",    "silu_gate",
                                       "silu_gate_resid", "gate_up", "gemm"};

static double silu_gate_value(uint16_t g, uint16_t u) {
    return mg_bf16_to_f32(mlx_test_silu_mul(g, u));
}

typedef struct mlx_call {
    const mlx_test_layer *gate, *up;
    uint32_t m, expert;
    mg_devptr x, u, resid, y, scratch;
    size_t y_bytes; /* the outputs, then 64 poisoned bytes */
} mlx_call;

/* Runs `op` with `provider` forced for the MLX ops and the GEMM ("reference" for the GEMM when
 * the MLX provider is "kernels"); the outputs with their guard bytes into `host`. */
static void mlx_run(mg_backend *b, int op, const char *provider, const mlx_call *c, void *host) {
    const bool ref = !strcmp(provider, "kernels");
    CHECK_OK(mg_op_force_provider(b, MG_OP_MLX_QUANT, provider));
    /* the GEMM's provider of the same name (cpu_avx512 has none: the automatic one) */
    const bool gemm_has = mg_op_provider_available(b, MG_OP_GEMM_BF16, provider, NULL, 0);
    CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16,
                                  ref        ? "reference"
                                  : gemm_has ? provider
                                             : NULL));
    CHECK_OK(mg_memset(b, c->y, POISON, c->y_bytes));
    const mg_mlx_linear *w = &c->gate->w;
    const size_t half = (size_t)c->m * w->n * 2;
    switch (op) {
    case OP_DEQUANT:
        CHECK_OK(mg_mlx_dequant(b, NULL, w, c->expert, c->y));
        break;
    case OP_GEMV:
        CHECK_OK(mg_mlx_gemv(b, NULL, w, c->expert, c->m, c->x, c->y));
        break;
    case OP_SILU:
        CHECK_OK(mg_mlx_gemv_silu_gate(b, NULL, w, c->expert, c->m, c->x, c->u, c->y));
        break;
    case OP_SILU_RESID:
        CHECK_OK(
            mg_mlx_gemv_silu_gate_resid(b, NULL, w, c->expert, c->m, c->x, c->u, c->resid, c->y));
        break;
    case OP_GATE_UP:
        CHECK_OK(
            mg_mlx_gemv_gate_up(b, NULL, w, &c->up->w, c->expert, c->m, c->x, c->y, c->y + half));
        break;
    default:
        CHECK_OK(mg_mlx_gemm(b, NULL, w, c->expert, c->m, c->x, c->y, c->scratch));
        break;
    }
    CHECK_OK(mg_copy_d2h(b, host, c->y, c->y_bytes));
    mg_op_stats st;
    CHECK_OK(mg_op_stats_get(b, MG_OP_MLX_QUANT, &st));
    CHECK(!strcmp(st.provider, provider));
}

/* The magnitudes an output's FP32 sum adds up (mlx_cpu_fast.h's S) of layer l, row r, token t:
 * sum over groups of |scale| sum_j q_j |a_j| + |bias| sum_j |a_j|. */
static double mlx_spread(const mlx_test_layer *l, uint32_t e, uint32_t r, const double *a) {
    const mg_mlx_linear *w = &l->w;
    const uint32_t groups = w->k / w->group_size, per = 32 / w->bits;
    const size_t row = (size_t)e * w->n + r;
    double s = 0;
    for (uint32_t g = 0; g < groups; g++) {
        double qa = 0, aa = 0;
        for (uint32_t j = g * w->group_size; j < (g + 1) * w->group_size; j++) {
            uint32_t word = l->words[row * (w->k / per) + j / per];
            qa += ((word >> ((j % per) * w->bits)) & ((1u << w->bits) - 1)) * fabs(a[j]);
            aa += fabs(a[j]);
        }
        s += fabs(mlx_test_half_value(w->scale_type, l->scales[row * groups + g])) * qa +
             fabs(mlx_test_half_value(w->scale_type, l->biases[row * groups + g])) * aa;
    }
    return s;
}

static void mlx_case(mg_backend *b, int op, uint32_t bits, uint32_t group, mg_dtype type,
                     uint32_t n, uint32_t k, uint32_t m) {
    mlx_test_layer gate, up;
    mlx_test_layer_make(b, &gate, 2, n, k, bits, group, type);
    mlx_test_layer_make(b, &up, 2, n, k, bits, group, type);
    uint16_t *hx = mlx_test_activations((size_t)m * k), *hu = mlx_test_activations((size_t)m * k);
    uint16_t *hr = mlx_test_activations((size_t)m * n);
    mlx_call c = {.gate = &gate, .up = &up, .m = m, .expert = 1};
    c.x = mlx_test_upload(b, hx, (size_t)m * k * 2);
    c.u = mlx_test_upload(b, hu, (size_t)m * k * 2);
    c.resid = mlx_test_upload(b, hr, (size_t)m * n * 2);
    const size_t outputs =
        op == OP_DEQUANT ? (size_t)n * k : (size_t)m * n * (op == OP_GATE_UP ? 2 : 1);
    c.y_bytes = outputs * 2 + 64;
    CHECK_OK(mg_alloc(b, c.y_bytes, &c.y));
    CHECK_OK(mg_alloc(b, mg_mlx_gemm_scratch_bytes(&gate.w), &c.scratch));
    uint16_t *ref = malloc(c.y_bytes), *got = malloc(c.y_bytes);
    double *act = malloc((size_t)m * k * sizeof *act);
    const bool silu = op == OP_SILU || op == OP_SILU_RESID;
    for (size_t i = 0; i < (size_t)m * k; i++)
        act[i] = silu ? silu_gate_value(hx[i], hu[i]) : mg_bf16_to_f32(hx[i]);
    mlx_run(b, op, "kernels", &c, ref);
    const uint32_t groups = k / group;
    for (size_t p = 0; p < sizeof mlx_fast_providers / sizeof *mlx_fast_providers; p++) {
        if (!provider_usable(b, MG_OP_MLX_QUANT, mlx_fast_providers[p]))
            continue;
        mlx_run(b, op, mlx_fast_providers[p], &c, got);
        long bad = memcmp((char *)got + outputs * 2, (char *)ref + outputs * 2, 64) != 0;
        for (size_t i = 0; i < outputs; i++) {
            double g = bf16(got[i]), r = bf16(ref[i]), tol = 0;
            if (op == OP_DEQUANT) {
                bad += got[i] != ref[i];
                continue;
            }
            const uint32_t t = (uint32_t)(i / n % m), row = (uint32_t)(i % n);
            const mlx_test_layer *l = i >= (size_t)m * n ? &up : &gate;
            const double spread = mlx_spread(l, 1, row, act + (size_t)t * k);
            if (op == OP_GEMM) /* dequant exact, then the GEMM's bound (the weights within 2^-7) */
                tol = 2.0 * (k + 16) * ldexp(spread * 1.01, -24);
            else
                tol = (k + 2.0 * groups + 16) * ldexp(spread, -24) +
                      (op == OP_SILU_RESID ? ldexp(fabs(bf16(hr[i])), -24) : 0);
            tol += ldexp(fmax(fabs(g), fabs(r)), -7) + 1e-37;
            if (!(fabs(g - r) <= tol)) {
                if (bad < 3)
                    fprintf(stderr,
                            "  %s %s bits=%u group=%u %s n=%u k=%u m=%u: [%zu] = %g, "
                            "reference %g (tolerance %g)\n",
                            mlx_fast_providers[p], op_names[op], bits, group, mg_dtype_name(type),
                            n, k, m, i, g, r, tol);
                bad++;
            }
        }
        CHECK(bad == 0);
    }
    mg_op_force_provider(b, MG_OP_MLX_QUANT, NULL);
    mg_op_force_provider(b, MG_OP_GEMM_BF16, NULL);
    mg_devptr all[] = {c.x, c.u, c.resid, c.y, c.scratch};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        mg_free(b, all[i]);
    mlx_test_layer_free(b, &gate);
    mlx_test_layer_free(b, &up);
    free(hx);
    free(hu);
    free(hr);
    free(ref);
    free(got);
    free(act);
}

/* gate_up with the SiLU-mul epilogue under each CPU provider (the reference included): the
 * SiLU-mul of that provider's own gate_up products, bit for bit, the 64 bytes past y untouched. */
static void mlx_silu_mul_case(mg_backend *b, uint32_t bits, uint32_t group, mg_dtype type,
                              uint32_t n, uint32_t k, uint32_t m) {
    static const char *const providers[] = {"kernels", "cpu_portable", "cpu_avx2", "cpu_avx512"};
    mlx_test_layer gate, up;
    mlx_test_layer_make(b, &gate, 2, n, k, bits, group, type);
    mlx_test_layer_make(b, &up, 2, n, k, bits, group, type);
    uint16_t *hx = mlx_test_activations((size_t)m * k);
    const size_t half = (size_t)m * n * 2;
    mg_devptr x = mlx_test_upload(b, hx, (size_t)m * k * 2), y = 0;
    CHECK_OK(mg_alloc(b, 3 * half + 64, &y));
    uint16_t *host = malloc(3 * half + 64);
    const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
    const mg_gemm_fusion_tensors none = {0};
    for (size_t p = 0; host && p < sizeof providers / sizeof *providers; p++) {
        if (!provider_usable(b, MG_OP_MLX_QUANT, providers[p]))
            continue;
        CHECK_OK(mg_op_force_provider(b, MG_OP_MLX_QUANT, providers[p]));
        CHECK_OK(mg_memset(b, y, POISON, 3 * half + 64));
        CHECK_OK(mg_mlx_gemv_gate_up(b, NULL, &gate.w, &up.w, 1, m, x, y, y + half));
        CHECK_OK(
            mg_mlx_gemv_fused(b, NULL, &gate.w, &up.w, 1, m, x, y + 2 * half, &silu_mul, &none));
        CHECK_OK(mg_copy_d2h(b, host, y, 3 * half + 64));
        char what[128];
        snprintf(what, sizeof what, "%s gate_up+silu_mul bits=%u group=%u %s n=%u k=%u m=%u",
                 providers[p], bits, group, mg_dtype_name(type), n, k, m);
        mlx_test_check_silu_mul(what, host + 2 * half / 2, host, host + half / 2, half / 2, 0);
        size_t guard = 0;
        for (size_t i = 0; i < 32; i++)
            guard += host[3 * half / 2 + i] != (uint16_t)(POISON * 0x0101u);
        CHECK(guard == 0);
    }
    mg_op_force_provider(b, MG_OP_MLX_QUANT, NULL);
    mg_free(b, x);
    mg_free(b, y);
    mlx_test_layer_free(b, &gate);
    mlx_test_layer_free(b, &up);
    free(hx);
    free(host);
}

static void test_mlx(mg_backend *b) {
    static const uint32_t groups[] = {32, 64, 128};
    for (int op = 0; op < OP_COUNT; op++)
        for (uint32_t bits = 4; bits <= 8; bits += 4)
            for (int g = 0; g < 3; g++)
                for (int t = 0; t < 2; t++) {
                    uint32_t n = (uint32_t)test_rand_range(1, 70);
                    uint32_t k = groups[g] * (uint32_t)test_rand_range(1, 6);
                    uint32_t m = op == OP_GEMM ? (uint32_t)test_rand_range(9, 40)
                                               : (uint32_t)test_rand_range(1, 8);
                    mlx_case(b, op, bits, groups[g], t ? MG_DTYPE_F16 : MG_DTYPE_BF16, n, k, m);
                }
    for (uint32_t bits = 4; bits <= 8; bits += 4)
        for (int g = 0; g < 3; g++)
            mlx_silu_mul_case(b, bits, groups[g], g % 2 ? MG_DTYPE_F16 : MG_DTYPE_BF16,
                              (uint32_t)test_rand_range(1, 70),
                              groups[g] * (uint32_t)test_rand_range(1, 6),
                              (uint32_t)test_rand_range(1, 8));
    /* SmolLM2's layers: 4 bits, groups of 32, FP16 scales */
    mlx_case(b, OP_GATE_UP, 4, 32, MG_DTYPE_F16, 1536, 576, 1);
    mlx_case(b, OP_SILU_RESID, 4, 32, MG_DTYPE_F16, 576, 1536, 1);
    mlx_case(b, OP_GEMM, 4, 32, MG_DTYPE_F16, 384, 576, 37);
}

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!b)
        return test_finish();
    const char *names[8] = {0};
    CHECK(mg_op_providers(MG_OP_GEMM_BF16, MG_BACKEND_CPU, names, 8) == 4);
    CHECK(names[2] && !strcmp(names[2], "reference") && names[3] && !strcmp(names[3], "kernels"));
    CHECK(mg_op_providers(MG_OP_MLX_QUANT, MG_BACKEND_CPU, names, 8) == 4);
    CHECK(names[3] && !strcmp(names[3], "kernels"));
    test_gemm(b);
    test_mlx(b);
    mg_backend_close(b);
    return test_finish();
}
