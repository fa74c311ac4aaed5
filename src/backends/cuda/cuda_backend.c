/*
 * cuda_backend.c - the CUDA backend on the driver API: probe and open, the primary context,
 * errors and sticky faults, device and memory queries, streams, events, pinned host memory,
 * and the ops table the core dispatches through (cuda_internal.h lists the other files).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "host_memory.h"

/* ------------------------------------------------------------------ errors and faults */

mg_status mg_cuda_fail(mg_cuda_context *c, CUresult r, const char *call, const char *file, int line,
                       const char *detail_fmt, ...) {
    char result[256], detail[320] = "";
    mg_cuda_result_text(r, result, sizeof result);
    if (detail_fmt && *detail_fmt) {
        detail[0] = ',';
        detail[1] = ' ';
        va_list ap;
        va_start(ap, detail_fmt);
        vsnprintf(detail + 2, sizeof detail - 2, detail_fmt, ap);
        va_end(ap);
    }
    if (!c || !mg_cuda_result_is_sticky(r))
        return mg_error_set(mg_cuda_result_status(r), file, line, "%s: %s%s", call, result, detail);

    /* A sticky fault: the driver keeps failing every call of this process on the device
     * (reopening included) until the process exits. It surfaces at the next synchronizing
     * call, usually after the kernel that caused it. */
    mg_cuda_kernel *last = atomic_load_explicit(&c->last_kernel, memory_order_acquire);
    mg_error_set(MG_ERR_DEVICE_FAULT, file, line,
                 "sticky device fault on CUDA device %d: %s: %s%s; last kernel launched: %s; "
                 "close the backend; the process must restart to use the device again",
                 c->ordinal, call, result, detail, last ? last->name : "none");
    pthread_mutex_lock(&c->fault_lock);
    if (!atomic_load_explicit(&c->faulted, memory_order_relaxed)) {
        snprintf(c->fault_message, sizeof c->fault_message, "%s", mg_last_error());
        atomic_store_explicit(&c->faulted, true, memory_order_release);
    }
    pthread_mutex_unlock(&c->fault_lock);
    mg_backend *owner = atomic_load_explicit(&c->owner, memory_order_acquire);
    if (owner)
        mg_backend_set_fault(owner, c->fault_message);
    return MG_ERR_DEVICE_FAULT;
}

mg_status mg_cuda_check_fault(mg_cuda_context *c) {
    if (!atomic_load_explicit(&c->faulted, memory_order_acquire))
        return MG_OK;
    return mg_error_set(MG_ERR_DEVICE_FAULT, NULL, 0, "%s", c->fault_message);
}

mg_status mg_cuda_make_current(mg_cuda_context *c) {
    CUcontext current = NULL;
    CUresult r = c->drv->CtxGetCurrent(&current);
    if (r == CUDA_SUCCESS && current == c->primary)
        return MG_OK;
    r = c->drv->CtxSetCurrent(c->primary);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuCtxSetCurrent", "CUDA device %d", c->ordinal);
    return MG_OK;
}

mg_status mg_cuda_enter_to_free(mg_cuda_context *c, bool *gone) {
    *gone = false;
    CUcontext current = NULL;
    CUresult r = c->drv->CtxGetCurrent(&current);
    if (r == CUDA_SUCCESS && current == c->primary)
        return MG_OK;
    r = c->drv->CtxSetCurrent(c->primary);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    if (mg_cuda_result_is_teardown(r) || mg_cuda_result_is_sticky(r) ||
        atomic_load_explicit(&c->faulted, memory_order_acquire)) {
        *gone = true;
        return MG_OK;
    }
    return MG_CUDA_FAIL(c, r, "cuCtxSetCurrent", "CUDA device %d, before freeing memory",
                        c->ordinal);
}

mg_status mg_cuda_enter(mg_cuda_context *c) {
    mg_status st = mg_cuda_check_fault(c);
    return st ? st : mg_cuda_make_current(c);
}

