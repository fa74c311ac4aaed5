/* metal_backend.c - the Metal backend's driver entry (probe, open), its queries and its ops
 * table. UNVERIFIED ON HARDWARE (metal_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "host_memory.h"
#include "metal_internal.h"

static void metal_destroy(void *ctx) {
    mg_metal_backend *c = ctx;
    mg_metal_release_all_objects(c);
    mg_metal_release_kernels(c);
    mg_metal_release_all_buffers(c);
    mg_metal_release(c->rt, c->dev);
    pthread_mutex_destroy(&c->buffers_lock);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->library_lock);
    free(c);
}

static mg_status metal_device_info(void *ctx, mg_device_info *out) {
    mg_metal_backend *c = ctx;
    const mg_metal_runtime *rt = c->rt;
    memset(out, 0, sizeof *out);
    void *pool = mg_metal_pool_push(rt);
    mg_id name = MG_MSG(rt, mg_id, (mg_id, mg_sel))(c->dev, rt->sel.name);
    const char *utf8 =
        name ? MG_MSG(rt, const char *, (mg_id, mg_sel))(name, rt->sel.UTF8String) : NULL;
    snprintf(out->name, sizeof out->name, "%s", utf8 ? utf8 : "Metal device");
    mg_metal_pool_pop(rt, pool);
    out->total_bytes = c->working_set_bytes;
    /* Metal does not report the GPU's core count; 1 keeps the field's contract (> 0) without
     * inventing a figure. */
    out->multiprocessors = 1;
    out->integrated = c->unified_memory;
    out->max_shared_per_block_optin = c->max_threadgroup_memory;
    snprintf(out->driver, sizeof out->driver, "Metal (UNVERIFIED ON HARDWARE)");
    return MG_OK;
}

static mg_status metal_memory_info(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes,
                                   uint64_t *device_free_bytes) {
    mg_metal_backend *c = ctx;
    uint64_t total = c->working_set_bytes;
    uint64_t used =
        MG_MSG(c->rt, mg_nsuint, (mg_id, mg_sel))(c->dev, c->rt->sel.currentAllocatedSize);
    uint64_t device_free = used < total ? total - used : 0;
    uint64_t avail = device_free;
    if (c->unified_memory) { /* the integrated-GPU rule of gpu.h: max(driver, host) */
        uint64_t host = mg_host_available_bytes();
        if (host > avail)
            avail = host < total ? host : total;
    }
    if (free_bytes)
        *free_bytes = avail;
    if (total_bytes)
        *total_bytes = total;
    if (device_free_bytes)
        *device_free_bytes = device_free;
    return MG_OK;
}

static bool metal_supports(void *ctx, mg_capability cap) {
    (void)ctx;
    switch (cap) {
    case MG_CAP_MANAGED_MEMORY: /* shared storage is addressed by CPU and GPU alike */
    case MG_CAP_GRAPHS:
    case MG_CAP_GRAPH_UPDATE:
    case MG_CAP_EVENT_TIMING:
        return true;
    case MG_CAP_PINNED_HOST:
    case MG_CAP_HOST_DEVICE_POINTER:
    case MG_CAP_MODULES: /* the kernels are the embedded MSL, looked up by name */
    default:
        return false;
    }
}

