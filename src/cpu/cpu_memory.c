/* cpu_memory.c - the CPU backend's memory: device allocations in host memory, host_alloc,
 * and the table of live ranges every device address is checked against. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_backend.h"
#include "error.h"
#include "metrale/host_heap.h"
#include "metrale/pinned.h"

/* Index of the first range whose base is > addr. Caller holds c->lock. */
static size_t range_upper_bound(const mg_cpu_backend *c, uintptr_t addr) {
    size_t lo = 0, hi = c->range_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->ranges[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The range that contains addr, or NULL. Caller holds c->lock. */
static const mg_cpu_range *range_containing(const mg_cpu_backend *c, uintptr_t addr) {
    size_t i = range_upper_bound(c, addr);
    if (i == 0)
        return NULL;
    const mg_cpu_range *r = &c->ranges[i - 1];
    return addr - r->base < r->bytes ? r : NULL;
}

/* Index of the range whose base is exactly `base` and whose kind is `kind`, or SIZE_MAX.
 * Caller holds c->lock. */
static size_t range_index_of_base(const mg_cpu_backend *c, uintptr_t base, mg_cpu_range_kind kind) {
    size_t i = range_upper_bound(c, base);
    if (i == 0 || c->ranges[i - 1].base != base || c->ranges[i - 1].kind != kind)
        return SIZE_MAX;
    return i - 1;
}

/* Caller holds c->lock. Allocators never return overlapping live blocks, so the new range
 * goes in before the first base above it. */
static mg_status range_insert(mg_cpu_backend *c, mg_cpu_range range) {
    if (c->range_count == c->range_capacity) {
        size_t cap = c->range_capacity ? c->range_capacity * 2 : 64;
        mg_cpu_range *grown = realloc(c->ranges, cap * sizeof *grown);
        if (!grown)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                            "cpu backend: growing the allocation table to %zu entries", cap);
        c->ranges = grown;
        c->range_capacity = cap;
    }
    size_t i = range_upper_bound(c, range.base);
    memmove(&c->ranges[i + 1], &c->ranges[i], (c->range_count - i) * sizeof *c->ranges);
    c->ranges[i] = range;
    c->range_count++;
    return MG_OK;
}

/* Caller holds c->lock. */
static mg_cpu_range range_remove(mg_cpu_backend *c, size_t i) {
    mg_cpu_range r = c->ranges[i];
    memmove(&c->ranges[i], &c->ranges[i + 1], (c->range_count - i - 1) * sizeof *c->ranges);
    c->range_count--;
    return r;
}

mg_status mg_cpu_resolve(mg_cpu_backend *c, mg_devptr ptr, uint64_t bytes, const char *call,
                         const char *what, void **host_out) {
    if (ptr == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu %s %s: null device pointer", call, what);
    if (bytes > UINTPTR_MAX - ptr)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu %s %s: %" PRIu64 " bytes at 0x%" PRIx64 " wrap the address space",
                        call, what, bytes, ptr);
    pthread_mutex_lock(&c->lock);
    const mg_cpu_range *r = range_containing(c, (uintptr_t)ptr);
    mg_cpu_range found = r ? *r : (mg_cpu_range){0};
    pthread_mutex_unlock(&c->lock);
    if (!r)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu %s %s: 0x%" PRIx64
                        " is not inside any live allocation of cpu device %d",
                        call, what, ptr, c->device);
    uint64_t offset = ptr - found.base;
    if (bytes > found.bytes - offset)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu %s %s: %" PRIu64 " bytes at offset %" PRIu64
                        " overrun the %zu-byte allocation at 0x%" PRIxPTR,
                        call, what, bytes, offset, found.bytes, found.base);
    *host_out = (void *)(uintptr_t)ptr;
    return MG_OK;
}

