/*
 * nvfp4_gemm_reference.h - private: the kernel names and argument lists of the NVFP4 GEMM op
 * (kernels/cuda/nvfp4/nvfp4_gemm.cu), and the CPU kernels registered under the same names.
 *
 * GEMM kernels, two families (kernels/cuda/nvfp4/): up to 16 tokens per group
 * "nvfp4_gemm_t{8,16}_k{1,2,4,8}" and "nvfp4_gemm_gate_up_t{8,16}_k{1,2,4}" (nvfp4_gemm.cu: a
 * tile of 8 or 16 tokens, 1..8 warps splitting K); from 17 tokens
 * "nvfp4_gemm_[gate_up_]t{32,64}_r{rows}_k{groups}" (nvfp4_gemm_tile.cu: a tile of 32 or 64
 * tokens, `rows` output rows per CTA from 1, 2 or 4 row warps of 32 rows (16 gate_up), K split
 * in `groups` warp groups: mg_nvfp4_tile_variant_exists). All take:
 *   0 act (BF16), 1 act_pitch u32, 2 act_rows u32, 3 token_ids (INT32 or 0),
 *   4 expert_offsets (INT32 [experts + 1] or 0 for one dense group), 5 experts u32, 6 rows u32,
 *   7 values, 8 scales, 9 expert_value_bytes u64, 10 expert_scale_bytes u64,
 *   11 global_scales (FP32 [experts]), 12 up_values, 13 up_scales, 14 up_global_scales
 *   (0 unless gate_up), 15 out (BF16), 16 ldc u32, 17 n u32, 18 k u32.
 * The small-tile family's fused kernels (mg_nvfp4_gemm_fused, dense calls of up to 16 rows):
 * "nvfp4_gemm_add_t{8,16}_k{1,2,4,8}" (the residual-add epilogue), "nvfp4_gemm_norm_t{8,16}_
 * k{1,2,4,8}" (the RMSNorm prologue, with the residual add when a residual is passed) and
 * "nvfp4_gemm_gate_up_norm_t{8,16}_k{1,2,4}" (the RMSNorm prologue) take three more:
 *   19 norm_weight (BF16 [k], or 0 without the prologue), 20 residual (BF16 [rows, ldc], or 0;
 *   it may be out itself), 21 eps f32.
 * Grid (token tiles, row blocks of 16), block 32 * KW threads (twice that for gate_up); for the
 * tile family grid (token tiles, ceil(n / rows)), block 32 * row warps * groups threads and
 * MG_NVFP4_TILE_SHARED_BYTES(tile, groups) bytes of dynamic shared memory.
 *
 * "nvfp4_hopper_prepare": 0 codes, 1 e4m3 scales, 2 values, 3 scales, 4 n, 5 k, 6 experts.
 * "nvfp4_hopper_dequant_bf16" (the CUDA large-M provider only): 0 values, 1 scales,
 * 2 global_scale, 3 out BF16 [n, k], 4 n, 5 k.
 *
 * The CPU kernels compute the reference: every weight decoded exactly from the prepared
 * layout, FP64 sums, one rounding to BF16; they validate the routing and fail naming the bad
 * entry (the CUDA kernels clamp instead: metrale/ops_nvfp4.h). A fused launch is the
 * composition of metrale/ops_nvfp4.h (mg_nvfp4_cpu_gemm_run).
 */
#ifndef METRALE_NVFP4_GEMM_REFERENCE_H
#define METRALE_NVFP4_GEMM_REFERENCE_H

#include <stdint.h>

#include "metrale/launch.h"
#include "metrale/status.h"

#define MG_NVFP4_KERNEL_PREPARE "nvfp4_hopper_prepare"
#define MG_NVFP4_KERNEL_DEQUANT_BF16 "nvfp4_hopper_dequant_bf16" /* CUDA only */
#define MG_NVFP4_GEMM_ARGS 19u
#define MG_NVFP4_GEMM_FUSED_ARGS 22u

/* The fusion a small-tile kernel runs (its name's "add_" or "norm_"). */
typedef enum mg_nvfp4_kernel_fusion {
    MG_NVFP4_KERNEL_PLAIN = 0,
    MG_NVFP4_KERNEL_ADD = 1,  /* the residual-add epilogue */
    MG_NVFP4_KERNEL_NORM = 2, /* the RMSNorm prologue, and the residual add when passed */
} mg_nvfp4_kernel_fusion;