bool mg_cuda_stream_capturing(mg_cuda_context *c, CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (c->drv->StreamIsCapturing(s, &status) != CUDA_SUCCESS)
        return true;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

CUstream mg_cuda_blocking_stream(mg_cuda_context *c) {
    return c->default_stream;
}

mg_status mg_cuda_sync_stream(mg_cuda_context *c, CUstream s, const char *what) {
    CUresult r = c->drv->StreamSynchronize(s);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuStreamSynchronize", "after %s", what);
    return MG_OK;
}

/* ------------------------------------------------------------------ public bridge */

mg_status mg_cuda_bind(mg_backend *b, mg_cuda_context **out) {
    mg_status live = mg_backend_check_live(b, "mg_cuda_bind");
    if (live)
        return live;
    if (!out || mg_backend_live_kind(b) != MG_BACKEND_CUDA)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_cuda_bind: %s",
                        !out ? "NULL output" : "not a CUDA backend");
    mg_cuda_context *c = mg_backend_context(b);
    *out = NULL;
    mg_status st = mg_backend_check_fault(b);
    if (st == MG_OK)
        st = mg_cuda_enter(c);
    if (st == MG_OK)
        *out = c;
    return st;
}

mg_status mg_cuda_stream(mg_backend *b, mg_stream *s, CUstream *out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_cuda_stream: NULL output");
    mg_status live = mg_backend_check_live(b, "mg_cuda_stream");
    if (live)
        return live;
    if (mg_backend_live_kind(b) != MG_BACKEND_CUDA)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_cuda_stream: not a CUDA backend");
    void *impl = mg_stream_impl(b, s);
    if (!impl)
        return MG_ERR_INVALID_ARGUMENT; /* message set by mg_stream_impl */
    *out = (CUstream)impl;
    return MG_OK;
}

mg_status mg_cuda_result(mg_cuda_context *c, CUresult r, const char *call, const char *file,
                         int line) {
    if (r == CUDA_SUCCESS)
        return MG_OK;
    return mg_cuda_fail(c, r, call, file, line, NULL);
}

/* ------------------------------------------------------------------ probe and open */

/* Keeps the caller's last error message across a probe, which never fails. */
typedef struct saved_error {
    char text[1024];
} saved_error;

static void save_error(saved_error *s) {
    snprintf(s->text, sizeof s->text, "%s", mg_last_error());
}
static void restore_error(const saved_error *s) {
    if (s->text[0])
        mg_error_set(MG_OK, NULL, 0, "%s", s->text);
    else
        mg_clear_error();
}

/* Loads the driver and initializes it; the message says why not. */
static mg_status init_driver(const mg_cuda_driver **drv_out, int *count_out) {
    const mg_cuda_driver *drv;
    mg_status st = mg_cuda_driver_get(&drv);
    if (st)
        return st;
    CUresult r = drv->Init(0);
    if (r != CUDA_SUCCESS) {
        char text[256];
        return mg_error_set(MG_ERR_UNAVAILABLE, NULL, 0, "cuInit: %s",
                            mg_cuda_result_text(r, text, sizeof text));
    }
    int count = 0;
    r = drv->DeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        char text[256];
        return mg_error_set(MG_ERR_UNAVAILABLE, NULL, 0, "cuDeviceGetCount: %s",
                            mg_cuda_result_text(r, text, sizeof text));
    }
    if (count <= 0)
        return mg_error_set(MG_ERR_UNAVAILABLE, NULL, 0, "the CUDA driver (%s) sees no device",
                            drv->library_path);
    *drv_out = drv;
    *count_out = count;
    return MG_OK;
}

static void cuda_probe(mg_backend_probe *out) {
    saved_error saved;
    save_error(&saved);
    memset(out, 0, sizeof *out);
    out->compiled_in = true;
    const mg_cuda_driver *drv = NULL;
    int count = 0;
    if (init_driver(&drv, &count) == MG_OK) {
        out->usable = true;
        out->device_count = count;
    } else {
        snprintf(out->reason, sizeof out->reason, "%s", mg_last_error());
    }
    restore_error(&saved);
}

/* One device attribute; a failure is reported (naming the attribute) for a required one,
 * and leaves 0 (the capability absent) for an optional one. */
