/*
 * elementwise_reference.h - private: the CPU references of metrale/ops_elementwise.h,
 * registered as CPU kernels under the names and argument lists of the CUDA kernels
 * (kernels/cuda/elementwise/elementwise.cu):
 *   gather_rows_bf16(buffer ids, buffer src, buffer add_or_0, buffer out, u32 rows, u32 cols,
 *                    u32 src_rows)
 *   rmsnorm_bf16(buffer x, buffer add_or_0, buffer weight, buffer out, u32 rows, u32 cols,
 *                f32 eps)
 *   argmax_f32(buffer in, buffer ids, u32 rows, u32 cols, u32 pitch)
 */
#ifndef METRALE_ELEMENTWISE_REFERENCE_H
#define METRALE_ELEMENTWISE_REFERENCE_H

#include <stdint.h>

#define MG_GATHER_ROWS_KERNEL "gather_rows_bf16"
#define MG_RMSNORM_KERNEL "rmsnorm_bf16"
#define MG_ARGMAX_KERNEL "argmax_f32"
#define MG_ARGMAX_BF16_KERNEL "argmax_bf16"

/* The kernels' bodies on host memory, for references that compose them (the fused GEMM's,
 * gemm_reference.c). rmsnorm: x, add (may be NULL), out [rows, cols] packed, weight [cols];
 * with add, x is updated in place as the op states. argmax: `in` of f32 (element_bytes 4) or
 * bf16 (2) with row pitch `pitch`, ids [rows]. */
void mg_rmsnorm_bf16_host(uint32_t rows, uint32_t cols, float eps, uint16_t *x, const uint16_t *add,
                          const uint16_t *weight, uint16_t *out);
void mg_argmax_host(uint32_t rows, uint32_t cols, const void *in, uint32_t pitch,
                    unsigned element_bytes, int32_t *ids);

/* Registers the four CPU kernels once per process; later calls do nothing. */
void mg_elementwise_cpu_kernels_register(void);

#endif
