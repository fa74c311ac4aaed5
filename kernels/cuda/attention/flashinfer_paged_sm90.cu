// flashinfer_paged_sm90.cu - FlashInfer's Hopper (FA3) paged prefill kernel: BF16 pools,
// head_dim 128, causal, one schedule per head, sliding window applied at run time; sm_90a only.
// cmake/flashinfer.cmake compiles this file once (a single instantiation: it is the slowest kind
// of unit to build). Keys and values are gathered token by token through the page table
// (FlashInfer's sparse mainloop, cp.async rather than TMA), so any page size works.
//
// The window is a template switch in FlashInfer's FA3 kernels; only the window variant is built.
// Without a window it runs with kFa3PagedNoWindow: its tile bounds then equal the no-window
// ones, and what remains is a comparison per score in the diagonal tiles.
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>

#include "flashinfer_ragged_prefill.h"

namespace metrale_fi {

cudaError_t fa3_paged_launch(Fa3PagedParams &p, cudaStream_t stream) {
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        kFa3PagedHeadDim, kFa3PagedHeadDim, flashinfer::MaskMode::kCausal,
        /*LEFT_SLIDING_WINDOW=*/true, /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false,
        flashinfer::DefaultAttention</*use_logits_soft_cap=*/false>, Fa3PagedParams>(
        p, /*enable_pdl=*/false, stream);
}

} // namespace metrale_fi