static mg_status device_attribute(mg_cuda_context *c, CUdevice_attribute a, const char *name,
                                  bool required, int *out) {
    int v = 0;
    CUresult r = c->drv->DeviceGetAttribute(&v, a, c->device);
    if (r != CUDA_SUCCESS) {
        *out = 0;
        if (!required)
            return MG_OK;
        return MG_CUDA_FAIL(c, r, "cuDeviceGetAttribute", "%s of CUDA device %d", name, c->ordinal);
    }
    *out = v;
    return MG_OK;
}

/* The first word of `line` shaped like a driver version ("580.159.04"), or "". */
static void find_version_word(const char *line, char *out, size_t out_bytes) {
    out[0] = '\0';
    for (const char *p = line; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        size_t len = strcspn(p, " \t\n");
        size_t digits = strspn(p, "0123456789.");
        if (len && digits == len && len < out_bytes && p[0] != '.' && memchr(p, '.', len)) {
            memcpy(out, p, len);
            out[len] = '\0';
            return;
        }
        p += len;
    }
}

/* "580.159.04 (CUDA 13.0)" when the kernel module says its version, else "CUDA 13.0". */
static void driver_text(const mg_cuda_driver *drv, char *buf, size_t buf_bytes) {
    char module_version[32] = "";
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (f) {
        /* "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release ..." */
        char line[256];
        if (fgets(line, sizeof line, f))
            find_version_word(line, module_version, sizeof module_version);
        fclose(f);
    }
    int v = drv->driver_version;
    if (module_version[0])
        snprintf(buf, buf_bytes, "%s (CUDA %d.%d)", module_version, v / 1000, (v % 1000) / 10);
    else
        snprintf(buf, buf_bytes, "CUDA %d.%d", v / 1000, (v % 1000) / 10);
}

