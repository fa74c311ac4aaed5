/* test_cuda_mlx.c - the MLX ops' CUDA kernels (kernels/cuda/mlx/) against the CPU backend's
 * reference on the same random layers, under each CUDA provider forced in turn ("kernels": the
 * SIMT GEMVs of mlx_quant.cu; "cuda_mma": the tensor-core GEMVs of mlx_gemv_mma.cu, BF16 scales
 * only; "cuda_m1": mlx_quant.cu's one-row kernels, bit for bit the SIMT ones): dequant bit for bit;
 * GEMVs (plain, silu_gate, silu_gate_resid in place, gate_up) and the GEMM within BF16 bounds;
 * gate_up's SiLU-mul epilogue against the SiLU-mul of its products. Shapes are awkward (n not a
 * multiple of the 16 rows a block owns, k spanning several staged activation passes), every bits,
 * group size and scale type, M = 1..8; the automatic choice is checked per scale type. Skips (77)
 * without a usable GPU. */
#include <stdio.h>
#include <string.h>

#include "mlx_test_util.h"
#include "test_cuda_util.h"

static const char *const providers[] = {"kernels", "cuda_mma"};

/* CUDA `got` against the CPU's `ref` [rows, n] within 2^-7 |ref| + 2^-shift sum |w a|, plus
 * sum |(deq(w) - w) a| when `deq` (the dequant's BF16 weights of the expert, [n, k]) is given:
 * the tensor-core GEMVs multiply those, the reference the exact scale * q + bias. */
static void compare(const char *what, const mlx_test_layer *l, uint32_t e, uint32_t rows,
                    const uint16_t *act, const uint16_t *got, const uint16_t *ref,
                    const uint16_t *deq, int shift) {
    const mg_mlx_linear *w = &l->w;
    size_t count = (size_t)rows * w->n;
    double *want = malloc(count * sizeof *want), *spread = malloc(count * sizeof *spread);
    for (uint32_t t = 0; t < rows; t++)
        for (uint32_t r = 0; r < w->n; r++) {
            double s = 0, rounding = 0;
            for (uint32_t j = 0; j < w->k; j++) {
                double exact = mlx_test_weight(l, e, r, j);
                double a = fabs(mg_bf16_to_f32(act[(size_t)t * w->k + j]));
                s += fabs(exact) * a;
                if (deq)
                    rounding += fabs(mg_bf16_to_f32(deq[(size_t)r * w->k + j]) - exact) * a;
            }
            want[(size_t)t * w->n + r] = mg_bf16_to_f32(ref[(size_t)t * w->n + r]);
            /* mlx_test_compare scales the spread by 2^-shift: the rounding term enters whole. */
            spread[(size_t)t * w->n + r] = s + ldexp(rounding, shift);
        }
    mlx_test_compare(what, got, want, spread, count, shift);
    free(want);
    free(spread);
}

/* The CPU backend's dequant of expert e of layer l (the reference's BF16 weights). */
static uint16_t *cpu_dequant(mg_backend *cpu, const mlx_test_layer *l, uint32_t e) {
    uint64_t bytes = mg_mlx_gemm_scratch_bytes(&l->w);
    mg_devptr out = mlx_test_poisoned(cpu, bytes);
    CHECK_OK(mg_mlx_dequant(cpu, NULL, &l->w, e, out));
    uint16_t *host = mlx_test_download(cpu, out, bytes);
    mg_free(cpu, out);
    return host;
}

