// cutlass_dense_sm90.cu - the dense BF16 GEMMs of the CUTLASS plugin on Hopper
// (cutlass_dense.h): three TMA warp-specialized kernels built with CUTLASS's collective
// builders, one entry point choosing among them.
//
// CUTLASS's view of our contract out[M, N] = act[M, K] · weight[N, K]ᵀ: A = act, M x K
// row-major (K contiguous); B = weight as a K x N column-major matrix (K contiguous); D = out,
// M x N row-major with row pitch ldc. No source matrix C (beta is 0), so the epilogue reads
// nothing but the accumulators.
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "cutlass_dense.h"

namespace {

using namespace cute;

using Element = cutlass::bfloat16_t;
using Accumulator = float;
constexpr int kAlignment = 8; // elements per 16-byte TMA access

template <class TileShape, class KernelSchedule, class EpilogueSchedule> struct DenseGemm {
    using ClusterShape = Shape<_1, _1, _1>;
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator, void,
        cutlass::layout::RowMajor, kAlignment,          // no C
        Element, cutlass::layout::RowMajor, kAlignment, // D = out
        EpilogueSchedule>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor,
        kAlignment,                                        // A = act [M, K]
        Element, cutlass::layout::ColumnMajor, kAlignment, // B = weight [N, K]
        Accumulator, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename Epilogue::SharedStorage))>,
        KernelSchedule>::CollectiveOp;
    using Kernel =
        cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using Coop128x128 =
    DenseGemm<Shape<_128, _128, _64>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
              cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Coop128x256 =
    DenseGemm<Shape<_128, _256, _64>, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
              cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Pingpong64x128 =
    DenseGemm<Shape<_64, _128, _64>, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
              cutlass::epilogue::TmaWarpSpecialized>;

template <class Config>
mg_status run_config(const mg_cutlass_dense_args *a, cudaStream_t stream, mg_plugin_error *err) {
    using Gemm = typename Config::Gemm;
    using Kernel = typename Config::Kernel;
    const int m = (int)a->m, n = (int)a->n, k = (int)a->k;
    auto stride_a =
        cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(m, k, 1));
    auto stride_b =
        cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, k, 1));
    // The output's row pitch is ldc, not N: its stride is set by hand.
    typename Kernel::StrideD stride_d{};
    get<0>(stride_d) = (int64_t)a->ldc;
    get<2>(stride_d) = (int64_t)a->ldc * m;
    typename Kernel::StrideC stride_c = stride_d;

    cutlass::KernelHardwareInfo hw;
    cudaError_t e = cudaGetDevice(&hw.device_id);
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "cudaGetDevice");
    hw.sm_count = a->sm_count;

    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {static_cast<const Element *>(a->act), stride_a,
                                   static_cast<const Element *>(a->weight), stride_b},
                                  {{}, nullptr, stride_c, static_cast<Element *>(a->out), stride_d},
                                  hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;

    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
        return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                              "CUTLASS dense config %u cannot implement M=%d N=%d K=%d ldc=%u",
                              a->config, m, n, k, a->ldc);
    size_t need = Gemm::get_workspace_size(args);
    if (need > a->workspace_bytes)
        return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                              "CUTLASS dense config %u needs %zu bytes of workspace, %zu offered",
                              a->config, need, a->workspace_bytes);
    cutlass::Status s = gemm.initialize(args, a->workspace, stream);
    if (s != cutlass::Status::kSuccess) {
        e = cudaGetLastError();
        if (e != cudaSuccess)
            return mg_plugin_cuda_fail(err, e, "CUTLASS dense GEMM initialize");
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "CUTLASS dense GEMM initialize: %s",
                              cutlass::cutlassGetStatusString(s));
    }
    s = gemm.run(stream);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "CUTLASS dense GEMM launch");
    if (s != cutlass::Status::kSuccess)
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "CUTLASS dense GEMM run: %s",
                              cutlass::cutlassGetStatusString(s));
    return MG_OK;
}

} // namespace

MG_PLUGIN_EXPORT mg_status mg_cutlass_dense_sm90(const mg_cutlass_dense_args *a, void *stream,
                                                 mg_plugin_error *err) {
    return mg_plugin_guarded("mg_cutlass_dense_sm90", "CUTLASS", err, [&]() -> mg_status {
        if (!mg_cutlass_dense_fits(a->n, a->k, a->ldc) || a->m == 0)
            return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                                  "CUTLASS dense GEMM needs N, K and ldc multiples of 8, got "
                                  "N=%u K=%u ldc=%u",
                                  a->n, a->k, a->ldc);
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        switch (a->config) {
        case MG_CUTLASS_DENSE_COOP_128X128:
            return run_config<Coop128x128>(a, s, err);
        case MG_CUTLASS_DENSE_COOP_128X256:
            return run_config<Coop128x256>(a, s, err);
        case MG_CUTLASS_DENSE_PINGPONG_64X128:
            return run_config<Pingpong64x128>(a, s, err);
        default:
            return mg_plugin_fail(err, MG_ERR_INVALID_ARGUMENT, 0,
                                  "mg_cutlass_dense_sm90: unknown config %u", a->config);
        }
    });
}
