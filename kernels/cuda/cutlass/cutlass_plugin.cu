// cutlass_plugin.cu - the CUTLASS plugin's host unit: its ABI version, the CUTLASS version it
// was built with, and which kernel families cmake/cutlass.cmake compiled into it (each family's
// unit defines METRALE_CUTLASS_HAVE_<unit> here).
#include <cutlass/version.h>

#include "cutlass_plugin.h"

MG_PLUGIN_EXPORT uint32_t mg_cutlass_abi_version(void) {
    return MG_CUTLASS_ABI_VERSION;
}

MG_PLUGIN_EXPORT uint32_t mg_cutlass_version(void) {
    return CUTLASS_MAJOR * 10000u + CUTLASS_MINOR * 100u + CUTLASS_PATCH;
}

MG_PLUGIN_EXPORT uint32_t mg_cutlass_built_units(void) {
    uint32_t units = 0;
#if defined(METRALE_CUTLASS_HAVE_cutlass_moe_sm90_bf16)
    units |= MG_CUTLASS_UNITS_SM90_MOE;
#endif
#if defined(METRALE_CUTLASS_HAVE_cutlass_moe_sm90_fp8)
    units |= MG_CUTLASS_UNITS_SM90_MOE_FP8;
#endif
#if defined(METRALE_CUTLASS_HAVE_cutlass_moe_sm90_fp8_rowwise)
    units |= MG_CUTLASS_UNITS_SM90_MOE_FP8_ROWWISE;
#endif
#if defined(METRALE_CUTLASS_HAVE_cutlass_dense_sm90)
    units |= MG_CUTLASS_UNITS_SM90_DENSE;
#endif
#if defined(METRALE_CUTLASS_HAVE_cutlass_nvfp4_sm100)
    units |= MG_CUTLASS_UNITS_SM100_NVFP4;
#endif
#if defined(METRALE_CUTLASS_HAVE_cutlass_nvfp4_sm120)
    units |= MG_CUTLASS_UNITS_SM120_NVFP4;
#endif
    return units;
}
