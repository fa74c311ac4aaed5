/*
 * metrale/ops_moe.h - mixture-of-experts routing on the device: top-k over router logits, the
 * sort of (token, slot) pairs into expert order that a grouped GEMM consumes, and the weighted
 * combine of the experts' output rows back into tokens.
 *
 *   mg_moe_topk(b, s, &(mg_moe_topk_desc){T, E, k, MG_DTYPE_BF16, 0, true}, logits, ids, w);
 *   mg_moe_sort(b, s, &(mg_moe_sort_desc){T, E, k}, ids, ws, ws_bytes, offsets, tokens, pos);
 *   ... grouped GEMMs: expert e computes rows [offsets[e], offsets[e+1]) from the activations
 *       of tokens sorted_token_ids[row] ...
 *   mg_moe_combine(b, s, &(mg_moe_combine_desc){T, k, H}, expert_rows, pos, w, residual, out);
 *
 * Conventions (every backend):
 *  - pair p = t * k + j is slot j of token t; topk_ids / topk_weights are [T, k] row-major, so
 *    pair p's expert is topk_ids[p].
 *  - Top-k: experts ranked by their logit (FP32; BF16 logits widened exactly), larger first,
 *    ties to the lower expert index; a NaN logit ranks as -infinity. Weights are the softmax
 *    over all E experts in FP32, p_e = exp(l_e - max) / sum_all exp(l_i - max); with
 *    renormalize they are instead exp(l_j - max) / sum over the k chosen (summed in slot order),
 *    so a token's weights sum to 1. Slots are in rank order (slot 0 = best). The ids are exact
 *    on every backend; the weights agree with a float64 softmax to a few units in the last place
 *    (the backends' expf differ by up to 2 ulp and the full sum's order differs).
 *  - Sort: the valid pairs (0 <= id < E) sorted by expert, STABLY (within an expert in increasing
 *    p) and deterministically (no dependence on the order of atomic operations):
 *      expert_offsets   i32 [E+1]: offsets[0] = 0, expert e's rows are [offsets[e], offsets[e+1]),
 *                       offsets[E] = number of valid pairs (T * k when every id is in range);
 *      sorted_token_ids i32 [T*k]: the token t = p / k of each sorted row; rows past offsets[E]
 *                       hold -1;
 *      pair_positions   i32 [T*k]: the sorted row of pair p, or -1 for a dropped pair.
 *    Out-of-range ids: the CPU backend returns MG_ERR_INVALID_ARGUMENT naming the first bad pair
 *    before writing any output; the CUDA and Metal kernels cannot stop, so they DROP those pairs
 *    as above (offsets[E] < T*k is the signal a caller may check on the device; on Metal
 *    unverified on hardware: its test double runs the CPU reference, which refuses them when the
 *    work runs, reported as MG_ERR_DEVICE_FAULT at the next synchronize).
 *  - Combine: out[t, h] = BF16(acc) with acc = residual[t, h] (or 0 without residual), then for
 *    j = 0..k-1 acc = fmaf(topk_weights[t*k+j], rows[pair_positions[t*k+j], h], acc), skipping
 *    slots whose position is outside [0, T*k) (dropped pairs). FP32, fused multiply-add, this
 *    order, BF16 round to nearest even: bit-identical on every backend.
 *
 * What a caller may rely on:
 *  - Arguments are checked before anything is launched (shape limits, null or misaligned
 *    pointers, buffers too small on backends that know the allocations, overlapping outputs):
 *    MG_ERR_INVALID_ARGUMENT with a message naming the argument, and nothing is written.
 *  - Every output is computed on the device: no call reads anything back or waits, allocates
 *    nothing, so each may be captured into a graph and replayed with new logits / ids / rows.
 *  - Op MG_OP_MOE_ROUTING ("moe_routing"), provider "kernels": the same kernels of module
 *    "metrale" on every backend, the CPU backend's the reference. Kernels (u32 unless said):
 *      moe_topk(logits, topk_ids, topk_weights, tokens, experts, k, logits_pitch, logits_bf16,
 *               renormalize)
 *      moe_sort_count(topk_ids, workspace, pairs, experts)        one block per chunk
 *      moe_sort_scan(workspace, expert_offsets, sorted_token_ids, pairs, experts)  one block
 *      moe_sort_scatter(topk_ids, workspace, sorted_token_ids, pair_positions, pairs, experts, k)
 *      moe_combine(rows, pair_positions, topk_weights, residual, out, tokens, k, hidden,
 *                  has_residual)   (residual is `out` when has_residual is 0)
 */