/* Forced `provider` refuses the GEMVs of layer `w` as unsupported, launching nothing. */
static void check_refused(mg_backend *cuda, const char *provider, const mg_mlx_linear *w,
                          uint32_t expert, uint32_t m) {
    mg_devptr x = mlx_test_poisoned(cuda, 2ull * m * w->k);
    mg_devptr y = mlx_test_poisoned(cuda, 2ull * m * w->n);
    mg_devptr y2 = mlx_test_poisoned(cuda, 2ull * m * w->n);
    mg_op_stats before, after;
    CHECK_OK(mg_op_stats_get(cuda, MG_OP_MLX_QUANT, &before));
    CHECK(mg_mlx_gemv(cuda, NULL, w, expert, m, x, y) == MG_ERR_UNSUPPORTED);
    CHECK(strstr(mg_last_error(), provider) != NULL);
    CHECK(mg_mlx_gemv_gate_up(cuda, NULL, w, w, expert, m, x, y, y2) == MG_ERR_UNSUPPORTED);
    const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
    const mg_gemm_fusion_tensors none = {0};
    CHECK(mg_mlx_gemv_fused(cuda, NULL, w, w, expert, m, x, y, &silu_mul, &none) ==
          MG_ERR_UNSUPPORTED);
    CHECK_OK(mg_op_stats_get(cuda, MG_OP_MLX_QUANT, &after));
    CHECK(after.calls == before.calls);
    mg_free(cuda, x);
    mg_free(cuda, y);
    mg_free(cuda, y2);
}

/* Runs every op of c on the CPU and on CUDA (its provider already forced) and compares;
 * on_dequant: the provider multiplies the dequant's BF16 weights. */
static void run_and_compare(mg_backend *cpu, mg_backend *cuda, const mlx_test_layer *l,
                            const mlx_test_layer *l2, const mlx_test_layer *dl,
                            const mlx_test_layer *dl2, const mlx_test_case *c, const char *what,
                            bool on_dequant) {
    const uint32_t n = l->w.n, k = l->w.k, m = c->m;
    mlx_test_outputs ref = {0}, got = {0};
    mlx_test_run(cpu, &l->w, &l2->w, c, &ref);
    mlx_test_run(cuda, &dl->w, &dl2->w, c, &got);
    uint16_t *deq = on_dequant ? ref.deq : NULL;
    uint16_t *deq2 = on_dequant ? cpu_dequant(cpu, l2, c->expert) : NULL;
    CHECK_OK(mg_stream_synchronize(mg_stream_default(cuda)));
    size_t mismatches = 0;
    for (size_t i = 0; i < (size_t)n * k; i++)
        mismatches += got.deq[i] != ref.deq[i];
    CHECK(mismatches == 0);
    if (mismatches)
        fprintf(stderr, "  dequant %s: %zu of %zu differ\n", what, mismatches, (size_t)n * k);
    char label[192];
    /* Silu's expf differs by an ulp between the host and the device: BF16 activations may
     * round apart, so silu_gate gets 2^-8 of the spread. */
    struct {
        const char *name;
        const uint16_t *got, *ref, *act;
        int shift;
    } products[] = {{"gemv", got.plain, ref.plain, c->x, 12},
                    {"gate_up/gate", got.gate, ref.gate, c->x, 12},
                    {"silu_gate", got.silu, ref.silu, c->g, 8},
                    {"silu_gate_resid", got.resid, ref.resid, c->g, 8}};
    for (size_t i = 0; i < sizeof products / sizeof *products; i++) {
        snprintf(label, sizeof label, "%s %s", products[i].name, what);
        compare(label, l, c->expert, m, products[i].act, products[i].got, products[i].ref, deq,
                products[i].shift);
    }
    snprintf(label, sizeof label, "gate_up/up %s", what);
    compare(label, l2, c->expert, m, c->x, got.up, ref.up, deq2, 12);
    /* the SiLU-mul epilogue: of the same provider's gate_up products (checked just above), as
     * mg_silu_mul_bf16 computes it; the device's expf may round one BF16 step apart */
    snprintf(label, sizeof label, "gate_up+silu_mul %s", what);
    mlx_test_check_silu_mul(label, got.silu_mul, got.gate, got.up, (size_t)m * n, 1);
    snprintf(label, sizeof label, "gemm m=67 %s", what);
    compare(label, l, c->expert, 67, c->x_gemm, got.gemm, ref.gemm, NULL, 10);
    free(deq2);
    mlx_test_outputs_free(&ref);
    mlx_test_outputs_free(&got);
}

