/*
 * metrale/dtype.h - element types of the ops and exact host conversions between them.
 * Conversions to float are exact; conversions from float round to nearest even.
 */
#ifndef METRALE_DTYPE_H
#define METRALE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_dtype {
    MG_DTYPE_F32 = 0,
    MG_DTYPE_BF16,
    MG_DTYPE_F16,
    MG_DTYPE_FP8_E4M3,
    MG_DTYPE_U8,
    MG_DTYPE_I32,
    MG_DTYPE_U32,
} mg_dtype;

/* Bytes per element. */
MG_API size_t mg_dtype_bytes(mg_dtype t);
/* "f32", "bf16", ... */
MG_API const char *mg_dtype_name(mg_dtype t);

MG_API float mg_bf16_to_f32(uint16_t bits);
/* Round to nearest even; NaN stays NaN (quiet). */
MG_API uint16_t mg_f32_to_bf16(float value);

/* IEEE binary16: exact to float; from float round to nearest even, overflowing to infinity
 * (magnitudes from 65520 up), NaN kept quiet with its sign. */
MG_API float mg_f16_to_f32(uint16_t bits);
MG_API uint16_t mg_f32_to_f16(float value);

/* FP8 E4M3 ("e4m3fn", the OCP FP8 format the tensor cores use): 1 sign, 4 exponent bits with
 * bias 7, 3 mantissa bits; no infinities; 0x7f/0xff are NaN; the largest finite magnitude is
 * 448 (0x7e) and the smallest subnormal 2^-9. */
#define MG_FP8_E4M3_MAX 448.0f

/* Exact: every E4M3 value is a float. NaN codes give a quiet NaN with the code's sign. */
MG_API float mg_fp8_e4m3_to_f32(uint8_t code);
/* Round to nearest even, saturating: magnitudes above 448 (and infinities) become +-448;
 * NaN becomes 0x7f with its sign kept (0xff when negative). Independent of the host's
 * floating-point rounding mode. */
MG_API uint8_t mg_f32_to_fp8_e4m3(float value);

#ifdef __cplusplus
}
#endif
#endif
