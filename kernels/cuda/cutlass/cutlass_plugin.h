/*
 * cutlass_plugin.h - private: the C ABI of the CUTLASS plugin (libmetrale_gpu_cutlass.so, built
 * by cmake/cutlass.cmake from kernels/cuda/cutlass/cutlass_*.cu), which the GEMM providers in
 * src/ops/ load with dlopen (src/ops/common/cutlass_loader.h).
 *
 * Every entry point returns an mg_status and fills an mg_plugin_error on failure
 * (kernels/cuda/common/plugin_error.h); nothing is thrown across the boundary. They use the
 * CUDA runtime, which runs in the device's primary context: the caller makes that context
 * current first (mg_cuda_bind), and passes its CUstream as a void *.
 *
 * The kernel families each have a header of their own next to this one, declaring their entry
 * points; this one holds what the whole plugin shares.
 */
#ifndef METRALE_CUTLASS_PLUGIN_H
#define METRALE_CUTLASS_PLUGIN_H

#include <stdint.h>

#include "metrale/status.h"
#include "plugin_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct or signature of the plugin's headers changes; the loader refuses a
 * plugin of another version. */
#define MG_CUTLASS_ABI_VERSION 2

/* Bits of mg_cutlass_built_units(): which kernel families this build of the plugin holds. */
#define MG_CUTLASS_UNITS_SM90_MOE (1u << 0)
#define MG_CUTLASS_UNITS_SM90_DENSE (1u << 1)
#define MG_CUTLASS_UNITS_SM100_NVFP4 (1u << 2)
#define MG_CUTLASS_UNITS_SM120_NVFP4 (1u << 3)
#define MG_CUTLASS_UNITS_SM90_MOE_FP8 (1u << 4)
#define MG_CUTLASS_UNITS_SM90_MOE_FP8_ROWWISE (1u << 5)

typedef uint32_t (*mg_cutlass_abi_version_fn)(void);
/* CUTLASS_MAJOR * 10000 + CUTLASS_MINOR * 100 + CUTLASS_PATCH of the headers it was built with. */
typedef uint32_t (*mg_cutlass_version_fn)(void);
typedef uint32_t (*mg_cutlass_built_units_fn)(void);

#ifdef __cplusplus
}
#endif
#endif
