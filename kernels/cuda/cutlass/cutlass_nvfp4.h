/*
 * cutlass_nvfp4.h - private: the Blackwell NVFP4 family of the CUTLASS plugin
 * (kernels/cuda/cutlass/cutlass_nvfp4_sm100.cu for sm_100a, cutlass_nvfp4_sm120.cu for sm_120a,
 * cutlass_nvfp4_layout.cu for the host-only layout code): block-scaled FP4 x FP4 tensor-core
 * GEMMs, dense and grouped per expert, with the activation quantized per call.
 *
 *     out[r, n] = alpha * sum_k qa[r, k] * qw[n, k]      (BF16 out, FP32 accumulation)
 *     alpha     = act_global * w_global[expert]          (both FP32, computed on the device)
 *
 * Weights: E2M1 codes [n, k/2] K-major (the canonical byte order of metrale/nvfp4.h), block
 * scales in the Blackwell 128x4 layout of mg_nvfp4_swizzled_offset, one expert after another
 * (expert e at e * w_codes_stride and e * w_scales_stride).
 *
 * The activation (BF16) is quantized inside the call, by the rule of metrale/nvfp4.h with the
 * per-tensor global act_global = mg_nvfp4_global_scale_from_amax(max finite |act|) measured on
 * the device (so every block scale is (block amax / 6) / act_global, at most about 448), into the
 * caller's workspace: codes [rows, k/2], then scales in the 128x4 layout. The grouped form
 * gathers rows through sorted_token_ids and gives expert e its own scale tiles starting at row
 * mg_cutlass_nvfp4_moe_sf_row_base(offsets[e], e), and builds the per-expert CUTLASS arguments
 * (problem shapes, pointers, strides, scale layouts) on the device from expert_offsets, so a
 * captured graph replays with any routing. Everything lives in the workspace: the plugin
 * allocates nothing.
 *
 * Shapes: k a multiple of 32 (16-byte TMA rows of codes), n a multiple of 8 and ldc a multiple of
 * 8 (16-byte BF16 output rows); pointers 16-byte aligned.
 */
#ifndef METRALE_CUTLASS_NVFP4_H
#define METRALE_CUTLASS_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#include "cutlass_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where each part of a call's workspace begins (bytes from the workspace start, each 256-byte
 * aligned), for `rows` activation rows (dense: m), `experts` (dense: 1) and k. */
typedef struct mg_cutlass_nvfp4_workspace_layout {
    size_t amax;       /* u32: the activation amax (FP32 bits), zeroed by the call */
    size_t alpha;      /* FP32 [experts]: act_global * w_global[e] */
    size_t act_codes;  /* u8 [rows, k/2] */
    size_t act_scales; /* u8: the 128x4 layout, act_scale_bytes long, zeroed by the call */
    size_t act_scale_bytes;
    size_t group_args;  /* grouped form only: the per-expert CUTLASS arguments */
    size_t cutlass;     /* CUTLASS's own workspace */
    size_t fixed_bytes; /* everything before `cutlass` */
} mg_cutlass_nvfp4_workspace_layout;

/* ---- host-only layout code (cutlass_nvfp4_layout.cu; needs no GPU) ---- */

/* Bytes of the scale factors of a [rows, k] operand as CUTLASS's Sm1xxBlkScaledConfig lays
 * them out (its layout's cosize), 0 when k is not a positive multiple of 16. */
typedef size_t (*mg_cutlass_nvfp4_layout_sf_bytes_fn)(uint32_t rows, uint32_t k);
/* The byte offset CUTLASS reads block scale (row, kblock) of a [rows, k] operand from: the SFA
 * layout (is_b = 0, rows = M) or the SFB layout (is_b = 1, rows = N). */
typedef int64_t (*mg_cutlass_nvfp4_layout_sf_offset_fn)(uint32_t rows, uint32_t k, int is_b,
                                                        uint32_t row, uint32_t kblock);
/* The device kernels' own index math (cutlass_nvfp4_common.cuh): where the activation
 * quantizer writes scale (row, col) of a matrix of `cols` scale columns, and which (row, col)
 * the weight re-layout reads for byte `offset` (row or col out of range for padding). */
typedef int64_t (*mg_cutlass_nvfp4_layout_act_sf_offset_fn)(uint32_t row, uint32_t col,
                                                            uint32_t cols);
typedef void (*mg_cutlass_nvfp4_layout_sf_position_fn)(size_t offset, uint32_t cols, uint32_t *row,
                                                       uint32_t *col);
