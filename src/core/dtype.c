/* dtype.c - element sizes, names and exact host conversions (metrale/dtype.h). */
#include "metrale/dtype.h"

#include <math.h>
#include <string.h>

size_t mg_dtype_bytes(mg_dtype t) {
    switch (t) {
    case MG_DTYPE_F32:
        return 4;
    case MG_DTYPE_BF16:
        return 2;
    case MG_DTYPE_F16:
        return 2;
    case MG_DTYPE_FP8_E4M3:
        return 1;
    case MG_DTYPE_U8:
        return 1;
    case MG_DTYPE_I32:
        return 4;
    case MG_DTYPE_U32:
        return 4;
    }
    return 0;
}

const char *mg_dtype_name(mg_dtype t) {
    switch (t) {
    case MG_DTYPE_F32:
        return "f32";
    case MG_DTYPE_BF16:
        return "bf16";
    case MG_DTYPE_F16:
        return "f16";
    case MG_DTYPE_FP8_E4M3:
        return "fp8_e4m3";
    case MG_DTYPE_U8:
        return "u8";
    case MG_DTYPE_I32:
        return "i32";
    case MG_DTYPE_U32:
        return "u32";
    }
    return "?";
}

float mg_bf16_to_f32(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t mg_f32_to_bf16(float value) {
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

float mg_f16_to_f32(uint16_t bits) {
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    float magnitude;
    if (exponent == 0)
        magnitude = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        magnitude = mantissa ? NAN : INFINITY;
    else
        magnitude = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
    return (bits & 0x8000u) ? -magnitude : magnitude;
}

/* Integer rounding to nearest even of `value` >> `shift` (shift >= 1). */
static uint32_t shift_round_even(uint32_t value, uint32_t shift) {
    uint32_t kept = value >> shift, rest = value & ((1u << shift) - 1u), half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1u)));
}

uint16_t mg_f32_to_f16(float value) {
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and up (and infinity) round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) /* 2^-14 and up: normal; the carry may reach the next binade */
        return (uint16_t)(sign | shift_round_even(a - 0x38000000u, 13));
    uint32_t exponent = a >> 23;
    if (exponent < 102) /* below 2^-25: rounds to zero */
        return sign;
    /* subnormal: units of 2^-24 (rounding up to 0x400 gives the smallest normal) */
    return (uint16_t)(sign | shift_round_even((a & 0x7fffffu) | 0x800000u, 126 - exponent));
}

float mg_fp8_e4m3_to_f32(uint8_t code) {
    uint32_t exponent = (code >> 3) & 0xfu;
    uint32_t mantissa = code & 0x7u;
    float magnitude;
    if (exponent == 0xfu && mantissa == 0x7u)
        magnitude = NAN;
    else if (exponent == 0)
        magnitude = ldexpf((float)mantissa, -9); /* subnormal: m * 2^-9 */
    else
        magnitude = ldexpf((float)(8u + mantissa), (int)exponent - 10); /* 1.m * 2^(e-7) */
    return (code & 0x80u) ? -magnitude : magnitude;
}

uint8_t mg_f32_to_fp8_e4m3(float value) {
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t magnitude_bits = u & 0x7fffffffu;
    if (magnitude_bits > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (magnitude_bits >= 0x43e00000u) /* >= 448 (or inf): saturate */
        return (uint8_t)(sign | 0x7eu);
    if (magnitude_bits < 0x3c800000u) {
        /* Below 2^-6, the smallest normal: E4M3 subnormals are multiples of 2^-9. Scaling by
         * 512 is exact, so only the rounding to an integer remains; 8 rounds up into the
         * first normal, whose code is 8 as well. */
        float scaled;
        memcpy(&scaled, &magnitude_bits, sizeof scaled);
        scaled *= 512.0f;
        uint32_t whole = (uint32_t)scaled;
        float fraction = scaled - (float)whole;
        if (fraction > 0.5f || (fraction == 0.5f && (whole & 1u)))
            whole++;
        return (uint8_t)(sign | whole);
    }
    /* Normal: keep the float's exponent and the top 3 mantissa bits, round the other 20 to
     * nearest even (a carry into the exponent is the right result), then re-bias 127 -> 7. */
    uint32_t kept = magnitude_bits >> 20;
    uint32_t dropped = magnitude_bits & 0xfffffu;
    if (dropped > 0x80000u || (dropped == 0x80000u && (kept & 1u)))
        kept++;
    uint32_t code = kept - (120u << 3);
    if (code > 0x7eu)
        code = 0x7eu;
    return (uint8_t)(sign | code);
}
