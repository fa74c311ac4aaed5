/*
 * fp8_quantize_host.h - private: the FP8 E4M3 quantization rule on host memory, shared by the
 * host quantizers of metrale/ops_gemm.h (fp8_scale_layout.c) and the CPU reference of the
 * device quantizer (metrale/ops_quantize.h, src/ops/quantize/). The CUDA kernels
 * (kernels/cuda/quantize/fp8_quantize.cu) implement the same rule with the same IEEE operations, so
 * their results are bit-identical to these.
 *
 * The rule, per group of values (a tensor, a row, a 1x128 or 128x128 block):
 *   amax  = max |x| over the group's FINITE values (infinities and NaN are left out);
 *   scale = amax / 448 (IEEE single division, round to nearest even), or 1 when amax is 0;
 *   code  = E4M3 round-to-nearest-even of x / scale (IEEE single division), saturating to
 *           +-448 (0x7e / 0xfe): infinities are clipped to +-448; NaN gives the NaN code with
 *           the input's sign (0x7f, or 0xff for a negative NaN).
 * Arguments are trusted (callers checked them); nothing here fails.
 */
#ifndef METRALE_FP8_QUANTIZE_HOST_H
#define METRALE_FP8_QUANTIZE_HOST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"

/* `amax` grown by |value| when value is finite. NaN fails both comparisons; infinities fail
 * the isfinite test, so neither can reach the scale. */
static inline float mg_fp8_amax_accumulate(float amax, float value) {
    float magnitude = fabsf(value);
    return isfinite(magnitude) && magnitude > amax ? magnitude : amax;
}

/* The scale of a group whose finite values have magnitude at most `amax` (>= 0). */
static inline float mg_fp8_scale_from_amax(float amax) {
    return amax > 0.0f ? amax / MG_FP8_E4M3_MAX : 1.0f;
}

/* The E4M3 code of `value` in a group of scale `scale` (> 0). NaN is handled before the
 * division so its sign is kept whatever the host's NaN propagation does. */
static inline uint8_t mg_fp8_quantize_value(float value, float scale) {
    if (isnan(value))
        return (uint8_t)(signbit(value) ? 0xffu : 0x7fu);
    return mg_f32_to_fp8_e4m3(value / scale);
}

/* A rectangle of a BF16 matrix whose rows are `pitch` elements apart. */
typedef struct mg_fp8_region {
    uint32_t row_begin, row_end; /* [row_begin, row_end) */
    uint32_t col_begin, col_end; /* [col_begin, col_end) */
} mg_fp8_region;

/* amax (finite values) over `region` of `bf16`, folded into `amax`. */
float mg_fp8_region_amax(const uint16_t *bf16, size_t pitch, mg_fp8_region region, float amax);

/* Codes of `region` with one scale; `out` has rows `out_pitch` bytes apart. */
void mg_fp8_region_quantize(const uint16_t *bf16, size_t pitch, uint8_t *out, size_t out_pitch,
                            mg_fp8_region region, float scale);

/* How a quantizer cuts the matrix into groups and where each group's scale goes: tiles of
 * tile_rows x tile_cols (the last row and column of tiles cut at the matrix edge); tile (i, j)
 * stores its scale at scales[i * scale_row_stride + j * scale_col_stride]. */
typedef struct mg_fp8_tiling {
    uint32_t tile_rows, tile_cols;
    size_t scale_row_stride, scale_col_stride;
} mg_fp8_tiling;

/* Quantizes bf16 [rows, cols] (row pitch `in_pitch` elements) into out [rows, cols] (row pitch
 * `cols`) and one scale per tile. */
void mg_fp8_quantize_tiles(const uint16_t *bf16, size_t in_pitch, uint32_t rows, uint32_t cols,
                           uint8_t *out, float *scales, mg_fp8_tiling tiling);

#endif
