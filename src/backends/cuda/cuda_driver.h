/*
 * cuda_driver.h - private: the CUDA driver API, loaded at run time.
 *
 * libcuda.so.1 is opened with dlopen on first use (env METRALE_LIBCUDA names another path),
 * and every entry point is resolved through the driver's own query, cuGetProcAddress, for
 * the CUDA 12.0 ABI, so the pointer types below are exactly the declarations of <cuda.h>.
 * Nothing in the library links libcuda or the CUDA runtime: without a driver the load fails
 * with a reason and the CUDA backend reports itself unusable.
 *
 * Call sites read `drv->MemAlloc(&p, bytes)`: the member is the driver function without its
 * "cu" prefix. Optional entry points are NULL when the driver lacks them; required ones are
 * never NULL once mg_cuda_driver_get succeeded.
 */
#ifndef METRALE_CUDA_DRIVER_H
#define METRALE_CUDA_DRIVER_H

#include <cuda.h> /* types only */

#include "metrale/status.h"

/* The ABI requested for every entry point. Symbols whose signature changed after 12.0 are
 * not used here (cuStreamGetCaptureInfo, cuCtxCreate). */
#define MG_CUDA_DRIVER_ABI_VERSION 12000

/* X(name-without-cu, required) for each entry point the library uses. */
#define MG_CUDA_DRIVER_ENTRY_POINTS(X)                                                             \
    X(Init, 1)                                                                                     \
    X(DriverGetVersion, 1)                                                                         \
    X(GetErrorName, 1)                                                                             \
    X(GetErrorString, 1)                                                                           \
    X(DeviceGet, 1)                                                                                \
    X(DeviceGetCount, 1)                                                                           \
    X(DeviceGetName, 1)                                                                            \
    X(DeviceGetAttribute, 1)                                                                       \
    X(DeviceTotalMem, 1)                                                                           \
    X(DevicePrimaryCtxRetain, 1)                                                                   \
    X(DevicePrimaryCtxRelease, 1)                                                                  \
    X(CtxSetCurrent, 1)                                                                            \
    X(CtxGetCurrent, 1)                                                                            \
    X(CtxSynchronize, 1)                                                                           \
    X(MemAlloc, 1)                                                                                 \
    X(MemAllocManaged, 0)                                                                          \
    X(MemFree, 1)                                                                                  \
    X(MemGetInfo, 1)                                                                               \
    X(MemHostAlloc, 1)                                                                             \
    X(MemFreeHost, 1)                                                                              \
    X(MemHostGetDevicePointer, 1)                                                                  \
    X(MemcpyHtoDAsync, 1)                                                                          \
    X(MemcpyDtoHAsync, 1)                                                                          \
    X(MemcpyDtoDAsync, 1)                                                                          \
    X(Memcpy2DAsync, 1)                                                                            \
    X(MemsetD8Async, 1)                                                                            \
    X(StreamCreate, 1)                                                                             \
    X(StreamDestroy, 1)                                                                            \
    X(StreamSynchronize, 1)                                                                        \
    X(StreamQuery, 1)                                                                              \
    X(StreamIsCapturing, 1)                                                                        \
    X(StreamBeginCapture, 1)                                                                       \
    X(StreamEndCapture, 1)                                                                         \
    X(StreamWaitEvent, 1)                                                                          \
    X(EventCreate, 1)                                                                              \
    X(EventRecord, 1)                                                                              \
    X(EventSynchronize, 1)                                                                         \
    X(EventQuery, 1)                                                                               \
    X(EventElapsedTime, 1)                                                                         \
    X(EventDestroy, 1)                                                                             \
    X(GraphInstantiateWithFlags, 1)                                                                \
    X(GraphExecUpdate, 1)                                                                          \
    X(GraphUpload, 0)                                                                              \
    X(GraphLaunch, 1)                                                                              \
    X(GraphExecDestroy, 1)                                                                         \
    X(GraphDestroy, 1)                                                                             \
    X(GraphGetNodes, 0)                                                                            \
    X(GraphNodeGetType, 0)                                                                         \
    X(ModuleLoadDataEx, 1)                                                                         \
    X(ModuleUnload, 1)                                                                             \
    X(ModuleGetFunction, 1)                                                                        \
    X(ModuleGetGlobal, 1)                                                                          \
    X(FuncSetAttribute, 1)                                                                         \
    X(FuncGetAttribute, 1)                                                                         \
    X(LaunchKernel, 1)                                                                             \
    X(LaunchKernelEx, 0)

/* `__typeof__(cuMemAlloc)` follows <cuda.h>'s versioned macro (cuMemAlloc -> cuMemAlloc_v2),
 * so each pointer has the signature the header declares for that name. */
#define MG_CUDA_DRIVER_MEMBER(name, required) __typeof__(cu##name) *name;
typedef struct mg_cuda_driver {
    MG_CUDA_DRIVER_ENTRY_POINTS(MG_CUDA_DRIVER_MEMBER)
    int driver_version; /* cuDriverGetVersion, e.g. 13000 */
    char library_path[256];
} mg_cuda_driver;
#undef MG_CUDA_DRIVER_MEMBER

/* The loaded driver, loading it on the first call (thread-safe, once per process). On
 * failure returns MG_ERR_UNAVAILABLE with the reason as the message, e.g.
 * "libcuda.so.1 not found: libcuda.so.1: cannot open shared object file", every time. */
mg_status mg_cuda_driver_get(const mg_cuda_driver **out);

/* "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory": name, code and text of a driver result,
 * readable even when the driver could not be loaded. Returns buf. */
const char *mg_cuda_result_text(CUresult r, char *buf, size_t buf_bytes);

/* Results that leave the context unusable (illegal address, launch failure, ...). */
int mg_cuda_result_is_sticky(CUresult r);

/* Results a free path treats as "already gone": the driver or context was torn down first
 * (CUDA_ERROR_DEINITIALIZED 4, INVALID_CONTEXT 201, CONTEXT_IS_DESTROYED 709). */
int mg_cuda_result_is_teardown(CUresult r);

/* The status a failed driver result maps to (not counting sticky faults). */
mg_status mg_cuda_result_status(CUresult r);

#endif
