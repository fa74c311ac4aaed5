/*
 * metrale/ops_nvfp4.h - NVFP4 weights with BF16 activations: the dense GEMM and the grouped
 * per-expert (MoE) GEMM, on any backend (CUDA: our Hopper kernels; CPU: the reference and a
 * fast AVX2 kernel).
 *
 *     out[r, n] = sum_k act[token(r), k] * W[n, k] * global,   W = e2m1(code) * e4m3(scale)
 *
 * row-major, K contiguous, FP32 accumulation, BF16 out (the GEMM convention of
 * metrale/ops_gemm.h with NVFP4 weights). Canonical NVFP4 weights (the ModelOpt convention,
 * metrale/nvfp4.h converts the others): codes [N, K/2] bytes, low nibble = even k, each nibble
 * a sign bit (bit 3) and an E2M1 magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6}; block scales [N, K/16]
 * E4M3 bytes, one per 16 consecutive k; a global FP32 multiplier in device memory.
 *
 * Hopper has no FP4 tensor-core instruction: the kernels decode E2M1 in registers and
 * multiply with BF16 tensor cores, from a layout made once at load by mg_nvfp4_prepare (the
 * weights are read in 16-byte runs per lane, scales re-encoded so decoding is one shift and
 * one add). The same prepared weights serve every M, the dense and the grouped call.
 *
 *   size_t vb = mg_nvfp4_prepared_value_bytes(n, k), sb = mg_nvfp4_prepared_scale_bytes(n, k);
 *   mg_nvfp4_prepare(b, s, n, k, 1, codes, scales, wv, ws);          // once, at load
 *   mg_nvfp4_weight w = {.values = wv, .scales = ws, .global_scale = gs};
 *   mg_nvfp4_gemm(b, s, m, n, k, act, k, &w, out, n);                // every step
 *
 * On a Blackwell device (compute capability 10.0 or 12.0, with the CUTLASS plugin's Blackwell
 * kernels), for N a multiple of 128 and K a multiple of 32, mg_nvfp4_prepare writes another
 * layout (the codes unchanged, the scales in the 128x4 layout of metrale/nvfp4.h) and the GEMMs
 * run native FP4 x FP4 tensor-core kernels (provider "cutlass_blackwell"): the activation is
 * quantized to NVFP4 on every call (per-16 E4M3 scales, the global amax / (448 * 6) of the
 * activation measured on the device), so results carry FP4 activation error; ldc must be a
 * multiple of 8; the workspace is stream-private scratch that grows outside a capture only (make
 * one call of the largest shape on a stream before capturing on it); gate_up is two GEMMs and a
 * SiLU-multiply. Not yet verified on hardware. Other shapes and devices: as below.
 *
 * What a caller may rely on:
 *  - Arguments are checked before anything is launched (MG_ERR_INVALID_ARGUMENT naming the
 *    argument): K a multiple of 16, activation rows 16-byte aligned (act and act_pitch * 2),
 *    buffers inside live allocations of `b`, output not overlapping the inputs.
 *  - Calls are ordered on `s` and allocate nothing: they may be captured in a graph. The
 *    grouped call reads the routing (expert_offsets, sorted_token_ids) and the global scales
 *    on the device when it runs, so a captured graph replays with a new routing.
 *  - Results do not depend on timing (fixed reduction order), and an output row does not
 *    depend on the other rows of the batch for M <= 16 rows per tile (see mg_nvfp4_gemm).
 *  - On the CPU backend the reference (provider "kernels") decodes the weights exactly, sums
 *    in FP64 and rounds to BF16 once; where the CPU has AVX2 the automatic choice is the fast
 *    provider "cpu_avx2" (FP32 sums, within the bound src/ops/nvfp4/nvfp4_gemm_reference.h
 *    states). Both validate the routing (offsets from 0, non-decreasing, up to the row count;
 *    token ids inside the activation), with an error naming the bad entry.
 *    On CUDA, where checking would need a synchronisation, a bad routing cannot fault: offsets
 *    are clamped to [0, rows] (a decreasing pair is an empty expert) and a token id outside
 *    the activation reads zeros.
 */
#ifndef METRALE_OPS_NVFP4_H
#define METRALE_OPS_NVFP4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"
#include "metrale/ops_gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of the prepared values and scales of one N x K weight (rows padded to 16, K to 256;
 * about N * K / 2 and N * K / 16). 0 when K is not a positive multiple of 16 or N is 0. */
MG_API size_t mg_nvfp4_prepared_value_bytes(uint32_t n, uint32_t k);
MG_API size_t mg_nvfp4_prepared_scale_bytes(uint32_t n, uint32_t k);

