// flashinfer_ragged_prefill_fa2.cuh - private: the FA2 launcher template behind
// metrale_fi::fa2_launch_*; each flashinfer_ragged_prefill_fa2_*.cu instantiates its mask modes.
#ifndef METRALE_FLASHINFER_RAGGED_PREFILL_FA2_CUH
#define METRALE_FLASHINFER_RAGGED_PREFILL_FA2_CUH

#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "flashinfer_ragged_prefill.h"

namespace metrale_fi {

// Dispatches the plan's CTA_TILE_Q. For head_dim 128 FlashInfer's FA2 scheduler picks 16, 64 or
// 128 (FA2DetermineCtaTileQ); only those are instantiated.
template <flashinfer::MaskMode MASK, bool WINDOW>
cudaError_t fa2_launch(Fa2Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v, float *tmp_s,
                       cudaStream_t stream) {
    using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, WINDOW,
                                                 /*soft_cap=*/false, /*alibi=*/false>;
    constexpr auto kNoRope = flashinfer::PosEncodingMode::kNone;
#define METRALE_FI_FA2_TILE(TILE)                                                                  \
    case TILE:                                                                                     \
        return flashinfer::BatchPrefillWithRaggedKVCacheDispatched<                                \
            TILE, MG_FI_HEAD_DIM, MG_FI_HEAD_DIM, kNoRope, /*fp16_qk_reduction=*/false, MASK,      \
            /*token_head_sf=*/false, Variant, Fa2Params>(p, tmp_v, tmp_s, /*enable_pdl=*/false,    \
                                                         stream);
    switch (cta_tile_q) {
        METRALE_FI_FA2_TILE(16)
        METRALE_FI_FA2_TILE(64)
        METRALE_FI_FA2_TILE(128)
    }
#undef METRALE_FI_FA2_TILE
    return cudaErrorInvalidValue;
}

} // namespace metrale_fi
#endif
