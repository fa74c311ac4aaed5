// rmsnorm_prologue.cuh - the RMSNorm prologue of a GEMM that reads its activations straight from
// global memory (metrale/ops_gemm.h, "fusion"): each loaded activation word is multiplied by the
// norm weight at the same K position as it is loaded, the squares of the raw values are summed on
// the way, and the GEMM scales each output by 1 / sqrtf(sum / K + eps) at the end. That is
// RMSNorm with the scale applied after the dot product instead of before the rounding: each
// operand is still one BF16 rounding from the exact product, so a kernel that uses it is within
// the tolerance of the composed ops, not bit-equal to the CPU composition. Shared by the decode
// GEMV (gemm/decode_gemv.cu) and the NVFP4 small-tile GEMMs (nvfp4/nvfp4_gemm.cu).
#ifndef METRALE_RMSNORM_PROLOGUE_CUH
#define METRALE_RMSNORM_PROLOGUE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"

// One loaded activation word (two BF16): bf16(a * norm_weight) per value, one packed multiply (a
// product of two BF16 values is exact in FP32, so this is the product rounded once); with
// `count`, the squares of the raw values are added to *sum_sq (FP32, a fixed order per lane).
__device__ __forceinline__ uint32_t rmsnorm_prologue_word(uint32_t a, uint32_t w, bool count,
                                                          float *sum_sq) {
    if (count) {
        const float lo = mg_num_bf16_low(a), hi = mg_num_bf16_high(a);
        *sum_sq = fmaf(hi, hi, fmaf(lo, lo, *sum_sq));
    }
    __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 y = __hmul2(x, *reinterpret_cast<const __nv_bfloat162 *>(&w));
    return *reinterpret_cast<const uint32_t *>(&y);
}

// The scale of a row's outputs once its sum of squares over all of K is known.
__device__ __forceinline__ float rmsnorm_prologue_inv(float sum_sq, uint32_t k, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)k + eps);
}

// The sum of a value over the 4 lanes of a quad, in the same order on every lane.
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#endif