/* The load-time re-layout of `experts` stacked canonical weights (codes [experts * n, k / 2],
 * E4M3 scales [experts * n, k / 16], device memory) into values and scales of experts *
 * mg_nvfp4_prepared_*_bytes(n, k) bytes (expert e at e times that size). The sign bit of a
 * scale is ignored; a zero scale or the NaN code (0x7f) makes its block zero. Bit-identical on
 * every backend. Inputs need no alignment; outputs 16-byte aligned and not overlapping. */
MG_API mg_status mg_nvfp4_prepare(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                  uint32_t experts, mg_devptr codes, mg_devptr scales,
                                  mg_devptr prepared_values, mg_devptr prepared_scales);

/* A prepared weight (or `experts` of them, stacked as mg_nvfp4_prepare writes them), with its
 * global scale(s): FP32 in device memory, one per expert, read when the call runs. */
typedef struct mg_nvfp4_weight {
    mg_devptr values, scales;
    mg_devptr global_scale;
} mg_nvfp4_weight;

/* Dense: out[m, n] (row pitch ldc >= n) = act[m, k] (row pitch act_pitch >= k, in elements)
 * times the weight. Any M >= 1, N >= 1; K a multiple of 16. On CUDA, tokens are processed in
 * tiles of 8 (M <= 8) or 16, and from M = 17, where a grid of token tiles x 128-row CTAs
 * covers at least 3/4 of the multiprocessors (N >= 12,545 with one tile on an H200), in tiles
 * of 32 or 64 that decode each weight once per tile; a row's output bits depend only on its own
 * activation row as long as the kernel chosen is the same (it may change at M = 9, 17 and 33). */
MG_API mg_status mg_nvfp4_gemm(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                               mg_devptr act, uint32_t act_pitch, const mg_nvfp4_weight *w,
                               mg_devptr out, uint32_t ldc);

/* The dense GEMM with a workspace the caller owns (e.g. in its arena). From
 * MG_NVFP4_BF16_PATH_MIN_M rows on CUDA, with act_pitch == k and a workspace of at least
 * mg_nvfp4_gemm_workspace_bytes, the weight is first expanded into it as BF16 (global scale
 * folded in: one rounding per weight, the precision of a BF16 checkpoint) and multiplied by the
 * BF16 GEMM of metrale/ops_gemm.h (provider "dequant_bf16_gemm"), which is faster there than
 * decoding in every tile; otherwise it is mg_nvfp4_gemm. The BF16 GEMM plans its shape at the
 * first call: before capturing such a call, make one outside the capture (or mg_gemm_prewarm
 * the BF16 shape m x n x k). */
#define MG_NVFP4_BF16_PATH_MIN_M 128u
MG_API size_t mg_nvfp4_gemm_workspace_bytes(uint32_t m, uint32_t n, uint32_t k);
MG_API mg_status mg_nvfp4_gemm_with_workspace(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                              uint32_t k, mg_devptr act, uint32_t act_pitch,
                                              const mg_nvfp4_weight *w, mg_devptr out, uint32_t ldc,
                                              mg_devptr workspace, size_t workspace_bytes);

/* Dense fused gate_up: out[m, n] = silu(act . gateᵀ) * (act . upᵀ), the activation read once
 * for both weights (each N x K, with its own global scale). Same rules as mg_nvfp4_gemm. */
MG_API mg_status mg_nvfp4_gemm_gate_up(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                       uint32_t k, mg_devptr act, uint32_t act_pitch,
                                       const mg_nvfp4_weight *gate, const mg_nvfp4_weight *up,
                                       mg_devptr out, uint32_t ldc);