mg_status mg_cuda_read_device_info(mg_cuda_context *c) {
    mg_device_info *info = &c->info;
    memset(info, 0, sizeof *info);
    CUresult r = c->drv->DeviceGetName(info->name, (int)sizeof info->name, c->device);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuDeviceGetName", "CUDA device %d", c->ordinal);
    size_t total = 0;
    r = c->drv->DeviceTotalMem(&total, c->device);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuDeviceTotalMem", "CUDA device %d", c->ordinal);
    info->total_bytes = total;
    int sms = 0, major = 0, minor = 0, integrated = 0, l2 = 0, shared_optin = 0, managed = 0,
        map_host = 0;
    mg_status st;
#define ATTRIBUTE(name, required, out)                                                             \
    if ((st = device_attribute(c, CU_DEVICE_ATTRIBUTE_##name, #name, required, out)))              \
        return st;
    /* Required: launch checks, planning and the device report depend on them. */
    ATTRIBUTE(MULTIPROCESSOR_COUNT, true, &sms)
    ATTRIBUTE(COMPUTE_CAPABILITY_MAJOR, true, &major)
    ATTRIBUTE(COMPUTE_CAPABILITY_MINOR, true, &minor)
    ATTRIBUTE(INTEGRATED, true, &integrated)
    ATTRIBUTE(L2_CACHE_SIZE, true, &l2)
    ATTRIBUTE(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, true, &shared_optin)
    /* Optional: without an answer the capability counts as absent. */
    ATTRIBUTE(MANAGED_MEMORY, false, &managed)
    ATTRIBUTE(CAN_MAP_HOST_MEMORY, false, &map_host)
#undef ATTRIBUTE
    info->multiprocessors = sms;
    info->cc_major = major;
    info->cc_minor = minor;
    info->integrated = integrated != 0;
    info->l2_bytes = (uint64_t)l2;
    info->max_shared_per_block_optin = (uint32_t)shared_optin;
    driver_text(c->drv, info->driver, sizeof info->driver);
    c->managed_memory = managed != 0;
    c->map_host_memory = map_host != 0;
    return MG_OK;
}

static void cuda_destroy(void *ctx);
static const mg_backend_ops cuda_ops;

static mg_status cuda_open(int device, const mg_backend_ops **ops_out, void **ctx_out) {
    const mg_cuda_driver *drv = NULL;
    int count = 0;
    mg_status st = init_driver(&drv, &count);
    if (st)
        return st;
    if (device < 0 || device >= count)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "CUDA device %d does not exist: the driver sees %d device%s", device, count,
                        count == 1 ? "" : "s");

    mg_cuda_context *c = calloc(1, sizeof *c);
    if (!c)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "CUDA backend: context allocation");
    c->drv = drv;
    c->ordinal = device;
    pthread_mutex_init(&c->fault_lock, NULL);
    pthread_mutex_init(&c->module_lock, NULL);
    mg_cuda_staging_init(&c->staging);

    CUresult r = drv->DeviceGet(&c->device, device);
    if (r != CUDA_SUCCESS) {
        st = MG_CUDA_FAIL(c, r, "cuDeviceGet", "CUDA device %d", device);
        goto fail;
    }
    r = drv->DevicePrimaryCtxRetain(&c->primary, c->device);
    if (r != CUDA_SUCCESS) {
        c->primary = NULL;
        st = MG_CUDA_FAIL(c, r, "cuDevicePrimaryCtxRetain", "CUDA device %d", device);
        goto fail;
    }
    if ((st = mg_cuda_make_current(c)) || (st = mg_cuda_read_device_info(c)))
        goto fail;
    r = drv->StreamCreate(&c->default_stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        c->default_stream = NULL;
        st = MG_CUDA_FAIL(c, r, "cuStreamCreate", "default stream of CUDA device %d", device);
        goto fail;
    }
    if ((st = mg_cuda_modules_load_builtin(c)))
        goto fail;
    *ops_out = &cuda_ops;
    *ctx_out = c;
    return MG_OK;

fail:
    cuda_destroy(c);
    return st;
}

const mg_backend_driver mg_cuda_backend_driver = {
    .kind = MG_BACKEND_CUDA,
    .probe = cuda_probe,
    .open = cuda_open,
};

/* Releases everything the context holds; keeps the caller's error message (teardown errors
 * are not reported: the core frees allocations and objects before this). */
static void cuda_destroy(void *ctx) {
    mg_cuda_context *c = ctx;
    if (!c)
        return;
    saved_error saved;
    save_error(&saved);
    if (c->primary && mg_cuda_make_current(c) == MG_OK) {
        if (c->default_stream)
            (void)c->drv->StreamSynchronize(c->default_stream);
        mg_cuda_modules_destroy(c);
        mg_cuda_staging_destroy(c);
        if (c->default_stream)
            (void)c->drv->StreamDestroy(c->default_stream);
    }
    if (c->primary)
        (void)c->drv->DevicePrimaryCtxRelease(c->device);
    pthread_mutex_destroy(&c->fault_lock);
    pthread_mutex_destroy(&c->module_lock);
    pthread_mutex_destroy(&c->staging.lock);
    free(c);
    restore_error(&saved);
}

/* ------------------------------------------------------------------ queries */

static mg_status cuda_device_info(void *ctx, mg_device_info *out) {
    mg_cuda_context *c = ctx;
    *out = c->info;
    return MG_OK;
}

static mg_status cuda_memory_info(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes,
                                  uint64_t *device_free_bytes) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    size_t free_b = 0, total_b = 0;
    CUresult r = c->drv->MemGetInfo(&free_b, &total_b);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuMemGetInfo", "CUDA device %d", c->ordinal);
    uint64_t free_total = free_b;
    /* An integrated GPU shares host memory; the driver undercounts what it can still get. */
    if (c->info.integrated) {
        uint64_t host = mg_host_available_bytes();
        if (host > free_total)
            free_total = host;
    }
    if (free_bytes)
        *free_bytes = free_total;
    if (total_bytes)
        *total_bytes = total_b;
    if (device_free_bytes)
        *device_free_bytes = free_b;
    return MG_OK;
}

static bool cuda_supports(void *ctx, mg_capability cap) {
    mg_cuda_context *c = ctx;
    switch (cap) {
    case MG_CAP_MANAGED_MEMORY:
        return c->managed_memory && c->drv->MemAllocManaged;
    case MG_CAP_GRAPHS:
    case MG_CAP_GRAPH_UPDATE:
    case MG_CAP_PINNED_HOST:
    case MG_CAP_MODULES:
    case MG_CAP_EVENT_TIMING:
        return true;
    case MG_CAP_HOST_DEVICE_POINTER:
        return c->map_host_memory;
    default:
        return false; /* ops answer for themselves once they exist */
    }
}

