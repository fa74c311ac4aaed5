// flashinfer_paged_fa2.cu - FlashInfer FA2 paged BF16 prefill kernels (causal, sliding window
// chosen at run time: window_left -1 means none) for one head_dim and one logits soft-cap mode.
// Decode runs through the same kernels with one query per request: FlashInfer packs the GQA
// group's query heads into the query tile (CTA_TILE_Q 16), and its split-KV schedule spreads a
// small batch's keys over the whole GPU. cmake/flashinfer.cmake compiles this file once per
// (head_dim, soft cap) it builds, defining MG_FI_UNIT_HEAD_DIM and MG_FI_UNIT_SOFT_CAP (0 or 1).
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "flashinfer_ragged_prefill.h"

#if !defined(MG_FI_UNIT_HEAD_DIM) || !defined(MG_FI_UNIT_SOFT_CAP)
#error "compile with -DMG_FI_UNIT_HEAD_DIM=<128> -DMG_FI_UNIT_SOFT_CAP=<0|1>"
#endif

namespace metrale_fi {

// Dispatches the plan's CTA_TILE_Q (16, 64 or 128 from FlashInfer's FA2DetermineCtaTileQ; never
// 128 for head_dim 256). The window variant costs a comparison per tile when no window is set,
// and saves a second instantiation.
template <uint32_t HEAD_DIM, bool SOFT_CAP>
cudaError_t fa2_paged_launch(PagedParams &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v,
                             float *tmp_s, cudaStream_t stream) {
    using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/true,
                                                 SOFT_CAP, /*alibi=*/false>;
    constexpr auto kCausal = flashinfer::MaskMode::kCausal;
    constexpr auto kNoRope = flashinfer::PosEncodingMode::kNone;
#define METRALE_FI_PAGED_TILE(TILE)                                                                \
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<                                     \
        /*SAME_KV_STRIDES=*/true, TILE, HEAD_DIM, HEAD_DIM, kNoRope,                               \
        /*fp16_qk_reduction=*/false, kCausal, /*token_head_sf=*/false, Variant, PagedParams>(      \
        p, tmp_v, tmp_s, /*enable_pdl=*/false, stream)
    switch (cta_tile_q) {
    case 16:
        METRALE_FI_PAGED_TILE(16);
    case 64:
        METRALE_FI_PAGED_TILE(64);
    case 128:
        if constexpr (HEAD_DIM < 256) {
            METRALE_FI_PAGED_TILE(128);
        }
        break;
    }
#undef METRALE_FI_PAGED_TILE
    return cudaErrorInvalidValue;
}

template cudaError_t fa2_paged_launch<MG_FI_UNIT_HEAD_DIM, MG_FI_UNIT_SOFT_CAP != 0>(
    PagedParams &, uint32_t, __nv_bfloat16 *, float *, cudaStream_t);

} // namespace metrale_fi
