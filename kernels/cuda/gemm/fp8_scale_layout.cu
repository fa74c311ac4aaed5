// fp8_scale_layout.cu - FP8 block-scale layout kernels (metrale/ops_gemm.h).
#include "common/grid_dependency.cuh"
#include <stdint.h>

// The activation-scale transpose: src [m, blocks] (index t * blocks + g, as a per-token
// quantizer writes) -> dst [blocks, m_pad] (index g * m_pad + t, the 1x128 layout cuBLASLt
// reads), zero for the padding tokens m <= t < m_pad. One thread per destination element, so
// writes are coalesced; the reads are a small gather (blocks is K / 128). Grid-stride, so any
// 1-D grid covers the tensor.
extern "C" __global__ void fp8_act_scales_transpose(const float *src, float *dst, uint32_t m,
                                                    uint32_t m_pad, uint32_t blocks) {
    grid_dependency_wait();
    launch_dependents();
    uint64_t total = (uint64_t)blocks * m_pad;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t g = (uint32_t)(i / m_pad), t = (uint32_t)(i % m_pad);
        dst[i] = t < m ? src[(uint64_t)t * blocks + g] : 0.0f;
    }
}
