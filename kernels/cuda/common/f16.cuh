// f16.cuh - IEEE FP16 <-> FP32 for our kernels, with the rules of mg_f16_to_f32 /
// mg_f32_to_f16 (src/core/dtype.c): round to nearest even, overflow (65520 and up) to
// infinity, subnormals kept; a NaN encodes as a quiet NaN with its sign and its top payload
// bits, and every FP16 NaN decodes to the quiet NaN of its sign. The one definition every
// kernel uses (MLX scales and biases may be FP16).
//
// Host code in C and C++ as bf16.cuh says; tests/internal/test_kernel_numerics.c compares it
// bit for bit with dtype.c. On the device both directions are the hardware conversions, exact
// for every non-NaN value, with NaN redone by the rule above.
#ifndef METRALE_KERNELS_COMMON_F16_CUH
#define METRALE_KERNELS_COMMON_F16_CUH

#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include "bf16.cuh"

// Exact for every non-NaN code. Bits above the low 16 are ignored.
MG_NUM_FN float mg_num_f16_to_f32(uint32_t f16) {
    const uint32_t sign = (f16 & 0x8000u) << 16, exponent = (f16 >> 10) & 0x1fu,
                   mantissa = f16 & 0x3ffu;
    if (exponent == 0x1fu && mantissa)
        return mg_num_f32_from_bits(sign | 0x7fc00000u);
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)f16));
#else
    if (exponent == 0x1fu)
        return mg_num_f32_from_bits(sign | 0x7f800000u);
    if (exponent == 0) { // zero or subnormal: m * 2^-24, exact in FP32
        const float magnitude = (float)mantissa * 0x1p-24f;
        return sign ? -magnitude : magnitude;
    }
    return mg_num_f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
}

// The FP16 code of `value` (< 2^16).
MG_NUM_FN uint32_t mg_num_f32_to_f16(float value) {
    const uint32_t u = mg_num_f32_bits(value), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
#ifdef __CUDA_ARCH__
    return (uint32_t)__half_as_ushort(__float2half_rn(value));
#else
    if (a >= 0x477ff000u) // 65520 and up, infinity included
        return sign | 0x7c00u;
    uint32_t magnitude, shift;
    if (a >= 0x38800000u) { // 2^-14 and up: normal, re-biased; a carry may reach the next binade
        magnitude = a - 0x38000000u;
        shift = 13;
    } else {
        const uint32_t exponent = a >> 23;
        if (exponent < 102) // below 2^-25: rounds to zero
            return sign;
        magnitude = (a & 0x7fffffu) | 0x800000u; // subnormal, in units of 2^-24
        shift = 126 - exponent;
    }
    const uint32_t kept = magnitude >> shift, rest = magnitude & ((1u << shift) - 1u),
                   half = 1u << (shift - 1);
    return sign | (kept + (rest > half || (rest == half && (kept & 1u))));
#endif
}

#endif
