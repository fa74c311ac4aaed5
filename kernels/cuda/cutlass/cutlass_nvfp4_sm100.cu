// cutlass_nvfp4_sm100.cu - the NVFP4 GEMMs for sm_100a (B200/GB200): dense and grouped per expert,
// block-scaled FP4 x FP4 on the 5th-generation tensor cores (tcgen05), one tile config each.
// Compiled only for sm_100a (cmake/cutlass.cmake); chosen at run time on compute capability 10.x.
#include <cutlass/cutlass.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "cutlass_plugin.h"

#define MG_NVFP4_ARCH_NS mg_nvfp4_sm100
namespace MG_NVFP4_ARCH_NS {

using namespace cute;

using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
using ElementD = cutlass::bfloat16_t;
constexpr int kAlignAB = 32;  // 16 bytes of E2M1
constexpr int kAlignD = 8;    // 16 bytes of BF16
using Arch = cutlass::arch::Sm100;
using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;
// One SM per tile (no 2-SM pairs, no cluster): the shapes stay legal for any M, and decode-sized
// batches waste least of a 128-row tile.
using Tile = Shape<_128, _128, _256>;
using Cluster = Shape<_1, _1, _1>;

// ---- dense
using DenseEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    Arch, OpClass, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
    cutlass::epilogue::TmaWarpSpecialized1Sm>::CollectiveOp;
using DenseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    Arch, OpClass, ElementAB, cutlass::layout::RowMajor, kAlignAB, ElementAB,
    cutlass::layout::ColumnMajor, kAlignAB, float, Tile, Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename DenseEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100>::CollectiveOp;
using DenseGemm = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, DenseMainloop, DenseEpilogue, void>>;

// ---- grouped per expert
using GroupShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using GroupedEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    Arch, OpClass, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, cutlass::layout::RowMajor *, kAlignD, ElementD, cutlass::layout::RowMajor *, kAlignD,
    cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>::CollectiveOp;
using GroupedMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    Arch, OpClass, ElementAB, cutlass::layout::RowMajor *, kAlignAB, ElementAB,
    cutlass::layout::ColumnMajor *, kAlignAB, float, Tile, Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename GroupedEpilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>::CollectiveOp;
using GroupedGemm = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<GroupShape, GroupedMainloop, GroupedEpilogue>>;

}  // namespace MG_NVFP4_ARCH_NS

#include "cutlass_nvfp4_gemm.cuh"

MG_CUTLASS_NVFP4_ENTRY_POINTS(sm100)
