/* test_cuda_mlx.c - the MLX ops' CUDA kernels (kernels/cuda/mlx/) against the CPU backend's
 * reference on the same random layers: dequant bit for bit; GEMVs (plain, silu_gate,
 * silu_gate_resid in place, gate_up) and the GEMM within BF16 bounds. Shapes are awkward (n
 * not a multiple of the 16 rows a block owns, k spanning several staged activation passes),
 * every bits, group size and scale type, M = 1..8. Skips (77) without a usable GPU. */
#include <stdio.h>

#include "mlx_test_util.h"
#include "test_cuda_util.h"

/* CUDA `got` against the CPU's `ref` [rows, n] within 2^-7 |ref| + 2^-shift sum |w a|. */
static void compare(const char *what, const mlx_test_layer *l, uint32_t e, uint32_t rows,
                    const uint16_t *act, const uint16_t *got, const uint16_t *ref, int shift) {
    const mg_mlx_linear *w = &l->w;
    size_t count = (size_t)rows * w->n;
    double *want = malloc(count * sizeof *want), *spread = malloc(count * sizeof *spread);
    for (uint32_t t = 0; t < rows; t++)
        for (uint32_t r = 0; r < w->n; r++) {
            double s = 0;
            for (uint32_t j = 0; j < w->k; j++)
                s += fabs(mlx_test_weight(l, e, r, j) * mg_bf16_to_f32(act[(size_t)t * w->k + j]));
            want[(size_t)t * w->n + r] = mg_bf16_to_f32(ref[(size_t)t * w->n + r]);
            spread[(size_t)t * w->n + r] = s;
        }
    mlx_test_compare(what, got, want, spread, count, shift);
    free(want);
    free(spread);
}

static void run_case(mg_backend *cpu, mg_backend *cuda, uint32_t n, uint32_t k, uint32_t bits,
                     uint32_t group, mg_dtype type, uint32_t m) {
    char what[128];
    snprintf(what, sizeof what, "bits=%u group=%u %s n=%u k=%u m=%u", bits, group,
             mg_dtype_name(type), n, k, m);
    mlx_test_layer l, l2, dl, dl2;
    mlx_test_layer_make(cpu, &l, 2, n, k, bits, group, type);
    mlx_test_layer_make(cpu, &l2, 2, n, k, bits, group, type);
    mlx_test_layer_copy(cuda, &l, &dl);
    mlx_test_layer_copy(cuda, &l2, &dl2);
    mlx_test_case c;
    mlx_test_case_make(&c, &l.w, m, 67);
    mlx_test_outputs ref = {0}, got = {0};
    mlx_test_run(cpu, &l.w, &l2.w, &c, &ref);
    mlx_test_run(cuda, &dl.w, &dl2.w, &c, &got);
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
    } products[] = {{"gemv", got.plain, ref.plain, c.x, 12},
                    {"gate_up/gate", got.gate, ref.gate, c.x, 12},
                    {"silu_gate", got.silu, ref.silu, c.g, 8},
                    {"silu_gate_resid", got.resid, ref.resid, c.g, 8}};
    for (size_t i = 0; i < sizeof products / sizeof *products; i++) {
        snprintf(label, sizeof label, "%s %s", products[i].name, what);
        compare(label, &l, c.expert, m, products[i].act, products[i].got, products[i].ref,
                products[i].shift);
    }
    snprintf(label, sizeof label, "gate_up/up %s", what);
    compare(label, &l2, c.expert, m, c.x, got.up, ref.up, 12);
    snprintf(label, sizeof label, "gemm m=67 %s", what);
    compare(label, &l, c.expert, 67, c.x_gemm, got.gemm, ref.gemm, 10);
    mlx_test_outputs_free(&ref);
    mlx_test_outputs_free(&got);
    mlx_test_case_free(&c);
    mlx_test_layer_free(cpu, &l);
    mlx_test_layer_free(cpu, &l2);
    mlx_test_layer_free(cuda, &dl);
    mlx_test_layer_free(cuda, &dl2);
}

int main(void) {
    mg_backend *cuda = cuda_test_open_or_skip("test_cuda_mlx");
    test_seed();
    mg_backend *cpu = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &cpu));
    const uint32_t groups[] = {32, 64, 128};
    for (uint32_t bits = 4; bits <= 8; bits += 4)
        for (int g = 0; g < 3; g++)
            for (int t = 0; t < 2; t++) {
                uint32_t n = (uint32_t)test_rand_range(1, 90);
                /* k up to 2600: several activation passes at M > 3. */
                uint32_t k = groups[g] * (uint32_t)test_rand_range(1, 2600 / groups[g]);
                run_case(cpu, cuda, n, k, bits, groups[g], t ? MG_DTYPE_F16 : MG_DTYPE_BF16,
                         (uint32_t)test_rand_range(1, 8));
            }
    /* Every M at one larger shape (several activation passes from M = 4 up), and a K past one
     * pass at M = 1 (8192 columns). */
    for (uint32_t m = 1; m <= 8; m++)
        run_case(cpu, cuda, 203, 2176, m % 2 ? 4 : 8, 64, MG_DTYPE_BF16, m);
    run_case(cpu, cuda, 37, 14336, 4, 128, MG_DTYPE_F16, 1);
    run_case(cpu, cuda, 37, 14336, 8, 32, MG_DTYPE_BF16, 3);
    mg_backend_close(cpu);
    mg_backend_close(cuda);
    return test_finish();
}