/* The dense GEMM (up NULL) or gate_up (up given) with a fusion of metrale/ops_gemm.h
 * ("fusion"), for the decode step: each defined, as there, as the composition of the unfused
 * calls on the same operands.
 *   prologue MG_GEMM_PROLOGUE_RMSNORM: act is the un-normed residual stream, BF16 [m, k] with
 *       row pitch act_pitch, read only; the GEMM's input is mg_rmsnorm_bf16(act, add = 0,
 *       norm_weight, eps). tensors->norm_weight BF16 [k], 16-byte aligned; fusion->eps > 0
 *       and finite.
 *   epilogue MG_GEMM_EPILOGUE_RESIDUAL_ADD (dense only): out[t, j] = bf16(y[t, j] +
 *       residual[t, j]) with y the GEMM's BF16 output; tensors->residual BF16 [m, n] with row
 *       pitch ldc, either exactly out (the residual stream updated in place) or sharing no
 *       byte with it.
 *   epilogue MG_GEMM_EPILOGUE_SILU_MUL: the gate_up form's own SiLU-mul (mg_nvfp4_gemm_gate_up:
 *       out = silu(gate) * up of the unrounded sums, n the columns of out): required with `up`,
 *       refused without it.
 * With neither kind (and no up) the call is mg_nvfp4_gemm.
 *
 * What a caller may rely on:
 *  - The argument rules of mg_nvfp4_gemm, and: a missing fusion tensor, one given that the
 *    fusion does not read (residual, argmax_ids, kv_cache, kv_append included), a bad eps,
 *    SILU_MUL without up (or up without it), or out overlapping norm_weight or a residual that
 *    is not exactly out: MG_ERR_INVALID_ARGUMENT naming it, nothing launched.
 *  - A fusion is run whole or refused, never partly: the ARGMAX and KV_APPEND epilogues, more
 *    than 16 rows, a weight in the Blackwell layout, normed rows larger than the device's
 *    shared memory per block (m x K x 2 bytes, about), or a backend without the fused kernels
 *    (Metal) are MG_ERR_UNSUPPORTED naming the reason, nothing launched. On CUDA the Hopper
 *    small-tile kernels run it: each CTA first writes the normed rows into shared memory,
 *    rounded as mg_rmsnorm_bf16 rounds them (1 / rms from a sum in another order, so a value
 *    may differ from the CPU's by one BF16 rounding), and adds the residual as each output is
 *    stored. On the CPU (reference and AVX2 kernels) the result is the composition bit for
 *    bit.
 *  - Results do not depend on timing; a captured call replays as it ran.
 *  - Speed: measured on an H100 (bench/results/2026-12-07-h100-nvfp4-fused.md), an 8B-shaped
 *    decode step with these fusions was slower than with mg_rmsnorm_bf16 kernels of their own
 *    (5% at one token row, 2x at 8: the staging precedes every normed GEMM's main loop), so the
 *    forward pass of src/model does not use them. */
MG_API mg_status mg_nvfp4_gemm_fused(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                     uint32_t k, mg_devptr act, uint32_t act_pitch,
                                     const mg_nvfp4_weight *w, const mg_nvfp4_weight *up,
                                     mg_devptr out, uint32_t ldc, const mg_gemm_fusion *fusion,
                                     const mg_gemm_fusion_tensors *tensors);

/* Whether mg_nvfp4_gemm_fused would run `fusion` at m x n x k (gate_up: with an up weight) on
 * `b`, without operands: MG_OK, the MG_ERR_UNSUPPORTED the call would return (same message), or
 * MG_ERR_INVALID_ARGUMENT for a fusion or shape the call refuses anyway. Launches nothing; for
 * choosing a step's form before a capture. */
MG_API mg_status mg_nvfp4_gemm_fusion_supported(mg_backend *b, uint32_t m, uint32_t n, uint32_t k,
                                                bool gate_up, const mg_gemm_fusion *fusion);

/* The grouped (MoE) GEMM. `rows` rows in expert order: expert e owns rows
 * [expert_offsets[e], expert_offsets[e + 1]) (INT32 [experts + 1], device memory, offsets[0] =
 * 0, offsets[experts] = rows); row r reads activation row sorted_token_ids[r] (INT32 [rows];
 * 0: row r itself) of act [act_rows, k]; out has `rows` rows in the same order. Experts
 * without rows cost nothing. The grid is sized from `rows` and `experts` alone, so every
 * call with the same shape may replay one captured graph with any routing.
 *
 * `up` (optional) makes it the fused gate_up form: gate = `w`, up = `up`, both [experts, n, k],
 * and out[r, n] = silu(gate_r . act) * (up_r . act), the activation read once for both. */
typedef struct mg_nvfp4_moe_desc {
    uint32_t experts;        /* E >= 1 */
    uint32_t rows;           /* rows of the grouped problem (tokens * top_k), >= 1 */
    uint32_t act_rows;       /* rows of act (the tokens) */
    uint32_t n, k;           /* per expert: N >= 1, K a multiple of 16 */
    uint32_t act_pitch, ldc; /* 0: k and n */
} mg_nvfp4_moe_desc;

typedef struct mg_nvfp4_moe_tensors {
    mg_devptr act;              /* BF16 [act_rows, act_pitch] */
    mg_devptr sorted_token_ids; /* INT32 [rows], or 0 */
    mg_devptr expert_offsets;   /* INT32 [experts + 1] */
    mg_nvfp4_weight w;          /* E experts; global_scale FP32 [experts] */
    const mg_nvfp4_weight *up;  /* NULL, or the up projection (fused gate_up) */
    mg_devptr out;              /* BF16 [rows, ldc] */
} mg_nvfp4_moe_tensors;

MG_API mg_status mg_nvfp4_moe_gemm(mg_backend *b, mg_stream *s, const mg_nvfp4_moe_desc *d,
                                   const mg_nvfp4_moe_tensors *t);

#ifdef __cplusplus
}
#endif
#endif
