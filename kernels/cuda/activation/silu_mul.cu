// silu_mul.cu - out[r, c] = bf16(silu(g) * u), g = in[r, c], u = in[r, cols + c]
// (metrale/ops_activation.h). The arithmetic is the CPU reference's (common/silu.cuh); BF16
// rounding is to nearest even.
// Grid-stride over rows * cols elements.
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/grid_dependency.cuh"
#include "common/silu.cuh"

extern "C" __global__ void silu_mul_bf16(const uint16_t *__restrict__ in,
                                         uint16_t *__restrict__ out, uint32_t rows, uint32_t cols,
                                         uint32_t in_pitch, uint32_t out_pitch) {
    grid_dependency_wait();
    launch_dependents();
    const uint64_t total = static_cast<uint64_t>(rows) * cols;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = i / cols, c = i % cols;
        const float g = mg_num_bf16_to_f32(in[r * in_pitch + c]);
        const float u = mg_num_bf16_to_f32(in[r * in_pitch + cols + c]);
        out[r * out_pitch + c] = (uint16_t)mg_num_f32_to_bf16(mg_silu_mul_f32(g, u));
    }
}