/* The kernel name of a variant into buf (at least 40 bytes): of the small-tile family, and of
 * the tile family (`cta_rows` output rows per CTA). */
void mg_nvfp4_gemm_kernel_name(char *buf, unsigned bytes, unsigned tile_tokens, unsigned k_warps,
                               int gate_up, mg_nvfp4_kernel_fusion fusion);
void mg_nvfp4_gemm_tile_kernel_name(char *buf, unsigned bytes, unsigned tile_tokens,
                                    unsigned cta_rows, unsigned k_groups, int gate_up);

/* Whether the tile family has a kernel of `tile_tokens` tokens, `row_warps` row warps and
 * `k_groups` K groups: tiles of 32 or 64, 1, 2 or 4 row warps, 1 or 2 groups (also 4 with 32
 * tokens), at most 8 warps. */
int mg_nvfp4_tile_variant_exists(unsigned tile_tokens, unsigned row_warps, unsigned k_groups);

/* The tile family's dynamic shared memory: 4 stages of k_groups * tile_tokens activation rows
 * of 144 bytes (nvfp4_gemm_tile.cu). */
#define MG_NVFP4_TILE_SHARED_BYTES(tile_tokens, k_groups) (4u * (k_groups) * (tile_tokens)*144u)

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_nvfp4_cpu_kernels_register(void);

/* A GEMM kernel's arguments on the CPU backend (the list above), host pointers. */
typedef struct mg_nvfp4_cpu_gemm_call {
    const uint16_t *act;
    uint32_t act_pitch, act_rows;
    const int32_t *token_ids, *offsets; /* NULL: rows are act's rows; one dense group */
    uint32_t experts, rows;
    const uint8_t *values, *scales, *up_values, *up_scales; /* up_*: NULL unless gate_up */
    uint64_t expert_value_bytes, expert_scale_bytes;
    const float *global, *up_global;
    uint16_t *out;
    uint32_t ldc, n, k;
    /* A fused launch's (22 arguments; NULL otherwise): the RMSNorm prologue's weight and eps,
     * the residual (may be out). */
    const uint16_t *norm_weight;
    const uint16_t *residual;
    float eps;
} mg_nvfp4_cpu_gemm_call;

/* Unpacks and checks launch `l` of kernel `name` (19 arguments, or 22 for a fused kernel; every
 * buffer inside its allocation, the routing valid: mg_moe_routing_check_host), as the reference
 * kernel does. */
mg_status mg_nvfp4_cpu_gemm_args(const mg_launch *l, const char *name, mg_nvfp4_cpu_gemm_call *c);

/* Runs call `c` with GEMM `gemm` (the reference's or the fast kernel's): a plain call as it is,
 * a fused one as its composition (metrale/ops_nvfp4.h, mg_nvfp4_gemm_fused): the rows normed by
 * the RMSNorm reference, the GEMM, then out = bf16(bf16 product + residual). */
mg_status mg_nvfp4_cpu_gemm_run(const mg_nvfp4_cpu_gemm_call *c, const char *name,
                                mg_status (*gemm)(const mg_nvfp4_cpu_gemm_call *, const char *));

/* The fast CPU GEMM kernel (nvfp4_gemm_cpu_fast.c), one name for every problem: AVX2 + FMA,
 * registered where the build has it (an x86 build with GCC or Clang); the arguments above.
 * Per output, against the reference's exact sum v (times the global scale):
 *     |fast - ref| <= 2^-7 max(|fast|, |ref|) + (k + 8) 2^-24 S |global| (+ 2^-23 |v|)
 * with S = sum_i |x_i w_i| over the decoded weights (FP32 products of exact values, summed in
 * another order); gate_up: the same for each of g and u, carried through silu(g) * u. */
#define MG_NVFP4_KERNEL_GEMM_AVX2 "nvfp4_gemm_avx2"
void mg_nvfp4_cpu_fast_kernels_register(void);
/* Whether this build has the AVX2 kernel (the CPU must have AVX2 too: cpu_isa.h). */
int mg_nvfp4_cpu_avx2_built(void);

#endif