/* The first scale row of expert e in the grouped form's activation scales: a multiple of 128,
 * so the expert's tiles start on a 512-byte boundary, and never below the previous expert's
 * last tile for non-decreasing offsets. */
typedef uint32_t (*mg_cutlass_nvfp4_layout_moe_sf_row_base_fn)(uint32_t offset, uint32_t expert);
/* The fixed part of a call's workspace (without CUTLASS's own, which the arch entry points add)
 * for the dense (grouped = 0, experts = 1) or the grouped form. MG_ERR_INVALID_ARGUMENT for a
 * zero size, k not a multiple of 32 or a dense call with experts != 1. */
typedef mg_status (*mg_cutlass_nvfp4_layout_workspace_fn)(uint32_t rows, uint32_t experts,
                                                          uint32_t k, int grouped,
                                                          mg_cutlass_nvfp4_workspace_layout *out);

/* ---- the GEMMs (one set per architecture: mg_cutlass_nvfp4_sm100_*, mg_cutlass_nvfp4_sm120_*)
 * ---- */

typedef struct mg_cutlass_nvfp4_args {
    uint32_t rows; /* dense: m; grouped: rows in expert order */
    uint32_t n, k;
    uint32_t experts;        /* dense: 1 */
    uint32_t act_rows;       /* rows of act (grouped: what sorted_token_ids index; dense: rows) */
    uint32_t act_pitch, ldc; /* elements */
    const void *act;         /* BF16 [act_rows, act_pitch] */
    const int32_t *sorted_token_ids; /* grouped: INT32 [rows] or NULL (row r reads row r) */
    const int32_t *expert_offsets;   /* grouped: INT32 [experts + 1] */
    const void *w_codes;             /* u8: expert e's [n, k/2] at e * w_codes_stride */
    const void *w_scales;            /* u8: expert e's 128x4 scales at e * w_scales_stride */
    size_t w_codes_stride;           /* >= n * k / 2, a multiple of 16 (dense: ignored) */
    size_t w_scales_stride;          /* >= mg_nvfp4_swizzled_scale_bytes(n, k), a multiple of 16 */
    const float *w_global;           /* FP32 [experts] */
    void *out;                       /* BF16 [rows, ldc] */
    void *workspace;
    size_t workspace_bytes;
} mg_cutlass_nvfp4_args;

/* Workspace bytes the call needs (fixed part + CUTLASS's own for the current device). */
typedef mg_status (*mg_cutlass_nvfp4_workspace_fn)(const mg_cutlass_nvfp4_args *a, size_t *bytes,
                                                   mg_plugin_error *err);
/* Dense (experts == 1, no routing) and grouped GEMM on `stream`. */
typedef mg_status (*mg_cutlass_nvfp4_gemm_fn)(const mg_cutlass_nvfp4_args *a, void *stream,
                                              mg_plugin_error *err);
/* The load-time re-layout of `experts` stacked canonical weights (codes [experts * n, k/2],
 * E4M3 scales [experts * n, k/16]; any alignment) into what the GEMMs read: expert e's codes
 * copied unchanged to values + e * values_stride, its scales to scales_out + e * scales_stride in
 * the 128x4 layout (every byte of mg_nvfp4_swizzled_scale_bytes(n, k) written, padding 0), the
 * sign bit cleared and the NaN code 0x7f made 0, so such a block reads as zero as on Hopper.
 * Strides multiples of 16; values_stride >= n * k / 2, scales_stride >= the swizzled bytes. */
typedef mg_status (*mg_cutlass_nvfp4_prepare_fn)(const void *codes, const void *scales, uint32_t n,
                                                 uint32_t k, uint32_t experts, void *values,
                                                 size_t values_stride, void *scales_out,
                                                 size_t scales_stride, void *stream,
                                                 mg_plugin_error *err);

/* out[r, j] = bf16(silu(gate[r, j]) * up[r, j]) for r < rows, j < n (BF16 in and out, FP32
 * math; pitches in elements, multiples of 8; 16-byte aligned): the fused gate_up form made of
 * two GEMMs. */
typedef mg_status (*mg_cutlass_nvfp4_silu_mul_fn)(const void *gate, const void *up,
                                                  uint32_t in_pitch, void *out, uint32_t ldc,
                                                  uint32_t rows, uint32_t n, void *stream,
                                                  mg_plugin_error *err);

#ifdef __cplusplus
}
#endif
#endif
