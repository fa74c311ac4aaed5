/*
 * cuda_plugin.h - private: loading the CUDA kernel plugins (shared libraries built by nvcc that
 * launch through the CUDA runtime, e.g. libmetrale_gpu_attention.so), so the core library links
 * no CUDA library. A plugin is opened on first use, once per process, and never closed (its
 * kernels may be referenced by captured graphs until exit).
 *
 * Search order for `file_name`: the directory in env METRALE_CUDA_PLUGIN_DIR when set (then
 * only there), else the directory of the binary holding this code (libmetrale_gpu.so, or the
 * executable it is linked into), then the directory of /proc/self/exe.
 */
#ifndef METRALE_CUDA_PLUGIN_H
#define METRALE_CUDA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"

typedef struct mg_cuda_plugin_symbol {
    const char *name; /* exported C symbol */
    void **slot;      /* receives its address */
} mg_cuda_plugin_symbol;

/* Opens the plugin (or returns the handle opened before) and resolves every symbol of
 * `symbols` into its slot. MG_ERR_UNAVAILABLE, naming each path tried and the loader's
 * message, when the file is missing or fails to load; MG_ERR_NOT_FOUND naming the first
 * missing symbol. Thread-safe. */
mg_status mg_cuda_plugin_load(const char *file_name, const mg_cuda_plugin_symbol *symbols,
                              size_t count);

typedef struct mg_cuda_context mg_cuda_context;

/* A plugin call that failed with `st`, the CUDA runtime error `cuda_error` (0: none) and the
 * plugin's `message`, turned into the library's error: launch failures and device faults
 * (runtime codes >= 700, the same numbers as the driver's) go through the backend, which
 * records sticky faults, with the message appended; anything else is `st` with
 * "<what>: <message>". */
mg_status mg_cuda_plugin_failure(mg_cuda_context *ctx, mg_status st, int32_t cuda_error,
                                 const char *message, const char *what);

#endif
