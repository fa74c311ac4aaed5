// rmsnorm_prologue.cuh - the RMSNorm prologue of a GEMM (metrale/ops_gemm.h, "fusion"), two ways.
// On the fly (the BF16 decode GEMV): each loaded activation word is multiplied by the norm weight
// at the same K position as it is loaded, the squares of the raw values are summed on the way,
// and the GEMM scales each output by 1 / sqrtf(sum / K + eps) at the end: RMSNorm with the scale
// applied after the dot product instead of before the rounding, each operand still one BF16
// rounding from the exact product, so within the tolerance of the composed ops, not bit-equal to
// the CPU composition. Staged (the FP8 decode GEMV, the NVFP4 small-tile GEMMs): a block sums
// each row's squares (sum_squares, warp_sum), then writes the normed rows as mg_rmsnorm_bf16
// rounds them (norm_vector) where its MMAs read them. Shared by gemm/decode_gemv.cu and
// nvfp4/nvfp4_gemm.cu.
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

// bf16((x * inv) * w) for the 8 values of a vector, mg_rmsnorm_bf16's rounding.
__device__ __forceinline__ uint4 norm_vector(uint4 x, uint4 w, float inv) {
    auto pair = [inv](uint32_t a, uint32_t b) {
        const float lo = mg_num_bf16_low(a) * inv * mg_num_bf16_low(b);
        const float hi = mg_num_bf16_high(a) * inv * mg_num_bf16_high(b);
        return mg_num_f32_to_bf16(lo) | mg_num_f32_to_bf16(hi) << 16;
    };
    return make_uint4(pair(x.x, w.x), pair(x.y, w.y), pair(x.z, w.z), pair(x.w, w.w));
}

__device__ __forceinline__ float sum_squares(uint4 v, float sum) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float lo = mg_num_bf16_low(words[i]), hi = mg_num_bf16_high(words[i]);
        sum = fmaf(hi, hi, fmaf(lo, lo, sum));
    }
    return sum;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// The sum of a value over the 4 lanes of a quad, in the same order on every lane.
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#endif
