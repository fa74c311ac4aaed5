// flashinfer_ragged_prefill_fa2_causal.cu - FA2 ragged prefill kernels, causal mask (with and
// without a sliding window), head_dim 128, BF16.
#include "flashinfer_ragged_prefill_fa2.cuh"

namespace metrale_fi {

cudaError_t fa2_launch_causal(Fa2Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v, float *tmp_s,
                              cudaStream_t stream) {
    return fa2_launch<flashinfer::MaskMode::kCausal, false>(p, cta_tile_q, tmp_v, tmp_s, stream);
}

cudaError_t fa2_launch_causal_window(Fa2Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v,
                                     float *tmp_s, cudaStream_t stream) {
    return fa2_launch<flashinfer::MaskMode::kCausal, true>(p, cta_tile_q, tmp_v, tmp_s, stream);
}

} // namespace metrale_fi
