/*
 * metrale/ops_moe_gemm.h - grouped per-expert (MoE) GEMMs with BF16 or FP8 E4M3 weights, on
 * the same routing interface as the NVFP4 grouped GEMM (metrale/ops_nvfp4.h) and the routing
 * ops of metrale/ops_moe.h:
 *
 *   mg_moe_topk(...); mg_moe_sort(..., expert_offsets, sorted_token_ids, pair_positions);
 *   mg_moe_gemm_desc d = {.kind = MG_MOE_GEMM_BF16, .experts = E, .rows = T * k,
 *                         .act_rows = T, .n = inter, .k = hidden, .gate_up = true};
 *   mg_moe_gemm_workspace_bytes(b, &d, &ws_bytes);          // once, host-only
 *   mg_moe_gemm(b, s, &d, &(mg_moe_gemm_tensors){.act = x, .sorted_token_ids = ids,
 *               .expert_offsets = offsets, .weight = w13, .out = h,
 *               .workspace = ws, .workspace_bytes = ws_bytes});
 *   ... then the down projection (gate_up = false, n = hidden, k = inter, act = h,
 *       sorted_token_ids = 0: its rows are already in expert order) and mg_moe_combine.
 *
 * The problem: `rows` rows in expert order; expert e owns rows [expert_offsets[e],
 * expert_offsets[e + 1]) (INT32 [experts + 1] in device memory, offsets[0] = 0, non-decreasing,
 * offsets[experts] <= rows; rows past offsets[experts] are not computed: the plain form leaves
 * them untouched, the gate_up form may write anything there). Row r reads activation row
 * sorted_token_ids[r] (INT32 [rows]; 0 instead of a pointer: row r itself, which needs
 * act_rows >= rows) of act BF16 [act_rows, act_pitch], and
 *
 *     out[r, j] = sum_k act[tok(r), k] * W_e[j, k]                    (gate_up = false)
 *     out[r, j] = silu(sum_k act·W_e[j, k]) * (sum_k act·W_e[n + j, k]) (gate_up = true)
 *
 * with W_e = weight[e] of shape [n_w, k], n_w = n (plain) or 2n (gate_up: rows [0, n) are the
 * gate, rows [n, 2n) the up projection), FP32 accumulation, out BF16 [rows, ldc]. In gate_up
 * form the two products are rounded to BF16 before silu·mul, exactly as mg_silu_mul_bf16
 * computes it from a BF16 [rows, 2n] intermediate.
 *
 * Weight formats (`kind`):
 *   MG_MOE_GEMM_BF16             weight BF16 [E, n_w, k].
 *   MG_MOE_GEMM_FP8_ROWWISE      weight E4M3 [E, n_w, k], weight_scale FP32 [E, n_w] (one scale
 *                                per output row); the activation rows are quantized to E4M3 on
 *                                the device with one scale per row (amax / 448, the rule of
 *                                mg_fp8_quantize_rowwise).
 *   MG_MOE_GEMM_FP8_BLOCKSCALED  weight E4M3 [E, n_w, k], weight_scale FP32 [E, ceil(n_w / 128),
 *                                ceil(k / 128)] (one scale per 128x128 block, DeepSeek-style);
 *                                the activation is quantized on the device with one scale per
 *                                (row, 128-wide K block) (the rule of mg_fp8_quantize_1x128).
 * The FP8 kinds need k a multiple of 16 and n_w a multiple of 16 (TMA rows of 16 bytes). On CUDA
 * the BF16 kind needs k, n_w and (plain form) ldc multiples of 8 for the same reason; other
 * shapes are MG_ERR_UNSUPPORTED there (the CPU reference takes any). act_pitch is a multiple of
 * 8 on every backend (16-byte activation rows).
 *
 * What a caller may rely on:
 *  - Arguments are checked before anything is launched; a bad shape, kind, pointer, alignment
 *    or a workspace too small is MG_ERR_INVALID_ARGUMENT (MG_ERR_UNSUPPORTED when the kernel
 *    library refuses the problem, with its reason) and nothing is written. out and the
 *    workspace share no byte with any other tensor of the call.
 *  - Experts without rows cost nothing. Every per-expert argument (problem shapes, pointers,
 *    strides, scale pointers) is computed on the device from expert_offsets, so the call reads
 *    nothing back, allocates nothing, and a graph captured once replays with any routing.
 *  - Bad routing data cannot fault on CUDA: offsets are clamped into [0, rows] and token ids
 *    into [0, act_rows); the CPU reference reports them as MG_ERR_INVALID_ARGUMENT instead.
 *  - The workspace (device memory, 256-byte aligned, mg_moe_gemm_workspace_bytes long) holds
 *    the gathered (and, for FP8, quantized) activations, the gate_up intermediate and the
 *    per-expert arguments; calls that may overlap need workspaces of their own.
 *  - On CUDA the op runs CUTLASS's Hopper grouped GEMMs (sm_90a, compute capability 9.0; FP8
 *    with FP32 block-scaled accumulation: the row-wise product is scaled per 128-wide K block,
 *    equal up to FP32 rounding). The CPU backend runs the reference for every kind (FP8 values
 *    decoded exactly, FP32 accumulation).
 */
#ifndef METRALE_OPS_MOE_GEMM_H
#define METRALE_OPS_MOE_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_moe_gemm_kind {
    MG_MOE_GEMM_BF16 = 0,
    MG_MOE_GEMM_FP8_ROWWISE,
    MG_MOE_GEMM_FP8_BLOCKSCALED,
} mg_moe_gemm_kind;

typedef struct mg_moe_gemm_desc {
    mg_moe_gemm_kind kind;
    uint32_t experts;        /* E, 1 .. MG_MOE_MAX_EXPERTS (metrale/ops_moe.h) */
    uint32_t rows;           /* rows of the grouped problem (tokens * top_k), >= 1 */
    uint32_t act_rows;       /* rows of act (the tokens), >= 1 */
    uint32_t n, k;           /* per expert: output columns n >= 1, reduction k >= 1 */
    uint32_t act_pitch, ldc; /* elements between rows; 0: k and n */
    bool gate_up;            /* fused gate_up form (weight rows 2n), out = silu(gate) * up */
} mg_moe_gemm_desc;

typedef struct mg_moe_gemm_tensors {
    mg_devptr act;              /* BF16 [act_rows, act_pitch], 16-byte aligned */
    mg_devptr sorted_token_ids; /* INT32 [rows], or 0 (row r reads act row r) */
    mg_devptr expert_offsets;   /* INT32 [experts + 1] */
    mg_devptr weight;           /* [E, n_w, k] as `kind` says, 16-byte aligned */
    mg_devptr weight_scale;     /* FP32, FP8 kinds only (layouts above); 0 for BF16 */
    mg_devptr out;              /* BF16 [rows, ldc], 16-byte aligned */
    mg_devptr workspace;        /* >= mg_moe_gemm_workspace_bytes, 256-byte aligned */
    size_t workspace_bytes;
} mg_moe_gemm_tensors;

/* Bytes of workspace a call of `d` needs on `b` (0 on backends that need none). Host-only. */
MG_API mg_status mg_moe_gemm_workspace_bytes(mg_backend *b, const mg_moe_gemm_desc *d,
                                             size_t *bytes);

MG_API mg_status mg_moe_gemm(mg_backend *b, mg_stream *s, const mg_moe_gemm_desc *d,
                             const mg_moe_gemm_tensors *t);

#ifdef __cplusplus
}
#endif
#endif