static void run_case(mg_backend *cpu, mg_backend *cuda, uint32_t n, uint32_t k, uint32_t bits,
                     uint32_t group, mg_dtype type, uint32_t m, const char *provider) {
    char what[160];
    snprintf(what, sizeof what, "%s bits=%u group=%u %s n=%u k=%u m=%u", provider, bits, group,
             mg_dtype_name(type), n, k, m);
    mlx_test_layer l, l2, dl, dl2;
    mlx_test_layer_make(cpu, &l, 2, n, k, bits, group, type);
    mlx_test_layer_make(cpu, &l2, 2, n, k, bits, group, type);
    mlx_test_layer_copy(cuda, &l, &dl);
    mlx_test_layer_copy(cuda, &l2, &dl2);
    mlx_test_case c;
    mlx_test_case_make(&c, &l.w, m, 67);
    CHECK_OK(mg_op_force_provider(cuda, MG_OP_MLX_QUANT, provider));
    bool on_dequant = strcmp(provider, "cuda_mma") == 0;
    if (on_dequant && type != MG_DTYPE_BF16)
        check_refused(cuda, provider, &dl.w, c.expert, m);
    else
        run_and_compare(cpu, cuda, &l, &l2, &dl, &dl2, &c, what, on_dequant);
    CHECK_OK(mg_op_force_provider(cuda, MG_OP_MLX_QUANT, NULL));
    mlx_test_case_free(&c);
    mlx_test_layer_free(cpu, &l);
    mlx_test_layer_free(cpu, &l2);
    mlx_test_layer_free(cuda, &dl);
    mlx_test_layer_free(cuda, &dl2);
}

/* Provider cuda_m1 forced (the SIMT kernels compiled for one row): the plain GEMV and gate_up
 * (both epilogues) of one row equal the "kernels" provider's bit for bit (the same arithmetic)
 * and agree with the CPU; the silu forms and two rows are refused, launching nothing. */
