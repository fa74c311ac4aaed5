// flashinfer_ragged_prefill_sm90.cu - FlashInfer's Hopper (FA3) ragged BF16 prefill kernel for
// one head_dim and one mask; sm_90a only. cmake/flashinfer.cmake compiles this file once per
// (head_dim, mask) it builds, defining MG_FI_UNIT_HEAD_DIM and MG_FI_UNIT_CAUSAL.
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>

#include "flashinfer_ragged_prefill.h"

#if !defined(MG_FI_UNIT_HEAD_DIM) || !defined(MG_FI_UNIT_CAUSAL)
#error "compile with -DMG_FI_UNIT_HEAD_DIM=<64|128|256> -DMG_FI_UNIT_CAUSAL=<0|1>"
#endif

namespace metrale_fi {

// One schedule per head (the plan refuses batches that would need the shared schedule), no
// sliding window (FA2 serves those).
template <uint32_t HEAD_DIM, bool CAUSAL>
cudaError_t fa3_launch(Fa3Params &p, cudaStream_t stream) {
    constexpr auto kMask = CAUSAL ? flashinfer::MaskMode::kCausal : flashinfer::MaskMode::kNone;
    return flashinfer::BatchPrefillWithRaggedKVCacheDispatched<
        HEAD_DIM, HEAD_DIM, kMask, /*LEFT_SLIDING_WINDOW=*/false,
        /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false, flashinfer::DefaultAttention<false>, Fa3Params>(
        p, /*enable_pdl=*/false, stream);
}

template cudaError_t fa3_launch<MG_FI_UNIT_HEAD_DIM, MG_FI_UNIT_CAUSAL != 0>(Fa3Params &,
                                                                             cudaStream_t);

} // namespace metrale_fi
