// numerics.metal - the number conversions every Metal kernel shares, with the rules of
// src/core/dtype.c (the kernels/cuda/common/ headers hold the same rules for CUDA). The
// backend compiles one source: this file, then kernels/metal/*.metal in name order
// (cmake/metal_source_to_c.cmake), so each conversion is defined once, here. UNVERIFIED ON
// HARDWARE.
#include <metal_stdlib>
using namespace metal;

// Exact: every BF16 value is an FP32 value.
static inline float bf16_to_float(ushort v) {
    return as_type<float>(uint(v) << 16);
}

// Round to nearest even; NaN -> quiet NaN, sign kept (mg_f32_to_bf16).
static inline ushort float_to_bf16(float f) {
    uint u = as_type<uint>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return ushort((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return ushort(u >> 16);
}

// mg_f32_to_fp8_e4m3, bit for bit: nearest even, saturating at +-448 (infinities included),
// NaN -> 0x7f with its sign.
static inline uchar f32_to_e4m3(float value) {
    uint u = as_type<uint>(value);
    uint sign = (u >> 24) & 0x80u, magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return uchar(sign | 0x7fu);
    if (magnitude >= 0x43e00000u)
        return uchar(sign | 0x7eu);
    if (magnitude < 0x3c800000u) { // subnormal: multiples of 2^-9, scaling by 512 is exact
        float scaled = as_type<float>(magnitude) * 512.0f;
        uint whole = uint(scaled);
        float fraction = scaled - float(whole);
        if (fraction > 0.5f || (fraction == 0.5f && (whole & 1u)))
            whole++;
        return uchar(sign | whole);
    }
    uint kept = magnitude >> 20, dropped = magnitude & 0xfffffu;
    if (dropped > 0x80000u || (dropped == 0x80000u && (kept & 1u)))
        kept++;
    uint code = kept - (120u << 3);
    return uchar(sign | (code > 0x7eu ? 0x7eu : code));
}

// mg_fp8_e4m3_to_f32: exact; 0x7f and 0xff are NaN.
static inline float e4m3_to_float(uchar code) {
    uint exponent = (code >> 3) & 0xfu, mantissa = code & 0x7u;
    float magnitude;
    if (exponent == 0xfu && mantissa == 0x7u)
        magnitude = NAN;
    else if (exponent == 0)
        magnitude = float(mantissa) / 512.0f;
    else
        magnitude = float(8u + mantissa) * as_type<float>((exponent + 117u) << 23); // 2^(e-10)
    return (code & 0x80u) ? -magnitude : magnitude;
}