static void run_m1_case(mg_backend *cpu, mg_backend *cuda, uint32_t n, uint32_t k, uint32_t bits,
                        uint32_t group, mg_dtype type) {
    char what[160];
    snprintf(what, sizeof what, "cuda_m1 bits=%u group=%u %s n=%u k=%u m=1", bits, group,
             mg_dtype_name(type), n, k);
    mlx_test_layer l, l2, dl, dl2;
    mlx_test_layer_make(cpu, &l, 2, n, k, bits, group, type);
    mlx_test_layer_make(cpu, &l2, 2, n, k, bits, group, type);
    mlx_test_layer_copy(cuda, &l, &dl);
    mlx_test_layer_copy(cuda, &l2, &dl2);
    const uint32_t e = 1;
    uint16_t *hx = mlx_test_activations(k);
    const size_t out = (size_t)n * 2;
    mg_devptr x = mlx_test_upload(cuda, hx, (size_t)k * 2), cx = mlx_test_upload(cpu, hx, k * 2);
    mg_devptr y = mlx_test_poisoned(cuda, 4 * out), cy = mlx_test_poisoned(cpu, 2 * out);
    const mg_gemm_fusion silu_mul = {.epilogue = MG_GEMM_EPILOGUE_SILU_MUL};
    const mg_gemm_fusion_tensors none = {0};
    uint16_t *got = NULL, *simt = NULL;
    for (int pass = 0; pass < 2; pass++) { /* cuda_m1, then the SIMT kernels of every M */
        CHECK_OK(mg_op_force_provider(cuda, MG_OP_MLX_QUANT, pass ? "kernels" : "cuda_m1"));
        CHECK_OK(mg_memset(cuda, y, 0xff, 4 * out));
        CHECK_OK(mg_mlx_gemv(cuda, NULL, &dl.w, e, 1, x, y));
        CHECK_OK(mg_mlx_gemv_gate_up(cuda, NULL, &dl.w, &dl2.w, e, 1, x, y + out, y + 2 * out));
        CHECK_OK(
            mg_mlx_gemv_fused(cuda, NULL, &dl.w, &dl2.w, e, 1, x, y + 3 * out, &silu_mul, &none));
        mg_op_stats st;
        CHECK_OK(mg_op_stats_get(cuda, MG_OP_MLX_QUANT, &st));
        CHECK(!strcmp(st.provider, pass ? "kernels" : "cuda_m1"));
        *(pass ? &simt : &got) = mlx_test_download(cuda, y, 4 * out);
    }
    CHECK(!memcmp(got, simt, 4 * out));
    if (memcmp(got, simt, 4 * out))
        fprintf(stderr, "FAIL %s: differs from the SIMT kernels of every M\n", what);
    /* against the CPU: the plain GEMV and gate_up's gate within the product bound */
    CHECK_OK(mg_mlx_gemv(cpu, NULL, &l.w, e, 1, cx, cy));
    CHECK_OK(mg_mlx_gemv(cpu, NULL, &l2.w, e, 1, cx, cy + out));
    uint16_t *ref = mlx_test_download(cpu, cy, 2 * out);
    char label[200];
    snprintf(label, sizeof label, "gemv %s", what);
    compare(label, &l, e, 1, hx, got, ref, NULL, 12);
    snprintf(label, sizeof label, "gate_up/up %s", what);
    compare(label, &l2, e, 1, hx, got + out, ref + out / 2, NULL, 12);
    snprintf(label, sizeof label, "gate_up+silu_mul %s", what);
    mlx_test_check_silu_mul(label, got + 3 * out / 2, got + out / 2, got + out, n, 1);
    /* refusals: the silu forms, two rows */
    CHECK_OK(mg_op_force_provider(cuda, MG_OP_MLX_QUANT, "cuda_m1"));
    CHECK(mg_mlx_gemv_silu_gate(cuda, NULL, &dl.w, e, 1, x, x, y) == MG_ERR_UNSUPPORTED);
    mg_devptr x2 = mlx_test_poisoned(cuda, 4ull * k);
    CHECK(mg_mlx_gemv(cuda, NULL, &dl.w, e, 2, x2, y) == MG_ERR_UNSUPPORTED);
    CHECK(strstr(mg_last_error(), "m > 1") != NULL);
    CHECK_OK(mg_op_force_provider(cuda, MG_OP_MLX_QUANT, NULL));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(cuda)));
    mg_free(cuda, x2);
    free(got);
    free(simt);
    free(ref);
    free(hx);
    mg_free(cuda, x);
    mg_free(cuda, y);
    mg_free(cpu, cx);
    mg_free(cpu, cy);
    mlx_test_layer_free(cpu, &l);
    mlx_test_layer_free(cpu, &l2);
    mlx_test_layer_free(cuda, &dl);
    mlx_test_layer_free(cuda, &dl2);
}

/* Unforced, GEMVs of 8 rows run on cuda_mma for BF16 scales and on the SIMT kernels for FP16;
 * one row's plain GEMV on the SIMT kernels (cuda_m1 only when forced). */