/* ------------------------------------------------------------------ streams and events */

static mg_status cuda_stream_create(void *ctx, bool is_default, void **out) {
    mg_cuda_context *c = ctx;
    if (is_default && c->default_stream) {
        *out = c->default_stream;
        return MG_OK;
    }
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUstream s = NULL;
    CUresult r = c->drv->StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuStreamCreate", "CUDA device %d", c->ordinal);
    if (is_default)
        c->default_stream = s;
    *out = s;
    return MG_OK;
}

static mg_status cuda_stream_destroy(void *ctx, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_make_current(c);
    if (st)
        return st;
    CUstream s = stream;
    mg_status sync = MG_OK;
    CUresult r = c->drv->StreamSynchronize(s);
    if (r != CUDA_SUCCESS && !mg_cuda_result_is_teardown(r) && !c->faulted)
        sync = MG_CUDA_FAIL(c, r, "cuStreamSynchronize", "before destroying a stream");
    r = c->drv->StreamDestroy(s);
    if (s == c->default_stream)
        c->default_stream = NULL;
    if (r != CUDA_SUCCESS && !mg_cuda_result_is_teardown(r) && !c->faulted)
        return MG_CUDA_FAIL(c, r, "cuStreamDestroy", NULL);
    return sync;
}

static mg_status cuda_stream_synchronize(void *ctx, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    return st ? st : mg_cuda_sync_stream(c, stream, "stream work");
}

static mg_status cuda_stream_is_capturing(void *ctx, void *stream, bool *capturing) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_make_current(c);
    if (st) {
        *capturing = true;
        return st;
    }
    *capturing = mg_cuda_stream_capturing(c, stream);
    return MG_OK;
}

static mg_status cuda_event_create(void *ctx, void **out) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUevent e = NULL;
    CUresult r = c->drv->EventCreate(&e, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuEventCreate", NULL);
    *out = e;
    return MG_OK;
}

static mg_status cuda_event_record(void *ctx, void *event, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUresult r = c->drv->EventRecord(event, stream);
    return r == CUDA_SUCCESS ? MG_OK : MG_CUDA_FAIL(c, r, "cuEventRecord", NULL);
}

static mg_status cuda_stream_wait_event(void *ctx, void *stream, void *event) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUresult r = c->drv->StreamWaitEvent(stream, event, 0);
    return r == CUDA_SUCCESS ? MG_OK : MG_CUDA_FAIL(c, r, "cuStreamWaitEvent", NULL);
}

static mg_status cuda_event_synchronize(void *ctx, void *event) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUresult r = c->drv->EventSynchronize(event);
    return r == CUDA_SUCCESS ? MG_OK : MG_CUDA_FAIL(c, r, "cuEventSynchronize", NULL);
}

static mg_status cuda_event_query(void *ctx, void *event) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUresult r = c->drv->EventQuery(event);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    if (r == CUDA_ERROR_NOT_READY)
        return MG_ERR_NOT_READY; /* not a failure: no message, cheap to poll */
    return MG_CUDA_FAIL(c, r, "cuEventQuery", NULL);
}

static mg_status cuda_event_elapsed_ms(void *ctx, void *start, void *end, float *ms) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUresult r = c->drv->EventElapsedTime(ms, start, end);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    if (r == CUDA_ERROR_NOT_READY)
        return MG_ERROR(MG_ERR_NOT_READY,
                        "cuEventElapsedTime: an event has not completed yet (synchronize it "
                        "first)");
    return MG_CUDA_FAIL(c, r, "cuEventElapsedTime",
                        "both events must have been recorded and completed");
}

static mg_status cuda_event_destroy(void *ctx, void *event) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_make_current(c);
    if (st)
        return st;
    CUresult r = c->drv->EventDestroy(event);
    if (r != CUDA_SUCCESS && !mg_cuda_result_is_teardown(r) && !c->faulted)
        return MG_CUDA_FAIL(c, r, "cuEventDestroy", NULL);
    return MG_OK;
}

/* ------------------------------------------------------------------ pinned host memory */

