/*
 * cutlass_loader.h - private to src/ops: the CUTLASS plugin (libmetrale_gpu_cutlass.so,
 * kernels/cuda/cutlass/cutlass_plugin.h) as the GEMM providers built on it load it. Compiled
 * with the CUDA backend only (cutlass_loader_cuda.c).
 *
 *   static mg_cutlass_moe_sm90_fn run;                      // a family's entry points
 *   mg_status st = mg_cutlass_plugin_resolve("grouped MoE GEMM on CUDA", MG_CUTLASS_UNITS_SM90_MOE,
 *                                            (mg_cuda_plugin_symbol[]){{"mg_cutlass_...", (void
 * **)&run}}, 1);
 */
#ifndef METRALE_OPS_CUTLASS_LOADER_H
#define METRALE_OPS_CUTLASS_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "cuda_plugin.h"
#include "cutlass_plugin.h"
#include "metrale/status.h"

/* Loads the plugin (once per process; a failure is remembered and reported on every call),
 * checks its ABI version, checks that it was built with every family in `units`
 * (MG_CUTLASS_UNITS_*; MG_ERR_UNAVAILABLE naming the missing one otherwise), then resolves
 * `symbols`. `what` begins every message. Thread-safe. */
mg_status mg_cutlass_plugin_resolve(const char *what, uint32_t units,
                                    const mg_cuda_plugin_symbol *symbols, size_t count);

/* The MG_CUTLASS_UNITS_* bits of the plugin, 0 when it cannot be loaded (no error is set).
 * For availability tests and `metrale-gpu info`. */
uint32_t mg_cutlass_plugin_units(void);

/* A failed plugin call: mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, what). */

#endif
