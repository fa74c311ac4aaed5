/* gemm_cpu.c - reference GEMMs and FP8 scale transpose on host memory (gemm_cpu.h). */
#include "cpu/gemm_cpu.h"

#include <string.h>

static void store_output(void *out, mg_dtype out_type, size_t index, float value) {
    if (out_type == MG_DTYPE_F32)
        ((float *)out)[index] = value;
    else
        ((uint16_t *)out)[index] = mg_f32_to_bf16(value);
}

void mg_gemm_bf16_cpu(uint32_t m, uint32_t n, uint32_t k, const uint16_t *act,
                      const uint16_t *weight, void *out, mg_dtype out_type, uint32_t ldc) {
    for (uint32_t t = 0; t < m; t++) {
        const uint16_t *a = act + (size_t)t * k;
        for (uint32_t j = 0; j < n; j++) {
            const uint16_t *w = weight + (size_t)j * k;
            float acc = 0.0f;
            for (uint32_t i = 0; i < k; i++)
                acc += mg_bf16_to_f32(a[i]) * mg_bf16_to_f32(w[i]);
            store_output(out, out_type, (size_t)t * ldc + j, acc);
        }
    }
}

/* The scale of `row` for K-block g; rows is the operand's row count (M or N). */
static float operand_scale(const mg_fp8_operand_host *op, uint32_t rows, uint32_t k, uint32_t row,
                           uint32_t g) {
    switch (op->scaling) {
    case MG_FP8_SCALING_TENSOR: return op->scales[0];
    case MG_FP8_SCALING_ROW: return op->scales[row];
    case MG_FP8_SCALING_1X128:
        return op->scales[mg_fp8_block_scale_index(MG_FP8_BLOCK_1X128, rows, k, row, g)];
    case MG_FP8_SCALING_128X128:
        return op->scales[mg_fp8_block_scale_index(MG_FP8_BLOCK_128X128, rows, k, row, g)];
    }
    return 0.0f;
}

static bool scaling_is_blocked(mg_fp8_scaling s) {
    return s == MG_FP8_SCALING_1X128 || s == MG_FP8_SCALING_128X128;
}

void mg_gemm_fp8_cpu(uint32_t m, uint32_t n, uint32_t k, mg_fp8_operand_host act,
                     mg_fp8_operand_host weight, uint16_t *out, uint32_t ldc) {
    float decoded[256];
    for (int c = 0; c < 256; c++)
        decoded[c] = mg_fp8_e4m3_to_f32((uint8_t)c);
    bool blocked = scaling_is_blocked(act.scaling) || scaling_is_blocked(weight.scaling);
    uint32_t block = blocked ? MG_FP8_SCALE_BLOCK : k;
    for (uint32_t t = 0; t < m; t++) {
        const uint8_t *a = act.codes + (size_t)t * k;
        for (uint32_t j = 0; j < n; j++) {
            const uint8_t *w = weight.codes + (size_t)j * k;
            float acc = 0.0f;
            for (uint32_t k0 = 0, g = 0; k0 < k; k0 += block, g++) {
                uint32_t k1 = k - k0 < block ? k : k0 + block;
                float partial = 0.0f;
                for (uint32_t i = k0; i < k1; i++)
                    partial += decoded[a[i]] * decoded[w[i]];
                acc += partial * operand_scale(&act, m, k, t, g) *
                       operand_scale(&weight, n, k, j, g);
            }
            out[(size_t)t * ldc + j] = mg_f32_to_bf16(acc);
        }
    }
}

void mg_fp8_act_scales_transpose_cpu(uint32_t m, uint32_t m_pad, uint32_t k, const float *src,
                                     float *dst) {
    uint32_t blocks = mg_fp8_k_blocks(k);
    for (uint32_t g = 0; g < blocks; g++) {
        for (uint32_t t = 0; t < m; t++)
            dst[(size_t)g * m_pad + t] = src[(size_t)t * blocks + g];
        memset(dst + (size_t)g * m_pad + m, 0, (size_t)(m_pad - m) * sizeof(float));
    }
}
