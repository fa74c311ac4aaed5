/*
 * mlx_reference.h - private: the CPU reference of the MLX ops (metrale/mlx.h) and the kernel
 * names every backend ships for them. The CPU backend runs the reference as CPU kernels of
 * module "metrale" under the CUDA kernels' names and argument lists (kernels/cuda/mlx/).
 */
#ifndef METRALE_MLX_REFERENCE_H
#define METRALE_MLX_REFERENCE_H

#include <stdint.h>

#include "metrale/launch.h"
#include "metrale/status.h"

#define MG_MLX_KERNEL_DEQUANT "mlx_dequant"
#define MG_MLX_KERNEL_GEMV "mlx_gemv"
#define MG_MLX_KERNEL_GEMV_GATE_UP "mlx_gemv_gate_up"
#define MG_MLX_KERNEL_ADD_BIAS "mlx_add_bias"

/* The kernels' scale_type argument and mlx_gemv's mode argument. */
enum { MG_MLX_SCALE_BF16 = 0, MG_MLX_SCALE_F16 = 1 };
/* mlx_add_bias's bias_type argument. */
enum { MG_MLX_BIAS_BF16 = 0, MG_MLX_BIAS_F16 = 1, MG_MLX_BIAS_F32 = 2 };
enum { MG_MLX_GEMV_PLAIN = 0, MG_MLX_GEMV_SILU_GATE = 1, MG_MLX_GEMV_SILU_GATE_RESID = 2 };
/* mlx_gemv_gate_up's epilogue argument: both products stored (y1 gate, y2 up), or y1 =
 * silu(gate) * up of the two BF16 products (mg_silu_mul_bf16's arithmetic) and y2 not read. */
enum { MG_MLX_GATE_UP_BOTH = 0, MG_MLX_GATE_UP_SILU_MUL = 1 };

/* The GEMVs take at most this many activation rows. */
#define MG_MLX_GEMV_MAX_M 8u

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_mlx_cpu_kernels_register(void);

/* ---- the kernels' arguments, for every CPU implementation of them (the reference here, the
 * fast providers of mlx_cpu_fast.c): unpacked and checked once, so a bad launch is an error
 * naming the kernel `name`, never an out-of-bounds access. */

/* One layer in host memory. */
typedef struct mg_mlx_cpu_layer {
    const uint32_t *weight;
    const uint16_t *scales, *biases;
    uint32_t n, k, bits, group_size, scale_type;
} mg_mlx_cpu_layer;

/* mlx_dequant(weight, scales, biases, out, n, k, bits, group_size, scale_type). */
mg_status mg_mlx_cpu_dequant_args(const mg_launch *l, const char *name, mg_mlx_cpu_layer *w,
                                  uint16_t **out);
/* mlx_gemv(weight, scales, biases, x, u, resid, y, m, n, k, bits, group_size, scale_type,
 * mode): u is NULL for the plain mode, resid unless silu_gate_resid. */
mg_status mg_mlx_cpu_gemv_args(const mg_launch *l, const char *name, mg_mlx_cpu_layer *w,
                               uint32_t *m, const uint16_t **x, const uint16_t **u,
                               const uint16_t **resid, uint16_t **y);
/* mlx_gemv_gate_up(w1, s1, b1, w2, s2, b2, x, y1, y2, m, n, k, bits, group_size, scale_type,
 * epilogue): gate in w[0], up in w[1], one shape. With MG_MLX_GATE_UP_SILU_MUL, *y2 is a new
 * host buffer of m x n BF16 for the up product; either way the caller computes gate into *y1
 * and up into *y2, then calls mg_mlx_cpu_gate_up_finish. */
mg_status mg_mlx_cpu_gate_up_args(const mg_launch *l, const char *name, mg_mlx_cpu_layer w[2],
                                  uint32_t *m, const uint16_t **x, uint16_t **y1, uint16_t **y2,
                                  uint32_t *epilogue);
/* Ends a gate_up kernel whose products returned `st`: with the SiLU-mul epilogue (and st
 * MG_OK) y1[i] = silu(y1[i]) * y2[i] as mg_silu_mul_bf16 computes it, and y2 is freed. Returns
 * st. */
mg_status mg_mlx_cpu_gate_up_finish(mg_status st, uint32_t epilogue, uint32_t m, uint32_t n,
                                    uint16_t *y1, uint16_t *y2);

#endif
