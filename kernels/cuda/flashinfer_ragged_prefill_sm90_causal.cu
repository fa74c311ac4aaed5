// flashinfer_ragged_prefill_sm90_causal.cu - Hopper (FA3) ragged prefill kernel, causal mask,
// head_dim 128, BF16; sm_90a only.
#include "flashinfer_ragged_prefill_sm90.cuh"

namespace metrale_fi {

cudaError_t fa3_launch_causal(Fa3Params &p, cudaStream_t stream) {
    return fa3_launch<flashinfer::MaskMode::kCausal>(p, stream);
}

} // namespace metrale_fi
