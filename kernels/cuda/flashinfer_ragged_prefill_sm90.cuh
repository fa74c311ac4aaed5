// flashinfer_ragged_prefill_sm90.cuh - private: the Hopper (FA3) launcher template behind
// metrale_fi::fa3_launch_*; compiled for sm_90a only.
#ifndef METRALE_FLASHINFER_RAGGED_PREFILL_SM90_CUH
#define METRALE_FLASHINFER_RAGGED_PREFILL_SM90_CUH

#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>

#include "flashinfer_ragged_prefill.h"

namespace metrale_fi {

// One schedule per head (the plan refuses batches that would need the shared schedule), no
// sliding window (FA2 serves those).
template <flashinfer::MaskMode MASK> cudaError_t fa3_launch(Fa3Params &p, cudaStream_t stream) {
    return flashinfer::BatchPrefillWithRaggedKVCacheDispatched<
        MG_FI_HEAD_DIM, MG_FI_HEAD_DIM, MASK, /*LEFT_SLIDING_WINDOW=*/false,
        /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false, flashinfer::DefaultAttention<false>, Fa3Params>(
        p, /*enable_pdl=*/false, stream);
}

} // namespace metrale_fi
#endif