/* The core registers the block in the pinned-host registry and tracks it for mg_host_free. */
static mg_status cuda_host_alloc(void *ctx, size_t bytes, void **out) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    void *p = NULL;
    unsigned flags =
        CU_MEMHOSTALLOC_PORTABLE | (c->map_host_memory ? CU_MEMHOSTALLOC_DEVICEMAP : 0);
    CUresult r = c->drv->MemHostAlloc(&p, bytes, flags);
    if (r != CUDA_SUCCESS) {
        char size[32];
        return MG_CUDA_FAIL(c, r, "cuMemHostAlloc", "requested %s",
                            mg_format_bytes(bytes, size, sizeof size));
    }
    /* Page-aligned (so 64-byte aligned) by the driver; zeroed as the interface promises. */
    memset(p, 0, bytes);
    *out = p;
    return MG_OK;
}

static mg_status cuda_host_free(void *ctx, void *host) {
    mg_cuda_context *c = ctx;
    bool gone = false;
    mg_status st = mg_cuda_enter_to_free(c, &gone);
    if (st || gone)
        return st; /* gone: the context is, and the memory with it */
    CUresult r = c->drv->MemFreeHost(host);
    if (r != CUDA_SUCCESS && !mg_cuda_result_is_teardown(r) && !mg_cuda_result_is_sticky(r) &&
        !c->faulted)
        return MG_CUDA_FAIL(c, r, "cuMemFreeHost", "%p", host);
    return MG_OK;
}

static mg_status cuda_host_device_pointer(void *ctx, void *host, mg_devptr *out) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    if (!c->map_host_memory)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_host_device_pointer: CUDA device %d cannot "
                        "map host memory",
                        c->ordinal);
    CUdeviceptr d = 0;
    CUresult r = c->drv->MemHostGetDevicePointer(&d, host, 0);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuMemHostGetDevicePointer", "%p", host);
    *out = (mg_devptr)d;
    return MG_OK;
}

/* ------------------------------------------------------------------ the ops table */

static void cuda_attach(void *ctx, mg_backend *b) {
    mg_cuda_context *c = ctx;
    atomic_store_explicit(&c->owner, b, memory_order_release);
}

static const mg_backend_ops cuda_ops = {
    .version = MG_BACKEND_OPS_VERSION,
    .kind = MG_BACKEND_CUDA,
    .pointers_checked_strictly = false,
    .destroy = cuda_destroy,
    .device_info = cuda_device_info,
    .memory_info = cuda_memory_info,
    .supports = cuda_supports,
    .alloc = mg_cuda_alloc,
    .free = mg_cuda_free,
    .copy_h2d = mg_cuda_copy_h2d,
    .copy_d2h = mg_cuda_copy_d2h,
    .copy_d2d = mg_cuda_copy_d2d,
    .copy_h2d_async = mg_cuda_copy_h2d_async,
    .copy_d2h_async = mg_cuda_copy_d2h_async,
    .copy_d2d_async = mg_cuda_copy_d2d_async,
    .copy_2d_d2d_async = mg_cuda_copy_2d_d2d_async,
    .memset = mg_cuda_memset,
    .memset_async = mg_cuda_memset_async,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_is_capturing = cuda_stream_is_capturing,
    .event_create = cuda_event_create,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_synchronize = cuda_event_synchronize,
    .event_query = cuda_event_query,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .event_destroy = cuda_event_destroy,
    .graph_begin_capture = mg_cuda_graph_begin_capture,
    .graph_end_capture = mg_cuda_graph_end_capture,
    .graph_end_capture_update = mg_cuda_graph_end_capture_update,
    .graph_abort_capture = mg_cuda_graph_abort_capture,
    .graph_launch = mg_cuda_graph_launch,
    .graph_destroy = mg_cuda_graph_destroy,
    .graph_count_nodes = mg_cuda_graph_count_nodes,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_device_pointer = cuda_host_device_pointer,
    .module_load = mg_cuda_module_load,
    .module_unload_model = mg_cuda_module_unload_model,
    .module_symbol = mg_cuda_module_symbol,
    .kernel_lookup = mg_cuda_kernel_lookup,
    .launch = mg_cuda_launch,
    .attach = cuda_attach,
};
