/* test_mlx_ops.c - the MLX ops (metrale/mlx.h) on the CPU backend against float64 computed
 * here from the packed codes, on fresh random layers of awkward shapes for every bits, group
 * size and scale type, M from 1 to 8 (GEMVs) and above (GEMM), outputs poisoned first; the
 * bias add alone (mg_mlx_add_bias) bit for bit for each bias type; and every argument error,
 * which must leave the outputs untouched. */
#include <stdio.h>

#include "mlx_test_util.h"

static double silu_gate_value(uint16_t g, uint16_t u) {
    return mg_bf16_to_f32(mlx_test_silu_mul(g, u));
}

/* want and spread of act [rows, k] · Wᵀ of expert e (act given as a function of the index). */
static void expect_product(const mlx_test_layer *l, uint32_t e, uint32_t rows, const uint16_t *a,
                           const uint16_t *u, const uint16_t *resid, double *want, double *spread) {
    const mg_mlx_linear *w = &l->w;
    for (uint32_t t = 0; t < rows; t++)
        for (uint32_t r = 0; r < w->n; r++) {
            double s = 0, abs_sum = 0;
            for (uint32_t j = 0; j < w->k; j++) {
                size_t i = (size_t)t * w->k + j;
                double av = u ? silu_gate_value(a[i], u[i]) : mg_bf16_to_f32(a[i]);
                double p = mlx_test_weight(l, e, r, j) * av;
                s += p;
                abs_sum += fabs(p);
            }
            size_t o = (size_t)t * w->n + r;
            want[o] = s + (resid ? mg_bf16_to_f32(resid[o]) : 0.0);
            spread[o] = abs_sum;
        }
}

static void run_case(mg_backend *b, uint32_t bits, uint32_t group, mg_dtype type) {
    uint32_t n = (uint32_t)test_rand_range(1, 70), k = group * (uint32_t)test_rand_range(1, 5);
    uint32_t m = (uint32_t)test_rand_range(1, 8), m_gemm = (uint32_t)test_rand_range(9, 33);
    char what[96];
    snprintf(what, sizeof what, "bits=%u group=%u %s n=%u k=%u m=%u", bits, group,
             mg_dtype_name(type), n, k, m);
    mlx_test_layer l, l2;
    mlx_test_layer_make(b, &l, 2, n, k, bits, group, type);
    mlx_test_layer_make(b, &l2, 2, n, k, bits, group, type);
    mlx_test_case c;
    mlx_test_case_make(&c, &l.w, m, m_gemm);
    mlx_test_outputs o = {0};
    mlx_test_run(b, &l.w, &l2.w, &c, &o);
    size_t cap = (size_t)(m_gemm > n ? m_gemm : n) * (k > n ? k : n) * 2;
    double *want = malloc(cap * sizeof *want), *spread = malloc(cap * sizeof *spread);
    char label[160];
    /* Dequant: the exact weight within its two roundings in the scales' type and to BF16. */
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < k; j++) {
            size_t i = (size_t)r * k + j;
            want[i] = mlx_test_weight_parts(&l, c.expert, r, j, &spread[i]);
        }
    /* round(round(s*q) + b), then BF16: within 2^-9 |s*q| + 2^-9 |w| (+ 2^-9 |w| from FP16). */
    snprintf(label, sizeof label, "dequant %s", what);
    mlx_test_compare(label, o.deq, want, spread, (size_t)n * k, 8);
    expect_product(&l, c.expert, m, c.x, NULL, NULL, want, spread);
    snprintf(label, sizeof label, "gemv %s", what);
    mlx_test_compare(label, o.plain, want, spread, (size_t)m * n, 16);
    snprintf(label, sizeof label, "gate_up/gate %s", what);
    mlx_test_compare(label, o.gate, want, spread, (size_t)m * n, 16);
    expect_product(&l2, c.expert, m, c.x, NULL, NULL, want, spread);
    snprintf(label, sizeof label, "gate_up/up %s", what);
    mlx_test_compare(label, o.up, want, spread, (size_t)m * n, 16);
    /* the SiLU-mul epilogue: the composition of gate_up and mg_silu_mul_bf16, bit for bit */
    snprintf(label, sizeof label, "gate_up+silu_mul %s", what);
    mlx_test_check_silu_mul(label, o.silu_mul, o.gate, o.up, (size_t)m * n, 0);
    expect_product(&l, c.expert, m, c.g, c.u, NULL, want, spread);
    snprintf(label, sizeof label, "silu_gate %s", what);
    mlx_test_compare(label, o.silu, want, spread, (size_t)m * n, 16);
    expect_product(&l, c.expert, m, c.g, c.u, c.resid, want, spread);
    snprintf(label, sizeof label, "silu_gate_resid %s", what);
    mlx_test_compare(label, o.resid, want, spread, (size_t)m * n, 16);
    /* The GEMM multiplies the dequant's BF16 weights: 2^-8 of the spread. */
    expect_product(&l, c.expert, m_gemm, c.x_gemm, NULL, NULL, want, spread);
    snprintf(label, sizeof label, "gemm m=%u %s", m_gemm, what);
    mlx_test_compare(label, o.gemm, want, spread, (size_t)m_gemm * n, 8);
    free(want);
    free(spread);
    mlx_test_outputs_free(&o);
    mlx_test_case_free(&c);
    mlx_test_layer_free(b, &l);
    mlx_test_layer_free(b, &l2);
}