#ifndef METRALE_OPS_MOE_H
#define METRALE_OPS_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_MOE_MAX_TOPK 8u      /* k: 1 .. 8 */
#define MG_MOE_MAX_EXPERTS 256u /* E: 1 .. 256 (top-k needs k <= E) */
/* Pairs counted per chunk of the sort (its workspace holds one count per chunk per expert). */
#define MG_MOE_SORT_CHUNK 4096u

typedef struct mg_moe_topk_desc {
    uint32_t tokens;       /* T >= 1 */
    uint32_t experts;      /* E, 1 .. MG_MOE_MAX_EXPERTS */
    uint32_t k;            /* 1 .. min(E, MG_MOE_MAX_TOPK) */
    mg_dtype logits_dtype; /* MG_DTYPE_BF16 or MG_DTYPE_F32 */
    uint32_t logits_pitch; /* elements between rows of logits; 0 means E */
    bool renormalize;      /* the k weights sum to 1 (else: plain softmax probabilities) */
} mg_moe_topk_desc;

/* Top-k of `logits` [T, E] (4-byte aligned for F32, 2 for BF16) into topk_ids i32 [T, k] and
 * topk_weights f32 [T, k] (both 4-byte aligned), as described above. */
MG_API mg_status mg_moe_topk(mg_backend *b, mg_stream *s, const mg_moe_topk_desc *d,
                             mg_devptr logits, mg_devptr topk_ids, mg_devptr topk_weights);

typedef struct mg_moe_sort_desc {
    uint32_t tokens;  /* T >= 1 */
    uint32_t experts; /* E, 1 .. MG_MOE_MAX_EXPERTS */
    uint32_t k;       /* 1 .. MG_MOE_MAX_TOPK; T * k < 2^31 */
} mg_moe_sort_desc;

/* Workspace bytes mg_moe_sort needs: ceil(T*k / MG_MOE_SORT_CHUNK) * E * 4. 0 when `d` is NULL
 * or out of range. The contents need no initialisation and are scratch after the call. */
MG_API size_t mg_moe_sort_workspace_bytes(const mg_moe_sort_desc *d);

/* Sorts the pairs of `topk_ids` i32 [T, k] into expert order (above). workspace (16-byte
 * aligned, workspace_bytes >= mg_moe_sort_workspace_bytes) must not be used by concurrent work;
 * all buffers 4-byte aligned and disjoint. Three launches (count, scan, scatter). */
MG_API mg_status mg_moe_sort(mg_backend *b, mg_stream *s, const mg_moe_sort_desc *d,
                             mg_devptr topk_ids, mg_devptr workspace, size_t workspace_bytes,
                             mg_devptr expert_offsets, mg_devptr sorted_token_ids,
                             mg_devptr pair_positions);

typedef struct mg_moe_combine_desc {
    uint32_t tokens; /* T >= 1 */
    uint32_t k;      /* 1 .. MG_MOE_MAX_TOPK; T * k < 2^31 */
    uint32_t hidden; /* H >= 8, a multiple of 8 (rows move in 16-byte vectors) */
} mg_moe_combine_desc;

/* out BF16 [T, H] = the weighted sum above of `rows` BF16 [T*k, H] (in sorted order, e.g. the
 * experts' outputs), with pair_positions i32 [T*k] and topk_weights f32 [T*k]; `residual` BF16
 * [T, H] is added when not 0. rows, residual and out 16-byte aligned. out must not overlap rows,
 * positions or weights; it may BE the residual (an in-place residual add), but not partly
 * overlap it. */
MG_API mg_status mg_moe_combine(mg_backend *b, mg_stream *s, const mg_moe_combine_desc *d,
                                mg_devptr rows, mg_devptr pair_positions, mg_devptr topk_weights,
                                mg_devptr residual, mg_devptr out);

#ifdef __cplusplus
}
#endif
#endif
