// cutlass_nvfp4_sm120.cu - the NVFP4 GEMMs for sm_120a (GeForce RTX 50xx, RTX PRO Blackwell):
// dense and grouped per expert, block-scaled FP4 x FP4 on the warp-level block-scaled MMA
// (mma.sync kind::mxf4nvf4), one tile config each. Compiled only for sm_120a
// (cmake/cutlass.cmake); chosen at run time on compute capability 12.x.
#include <cutlass/cutlass.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "cutlass_plugin.h"

#define MG_NVFP4_ARCH_NS mg_nvfp4_sm120
namespace MG_NVFP4_ARCH_NS {

using namespace cute;

using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
using ElementD = cutlass::bfloat16_t;
constexpr int kAlignAB = 32;  // 16 bytes of E2M1
constexpr int kAlignD = 8;    // 16 bytes of BF16
using Arch = cutlass::arch::Sm120;
using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;
// sm_120 has no clusters and about 100 KiB of shared memory per SM: 128x128 tiles, K steps of 128,
// the cooperative schedules (the builders' choice for block-scaled FP4).
using Tile = Shape<_128, _128, _128>;
using Cluster = Shape<_1, _1, _1>;

// ---- dense
using DenseEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    Arch, OpClass, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
    cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
using DenseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    Arch, OpClass, ElementAB, cutlass::layout::RowMajor, kAlignAB, ElementAB,
    cutlass::layout::ColumnMajor, kAlignAB, float, Tile, Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename DenseEpilogue::SharedStorage))>,
    cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
using DenseGemm = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, DenseMainloop, DenseEpilogue, void>>;

// ---- grouped per expert
using GroupShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using GroupedEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    Arch, OpClass, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, cutlass::layout::RowMajor *, kAlignD, ElementD, cutlass::layout::RowMajor *, kAlignD,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using GroupedMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    Arch, OpClass, ElementAB, cutlass::layout::RowMajor *, kAlignAB, ElementAB,
    cutlass::layout::ColumnMajor *, kAlignAB, float, Tile, Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename GroupedEpilogue::SharedStorage))>,
    cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
using GroupedGemm = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<GroupShape, GroupedMainloop, GroupedEpilogue>>;

}  // namespace MG_NVFP4_ARCH_NS

#include "cutlass_nvfp4_gemm.cuh"

MG_CUTLASS_NVFP4_ENTRY_POINTS(sm120)
