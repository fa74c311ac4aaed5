/* gemm_host.c - the reference GEMMs on host memory (gemm_host.h). */
#include "gemm_host.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "host_parallel.h"
#include "metrale/ops_gemm.h"

static void store_output(void *out, mg_dtype out_type, size_t index, float value) {
    if (out_type == MG_DTYPE_F32)
        ((float *)out)[index] = value;
    else
        ((uint16_t *)out)[index] = mg_f32_to_bf16(value);
}

static float bf16_value(uint16_t bits) { /* mg_bf16_to_f32, inlined for the inner loops */
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Weight rows per block: the block's rows are transposed into [k][ROWS] floats once and then
 * feed ROWS independent sums per activation row, which run side by side instead of waiting on
 * one another. Each output is still the FP32 sum over i = 0 .. k-1 in order, one multiply and
 * one add per term, so the result is the same for any blocking and any thread count. */
#define GEMM_ROWS 8

typedef struct gemm_bf16_job {
    uint32_t m, n, k, ldc;
    const uint16_t *act, *weight;
    void *out;
    mg_dtype out_type;
} gemm_bf16_job;

static void gemm_bf16_blocks(void *ctx, size_t first, size_t count) {
    const gemm_bf16_job *g = ctx;
    float *packed = malloc((size_t)g->k * GEMM_ROWS * sizeof *packed);
    float *a = malloc((size_t)g->k * sizeof *a);
    for (size_t blk = first; blk < first + count; blk++) {
        const uint32_t j0 = (uint32_t)blk * GEMM_ROWS;
        const uint32_t rows = g->n - j0 < GEMM_ROWS ? g->n - j0 : GEMM_ROWS;
        if (!packed || !a) { /* no scratch: the plain loop, same sums */
            for (uint32_t t = 0; t < g->m; t++)
                for (uint32_t j = j0; j < j0 + rows; j++) {
                    const uint16_t *x = g->act + (size_t)t * g->k,
                                   *w = g->weight + (size_t)j * g->k;
                    float acc = 0.0f;
                    for (uint32_t i = 0; i < g->k; i++)
                        acc += bf16_value(x[i]) * bf16_value(w[i]);
                    store_output(g->out, g->out_type, (size_t)t * g->ldc + j, acc);
                }
            continue;
        }
        for (uint32_t r = 0; r < GEMM_ROWS; r++) {
            const uint16_t *w = g->weight + (size_t)(j0 + (r < rows ? r : 0)) * g->k;
            for (uint32_t i = 0; i < g->k; i++)
                packed[(size_t)i * GEMM_ROWS + r] = bf16_value(w[i]);
        }
        for (uint32_t t = 0; t < g->m; t++) {
            const uint16_t *x = g->act + (size_t)t * g->k;
            for (uint32_t i = 0; i < g->k; i++)
                a[i] = bf16_value(x[i]);
            float acc[GEMM_ROWS] = {0};
            for (uint32_t i = 0; i < g->k; i++) {
                const float *p = packed + (size_t)i * GEMM_ROWS;
                for (uint32_t r = 0; r < GEMM_ROWS; r++)
                    acc[r] += a[i] * p[r];
            }
            for (uint32_t r = 0; r < rows; r++)
                store_output(g->out, g->out_type, (size_t)t * g->ldc + j0 + r, acc[r]);
        }
    }
    free(packed);
    free(a);
}

void mg_gemm_bf16_cpu(uint32_t m, uint32_t n, uint32_t k, const uint16_t *act,
                      const uint16_t *weight, void *out, mg_dtype out_type, uint32_t ldc) {
    gemm_bf16_job g = {.m = m,
                       .n = n,
                       .k = k,
                       .ldc = ldc,
                       .act = act,
                       .weight = weight,
                       .out = out,
                       .out_type = out_type};
    const size_t blocks = (n + GEMM_ROWS - 1) / GEMM_ROWS;
    /* about 2^18 multiply-adds per part at least: below that a thread costs more than it saves */
    const uint64_t per_block = (uint64_t)GEMM_ROWS * k * (m ? m : 1);
    mg_host_parallel_for(blocks, (size_t)((1u << 18) / (per_block ? per_block : 1) + 1),
                         gemm_bf16_blocks, &g);
}

/* The scale of `row` for K-block g; rows is the operand's row count (M or N). */
static float operand_scale(const mg_fp8_operand_host *op, uint32_t rows, uint32_t k, uint32_t row,
                           uint32_t g) {
    switch (op->scaling) {
    case MG_FP8_SCALING_TENSOR:
        return op->scales[0];
    case MG_FP8_SCALING_ROW:
        return op->scales[row];
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
                acc +=
                    partial * operand_scale(&act, m, k, t, g) * operand_scale(&weight, n, k, j, g);
            }
            out[(size_t)t * ldc + j] = mg_f32_to_bf16(acc);
        }
    }
}
