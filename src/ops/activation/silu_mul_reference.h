/*
 * silu_mul_reference.h - private: the CPU reference of mg_silu_mul_bf16
 * (metrale/ops_activation.h), registered as the CPU kernel of the CUDA kernel's name and
 * argument list (kernels/cuda/activation/silu_mul.cu):
 *   silu_mul_bf16(buffer in, buffer out, u32 rows, u32 cols, u32 in_pitch, u32 out_pitch)
 */
#ifndef METRALE_SILU_MUL_REFERENCE_H
#define METRALE_SILU_MUL_REFERENCE_H

#include <stdint.h>

#define MG_SILU_MUL_KERNEL "silu_mul_bf16"

/* Registers the CPU kernel once per process; later calls do nothing. */
void mg_silu_mul_cpu_kernels_register(void);

#endif
