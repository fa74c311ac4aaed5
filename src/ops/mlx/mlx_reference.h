/*
 * mlx_reference.h - private: the CPU reference of the MLX ops (metrale/mlx.h) and the kernel
 * names every backend ships for them. The CPU backend runs the reference as CPU kernels of
 * module "metrale" under the CUDA kernels' names and argument lists (kernels/cuda/mlx/).
 */
#ifndef METRALE_MLX_REFERENCE_H
#define METRALE_MLX_REFERENCE_H

#include <stdint.h>

#define MG_MLX_KERNEL_DEQUANT "mlx_dequant"
#define MG_MLX_KERNEL_GEMV "mlx_gemv"
#define MG_MLX_KERNEL_GEMV_GATE_UP "mlx_gemv_gate_up"
#define MG_MLX_KERNEL_ADD_BIAS "mlx_add_bias"

/* The kernels' scale_type argument and mlx_gemv's mode argument. */
enum { MG_MLX_SCALE_BF16 = 0, MG_MLX_SCALE_F16 = 1 };
/* mlx_add_bias's bias_type argument. */
enum { MG_MLX_BIAS_BF16 = 0, MG_MLX_BIAS_F16 = 1, MG_MLX_BIAS_F32 = 2 };
enum { MG_MLX_GEMV_PLAIN = 0, MG_MLX_GEMV_SILU_GATE = 1, MG_MLX_GEMV_SILU_GATE_RESID = 2 };

/* The GEMVs take at most this many activation rows. */
#define MG_MLX_GEMV_MAX_M 8u

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_mlx_cpu_kernels_register(void);

#endif
