/* dtype.c - element sizes, names and exact host conversions (metrale/dtype.h). */
#include "metrale/dtype.h"

#include <string.h>

size_t mg_dtype_bytes(mg_dtype t) {
    switch (t) {
    case MG_DTYPE_F32: return 4;
    case MG_DTYPE_BF16: return 2;
    case MG_DTYPE_F16: return 2;
    case MG_DTYPE_FP8_E4M3: return 1;
    case MG_DTYPE_U8: return 1;
    case MG_DTYPE_I32: return 4;
    case MG_DTYPE_U32: return 4;
    }
    return 0;
}

const char *mg_dtype_name(mg_dtype t) {
    switch (t) {
    case MG_DTYPE_F32: return "f32";
    case MG_DTYPE_BF16: return "bf16";
    case MG_DTYPE_F16: return "f16";
    case MG_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case MG_DTYPE_U8: return "u8";
    case MG_DTYPE_I32: return "i32";
    case MG_DTYPE_U32: return "u32";
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
