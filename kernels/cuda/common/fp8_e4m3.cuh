// fp8_e4m3.cuh - the device side of the FP8 E4M3 quantization rule of metrale/ops_quantize.h,
// shared by the quantizer kernels (kernels/cuda/quantize/fp8_quantize.cu) and the kernels that
// quantize activations on the way into a GEMM (kernels/cuda/cutlass/cutlass_moe_sm90_fp8.cu).
// Why each step is bit-identical to the CPU reference: see fp8_quantize.cu.
#pragma once

#include <cuda_fp8.h>
#include <stdint.h>

namespace mg_fp8 {

constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ float bf16_low(uint32_t pair) {
    return __uint_as_float(pair << 16);
}

__device__ __forceinline__ float bf16_high(uint32_t pair) {
    return __uint_as_float(pair & 0xffff0000u);
}

// |x| for finite x, else 0: infinities and NaN (which fails the comparison) never reach a
// scale.
__device__ __forceinline__ float finite_magnitude(float x) {
    float magnitude = fabsf(x);
    return magnitude < __uint_as_float(0x7f800000u) ? magnitude : 0.0f;
}

__device__ __forceinline__ float pair_amax(uint32_t pair, float amax) {
    return fmaxf(amax, fmaxf(finite_magnitude(bf16_low(pair)), finite_magnitude(bf16_high(pair))));
}

__device__ __forceinline__ float vector_amax(uint4 v, float amax) {
    return pair_amax(v.w, pair_amax(v.z, pair_amax(v.y, pair_amax(v.x, amax))));
}

__device__ __forceinline__ float scale_from_amax(float amax) {
    return amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
}

// The codes of two BF16 values, the first in the low byte.
__device__ __forceinline__ uint32_t quantize_pair(uint32_t pair, float scale) {
    float2 scaled =
        make_float2(__fdiv_rn(bf16_low(pair), scale), __fdiv_rn(bf16_high(pair), scale));
    uint32_t codes = __nv_cvt_float2_to_fp8x2(scaled, __NV_SATFINITE, __NV_E4M3);
    if ((pair & 0x7fffu) > 0x7f80u) // low value is NaN
        codes = (codes & 0xff00u) | ((pair >> 8) & 0x80u) | 0x7fu;
    if ((pair & 0x7fff0000u) > 0x7f800000u) // high value is NaN
        codes = (codes & 0x00ffu) | ((pair >> 16) & 0x8000u) | 0x7f00u;
    return codes;
}

// The 8 codes of one vector, in memory order.
__device__ __forceinline__ uint2 quantize_vector(uint4 v, float scale) {
    return make_uint2(quantize_pair(v.x, scale) | quantize_pair(v.y, scale) << 16,
                      quantize_pair(v.z, scale) | quantize_pair(v.w, scale) << 16);
}

// Max over groups of `width` consecutive lanes (a power of two <= 32); every lane of the group
// gets it. All 32 lanes must call it.
__device__ __forceinline__ float lanes_max(float v, int width) {
    for (int offset = width / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

} // namespace mg_fp8
