/* test_cuda_tp_mlp.c - the tensor-parallel MLP block on two GPUs (NCCL all-reduce) equals the
 * block on one GPU within BF16 bounds (skipped, 77, with fewer than two GPUs or without
 * NCCL); and the CUDA SiLU-mul kernel against the CPU reference. */
#include "metrale/ops_activation.h"
#include "tp_mlp_test_util.h"

/* The CUDA kernel against the CPU backend's reference kernel on the same input: equal, or one
 * BF16 spacing apart (CUDA's expf vs the host's). */
static void test_silu_mul(mg_backend *gpu, mg_backend *cpu) {
    const uint32_t rows = 67, cols = 1373, pitch = 2 * cols + 5;
    size_t in_count = (size_t)rows * pitch, out_count = (size_t)rows * cols;
    uint16_t *in = malloc(in_count * 2), *a = malloc(out_count * 2), *b = malloc(out_count * 2);
    comm_fill(MG_DTYPE_BF16, in, in_count);
    mg_backend *both[2] = {gpu, cpu};
    uint16_t *outs[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        mg_devptr din, dout;
        CHECK_OK(mg_alloc(both[i], in_count * 2, &din));
        CHECK_OK(mg_alloc(both[i], out_count * 2, &dout));
        CHECK_OK(mg_copy_h2d(both[i], din, in, in_count * 2));
        CHECK_OK(mg_memset(both[i], dout, 0xff, out_count * 2));
        CHECK_OK(mg_silu_mul_bf16(both[i], NULL, rows, cols, din, pitch, dout, cols));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(both[i])));
        CHECK_OK(mg_copy_d2h(both[i], outs[i], dout, out_count * 2));
        mg_free(both[i], din);
        mg_free(both[i], dout);
    }
    size_t differ = 0, bad = 0;
    for (size_t i = 0; i < out_count; i++) {
        double x = mg_bf16_to_f32(a[i]), y = mg_bf16_to_f32(b[i]);
        differ += a[i] != b[i];
        bad += !(fabs(x - y) <= comm_ulp(MG_DTYPE_BF16, y));
    }
    printf("silu_mul: %zu of %zu outputs differ from the CPU's by one spacing\n", differ,
           out_count);
    CHECK(bad == 0);
    free(in);
    free(a);
    free(b);
}

int main(void) {
    mg_backend *gpu[2], *cpu;
    comm_open_two_cuda_or_skip("test_cuda_tp_mlp", gpu);
    test_seed();
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &cpu));
    test_silu_mul(gpu[0], cpu);
    /* A Llama-like block, scaled down; batch 1, 64 and an odd 37. */
    static const uint32_t tokens[] = {1, 64, 37};
    tp_mlp_check(gpu, gpu[0], 1024, 2816, tokens, 3);
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_backend_close(gpu[r]));
    CHECK_OK(mg_backend_close(cpu));
    return test_finish();
}