/* Each bad call fails with INVALID_ARGUMENT naming the problem, and y stays poisoned. */
static void test_errors(mg_backend *b) {
    mlx_test_layer l;
    mlx_test_layer_make(b, &l, 1, 16, 128, 4, 64, MG_DTYPE_BF16);
    mg_devptr x = mlx_test_poisoned(b, 8 * 128 * 2 + 16), y = mlx_test_poisoned(b, 9 * 16 * 2);
    mg_mlx_linear w = l.w;
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 0, x, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("m=0");
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 9, x, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("m=9");
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 1, 1, x, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("expert 1 of 1");
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 1, x + 2, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("16-byte aligned");
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 1, x, x + 64), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    w.bits = 3;
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 1, x, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("bits=3");
    w = l.w;
    w.group_size = 16;
    CHECK_STATUS(mg_mlx_dequant(b, NULL, &w, 0, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("group_size=16");
    w = l.w;
    w.k = 96;
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 1, x, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("multiple of group_size");
    w = l.w;
    w.n = 4096; /* the weight buffer is far smaller */
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 1, x, y), MG_ERR_INVALID_ARGUMENT);
    w = l.w;
    w.scale_type = MG_DTYPE_F32;
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &w, 0, 1, x, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("scale_type");
    mg_mlx_linear other = l.w;
    other.scale_type = MG_DTYPE_F16;
    CHECK_STATUS(mg_mlx_gemv_gate_up(b, NULL, &l.w, &other, 0, 1, x, y, y + 64),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("differ");
    CHECK_STATUS(mg_mlx_gemv_silu_gate_resid(b, NULL, &l.w, 0, 1, x, x, y + 2, y),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("resid and y overlap");
    /* y on the layer's own buffers: the product would overwrite what it reads */
    CHECK_STATUS(mg_mlx_gemv(b, NULL, &l.w, 0, 1, x, l.w.scales), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("scales and y overlap");
    CHECK_STATUS(mg_mlx_gemm(b, NULL, &l.w, 0, 1, x, y, y), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_mlx_gemv(NULL, NULL, &l.w, 0, 1, x, y), MG_ERR_INVALID_ARGUMENT);
    /* the fused form: each refusal names its reason and launches nothing */
    const mg_gemm_fusion_tensors none = {0};
    mg_gemm_fusion_tensors with_norm = {.norm_weight = x};
    const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
    const mg_gemm_fusion resid_add = {.epilogue = MG_GEMM_EPILOGUE_RESIDUAL_ADD};
    const mg_gemm_fusion norm = {.prologue = MG_GEMM_PROLOGUE_RMSNORM, .eps = 1e-5f};
    const mg_gemm_fusion bad_kind = {.epilogue = (mg_gemm_epilogue)9};
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, y, NULL, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL fusion");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, y, &silu_mul, NULL),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL tensors");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, y, &bad_kind, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no such kind");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, NULL, 0, 1, x, y, &silu_mul, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("needs the up layer");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, y, &(mg_gemm_fusion){0}, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("needs epilogue silu_mul");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, y, &silu_mul, &with_norm),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("norm_weight given");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 9, x, y, &silu_mul, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("m=9");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, x + 64, &silu_mul, &none),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &l.w, 0, 1, x, y, &norm, &with_norm),
                 MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("prologue rmsnorm");
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, NULL, 0, 1, x, y, &resid_add, &none),
                 MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("epilogue residual_add");
    mg_mlx_linear biased = l.w;
    biased.bias = x; /* never read: refused first */
    biased.bias_type = MG_DTYPE_BF16;
    CHECK_STATUS(mg_mlx_gemv_fused(b, NULL, &l.w, &biased, 0, 1, x, y, &silu_mul, &none),
                 MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("up layer has a bias");
    uint16_t *after = mlx_test_download(b, y, 9 * 16 * 2);
    size_t untouched = 0;
    for (size_t i = 0; i < 9 * 16; i++)
        untouched += after[i] == 0xffff;
    CHECK(untouched == 9 * 16);
    free(after);
    mg_free(b, x);
    mg_free(b, y);
    mlx_test_layer_free(b, &l);
}

/* mg_mlx_add_bias on an awkward y [m, n] for each bias type: every element one FP32 addition
 * rounded to BF16 (mlx.h), bit for bit; bad arguments leave y untouched. */
static void test_add_bias(mg_backend *b) {
    const mg_dtype types[] = {MG_DTYPE_BF16, MG_DTYPE_F16, MG_DTYPE_F32};
    const uint32_t m = (uint32_t)test_rand_range(1, 40), n = (uint32_t)test_rand_range(1, 300);
    uint16_t *y0 = malloc(2ull * m * n), *got = NULL;
    float *bias32 = malloc(4ull * n);
    uint16_t *bias16 = malloc(2ull * n);
    mg_devptr y = 0, bias = 0;
    CHECK(y0 && bias32 && bias16);
    if (!y0 || !bias32 || !bias16)
        goto done;
    CHECK_OK(mg_alloc(b, 2ull * m * n, &y));
    CHECK_OK(mg_alloc(b, 4ull * n, &bias));
    for (int t = 0; t < 3; t++) {
        for (size_t i = 0; i < (size_t)m * n; i++)
            y0[i] = mg_f32_to_bf16((float)((int)(test_rand() % 2001) - 1000) / 97.0f);
        for (uint32_t j = 0; j < n; j++) {
            const float v = (float)((int)(test_rand() % 2001) - 1000) / 113.0f;
            bias16[j] = types[t] == MG_DTYPE_F16 ? mg_f32_to_f16(v) : mg_f32_to_bf16(v);
            bias32[j] = types[t] == MG_DTYPE_F32   ? v
                        : types[t] == MG_DTYPE_F16 ? mg_f16_to_f32(bias16[j])
                                                   : mg_bf16_to_f32(bias16[j]);
        }
        CHECK_OK(mg_copy_h2d(b, y, y0, 2ull * m * n));
        CHECK_OK(mg_copy_h2d(b, bias, types[t] == MG_DTYPE_F32 ? (void *)bias32 : bias16,
                             n * mg_dtype_bytes(types[t])));
        CHECK_OK(mg_mlx_add_bias(b, NULL, m, n, y, bias, types[t]));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
        got = mlx_test_download(b, y, 2ull * m * n);
        size_t wrong = 0;
        for (size_t i = 0; got && i < (size_t)m * n; i++)
            wrong += got[i] != mg_f32_to_bf16(mg_bf16_to_f32(y0[i]) + bias32[i % n]);
        CHECK(got && wrong == 0);
        free(got);
    }
    CHECK_OK(mg_copy_h2d(b, y, y0, 2ull * m * n));
    CHECK_STATUS(mg_mlx_add_bias(b, NULL, 0, n, y, bias, MG_DTYPE_F32), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("m=0");
    CHECK_STATUS(mg_mlx_add_bias(b, NULL, m, n, y, bias, MG_DTYPE_I32), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("bias_type");
    CHECK_STATUS(mg_mlx_add_bias(b, NULL, m, n, y, bias + 2, MG_DTYPE_F32),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    CHECK_STATUS(mg_mlx_add_bias(b, NULL, m + 1000000, n, y, bias, MG_DTYPE_F32),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_mlx_add_bias(b, NULL, 1, n, y, y, MG_DTYPE_BF16), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_mlx_add_bias(NULL, NULL, m, n, y, bias, MG_DTYPE_F32), MG_ERR_INVALID_ARGUMENT);
    got = mlx_test_download(b, y, 2ull * m * n);
    CHECK(got && !memcmp(got, y0, 2ull * m * n));
    free(got);
done:
    if (y)
        mg_free(b, y);
    if (bias)
        mg_free(b, bias);
    free(y0);
    free(bias32);
    free(bias16);
}

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!b)
        return test_finish();
    const uint32_t groups[] = {32, 64, 128};
    for (uint32_t bits = 4; bits <= 8; bits += 4)
        for (int g = 0; g < 3; g++)
            for (int t = 0; t < 2; t++)
                run_case(b, bits, groups[g], t ? MG_DTYPE_F16 : MG_DTYPE_BF16);
    test_errors(b);
    test_add_bias(b);
    mg_op_stats st;
    CHECK_OK(mg_op_stats_get(b, MG_OP_MLX_QUANT, &st));
    /* the automatic choice on the CPU backend: cpu_avx512 or cpu_avx2 where the CPU has them,
     * else the reference (test_cpu_fast.c checks the fast providers against it) */
    CHECK(st.calls > 0 && (!strcmp(st.provider, "cpu_avx512") || !strcmp(st.provider, "cpu_avx2") ||
                           !strcmp(st.provider, "kernels")));
    mg_backend_close(b);
    return test_finish();
}
