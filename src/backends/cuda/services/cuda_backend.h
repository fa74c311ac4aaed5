/*
 * cuda_backend.h - private: what the CUDA-side modules (cuBLASLt bridge, attention, NVFP4,
 * benchmarks) may use of the CUDA backend, after the core has validated public handles.
 */
#ifndef METRALE_CUDA_BACKEND_H
#define METRALE_CUDA_BACKEND_H

#include <cuda.h> /* driver API types only; every entry point comes from cuda_driver.h */

#include "metrale/gpu.h"

typedef struct mg_cuda_context mg_cuda_context; /* the backend's ctx (mg_backend_context) */

/* Makes the device's primary context current on this thread and returns the CUDA context
 * of backend `b` (MG_ERR_INVALID_ARGUMENT if `b` is not a CUDA backend). */
mg_status mg_cuda_bind(mg_backend *b, mg_cuda_context **out);

/* The CUstream behind a validated stream (NULL resolves to the backend's default stream). */
mg_status mg_cuda_stream(mg_backend *b, mg_stream *s, CUstream *out);

/* Turns a driver result into a status and message ("cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY
 * (2): out of memory ..."); records sticky faults on the backend. MG_OK for CUDA_SUCCESS. */
mg_status mg_cuda_result(mg_cuda_context *c, CUresult r, const char *call, const char *file,
                         int line);
#define MG_CUDA_RESULT(c, r, call) mg_cuda_result((c), (r), (call), __FILE__, __LINE__)

#endif
