/*
 * mlx_cpu_fast.h - private: the fast CPU kernels of the MLX ops (mlx_cpu_fast.c), behind the
 * providers "cpu_avx512", "cpu_avx2" and "cpu_portable" of mlx.c. Each takes the argument list of
 * the reference kernel it stands for (mlx_reference.h, kernels/cuda/mlx/), so mlx.c launches either
 * by name with the same arguments.
 *
 * What a caller may rely on:
 * - dequant: bit for bit the reference's BF16 values where scales and biases are finite (the
 *   same two roundings to the scales' type, then to BF16).
 * - the GEMVs: the activations exactly as the reference forms them (x, or bf16(silu(g) * u)
 *   with the same expf), the sum of the same terms scale * code * a and bias * a in FP32 in a
 *   different order instead of double, and the output rounded to BF16 once. Per output,
 *       |fast - reference| <= 2^-7 * max(|fast|, |reference|)
 *                             + (k + 2 * groups + 16) * 2^-24 * S (+ |resid| 2^-24),
 *   S = sum over groups of |scale| * sum_j code_j |a_j| + |bias| * sum_j |a_j|: an FP32
 *   summation of at most k + 2 * groups + 16 terms in any order is within that many units
 *   2^-24 of the magnitudes summed; each side then rounds to BF16 (at most half a spacing,
 *   2^-8 of the value, each). The result does not depend on the thread count.
 */
#ifndef METRALE_MLX_CPU_FAST_H
#define METRALE_MLX_CPU_FAST_H

#include <stdbool.h>

#define MG_MLX_KERNEL_DEQUANT_AVX2 "mlx_dequant_avx2"
#define MG_MLX_KERNEL_GEMV_AVX2 "mlx_gemv_avx2"
#define MG_MLX_KERNEL_GEMV_GATE_UP_AVX2 "mlx_gemv_gate_up_avx2"
#define MG_MLX_KERNEL_GEMV_AVX512 "mlx_gemv_avx512" /* its dequant is the AVX2 kernel */
#define MG_MLX_KERNEL_GEMV_GATE_UP_AVX512 "mlx_gemv_gate_up_avx512"
#define MG_MLX_KERNEL_DEQUANT_PORTABLE "mlx_dequant_portable"
#define MG_MLX_KERNEL_GEMV_PORTABLE "mlx_gemv_portable"
#define MG_MLX_KERNEL_GEMV_GATE_UP_PORTABLE "mlx_gemv_gate_up_portable"

/* Whether this build has the AVX2 kernels (an x86 build with GCC or Clang); the CPU must have
 * AVX2 too (cpu_isa.h). */
bool mg_mlx_cpu_avx2_built(void);

/* Registers the kernels once per process; later calls do nothing. */
void mg_mlx_cpu_fast_kernels_register(void);

#endif
