// bf16.cuh - BF16 <-> FP32 for our kernels, with the rounding and NaN rules of
// mg_f32_to_bf16 / mg_bf16_to_f32 (src/core/dtype.c): round to nearest even, a NaN becomes a
// quiet NaN with its sign and its top payload bits kept, infinities stay infinite. The one
// definition every kernel uses; no kernel converts BF16 on its own.
//
// The functions are __host__ __device__ under nvcc and plain static inline functions in C or
// C++, so the CPU tests compile this very header and compare it bit for bit with dtype.c
// (tests/internal/test_kernel_numerics.c). A BF16 value travels as the low 16 bits of a
// uint32_t; a pair is one 32-bit word, the first value in the low half (memory order).
#ifndef METRALE_KERNELS_COMMON_BF16_CUH
#define METRALE_KERNELS_COMMON_BF16_CUH

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#define MG_NUM_FN __host__ __device__ __forceinline__
#else
#define MG_NUM_FN static inline
#endif

MG_NUM_FN uint32_t mg_num_f32_bits(float value) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(value);
#else
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
#endif
}

MG_NUM_FN float mg_num_f32_from_bits(uint32_t bits) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
#endif
}

// Exact: every BF16 value is an FP32 value. Bits above the low 16 are ignored.
MG_NUM_FN float mg_num_bf16_to_f32(uint32_t bf16) {
    return mg_num_f32_from_bits(bf16 << 16);
}

// Round to nearest even; NaN -> quiet NaN, sign kept (mg_f32_to_bf16). The result is < 2^16.
MG_NUM_FN uint32_t mg_num_f32_to_bf16(float value) {
    uint32_t u = mg_num_f32_bits(value);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return ((u >> 16) | 0x0040u) & 0xffffu;
    return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
}

// The two values of a pair of BF16 in one word, and a pair made of two rounded floats.
MG_NUM_FN float mg_num_bf16_low(uint32_t pair) {
    return mg_num_f32_from_bits(pair << 16);
}

MG_NUM_FN float mg_num_bf16_high(uint32_t pair) {
    return mg_num_f32_from_bits(pair & 0xffff0000u);
}

// On sm_80 and later one cvt rounds both (nearest even, as above); only its NaN differs (the
// canonical 0x7fff), so a NaN lane is redone by the rule above.
MG_NUM_FN uint32_t mg_num_bf16_pack(float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const __nv_bfloat162 v = __floats2bfloat162_rn(low, high);
    uint32_t pair =
        (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
    if (low != low)
        pair = (pair & 0xffff0000u) | mg_num_f32_to_bf16(low);
    if (high != high)
        pair = (pair & 0x0000ffffu) | (mg_num_f32_to_bf16(high) << 16);
    return pair;
#else
    return mg_num_f32_to_bf16(low) | (mg_num_f32_to_bf16(high) << 16);
#endif
}

#ifdef __CUDACC__
// The same rounding for a kernel that stores CUDA's BF16 type.
__device__ __forceinline__ __nv_bfloat16 mg_num_to_nv_bf16(float value) {
    return __ushort_as_bfloat16((unsigned short)mg_num_f32_to_bf16(value));
}
#endif

#endif
