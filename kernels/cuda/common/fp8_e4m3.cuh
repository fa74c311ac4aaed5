// fp8_e4m3.cuh - FP8 E4M3 for our kernels: the conversions, with the rounding and NaN rules of
// mg_f32_to_fp8_e4m3 / mg_fp8_e4m3_to_f32 (src/core/dtype.c): round to nearest even, saturate
// at +-448 (infinities included), NaN -> 0x7f with its sign; 0x7f / 0xff decode to NaN. Then
// (device code only) the quantization rule of metrale/ops_quantize.h, shared by the quantizer
// kernels (kernels/cuda/quantize/fp8_quantize.cu) and the kernels that quantize activations on
// the way into a GEMM (kernels/cuda/cutlass/cutlass_moe_sm90_fp8.cu). Why each step is
// bit-identical to the CPU reference: see fp8_quantize.cu.
//
// The conversions compile as host code in C and C++ too (bf16.cuh says how), and
// tests/internal/test_kernel_numerics.c compares them with dtype.c over every code and a large
// sample of floats. On the device the encoder is the hardware conversion, whose NaN (0x7f,
// sign lost) is the only difference from the rule above, so NaN is redone.
#ifndef METRALE_KERNELS_COMMON_FP8_E4M3_CUH
#define METRALE_KERNELS_COMMON_FP8_E4M3_CUH

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#include "bf16.cuh"

// Exact; the code's top bit is the sign.
MG_NUM_FN float mg_num_fp8_e4m3_to_f32(uint32_t code) {
    uint32_t exponent = (code >> 3) & 0xfu, mantissa = code & 0x7u;
    float magnitude;
    if (exponent == 0xfu && mantissa == 0x7u)
        magnitude = mg_num_f32_from_bits(0x7fc00000u);
    else if (exponent == 0)
        magnitude = (float)mantissa * 0x1p-9f; // subnormal: m * 2^-9, exact
    else
        magnitude = mg_num_f32_from_bits(((exponent + 120u) << 23) | (mantissa << 20));
    return (code & 0x80u) ? -magnitude : magnitude;
}

// The code of `value` (< 256).
MG_NUM_FN uint32_t mg_num_f32_to_fp8_e4m3(float value) {
    uint32_t u = mg_num_f32_bits(value), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7fu;
#ifdef __CUDA_ARCH__
    return (uint32_t)__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
#else
    if (a >= 0x43e00000u) // >= 448 (or inf): saturate
        return sign | 0x7eu;
    if (a < 0x3c800000u) {
        // Below 2^-6: subnormal multiples of 2^-9; scaling by 512 is exact, so only the
        // rounding to an integer remains (8 rounds up into the first normal, code 8 too).
        float scaled = mg_num_f32_from_bits(a) * 512.0f;
        uint32_t whole = (uint32_t)scaled;
        float fraction = scaled - (float)whole;
        if (fraction > 0.5f || (fraction == 0.5f && (whole & 1u)))
            whole++;
        return sign | whole;
    }
    // Normal: the top 3 mantissa bits, the other 20 rounded to nearest even (a carry into the
    // exponent is right), then the exponent re-biased 127 -> 7.
    uint32_t kept = a >> 20, dropped = a & 0xfffffu;
    if (dropped > 0x80000u || (dropped == 0x80000u && (kept & 1u)))
        kept++;
    uint32_t code = kept - (120u << 3);
    return sign | (code > 0x7eu ? 0x7eu : code);
#endif
}

// The four codes of one word (memory order: the lowest byte first), widened exactly. On the
// device two hardware conversions through FP16 (exact: every E4M3 value is an FP16 value, and
// NaN stays NaN of its sign).
MG_NUM_FN void mg_num_fp8x4_e4m3_to_f32(uint32_t codes, float out[4]) {
#ifdef __CUDA_ARCH__
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(codes >> (16 * h)), __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&pair));
        out[2 * h] = f.x;
        out[2 * h + 1] = f.y;
    }
#else
    for (int i = 0; i < 4; i++)
        out[i] = mg_num_fp8_e4m3_to_f32((codes >> (8 * i)) & 0xffu);
#endif
}

// |x| for finite x, else 0: infinities and NaN (which fails the comparison) never reach a
// scale or an amax.
MG_NUM_FN float mg_num_finite_magnitude(float x) {
    float magnitude = fabsf(x);
    return magnitude < mg_num_f32_from_bits(0x7f800000u) ? magnitude : 0.0f;
}

#ifdef __CUDACC__
namespace mg_fp8 {

constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ float pair_amax(uint32_t pair, float amax) {
    return fmaxf(amax, fmaxf(mg_num_finite_magnitude(mg_num_bf16_low(pair)),
                             mg_num_finite_magnitude(mg_num_bf16_high(pair))));
}

__device__ __forceinline__ float vector_amax(uint4 v, float amax) {
    return pair_amax(v.w, pair_amax(v.z, pair_amax(v.y, pair_amax(v.x, amax))));
}

__device__ __forceinline__ float scale_from_amax(float amax) {
    return amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
}

// The codes of two BF16 values, the first in the low byte.
__device__ __forceinline__ uint32_t quantize_pair(uint32_t pair, float scale) {
    float2 scaled = make_float2(__fdiv_rn(mg_num_bf16_low(pair), scale),
                                __fdiv_rn(mg_num_bf16_high(pair), scale));
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
#endif // __CUDACC__

#endif
