/* metal_memory.c - MTLBuffer allocations in shared storage and the table that maps a device
 * pointer (a `contents` address) back to its buffer and offset. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "metal_internal.h"

/* Index of the first buffer whose base is > ptr. Caller holds buffers_lock. */
static size_t upper_bound(const mg_metal_backend *c, mg_devptr ptr) {
    size_t lo = 0, hi = c->buffer_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->buffers[mid].base <= ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

mg_status mg_metal_resolve(mg_metal_backend *c, mg_devptr ptr, uint64_t bytes, const char *call,
                           const char *what, mg_id *buffer, uint64_t *offset) {
    if (ptr == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "metal %s %s: null device pointer", call, what);
    pthread_mutex_lock(&c->buffers_lock);
    size_t i = upper_bound(c, ptr);
    mg_metal_buffer found = {0};
    if (i > 0)
        found = c->buffers[i - 1];
    pthread_mutex_unlock(&c->buffers_lock);
    if (!found.buffer || ptr - found.base >= (found.bytes ? found.bytes : 1))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal %s %s: 0x%" PRIx64 " is not inside any live buffer of metal "
                        "device %d",
                        call, what, ptr, c->device);
    uint64_t off = ptr - found.base;
    if (bytes > found.bytes - off)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal %s %s: %" PRIu64 " bytes at offset %" PRIu64 " overrun the %" PRIu64
                        "-byte buffer at 0x%" PRIx64,
                        call, what, bytes, off, found.bytes, found.base);
    *buffer = found.buffer;
    *offset = off;
    return MG_OK;
}

mg_status mg_metal_alloc(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out) {
    mg_metal_backend *c = ctx;
    const mg_metal_runtime *rt = c->rt;
    (void)kind; /* device, managed and arena memory are all shared storage */
    if (bytes == 0)
        return mg_error_set(MG_ERR_INVALID_ARGUMENT, NULL, 0, "metal alloc: zero bytes");
    mg_id buf = MG_MSG(rt, mg_id, (mg_id, mg_sel, mg_nsuint, mg_nsuint))(
        c->dev, rt->sel.newBufferWithLength, bytes, MG_MTL_STORAGE_MODE_SHARED);
    if (!buf)
        return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                            "metal alloc: newBufferWithLength:options: returned nil");
    void *host = MG_MSG(rt, void *, (mg_id, mg_sel))(buf, rt->sel.contents);
    if (!host) {
        mg_metal_release(rt, buf);
        return mg_error_set(MG_ERR_INTERNAL, NULL, 0,
                            "metal alloc: a shared-storage buffer has no contents");
    }
    pthread_mutex_lock(&c->buffers_lock);
    if (c->buffer_count == c->buffer_capacity) {
        size_t cap = c->buffer_capacity ? c->buffer_capacity * 2 : 64;
        mg_metal_buffer *grown = realloc(c->buffers, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&c->buffers_lock);
            mg_metal_release(rt, buf);
            return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                                "metal alloc: out of host memory for the buffer table");
        }
        c->buffers = grown;
        c->buffer_capacity = cap;
    }
    mg_devptr base = (mg_devptr)(uintptr_t)host;
    size_t i = upper_bound(c, base);
    memmove(&c->buffers[i + 1], &c->buffers[i], (c->buffer_count - i) * sizeof c->buffers[0]);
    c->buffers[i] = (mg_metal_buffer){.base = base, .bytes = bytes, .buffer = buf};
    c->buffer_count++;
    c->live_bytes += bytes;
    pthread_mutex_unlock(&c->buffers_lock);
    *out = base;
    return MG_OK;
}

mg_status mg_metal_free(void *ctx, mg_devptr base, mg_alloc_kind kind) {
    mg_metal_backend *c = ctx;
    (void)kind;
    pthread_mutex_lock(&c->buffers_lock);
    size_t i = upper_bound(c, base);
    if (i == 0 || c->buffers[i - 1].base != base) {
        pthread_mutex_unlock(&c->buffers_lock);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal free: 0x%" PRIx64 " is not the base of a live buffer", base);
    }
    mg_metal_buffer b = c->buffers[i - 1];
    memmove(&c->buffers[i - 1], &c->buffers[i], (c->buffer_count - i) * sizeof c->buffers[0]);
    c->buffer_count--;
    c->live_bytes -= b.bytes;
    pthread_mutex_unlock(&c->buffers_lock);
    /* A command buffer still in flight holds its own reference (command buffers made with
     * `commandBuffer` retain what they use), so the memory stays valid until it completes. */
    mg_metal_release(c->rt, b.buffer);
    return MG_OK;
}

void mg_metal_release_all_buffers(mg_metal_backend *c) {
    pthread_mutex_lock(&c->buffers_lock);
    for (size_t i = 0; i < c->buffer_count; i++)
        mg_metal_release(c->rt, c->buffers[i].buffer);
    free(c->buffers);
    c->buffers = NULL;
    c->buffer_count = c->buffer_capacity = 0;
    c->live_bytes = 0;
    pthread_mutex_unlock(&c->buffers_lock);
}
