/*
 * elementwise_reference.h - private: the CPU references of metrale/ops_elementwise.h,
 * registered as CPU kernels under the names and argument lists of the CUDA kernels
 * (kernels/cuda/elementwise/elementwise.cu):
 *   gather_rows_bf16(buffer ids, buffer src, buffer add_or_0, buffer out, u32 rows, u32 cols,
 *                    u32 src_rows)
 *   rmsnorm_bf16(buffer x, buffer add_or_0, buffer weight, buffer out, u32 rows, u32 cols,
 *                f32 eps)
 *   argmax_f32(buffer in, buffer ids, u32 rows, u32 cols, u32 pitch)
 *   fill_uniform_bf16(buffer out, u64 count, u64 counter, f32 offset, f32 scale)
 *   amax_bf16(buffer x, buffer out, u64 count): out, FP32 [1], receives max(out, the amax), so
 *             the front zeroes it first (the CUDA kernel's blocks meet through an atomic max)
 */
#ifndef METRALE_ELEMENTWISE_REFERENCE_H
#define METRALE_ELEMENTWISE_REFERENCE_H

#include <stdint.h>

#define MG_GATHER_ROWS_KERNEL "gather_rows_bf16"
#define MG_RMSNORM_KERNEL "rmsnorm_bf16"
#define MG_ARGMAX_KERNEL "argmax_f32"
#define MG_ARGMAX_BF16_KERNEL "argmax_bf16"
#define MG_FILL_UNIFORM_KERNEL "fill_uniform_bf16"
#define MG_AMAX_KERNEL "amax_bf16"

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_elementwise_cpu_kernels_register(void);

#endif
