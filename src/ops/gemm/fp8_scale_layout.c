/* fp8_scale_layout.c - FP8 block-scale layout math and the host FP8 quantizer
 * (metrale/ops_gemm.h). */
#include <math.h>

#include "error.h"
#include "metrale/ops_gemm.h"

uint32_t mg_fp8_k_blocks(uint32_t k) {
    return (uint32_t)(((uint64_t)k + MG_FP8_SCALE_BLOCK - 1) / MG_FP8_SCALE_BLOCK);
}

uint32_t mg_fp8_rows_padded(uint32_t m) {
    return (uint32_t)(((uint64_t)m + 3) & ~(uint64_t)3);
}

/* The 128x128 layout's row pitch: L rounded up to a multiple of 4 (cuBLAS docs, block-scaling
 * factor layouts). */
static uint32_t k_blocks_padded(uint32_t k) {
    return (mg_fp8_k_blocks(k) + 3u) & ~3u;
}

size_t mg_fp8_block_scale_count(mg_fp8_block_scale mode, uint32_t rows, uint32_t k) {
    if (mode == MG_FP8_BLOCK_1X128)
        return (size_t)mg_fp8_k_blocks(k) * rows;
    return (size_t)mg_fp8_k_blocks(rows) * k_blocks_padded(k);
}

size_t mg_fp8_block_scale_index(mg_fp8_block_scale mode, uint32_t rows, uint32_t k, uint32_t row,
                                uint32_t k_block) {
    if (mode == MG_FP8_BLOCK_1X128)
        return (size_t)k_block * rows + row;
    return (size_t)(row / MG_FP8_SCALE_BLOCK) * k_blocks_padded(k) + k_block;
}

/* ------------------------------------------------------------------ quantizer */

static mg_status check_quantize_args(const char *what, const uint16_t *bf16, uint32_t rows,
                                     uint32_t cols, const uint8_t *out, const float *scales) {
    if (!bf16 || !out || !scales)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", what,
                        !bf16  ? "input"
                        : !out ? "output"
                               : "scales");
    if (rows == 0 || cols == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape %u x %u", what, rows, cols);
    return MG_OK;
}

/* amax / 448 over rows [r0, r1) x columns [c0, c1); 1 for an all-zero group, so zero inputs
 * quantize to zero codes with a harmless scale. */
static float group_scale(const uint16_t *bf16, uint32_t cols, uint32_t r0, uint32_t r1, uint32_t c0,
                         uint32_t c1) {
    float amax = 0.0f;
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t c = c0; c < c1; c++) {
            float v = fabsf(mg_bf16_to_f32(bf16[(size_t)r * cols + c]));
            if (v > amax)
                amax = v;
        }
    return amax > 0.0f ? amax / MG_FP8_E4M3_MAX : 1.0f;
}

static void quantize_group(const uint16_t *bf16, uint8_t *out, uint32_t cols, uint32_t r0,
                           uint32_t r1, uint32_t c0, uint32_t c1, float scale) {
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t c = c0; c < c1; c++) {
            size_t i = (size_t)r * cols + c;
            out[i] = mg_f32_to_fp8_e4m3(mg_bf16_to_f32(bf16[i]) / scale);
        }
}

/* Quantizes `bf16` in tiles of tile_rows x tile_cols (the last row and column of tiles cut at
 * the matrix edge), one scale per tile: tile (i, j) stores its scale at
 * scales[i * scale_pitch + j]. */
static void quantize_tiles(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                           float *scales, uint32_t tile_rows, uint32_t tile_cols,
                           size_t scale_pitch) {
    size_t i = 0;
    for (uint64_t r0 = 0; r0 < rows; r0 += tile_rows, i++) {
        uint32_t r1 = (uint32_t)(r0 + tile_rows < rows ? r0 + tile_rows : rows);
        size_t j = 0;
        for (uint64_t c0 = 0; c0 < cols; c0 += tile_cols, j++) {
            uint32_t c1 = (uint32_t)(c0 + tile_cols < cols ? c0 + tile_cols : cols);
            float scale = group_scale(bf16, cols, (uint32_t)r0, r1, (uint32_t)c0, c1);
            scales[i * scale_pitch + j] = scale;
            quantize_group(bf16, out, cols, (uint32_t)r0, r1, (uint32_t)c0, c1, scale);
        }
    }
}

mg_status mg_fp8_quantize_tensorwise(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                     uint8_t *out, float *scale) {
    mg_status st = check_quantize_args("mg_fp8_quantize_tensorwise", bf16, rows, cols, out, scale);
    if (!st)
        quantize_tiles(bf16, rows, cols, out, scale, rows, cols, 1);
    return st;
}

mg_status mg_fp8_quantize_rowwise(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                  float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_rowwise", bf16, rows, cols, out, scales);
    if (!st)
        quantize_tiles(bf16, rows, cols, out, scales, 1, cols, 1);
    return st;
}

/* Scales in the quantizer's natural [rows, L] layout. */
mg_status mg_fp8_quantize_1x128(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_1x128", bf16, rows, cols, out, scales);
    if (!st)
        quantize_tiles(bf16, rows, cols, out, scales, 1, MG_FP8_SCALE_BLOCK, mg_fp8_k_blocks(cols));
    return st;
}

/* Scales in the GEMM's [ceil(rows / 128), L4] layout; the padding columns are zeroed. */
mg_status mg_fp8_quantize_128x128(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                  float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_128x128", bf16, rows, cols, out, scales);
    if (st)
        return st;
    size_t count = mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, rows, cols);
    for (size_t i = 0; i < count; i++)
        scales[i] = 0.0f;
    quantize_tiles(bf16, rows, cols, out, scales, MG_FP8_SCALE_BLOCK, MG_FP8_SCALE_BLOCK,
                   k_blocks_padded(cols));
    return MG_OK;
}
