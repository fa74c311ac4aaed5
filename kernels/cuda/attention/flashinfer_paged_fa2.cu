// flashinfer_paged_fa2.cu - FlashInfer FA2 paged prefill kernels (BF16 queries and outputs;
// causal, sliding window chosen at run time: window_left -1 means none) for one KV dtype, one
// head_dim and one logits soft-cap mode.
// Decode runs through the same kernels with one query per request: FlashInfer packs the GQA
// group's query heads into the query tile (CTA_TILE_Q 16), and its split-KV schedule spreads a
// small batch's keys over the whole GPU. cmake/flashinfer.cmake compiles this file once per
// (KV dtype, head_dim, soft cap) it builds, defining MG_FI_UNIT_KV_FP8 (0: BF16 pools, 1: FP8
// E4M3 pools), MG_FI_UNIT_HEAD_DIM and MG_FI_UNIT_SOFT_CAP (0 or 1).
//
// FP8 pools: FlashInfer loads the E4M3 codes and widens them to BF16 (exact) for the BF16 tensor
// core MMAs; the per-KV-head scales are applied by the variant below, exactly as a dequantized
// K and V would be: q.(code * ks) = (q.code) * ks, folded into the score scale, and the output
// (a softmax-weighted sum of value codes) times vs.
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "flashinfer_ragged_prefill.h"

#if !defined(MG_FI_UNIT_HEAD_DIM) || !defined(MG_FI_UNIT_SOFT_CAP) || !defined(MG_FI_UNIT_KV_FP8)
#error                                                                                             \
    "compile with -DMG_FI_UNIT_KV_FP8=<0|1> -DMG_FI_UNIT_HEAD_DIM=<64|128|256> -DMG_FI_UNIT_SOFT_CAP=<0|1>"
#endif

namespace metrale_fi {

// Dispatches the plan's CTA_TILE_Q (16, 64 or 128 from FlashInfer's FA2DetermineCtaTileQ; never
// 128 for head_dim 256). The window variant costs a comparison per tile when no window is set,
// and saves a second instantiation.
template <uint32_t HEAD_DIM, typename Variant, typename Params>
cudaError_t paged_dispatch(Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v, float *tmp_s,
                           cudaStream_t stream) {
    constexpr auto kCausal = flashinfer::MaskMode::kCausal;
    constexpr auto kNoRope = flashinfer::PosEncodingMode::kNone;
#define METRALE_FI_PAGED_TILE(TILE)                                                                \
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<                                     \
        /*SAME_KV_STRIDES=*/true, TILE, HEAD_DIM, HEAD_DIM, kNoRope, /*fp16_qk_reduction=*/false,  \
        kCausal, /*token_head_sf=*/false, Variant, Params>(p, tmp_v, tmp_s, /*enable_pdl=*/false,  \
                                                           stream)
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

template <bool SOFT_CAP>
using PagedVariant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/true,
                                                  SOFT_CAP, /*alibi=*/false>;

#if MG_FI_UNIT_KV_FP8
// The default variant with per-KV-head scales of FP8 pools. A CTA of FlashInfer's paged FA2
// kernel (0.7.4, the pinned version) serves one KV head, blockIdx.z, and builds its variant once,
// so the scales are read once per CTA: the key scale multiplies the factor FlashInfer applies to
// every raw score (sm_scale * log2 e without soft-cap; sm_scale / cap inside the tanh with it),
// the value scale the normalized output.
template <bool SOFT_CAP> struct HeadScaledVariant : PagedVariant<SOFT_CAP> {
    using Base = PagedVariant<SOFT_CAP>;
    float head_v_scale;

    template <typename Params>
    __device__ __host__ HeadScaledVariant(const Params &params, uint32_t batch_idx,
                                          uint8_t *smem_ptr)
        : Base(params, batch_idx, smem_ptr), head_v_scale(1.0f) {
#ifdef __CUDA_ARCH__
        const uint32_t kv_head = blockIdx.z;
        const float k_scale = params.head_k_scale[kv_head];
        if constexpr (SOFT_CAP)
            this->soft_cap_pre_tanh_scale *= k_scale;
        else
            this->sm_scale_log2 *= k_scale;
        head_v_scale = params.head_v_scale[kv_head];
#endif
    }

    REGISTER_OUTPUT_TRANSFORM(params, output, batch_idx, qo_idx, qo_head_idx, m, d, scale, {
        const float d_rcp = (m != -flashinfer::math::inf) ? flashinfer::math::ptx_rcp(d) : 0.f;
        return output * d_rcp * head_v_scale;
    })
};

template <uint32_t HEAD_DIM, bool SOFT_CAP>
cudaError_t fa2_paged_fp8_launch(PagedFp8Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v,
                                 float *tmp_s, cudaStream_t stream) {
    return paged_dispatch<HEAD_DIM, HeadScaledVariant<SOFT_CAP>>(p, cta_tile_q, tmp_v, tmp_s,
                                                                 stream);
}

template cudaError_t fa2_paged_fp8_launch<MG_FI_UNIT_HEAD_DIM, MG_FI_UNIT_SOFT_CAP != 0>(
    PagedFp8Params &, uint32_t, __nv_bfloat16 *, float *, cudaStream_t);
#else
template <uint32_t HEAD_DIM, bool SOFT_CAP>
cudaError_t fa2_paged_launch(PagedParams &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v,
                             float *tmp_s, cudaStream_t stream) {
    return paged_dispatch<HEAD_DIM, PagedVariant<SOFT_CAP>>(p, cta_tile_q, tmp_v, tmp_s, stream);
}

template cudaError_t fa2_paged_launch<MG_FI_UNIT_HEAD_DIM, MG_FI_UNIT_SOFT_CAP != 0>(
    PagedParams &, uint32_t, __nv_bfloat16 *, float *, cudaStream_t);
#endif

} // namespace metrale_fi
