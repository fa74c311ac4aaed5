/* cuda_driver.c - loading libcuda.so.1 and resolving its entry points (cuda_driver.h). */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static mg_cuda_driver loaded;
static mg_status load_status = MG_ERR_INTERNAL;
static char load_reason[512];

/* cuGetProcAddress as of CUDA 12.0 (exported as cuGetProcAddress_v2). */
typedef CUresult (*get_proc_address_fn)(const char *symbol, void **pfn, int cuda_version,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbol_status);

static void fail_load(const char *fmt, const char *a, const char *b) {
    snprintf(load_reason, sizeof load_reason, fmt, a, b);
    load_status = MG_ERR_UNAVAILABLE;
}

static void load_driver(void) {
    const char *path = getenv("METRALE_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    snprintf(loaded.library_path, sizeof loaded.library_path, "%s", path);

    /* RTLD_LOCAL: the driver's symbols stay out of the global namespace, so a CUDA runtime
     * loaded later by another library resolves its own copy the usual way. The handle is
     * never closed: function pointers into it live for the process. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        fail_load("%s not found: %s", path, why ? why : "dlopen failed");
        return;
    }
    get_proc_address_fn get_proc = (get_proc_address_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!get_proc) {
        fail_load("%s: the driver has no cuGetProcAddress_v2 (CUDA %s or newer needed)", path,
                  "12.0");
        return;
    }

    /* LEGACY_STREAM: the plain entry points; every call here names its stream explicitly
     * (never stream 0), so per-thread default-stream variants would change nothing. */
    int missing = 0;
    char missing_names[256] = "";
#define MG_CUDA_RESOLVE(name, required)                                                            \
    do {                                                                                           \
        void *fn = NULL;                                                                           \
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;               \
        CUresult r = get_proc("cu" #name, &fn, MG_CUDA_DRIVER_ABI_VERSION,                         \
                              CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);                          \
        if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS)                             \
            fn = NULL;                                                                             \
        loaded.name = (__typeof__(loaded.name))fn;                                                 \
        if (!fn && (required)) {                                                                   \
            missing++;                                                                             \
            size_t used = strlen(missing_names);                                                   \
            snprintf(missing_names + used, sizeof missing_names - used, "%scu%s",                  \
                     used ? ", " : "", #name);                                                     \
        }                                                                                          \
    } while (0);
    MG_CUDA_DRIVER_ENTRY_POINTS(MG_CUDA_RESOLVE)
#undef MG_CUDA_RESOLVE
    if (missing) {
        fail_load("%s lacks required entry points: %s", path, missing_names);
        return;
    }

    int version = 0;
    if (loaded.DriverGetVersion(&version) != CUDA_SUCCESS || version < MG_CUDA_DRIVER_ABI_VERSION) {
        char have[32];
        snprintf(have, sizeof have, "%d.%d", version / 1000, (version % 1000) / 10);
        fail_load("%s is CUDA %s; CUDA 12.0 or newer is needed", path, have);
        return;
    }
    loaded.driver_version = version;
    load_status = MG_OK;
}

mg_status mg_cuda_driver_get(const mg_cuda_driver **out) {
    pthread_once(&load_once, load_driver);
    if (load_status != MG_OK) {
        *out = NULL;
        return mg_error_set(load_status, NULL, 0, "%s", load_reason);
    }
    *out = &loaded;
    return MG_OK;
}

/* Names of the results whose text matters when no driver is loaded to ask. */
static const char *fallback_result_name(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS:
        return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
        return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
        return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED:
        return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_NO_DEVICE:
        return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE:
        return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT:
        return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_FOUND:
        return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_READY:
        return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_FAILED:
        return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
        return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    default:
        return "CUDA_ERROR";
    }
}

const char *mg_cuda_result_text(CUresult r, char *buf, size_t buf_bytes) {
    const char *name = NULL, *text = NULL;
    pthread_once(&load_once, load_driver); /* a no-op after the first load */
    if (load_status == MG_OK) {
        if (loaded.GetErrorName(r, &name) != CUDA_SUCCESS)
            name = NULL;
        if (loaded.GetErrorString(r, &text) != CUDA_SUCCESS)
            text = NULL;
    }
    if (!name)
        name = fallback_result_name(r);
    if (text)
        snprintf(buf, buf_bytes, "%s (%d): %s", name, (int)r, text);
    else
        snprintf(buf, buf_bytes, "%s (%d)", name, (int)r);
    return buf;
}

int mg_cuda_result_is_sticky(CUresult r) {
    switch (r) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
        return 1;
    default:
        return 0;
    }
}

int mg_cuda_result_is_teardown(CUresult r) {
    return r == CUDA_ERROR_DEINITIALIZED || r == CUDA_ERROR_INVALID_CONTEXT ||
           r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

mg_status mg_cuda_result_status(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS:
        return MG_OK;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return MG_ERR_OUT_OF_MEMORY;
    case CUDA_ERROR_NOT_READY:
        return MG_ERR_NOT_READY;
    case CUDA_ERROR_NOT_FOUND:
        return MG_ERR_NOT_FOUND;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case CUDA_ERROR_INVALID_CLUSTER_SIZE:
        return MG_ERR_INVALID_ARGUMENT;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_SYSTEM_NOT_READY:
        return MG_ERR_UNAVAILABLE;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
        return MG_ERR_UNSUPPORTED;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_MERGE:
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    case CUDA_ERROR_CAPTURED_EVENT:
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
        return MG_ERR_CAPTURING;
    default:
        return mg_cuda_result_is_sticky(r) ? MG_ERR_DEVICE_FAULT : MG_ERR_DEVICE;
    }
}
