/*
 * gemm_reference.h - private: the FP8 scale transpose on host memory and the CPU kernels of the
 * GEMM ops, which run the reference GEMMs of gemm_host.h. Arguments of the host functions are
 * trusted (the op layer checked them); nothing here fails.
 */
#ifndef METRALE_GEMM_REFERENCE_H
#define METRALE_GEMM_REFERENCE_H

#include <stdint.h>

#include "gemm_host.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "metrale/ops_gemm.h"

/* The arguments of the BF16 GEMM's CPU kernels (gemm_bf16_ref and the fast providers'):
 * (act, weight, out, m, n, k, ldc, out_type), unpacked and checked once so a bad launch is an
 * error naming the kernel `name`, never an out-of-bounds access. */
typedef struct mg_gemm_bf16_cpu_args {
    uint32_t m, n, k, ldc;
    mg_dtype out_type; /* F32 or BF16 */
    const uint16_t *act, *weight;
    void *out;
} mg_gemm_bf16_cpu_args;
mg_status mg_gemm_bf16_cpu_args_get(const mg_launch *l, const char *name,
                                    mg_gemm_bf16_cpu_args *out);

/* The reference of mg_fp8_act_scales_transpose: src [m, L] -> dst [L, m_pad], zero padding. */
void mg_fp8_act_scales_transpose_cpu(uint32_t m, uint32_t m_pad, uint32_t k, const float *src,
                                     float *dst);

/* The GEMM ops run on the CPU backend as CPU kernels of module "metrale", launched through the
 * public launch path like any kernel, so they are stream-ordered, recorded by captures and
 * their buffers checked against the live allocations when they run. Argument lists:
 *   gemm_bf16_ref(act, weight, out; u32 m, n, k, ldc, out_type)
 *   gemm_fp8_ref(act, act_scale, weight, weight_scale, out; u32 m, n, k, ldc, act_scaling,
 *                weight_scaling)                                     (mg_fp8_scaling values)
 *   fp8_act_scales_transpose(src, dst; u32 m, m_pad, blocks)         (as the CUDA kernel)
 *   gemm_fused_ref(act, act_scale_or_0, weight, weight_scale_or_0, out, norm_weight_or_0,
 *                  residual_or_0, argmax_ids_or_0; u32 kind, m, n, k, ldc, out_type, prologue,
 *                  epilogue; f32 eps)        (BF16 or row-wise FP8 with a fusion: the composition
 *                                             of the reference ops, metrale/ops_gemm.h)
 * Registers them once per process; later calls do nothing. */
void mg_gemm_reference_kernels_register(void);

#endif