static void check_automatic_choice(mg_backend *cpu, mg_backend *cuda) {
    const mg_dtype types[] = {MG_DTYPE_BF16, MG_DTYPE_F16};
    const char *const expected[] = {"cuda_mma", "kernels"};
    for (int i = 0; i < 2; i++) {
        mlx_test_layer l, dl;
        mlx_test_layer_make(cpu, &l, 1, 40, 256, 4, 64, types[i]);
        mlx_test_layer_copy(cuda, &l, &dl);
        mg_devptr x = mlx_test_poisoned(cuda, 2ull * 8 * 256);
        mg_devptr y = mlx_test_poisoned(cuda, 2ull * 8 * 40);
        CHECK_OK(mg_memset(cuda, x, 0, 2ull * 8 * 256));
        CHECK_OK(mg_mlx_gemv(cuda, NULL, &dl.w, 0, 8, x, y));
        mg_op_stats st;
        CHECK_OK(mg_op_stats_get(cuda, MG_OP_MLX_QUANT, &st));
        CHECK(strcmp(st.provider, expected[i]) == 0);
        if (strcmp(st.provider, expected[i]) != 0)
            fprintf(stderr, "FAIL automatic choice for %s scales: %s, want %s\n",
                    mg_dtype_name(types[i]), st.provider, expected[i]);
        CHECK_OK(mg_mlx_gemv(cuda, NULL, &dl.w, 0, 1, x, y));
        CHECK_OK(mg_op_stats_get(cuda, MG_OP_MLX_QUANT, &st));
        CHECK(strcmp(st.provider, "kernels") == 0); /* cuda_m1 runs only when forced */
        CHECK_OK(mg_stream_synchronize(mg_stream_default(cuda)));
        mg_free(cuda, x);
        mg_free(cuda, y);
        mlx_test_layer_free(cpu, &l);
        mlx_test_layer_free(cuda, &dl);
    }
}

int main(void) {
    mg_backend *cuda = cuda_test_open_or_skip("test_cuda_mlx");
    test_seed();
    mg_backend *cpu = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &cpu));
    check_automatic_choice(cpu, cuda);
    const uint32_t groups[] = {32, 64, 128};
    for (int p = 0; p < 2; p++) {
        const char *provider = providers[p];
        for (uint32_t bits = 4; bits <= 8; bits += 4)
            for (int g = 0; g < 3; g++)
                for (int t = 0; t < 2; t++) {
                    uint32_t n = (uint32_t)test_rand_range(1, 90);
                    /* k up to 2600: several activation passes at M > 3; K chunks of 64 bytes a
                     * row past the last, for the tensor-core GEMVs. */
                    uint32_t k = groups[g] * (uint32_t)test_rand_range(1, 2600 / groups[g]);
                    run_case(cpu, cuda, n, k, bits, groups[g], t ? MG_DTYPE_F16 : MG_DTYPE_BF16,
                             (uint32_t)test_rand_range(1, 8), provider);
                }
        /* Every M at one larger shape (several activation passes from M = 4 up), and a K past
         * one pass at M = 1 (8192 columns). */
        for (uint32_t m = 1; m <= 8; m++)
            run_case(cpu, cuda, 203, 2176, m % 2 ? 4 : 8, 64, MG_DTYPE_BF16, m, provider);
        run_case(cpu, cuda, 37, 14336, 4, 128, MG_DTYPE_F16, 1, provider);
        run_case(cpu, cuda, 37, 14336, 8, 32, MG_DTYPE_BF16, 3, provider);
        run_case(cpu, cuda, 16, 32, 4, 32, MG_DTYPE_BF16, 8, provider); /* one vector a row */
    }
    for (uint32_t bits = 4; bits <= 8; bits += 4)
        for (int g = 0; g < 3; g++)
            for (int t = 0; t < 2; t++)
                run_m1_case(cpu, cuda, (uint32_t)test_rand_range(1, 90),
                            groups[g] * (uint32_t)test_rand_range(1, 2600 / groups[g]), bits,
                            groups[g], t ? MG_DTYPE_F16 : MG_DTYPE_BF16);
    run_m1_case(cpu, cuda, 37, 14336, 4, 64, MG_DTYPE_BF16);
    run_m1_case(cpu, cuda, 203, 4096, 8, 64, MG_DTYPE_BF16);
    mg_backend_close(cpu);
    mg_backend_close(cuda);
    return test_finish();
}
