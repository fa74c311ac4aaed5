/* test_nvfp4_moe_cuda.c - the same tests as test_nvfp4_moe_cpu.c on CUDA device 0: the CUDA
 * kernels of kernels/cuda/nvfp4/nvfp4_format.cu and kernels/cuda/moe/moe_routing.cu against
 * the independent host results of the checks. Skips (77) without a usable CUDA device. */
#include "nvfp4_moe_tests.h"
#include "test_cuda_util.h"

int main(void) {
    test_seed();
    return run_nvfp4_moe_tests(cuda_test_open_or_skip("test_nvfp4_moe_cuda"));
}
