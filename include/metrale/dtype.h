/*
 * metrale/dtype.h - element types of the ops and exact host conversions between them.
 * Conversions to float are exact; conversions from float round to nearest even.
 */
#ifndef METRALE_DTYPE_H
#define METRALE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

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
size_t mg_dtype_bytes(mg_dtype t);
/* "f32", "bf16", ... */
const char *mg_dtype_name(mg_dtype t);

float mg_bf16_to_f32(uint16_t bits);
/* Round to nearest even; NaN stays NaN (quiet). */
uint16_t mg_f32_to_bf16(float value);

#ifdef __cplusplus
}
#endif
#endif
