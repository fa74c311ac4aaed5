/* fp8_scale_layout.c - FP8 block-scale layout math and the host FP8 quantizers
 * (metrale/ops_gemm.h), built on the quantization rule of fp8_quantize_host.h. */
#include "error.h"
#include "fp8_quantize_host.h"
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

float mg_fp8_region_amax(const uint16_t *bf16, size_t pitch, mg_fp8_region region, float amax) {
    for (uint32_t r = region.row_begin; r < region.row_end; r++)
        for (uint32_t c = region.col_begin; c < region.col_end; c++)
            amax = mg_fp8_amax_accumulate(amax, mg_bf16_to_f32(bf16[(size_t)r * pitch + c]));
    return amax;
}

void mg_fp8_region_quantize(const uint16_t *bf16, size_t pitch, uint8_t *out, size_t out_pitch,
                            mg_fp8_region region, float scale) {
    for (uint32_t r = region.row_begin; r < region.row_end; r++)
        for (uint32_t c = region.col_begin; c < region.col_end; c++)
            out[(size_t)r * out_pitch + c] =
                mg_fp8_quantize_value(mg_bf16_to_f32(bf16[(size_t)r * pitch + c]), scale);
}

void mg_fp8_quantize_tiles(const uint16_t *bf16, size_t in_pitch, uint32_t rows, uint32_t cols,
                           uint8_t *out, float *scales, mg_fp8_tiling tiling) {
    size_t i = 0;
    for (uint64_t r0 = 0; r0 < rows; r0 += tiling.tile_rows, i++) {
        uint32_t r1 = (uint32_t)(r0 + tiling.tile_rows < rows ? r0 + tiling.tile_rows : rows);
        size_t j = 0;
        for (uint64_t c0 = 0; c0 < cols; c0 += tiling.tile_cols, j++) {
            uint32_t c1 = (uint32_t)(c0 + tiling.tile_cols < cols ? c0 + tiling.tile_cols : cols);
            mg_fp8_region tile = {(uint32_t)r0, r1, (uint32_t)c0, c1};
            float scale = mg_fp8_scale_from_amax(mg_fp8_region_amax(bf16, in_pitch, tile, 0.0f));
            scales[i * tiling.scale_row_stride + j * tiling.scale_col_stride] = scale;
            mg_fp8_region_quantize(bf16, in_pitch, out, cols, tile, scale);
        }
    }
}

mg_status mg_fp8_quantize_tensorwise(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                     uint8_t *out, float *scale) {
    mg_status st = check_quantize_args("mg_fp8_quantize_tensorwise", bf16, rows, cols, out, scale);
    if (!st)
        mg_fp8_quantize_tiles(bf16, cols, rows, cols, out, scale,
                              (mg_fp8_tiling){rows, cols, 1, 1});
    return st;
}

mg_status mg_fp8_quantize_rowwise(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                  float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_rowwise", bf16, rows, cols, out, scales);
    if (!st)
        mg_fp8_quantize_tiles(bf16, cols, rows, cols, out, scales, (mg_fp8_tiling){1, cols, 1, 1});
    return st;
}

/* Scales in the quantizer's natural [rows, L] layout. */
mg_status mg_fp8_quantize_1x128(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_1x128", bf16, rows, cols, out, scales);
    if (!st)
        mg_fp8_quantize_tiles(bf16, cols, rows, cols, out, scales,
                              (mg_fp8_tiling){1, MG_FP8_SCALE_BLOCK, mg_fp8_k_blocks(cols), 1});
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
    mg_fp8_quantize_tiles(
        bf16, cols, rows, cols, out, scales,
        (mg_fp8_tiling){MG_FP8_SCALE_BLOCK, MG_FP8_SCALE_BLOCK, k_blocks_padded(cols), 1});
    return MG_OK;
}
