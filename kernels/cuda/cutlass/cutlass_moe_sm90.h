/*
 * cutlass_moe_sm90.h - private: the Hopper grouped MoE GEMM entry points of the CUTLASS plugin
 * (cutlass_moe_sm90_bf16.cu, cutlass_moe_sm90_fp8.cu, cutlass_moe_sm90_fp8_rowwise.cu), as
 * src/ops/moe_gemm/moe_gemm_cuda.c calls them for metrale/ops_moe_gemm.h.
 *
 * One call: a kernel of the unit gathers the activation rows into the workspace (for FP8 it
 * quantizes them there) and writes every per-expert argument of the grouped GEMM from
 * expert_offsets, then CUTLASS's pointer-array grouped GEMM runs with the problem shapes in
 * device memory. Nothing is read back and nothing is allocated, so the call may be captured.
 * The caller has checked every argument (the op front) and the alignments these kernels need
 * (k, n_w and ldd multiples of 8 for BF16, of 16 for FP8; d 16-byte aligned).
 */
#ifndef METRALE_CUTLASS_MOE_SM90_H
#define METRALE_CUTLASS_MOE_SM90_H

#include <stddef.h>
#include <stdint.h>

#include "cutlass_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The weight formats, numbered as mg_moe_gemm_kind (metrale/ops_moe_gemm.h). */
#define MG_CUTLASS_MOE_BF16 0u
#define MG_CUTLASS_MOE_FP8_ROWWISE 1u
#define MG_CUTLASS_MOE_FP8_BLOCKSCALED 2u

typedef struct mg_cutlass_moe_problem {
    uint32_t kind; /* MG_CUTLASS_MOE_* */
    uint32_t experts, rows, act_rows;
    uint32_t n_w, k;               /* per expert: weight rows (output columns of D), reduction */
    uint32_t act_pitch, ldd;       /* elements between rows of act and of d */
    const void *act;               /* BF16 [act_rows, act_pitch] */
    const int32_t *token_ids;      /* INT32 [rows] or NULL (row r reads act row r) */
    const int32_t *expert_offsets; /* INT32 [experts + 1]; clamped into [0, rows] */
    const void *weight;            /* [experts, n_w, k], BF16 or E4M3 */
    const float *weight_scale;     /* FP8 kinds: [experts, n_w] or [experts, n_w/128, k/128] */
    void *d;                       /* BF16 [rows, ldd] */
    void *workspace;               /* 256-byte aligned, workspace_bytes long */
    size_t workspace_bytes;
} mg_cutlass_moe_problem;

/* Bytes of workspace `p` needs (p's pointers are not read): gathered activations, per-expert
 * arguments and CUTLASS's own workspace, for the current device. Host-only. */
typedef mg_status (*mg_cutlass_moe_sm90_workspace_fn)(const mg_cutlass_moe_problem *p,
                                                      size_t *bytes, mg_plugin_error *err);
/* Runs `p` on `stream` (a CUstream / cudaStream_t of the current device). A problem CUTLASS
 * refuses is MG_ERR_UNSUPPORTED with its reason. */
typedef mg_status (*mg_cutlass_moe_sm90_run_fn)(const mg_cutlass_moe_problem *p, void *stream,
                                                mg_plugin_error *err);

/* Exported names, one pair per unit (one kind each). */
#define MG_CUTLASS_MOE_SM90_BF16_WORKSPACE "mg_cutlass_moe_sm90_bf16_workspace"
#define MG_CUTLASS_MOE_SM90_BF16_RUN "mg_cutlass_moe_sm90_bf16_run"
#define MG_CUTLASS_MOE_SM90_FP8_WORKSPACE "mg_cutlass_moe_sm90_fp8_workspace"
#define MG_CUTLASS_MOE_SM90_FP8_RUN "mg_cutlass_moe_sm90_fp8_run"
#define MG_CUTLASS_MOE_SM90_FP8_ROWWISE_WORKSPACE "mg_cutlass_moe_sm90_fp8_rowwise_workspace"
#define MG_CUTLASS_MOE_SM90_FP8_ROWWISE_RUN "mg_cutlass_moe_sm90_fp8_rowwise_run"

#ifdef __cplusplus
}
#endif
#endif