static const mg_backend_ops metal_ops = {
    .version = MG_BACKEND_OPS_VERSION,
    .kind = MG_BACKEND_METAL,
    /* Metal does not validate addresses; every one is resolved against the buffer table. */
    .pointers_checked_strictly = true,
    .destroy = metal_destroy,
    .device_info = metal_device_info,
    .memory_info = metal_memory_info,
    .supports = metal_supports,
    .alloc = mg_metal_alloc,
    .free = mg_metal_free,
    .copy_h2d = mg_metal_copy_h2d,
    .copy_d2h = mg_metal_copy_d2h,
    .copy_d2d = mg_metal_copy_d2d,
    .copy_h2d_async = mg_metal_copy_h2d_async,
    .copy_d2h_async = mg_metal_copy_d2h_async,
    .copy_d2d_async = mg_metal_copy_d2d_async,
    .copy_2d_d2d_async = mg_metal_copy_2d_d2d_async,
    .memset = mg_metal_memset,
    .memset_async = mg_metal_memset_async,
    .stream_create = mg_metal_stream_create,
    .stream_destroy = mg_metal_stream_destroy,
    .stream_synchronize = mg_metal_stream_synchronize,
    .stream_is_capturing = mg_metal_stream_is_capturing,
    .event_create = mg_metal_event_create,
    .event_record = mg_metal_event_record,
    .stream_wait_event = mg_metal_stream_wait_event,
    .event_synchronize = mg_metal_event_synchronize,
    .event_query = mg_metal_event_query,
    .event_elapsed_ms = mg_metal_event_elapsed_ms,
    .event_destroy = mg_metal_event_destroy,
    .graph_begin_capture = mg_metal_graph_begin_capture,
    .graph_end_capture = mg_metal_graph_end_capture,
    .graph_end_capture_update = mg_metal_graph_end_capture_update,
    .graph_abort_capture = mg_metal_graph_abort_capture,
    .graph_launch = mg_metal_graph_launch,
    .graph_destroy = mg_metal_graph_destroy,
    .graph_count_nodes = mg_metal_graph_count_nodes,
    .kernel_lookup = mg_metal_kernel_lookup,
    .launch = mg_metal_launch,
};

static void metal_probe(mg_backend_probe *out) {
    memset(out, 0, sizeof *out);
    out->compiled_in = true;
    const char *reason = "";
    mg_error_state saved; /* a probe never changes the caller's error */
    mg_error_save(&saved);
    const mg_metal_runtime *rt = mg_metal_runtime_load(&reason);
    if (!rt) {
        snprintf(out->reason, sizeof out->reason, "%s (UNVERIFIED ON HARDWARE)", reason);
    } else {
        mg_id dev = rt->MTLCreateSystemDefaultDevice();
        if (!dev) {
            snprintf(out->reason, sizeof out->reason,
                     "MTLCreateSystemDefaultDevice returned nil: no Metal device (UNVERIFIED ON "
                     "HARDWARE)");
        } else {
            out->usable = true;
            out->device_count = 1;
            mg_metal_release(rt, dev);
        }
    }
    mg_error_restore(&saved);
}

static mg_status metal_open(int device, const mg_backend_ops **ops_out, void **ctx_out) {
    if (device != 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal backend: device %d out of range (the system default device is 0)",
                        device);
    const char *reason;
    const mg_metal_runtime *rt = mg_metal_runtime_load(&reason);
    if (!rt)
        return MG_ERR_UNAVAILABLE; /* the message is set, with the reason */
    mg_id dev = rt->MTLCreateSystemDefaultDevice();
    if (!dev)
        return MG_ERROR(MG_ERR_UNAVAILABLE,
                        "metal backend: MTLCreateSystemDefaultDevice returned nil: no Metal device "
                        "(UNVERIFIED ON HARDWARE)");
    mg_metal_backend *c = calloc(1, sizeof *c);
    if (!c) {
        mg_metal_release(rt, dev);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal backend: out of host memory opening device 0");
    }
    c->rt = rt;
    c->device = device;
    c->dev = dev;
    c->working_set_bytes =
        MG_MSG(rt, uint64_t, (mg_id, mg_sel))(dev, rt->sel.recommendedMaxWorkingSetSize);
    c->max_threadgroup_memory =
        (uint32_t)MG_MSG(rt, mg_nsuint, (mg_id, mg_sel))(dev, rt->sel.maxThreadgroupMemoryLength);
    c->unified_memory =
        MG_MSG(rt, signed char, (mg_id, mg_sel))(dev, rt->sel.hasUnifiedMemory) != 0;
    pthread_mutex_init(&c->buffers_lock, NULL);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->library_lock, NULL);
    *ops_out = &metal_ops;
    *ctx_out = c;
    return MG_OK;
}

const mg_backend_driver mg_metal_backend_driver = {
    .kind = MG_BACKEND_METAL,
    .probe = metal_probe,
    .open = metal_open,
};
