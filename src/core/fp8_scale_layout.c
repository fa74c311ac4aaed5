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

static uint32_t min_u32(uint32_t a, uint32_t b) {
    return a < b ? a : b;
}

mg_status mg_fp8_quantize_tensorwise(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                     uint8_t *out, float *scale) {
    mg_status st = check_quantize_args("mg_fp8_quantize_tensorwise", bf16, rows, cols, out, scale);
    if (st)
        return st;
    *scale = group_scale(bf16, cols, 0, rows, 0, cols);
    quantize_group(bf16, out, cols, 0, rows, 0, cols, *scale);
    return MG_OK;
}

mg_status mg_fp8_quantize_rowwise(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                  float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_rowwise", bf16, rows, cols, out, scales);
    if (st)
        return st;
    for (uint32_t r = 0; r < rows; r++) {
        scales[r] = group_scale(bf16, cols, r, r + 1, 0, cols);
        quantize_group(bf16, out, cols, r, r + 1, 0, cols, scales[r]);
    }
    return MG_OK;
}

mg_status mg_fp8_quantize_1x128(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_1x128", bf16, rows, cols, out, scales);
    if (st)
        return st;
    uint32_t blocks = mg_fp8_k_blocks(cols);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t g = 0; g < blocks; g++) {
            uint32_t c0 = g * MG_FP8_SCALE_BLOCK, c1 = min_u32(cols, c0 + MG_FP8_SCALE_BLOCK);
            float scale = group_scale(bf16, cols, r, r + 1, c0, c1);
            scales[(size_t)r * blocks + g] = scale;
            quantize_group(bf16, out, cols, r, r + 1, c0, c1, scale);
        }
    return MG_OK;
}

mg_status mg_fp8_quantize_128x128(const uint16_t *bf16, uint32_t rows, uint32_t cols, uint8_t *out,
                                  float *scales) {
    mg_status st = check_quantize_args("mg_fp8_quantize_128x128", bf16, rows, cols, out, scales);
    if (st)
        return st;
    size_t count = mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, rows, cols);
    for (size_t i = 0; i < count; i++)
        scales[i] = 0.0f;
    uint32_t blocks = mg_fp8_k_blocks(cols);
    for (uint32_t r0 = 0; r0 < rows; r0 += MG_FP8_SCALE_BLOCK) {
        uint32_t r1 = min_u32(rows, r0 + MG_FP8_SCALE_BLOCK);
        for (uint32_t g = 0; g < blocks; g++) {
            uint32_t c0 = g * MG_FP8_SCALE_BLOCK, c1 = min_u32(cols, c0 + MG_FP8_SCALE_BLOCK);
            float scale = group_scale(bf16, cols, r0, r1, c0, c1);
            scales[mg_fp8_block_scale_index(MG_FP8_BLOCK_128X128, rows, cols, r0, g)] = scale;
            quantize_group(bf16, out, cols, r0, r1, c0, c1, scale);
        }
    }
    return MG_OK;
}
