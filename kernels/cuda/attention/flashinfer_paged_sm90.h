/*
 * flashinfer_paged_sm90.h - private, C++/CUDA only: the params and launcher shared by the
 * attention plugin's host unit (flashinfer_ragged_prefill.cu) and the Hopper (FA3) paged prefill
 * unit (flashinfer_paged_sm90.cu).
 *
 * FlashInfer's own hopper BatchPrefillPagedParams cannot be used: it has the same name, in the
 * same namespace, as the FA2 paged params the host unit also needs. This struct carries the
 * members the FA3 paged kernel (0.7.4, the pinned version) reads, nothing else: its default
 * variant (no soft cap, no FP8 scales, no multi-item scoring) finds the optional members by name
 * and goes without them.
 */
#ifndef METRALE_FLASHINFER_PAGED_SM90_H
#define METRALE_FLASHINFER_PAGED_SM90_H

#include <cstdint>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

namespace metrale_fi {

/* The one FA3 paged kernel built: BF16 pools, head_dim 128, causal, no soft cap, the sliding
 * window applied at run time (window_left >= 0; kFa3PagedNoWindow stands for none). */
constexpr uint32_t kFa3PagedHeadDim = 128;

/* The left window the kernel runs with when the plan has none: no key is ever that far behind
 * its query (a request holds fewer than 2^31 tokens), so nothing is masked, and FlashInfer's
 * window tile bounds (positions minus this, never below -INT32_MAX) cannot overflow. */
constexpr int32_t kFa3PagedNoWindow = INT32_MAX;

struct Fa3PagedParams {
    using DTypeQ = cutlass::bfloat16_t;
    using DTypeKV = cutlass::bfloat16_t;
    using DTypeO = cutlass::bfloat16_t;
    using IdType = int32_t;

    DTypeQ *q_ptr;
    DTypeKV *k_ptr; /* the page pools, [pages][page_size][num_kv_heads][head_dim] */
    DTypeKV *v_ptr;
    DTypeO *o_ptr;
    float *lse_ptr;

    /* The schedule (FlashInfer's PrefillSM90Plan; kv_indptr counts pages, kv_lens tokens) and
     * the caller's page ids. */
    IdType *qo_tile_indices, *qo_indptr, *kv_indptr, *kv_indices, *qo_lens, *kv_lens,
        *head_indices, *work_indptr, *batch_indices;

    struct AdditionalParams {
        float sm_scale;
    } additional_params;

    int64_t q_stride_n, k_stride_n, v_stride_n, o_stride_n; /* k, v: between tokens of a page */
    int64_t q_stride_h, k_stride_h, v_stride_h, o_stride_h;
    int64_t nnz_qo;
    int64_t k_page_stride, v_page_stride; /* elements between pages */

    int num_qo_heads, num_kv_heads, group_size, page_size, window_left;
    bool causal;
};

/* Launches the FA3 paged kernel (causal, per-head schedule) of flashinfer_paged_sm90.cu; built
 * only when sm_90a is among the CUDA architectures (METRALE_FI_FA3_PAGED). */
cudaError_t fa3_paged_launch(Fa3PagedParams &p, cudaStream_t stream);

} // namespace metrale_fi
#endif
