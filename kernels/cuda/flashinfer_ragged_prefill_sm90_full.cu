// flashinfer_ragged_prefill_sm90_full.cu - Hopper (FA3) ragged prefill kernel without a causal
// mask, head_dim 128, BF16; sm_90a only.
#include "flashinfer_ragged_prefill_sm90.cuh"

namespace metrale_fi {

cudaError_t fa3_launch_full(Fa3Params &p, cudaStream_t stream) {
    return fa3_launch<flashinfer::MaskMode::kNone>(p, stream);
}

} // namespace metrale_fi
