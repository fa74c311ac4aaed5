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

/* One measured choice: for M in [m_min, m_max] and exactly this N and K, CUTLASS `config`
 * was faster than cuBLASLt by `margin` (1.05 = 5 %; kept for the record). */
typedef struct mg_gemm_cutlass_row {
    uint32_t m_min, m_max, n, k;
    mg_cutlass_dense_config config;
    float margin;
} mg_gemm_cutlass_row;

/* The configuration the table names for this shape, or -1: cuBLASLt. */
int mg_gemm_cutlass_table_lookup(uint32_t m, uint32_t n, uint32_t k);

/* "coop_128x128", "coop_128x256", "pingpong_64x128"; "?" for another value. */
const char *mg_gemm_cutlass_config_name(int config);
/* The config named `name`, or -1. */
int mg_gemm_cutlass_config_parse(const char *name);

/* Environment variable that, while the CUTLASS provider is forced (mg_op_force_provider),
 * pins its kernel configuration by name and makes a call it cannot run fail with
 * MG_ERR_UNSUPPORTED instead of falling back to cuBLASLt: `bench gemm_providers` times each
 * configuration through it. */
#define MG_GEMM_CUTLASS_CONFIG_ENV "METRALE_CUTLASS_GEMM_CONFIG"

#endif
