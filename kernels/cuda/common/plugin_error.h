/*
 * plugin_error.h - private: how a CUDA kernel plugin (a shared library built by nvcc that
 * launches through the CUDA runtime: libmetrale_gpu_attention.so, libmetrale_gpu_cutlass.so)
 * reports failure across its C ABI. Every entry point returns an mg_status and fills an
 * mg_plugin_error; nothing is thrown across the boundary and nothing exits.
 *
 * C callers see only the struct. C++ plugin units also get mg_plugin_fail, mg_plugin_cuda_fail
 * and mg_plugin_guarded, the one implementation of that rule.
 */
#ifndef METRALE_PLUGIN_ERROR_H
#define METRALE_PLUGIN_ERROR_H

#include <stdint.h>

#include "metrale/status.h"

#define MG_PLUGIN_MESSAGE_BYTES 512

/* What went wrong in a failed call: the message (naming the CUDA error and its number), and the
 * CUDA runtime error code when a CUDA call failed (0 otherwise), so the caller can record sticky
 * device faults. A failed CUDA call returns MG_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation,
 * MG_ERR_DEVICE for anything else. */
typedef struct mg_plugin_error {
    int32_t cuda_error;
    char message[MG_PLUGIN_MESSAGE_BYTES];
} mg_plugin_error;

#ifdef __cplusplus
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <new>

#include <cuda_runtime.h>

#define MG_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

inline mg_status mg_plugin_fail(mg_plugin_error *err, mg_status st, int32_t cuda_error,
                                const char *fmt, ...) __attribute__((format(printf, 4, 5)));

inline mg_status mg_plugin_fail(mg_plugin_error *err, mg_status st, int32_t cuda_error,
                                const char *fmt, ...) {
    err->cuda_error = cuda_error;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return st;
}

// Running out of device memory is a resource limit the caller may act on (free something,
// retry smaller), not a broken device.
inline mg_status mg_plugin_cuda_fail(mg_plugin_error *err, cudaError_t e, const char *call) {
    const mg_status st = e == cudaErrorMemoryAllocation ? MG_ERR_OUT_OF_MEMORY : MG_ERR_DEVICE;
    return mg_plugin_fail(err, st, (int32_t)e, "%s: %s (%d): %s", call, cudaGetErrorName(e), (int)e,
                          cudaGetErrorString(e));
}

// Runs `body` (returning mg_status) with every C++ exception turned into a status: the kernel
// libraries report invalid configurations and workspace overflows by throwing. `library` names
// the thrower in the message.
template <typename Body>
mg_status mg_plugin_guarded(const char *call, const char *library, mg_plugin_error *err,
                            Body &&body) {
    err->cuda_error = 0;
    err->message[0] = '\0';
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return mg_plugin_fail(err, MG_ERR_OUT_OF_MEMORY, 0, "%s: out of host memory", call);
    } catch (const std::exception &e) {
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "%s: %s: %s", call, library, e.what());
    } catch (...) {
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "%s: unknown C++ exception", call);
    }
}
#endif

#endif
