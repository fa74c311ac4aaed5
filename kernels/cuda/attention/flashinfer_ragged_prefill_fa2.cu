// flashinfer_ragged_prefill_fa2.cu - FlashInfer FA2 ragged BF16 prefill kernels for one head_dim
// and one mask, with and without a sliding window. cmake/flashinfer.cmake compiles this file once
// per (head_dim, mask) it builds, defining MG_FI_UNIT_HEAD_DIM (64, 128 or 256) and
// MG_FI_UNIT_CAUSAL (0 or 1), so the heavy instantiations compile in parallel.
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "flashinfer_ragged_prefill.h"

#if !defined(MG_FI_UNIT_HEAD_DIM) || !defined(MG_FI_UNIT_CAUSAL)
#error "compile with -DMG_FI_UNIT_HEAD_DIM=<64|128|256> -DMG_FI_UNIT_CAUSAL=<0|1>"
#endif

namespace metrale_fi {

// Dispatches the plan's CTA_TILE_Q. FlashInfer's FA2 scheduler (FA2DetermineCtaTileQ) picks 16,
// 64 or 128 query rows per CTA, and never 128 for head_dim 256; only those are instantiated.
template <uint32_t HEAD_DIM, bool CAUSAL, bool WINDOW>
cudaError_t fa2_launch(Fa2Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v, float *tmp_s,
                       cudaStream_t stream) {
    using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, WINDOW,
                                                 /*soft_cap=*/false, /*alibi=*/false>;
    constexpr auto kMask = CAUSAL ? flashinfer::MaskMode::kCausal : flashinfer::MaskMode::kNone;
    constexpr auto kNoRope = flashinfer::PosEncodingMode::kNone;
#define METRALE_FI_FA2_TILE(TILE)                                                                  \
    return flashinfer::BatchPrefillWithRaggedKVCacheDispatched<                                    \
        TILE, HEAD_DIM, HEAD_DIM, kNoRope, /*fp16_qk_reduction=*/false, kMask,                     \
        /*token_head_sf=*/false, Variant, Fa2Params>(p, tmp_v, tmp_s, /*enable_pdl=*/false,        \
                                                     stream)
    switch (cta_tile_q) {
    case 16:
        METRALE_FI_FA2_TILE(16);
    case 64:
        METRALE_FI_FA2_TILE(64);
    case 128:
        if constexpr (HEAD_DIM < 256) {
            METRALE_FI_FA2_TILE(128);
        }
        break;
    }
#undef METRALE_FI_FA2_TILE
    return cudaErrorInvalidValue;
}

template cudaError_t fa2_launch<MG_FI_UNIT_HEAD_DIM, MG_FI_UNIT_CAUSAL != 0, false>(
    Fa2Params &, uint32_t, __nv_bfloat16 *, float *, cudaStream_t);
template cudaError_t fa2_launch<MG_FI_UNIT_HEAD_DIM, MG_FI_UNIT_CAUSAL != 0, true>(
    Fa2Params &, uint32_t, __nv_bfloat16 *, float *, cudaStream_t);

} // namespace metrale_fi
