/*
 * gemm_cutlass.h - private: the CUTLASS provider of the BF16 GEMM op (gemm_cutlass_cuda.c),
 * as tests see it.
 */
#ifndef METRALE_GEMM_CUTLASS_H
#define METRALE_GEMM_CUTLASS_H

#include <stdint.h>

/* Process-wide counts of the provider's calls since load: run by the CUTLASS kernels, and
 * handed to cuBLASLt because the kernels could not take them. */
void mg_gemm_cutlass_counts(uint64_t *kernels, uint64_t *fallbacks);

#endif