mg_status mg_cpu_alloc(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out) {
    mg_cpu_backend *c = ctx;
    (void)kind; /* device, managed and arena memory are the same host memory here */
    mg_cpu_count(c, MG_CPU_COUNT_alloc);
    /* Messages carry no location and no size: the core appends the requested size and the
     * caller's file:line (backend_impl.h). */
    char text[32], cap_text[32];
    if (bytes == 0)
        return mg_error_set(MG_ERR_INVALID_ARGUMENT, NULL, 0, "cpu alloc: zero bytes");
    uint64_t physical = mg_cpu_physical_bytes();
    /* Refused up front: with overcommit the host allocator might hand out more than exists
     * and fail only when touched, and sanitizer allocators abort on absurd sizes. */
    if (bytes > physical || bytes > SIZE_MAX - (MG_CPU_ALLOC_ALIGNMENT - 1))
        return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                            "cpu alloc: out of memory: %zu bytes is more than the host's %s of "
                            "physical memory",
                            bytes, mg_format_bytes(physical, text, sizeof text));
    size_t rounded = (bytes + MG_CPU_ALLOC_ALIGNMENT - 1) & ~(size_t)(MG_CPU_ALLOC_ALIGNMENT - 1);

    pthread_mutex_lock(&c->lock);
    if (c->fail_countdown > 0 && --c->fail_countdown == 0) {
        pthread_mutex_unlock(&c->lock);
        return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                            "cpu alloc: out of memory (failure injected by "
                            "mg_cpu_fail_nth_allocation) for %zu bytes",
                            bytes);
    }
    if (c->allocation_cap_bytes && rounded > c->allocation_cap_bytes - c->live_device_bytes) {
        uint64_t live = c->live_device_bytes, cap = c->allocation_cap_bytes;
        pthread_mutex_unlock(&c->lock);
        return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                            "cpu alloc: out of memory: %zu bytes do not fit beside %s live under "
                            "the allocation cap of %s",
                            bytes, mg_format_bytes(live, text, sizeof text),
                            mg_format_bytes(cap, cap_text, sizeof cap_text));
    }
    c->live_device_bytes += rounded; /* reserved now so concurrent allocations see the cap */
    pthread_mutex_unlock(&c->lock);

    void *p = aligned_alloc(MG_CPU_ALLOC_ALIGNMENT, rounded);
    mg_status st = MG_OK;
    if (!p)
        st = mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                          "aligned_alloc: out of host memory for %zu bytes", bytes);
    pthread_mutex_lock(&c->lock);
    if (p)
        st = range_insert(c, (mg_cpu_range){(uintptr_t)p, bytes, rounded, MG_CPU_RANGE_DEVICE});
    if (st)
        c->live_device_bytes -= rounded;
    pthread_mutex_unlock(&c->lock);
    if (st) {
        free(p);
        return st;
    }
    *out = (mg_devptr)(uintptr_t)p;
    return MG_OK;
}

mg_status mg_cpu_free(void *ctx, mg_devptr base, mg_alloc_kind kind) {
    mg_cpu_backend *c = ctx;
    (void)kind;
    mg_cpu_count(c, MG_CPU_COUNT_free);
    pthread_mutex_lock(&c->lock);
    size_t i = range_index_of_base(c, (uintptr_t)base, MG_CPU_RANGE_DEVICE);
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&c->lock);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu free: 0x%" PRIx64 " is not the base of a live allocation", base);
    }
    mg_cpu_range r = range_remove(c, i);
    c->live_device_bytes -= r.rounded;
    pthread_mutex_unlock(&c->lock);
    free((void *)r.base);
    return MG_OK;
}

mg_status mg_cpu_host_alloc(void *ctx, size_t bytes, void **out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_host_alloc);
    char size_text[32], physical_text[32];
    uint64_t physical = mg_cpu_physical_bytes();
    if (bytes > physical)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                        "cpu host_alloc: out of memory, requested %s (%zu bytes), more than the "
                        "host's %s of physical memory",
                        mg_format_bytes(bytes, size_text, sizeof size_text), bytes,
                        mg_format_bytes(physical, physical_text, sizeof physical_text));
    void *p;
    mg_status st = mg_host_heap_alloc(bytes, &p);
    if (st)
        return st;
    /* Registered so async copies treat it as page-locked, as they would on CUDA. */
    st = mg_pinned_register(p, bytes);
    if (st) {
        mg_host_heap_free(p);
        return st;
    }
    pthread_mutex_lock(&c->lock);
    st = range_insert(c, (mg_cpu_range){(uintptr_t)p, bytes, bytes, MG_CPU_RANGE_HOST});
    pthread_mutex_unlock(&c->lock);
    if (st) {
        mg_pinned_unregister(p);
        mg_host_heap_free(p);
        return st;
    }
    *out = p;
    return MG_OK;
}

mg_status mg_cpu_host_free(void *ctx, void *host) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_host_free);
    pthread_mutex_lock(&c->lock);
    size_t i = range_index_of_base(c, (uintptr_t)host, MG_CPU_RANGE_HOST);
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&c->lock);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu host_free: %p is not live memory from mg_host_alloc", host);
    }
    range_remove(c, i);
    pthread_mutex_unlock(&c->lock);
    mg_pinned_unregister(host);
    mg_host_heap_free(host);
    return MG_OK;
}

mg_status mg_cpu_host_device_pointer(void *ctx, void *host, mg_devptr *out) {
    mg_cpu_backend *c = ctx;
    pthread_mutex_lock(&c->lock);
    const mg_cpu_range *r = range_containing(c, (uintptr_t)host);
    bool ok = r && r->kind == MG_CPU_RANGE_HOST;
    pthread_mutex_unlock(&c->lock);
    if (!ok)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu host_device_pointer: %p is not inside memory from mg_host_alloc",
                        host);
    *out = (mg_devptr)(uintptr_t)host; /* the CPU device addresses host memory directly */
    return MG_OK;
}

void mg_cpu_release_all_ranges(mg_cpu_backend *c) {
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->range_count; i++) {
        void *p = (void *)c->ranges[i].base;
        if (c->ranges[i].kind == MG_CPU_RANGE_HOST) {
            mg_pinned_unregister(p);
            mg_host_heap_free(p);
        } else {
            free(p);
        }
    }
    free(c->ranges);
    c->ranges = NULL;
    c->range_count = c->range_capacity = 0;
    c->live_device_bytes = 0;
    pthread_mutex_unlock(&c->lock);
}
