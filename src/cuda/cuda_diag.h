/*
 * cuda_diag.h - private: the CUDA backend's floor, measured by `metrale-gpu bench launch` to
 * separate the driver's own launch cost from this library's. No driver types, so the CLI
 * can include it.
 */
#ifndef METRALE_CUDA_DIAG_H
#define METRALE_CUDA_DIAG_H

#include "metrale/gpu.h"
#include "metrale/launch.h"

/* Launches built-in kernel `function` of module "metrale" `count` times on `s` with the
 * builder's configuration and arguments, calling cuLaunchKernel directly: no handle checks,
 * no fault or capture bookkeeping. Returns after issuing (the stream is not synchronized).
 * For measurements only. */
mg_status mg_cuda_diag_driver_launches(mg_backend *b, mg_stream *s, const char *function,
                                       const mg_launch *l, int count);

#endif
