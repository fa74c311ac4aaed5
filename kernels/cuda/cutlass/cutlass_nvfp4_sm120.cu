// cutlass_nvfp4_sm120.cu - the NVFP4 GEMMs for sm_120a (GeForce RTX 50xx, RTX PRO Blackwell):
// dense and grouped per expert, block-scaled FP4 x FP4 on the warp-level block-scaled MMA
// (mma.sync kind::mxf4nvf4), one tile config each. Compiled only for sm_120a
// (cmake/cutlass.cmake); chosen at run time on compute capability 12.0.
#include "cutlass_plugin.h"

#define MG_NVFP4_ARCH_NS mg_nvfp4_sm120
#include "cutlass_nvfp4_gemm.cuh"

namespace MG_NVFP4_ARCH_NS {
// sm_120 has no clusters and about 100 KiB of shared memory per SM: 128x128 tiles, K steps of 128,
// the cooperative schedules (the builders' choice for block-scaled FP4).
using Gemms =
    BlockScaledGemms<cutlass::arch::Sm120, cute::Shape<cute::_128, cute::_128, cute::_128>,
                     cutlass::epilogue::collective::EpilogueScheduleAuto,
                     cutlass::gemm::collective::KernelScheduleAuto,
                     cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                     cutlass::gemm::collective::KernelScheduleAuto>;
using DenseGemm = Gemms::Dense;
using GroupedGemm = Gemms::Grouped;
} // namespace MG_NVFP4_ARCH_NS

MG_CUTLASS_NVFP4_ENTRY_POINTS(sm120)
