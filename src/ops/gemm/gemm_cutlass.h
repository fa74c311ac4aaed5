/*
 * gemm_cutlass.h - private: the CUTLASS provider of the BF16 GEMM op (gemm_cutlass_cuda.c),
 * as its table, the benchmark's pinning and tests see it. Needs no CUDA header.
 */
#ifndef METRALE_GEMM_CUTLASS_H
#define METRALE_GEMM_CUTLASS_H

#include <stdint.h>

/* Process-wide counts of the provider's calls since load: run by the CUTLASS kernels, and
 * handed to cuBLASLt because the kernels could not take them. */
void mg_gemm_cutlass_counts(uint64_t *kernels, uint64_t *fallbacks);

/* The kernel configurations (mg_cutlass_dense_config) by name: "coop_128x128",
 * "coop_128x256", "pingpong_64x128"; "?" for another value. */
int mg_gemm_cutlass_config_count(void);
const char *mg_gemm_cutlass_config_name(int config);
/* The config named `name`, or -1. */
int mg_gemm_cutlass_config_parse(const char *name);

/* Environment variable that, while the CUTLASS provider is forced (mg_op_force_provider),
 * pins its kernel configuration by name and makes a call it cannot run fail with
 * MG_ERR_UNSUPPORTED instead of falling back to cuBLASLt: `bench gemm_providers` times each
 * configuration through it. */
#define MG_GEMM_CUTLASS_CONFIG_ENV "METRALE_CUTLASS_GEMM_CONFIG"

#endif
