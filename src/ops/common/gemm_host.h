/*
 * gemm_host.h - private to src/ops: the reference GEMMs on host memory. They define the results
 * of metrale/ops_gemm.h: FP32 accumulation, FP8 codes decoded exactly, outputs rounded once
 * (round to nearest even). Shared by the CPU kernels of the dense GEMM ops (src/ops/gemm/) and
 * of the grouped MoE GEMM (src/ops/moe_gemm/), whose experts' products are these GEMMs.
 * Arguments are trusted (the op layer checked them); nothing here fails.
 */
#ifndef METRALE_GEMM_HOST_H
#define METRALE_GEMM_HOST_H

#include <stdint.h>

#include "metrale/dtype.h"

/* How one FP8 operand is scaled (see metrale/ops_gemm.h for the layouts). */
typedef enum mg_fp8_scaling {
    MG_FP8_SCALING_TENSOR = 0, /* scale[0] */
    MG_FP8_SCALING_ROW,        /* scale[row] */
    MG_FP8_SCALING_1X128,      /* scale[g * rows + row] */
    MG_FP8_SCALING_128X128,    /* scale[(row / 128) * L4 + g] */
} mg_fp8_scaling;

/* One FP8 operand: E4M3 codes [rows, k] row-major and its FP32 scales. */
typedef struct mg_fp8_operand_host {
    const uint8_t *codes;
    const float *scales;
    mg_fp8_scaling scaling;
} mg_fp8_operand_host;

/* out (BF16 or F32, row pitch ldc) = act[m, k] · weight[n, k]ᵀ, BF16 inputs. */
void mg_gemm_bf16_cpu(uint32_t m, uint32_t n, uint32_t k, const uint16_t *act,
                      const uint16_t *weight, void *out, mg_dtype out_type, uint32_t ldc);

/* out BF16 (row pitch ldc) = scaled act[m, k] · scaled weight[n, k]ᵀ. Tensor and row scales
 * multiply the full FP32 dot product; block scales multiply each 128-wide partial sum, which
 * is accumulated in FP32. */
void mg_gemm_fp8_cpu(uint32_t m, uint32_t n, uint32_t k, mg_fp8_operand_host act,
                     mg_fp8_operand_host weight, uint16_t *out, uint32_t ldc);

#endif
