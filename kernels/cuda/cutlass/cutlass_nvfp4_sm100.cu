// cutlass_nvfp4_sm100.cu - the NVFP4 GEMMs for sm_100a (B200/GB200): dense and grouped per expert,
// block-scaled FP4 x FP4 on the 5th-generation tensor cores (tcgen05), one tile config each.
// Compiled only for sm_100a (cmake/cutlass.cmake); chosen at run time on compute capability 10.0.
#include "cutlass_plugin.h"

#define MG_NVFP4_ARCH_NS mg_nvfp4_sm100
#include "cutlass_nvfp4_gemm.cuh"

namespace MG_NVFP4_ARCH_NS {
// One SM per 128x128 tile (no 2-SM pairs, no cluster): legal for any M, and decode-sized batches
// waste least of a 128-row tile; K steps of 256.
using Gemms =
    BlockScaledGemms<cutlass::arch::Sm100, cute::Shape<cute::_128, cute::_128, cute::_256>,
                     cutlass::epilogue::TmaWarpSpecialized1Sm,
                     cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100,
                     cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm,
                     cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>;
using DenseGemm = Gemms::Dense;
using GroupedGemm = Gemms::Grouped;
} // namespace MG_NVFP4_ARCH_NS

MG_CUTLASS_NVFP4_ENTRY_POINTS(sm100)
