/*
 * gemm_cutlass_table.h - private to src/ops/gemm: which BF16 GEMM shapes the CUTLASS provider
 * (gemm_cutlass_cuda.c) takes from cuBLASLt in the automatic choice, and with which kernel
 * configuration (kernels/cuda/cutlass/cutlass_dense.h). The rows are measured on an H200 by
 * `metrale-gpu bench gemm_providers` (gemm_cutlass_table.c says how); a shape without a row
 * stays with cuBLASLt.
 */
#ifndef METRALE_GEMM_CUTLASS_TABLE_H
#define METRALE_GEMM_CUTLASS_TABLE_H

#include <stdint.h>

#include "cutlass_dense.h"
#include "gemm_cutlass.h"

/* One measured choice: for M in [m_min, m_max] and exactly this N and K, CUTLASS `config`
 * was faster than cuBLASLt by `margin` (1.05 = 5 %; kept for the record). */
typedef struct mg_gemm_cutlass_row {
    uint32_t m_min, m_max, n, k;
    mg_cutlass_dense_config config;
    float margin;
} mg_gemm_cutlass_row;

/* The configuration the table names for this shape, or -1: cuBLASLt. */
int mg_gemm_cutlass_table_lookup(uint32_t m, uint32_t n, uint32_t k);

#endif
