/* cpu_memory.c - the CPU backend's memory: device allocations in host memory, host_alloc,
 * and the tables of live ranges every device address is checked against. */
#include <inttypes.h>
#include <stdlib.h>

#include "cpu_backend.h"
#include "error.h"
#include "metrale/host_heap.h"

static size_t round_to_alignment(size_t bytes) {
    return (bytes + MG_CPU_ALLOC_ALIGNMENT - 1) & ~(size_t)(MG_CPU_ALLOC_ALIGNMENT - 1);
}

mg_status mg_cpu_resolve(mg_cpu_backend *c, mg_devptr ptr, uint64_t bytes, const char *call,
                         const char *what, void **host_out) {
    if (ptr == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu %s %s: null device pointer", call, what);
    if (bytes > UINTPTR_MAX - ptr)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu %s %s: %" PRIu64 " bytes at 0x%" PRIx64 " wrap the address space",
                        call, what, bytes, ptr);
    mg_ledger_entry found;
    if (!mg_ledger_find(&c->device_ranges, ptr, &found) &&
        !mg_ledger_find(&c->host_ranges, ptr, &found) &&
        !mg_ledger_find(&c->registered_ranges, ptr, &found))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu %s %s: 0x%" PRIx64
                        " is not inside any live allocation of cpu device %d",
                        call, what, ptr, c->device);
    uint64_t offset = ptr - found.base;
    if (bytes > found.bytes - offset)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu %s %s: %" PRIu64 " bytes at offset %" PRIu64 " overrun the %" PRIu64
                        "-byte allocation at 0x%" PRIx64,
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
    size_t rounded = round_to_alignment(bytes);

    pthread_mutex_lock(&c->lock);
    if (c->fail_countdown > 0 && --c->fail_countdown == 0) {
        pthread_mutex_unlock(&c->lock);
        return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                            "cpu alloc: out of memory (failure injected by "
                            "mg_cpu_fail_nth_allocation) for %zu bytes",
                            bytes);
    }
    /* A cap lowered below what is live refuses every allocation until enough is freed. */
    if (c->allocation_cap_bytes && (c->live_device_bytes > c->allocation_cap_bytes ||
                                    rounded > c->allocation_cap_bytes - c->live_device_bytes)) {
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
    else
        st = mg_ledger_add(&c->device_ranges,
                           &(mg_ledger_entry){.base = (uintptr_t)p, .bytes = bytes, .kind = kind});
    if (st) {
        free(p);
        pthread_mutex_lock(&c->lock);
        c->live_device_bytes -= rounded;
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    *out = (mg_devptr)(uintptr_t)p;
    return MG_OK;
}

mg_status mg_cpu_free(void *ctx, mg_devptr base, mg_alloc_kind kind) {
    mg_cpu_backend *c = ctx;
    (void)kind;
    mg_cpu_count(c, MG_CPU_COUNT_free);
    mg_ledger_entry e;
    if (!mg_ledger_remove(&c->device_ranges, base, &e))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu free: 0x%" PRIx64 " is not the base of a live allocation", base);
    pthread_mutex_lock(&c->lock);
    c->live_device_bytes -= round_to_alignment(e.bytes);
    pthread_mutex_unlock(&c->lock);
    free((void *)(uintptr_t)e.base);
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
    /* Plain heap memory, not page-locked: it stays out of the process-wide pinned registry,
     * where another backend (CUDA) would take it for DMA-able memory. This backend's copies
     * run on the host and need no page-locked memory. */
    st = mg_ledger_add(&c->host_ranges, &(mg_ledger_entry){.base = (uintptr_t)p, .bytes = bytes});
    if (st) {
        mg_host_heap_free(p);
        return st;
    }
    *out = p;
    return MG_OK;
}

mg_status mg_cpu_host_free(void *ctx, void *host) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_host_free);
    if (!mg_ledger_remove(&c->host_ranges, (uintptr_t)host, NULL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu host_free: %p is not live memory from mg_host_alloc", host);
    mg_host_heap_free(host);
    return MG_OK;
}

mg_status mg_cpu_host_device_pointer(void *ctx, void *host, mg_devptr *out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_host_device_pointer);
    if (!mg_ledger_find(&c->host_ranges, (uintptr_t)host, NULL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu host_device_pointer: %p is not inside memory from mg_host_alloc",
                        host);
    *out = (mg_devptr)(uintptr_t)host; /* the CPU device addresses host memory directly */
    return MG_OK;
}

mg_status mg_cpu_host_register(void *ctx, void *host, size_t bytes, mg_devptr *out) {
    mg_cpu_backend *c = ctx;
    uintptr_t base = (uintptr_t)host;
    if (bytes > UINTPTR_MAX - base)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu host_register: %zu bytes at %p wrap the address space", bytes, host);
    mg_ledger_entry found;
    mg_ledger *tables[] = {&c->device_ranges, &c->host_ranges, &c->registered_ranges};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (mg_ledger_find(tables[i], base, &found) ||
            mg_ledger_find(tables[i], base + bytes - 1, &found))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "cpu host_register: [%p, +%zu) overlaps the range [0x%" PRIx64
                            ", +%" PRIu64 ") this device already addresses",
                            host, bytes, found.base, found.bytes);
    mg_status st =
        mg_ledger_add(&c->registered_ranges, &(mg_ledger_entry){.base = base, .bytes = bytes});
    if (st)
        return st;
    *out = (mg_devptr)base;
    return MG_OK;
}

mg_status mg_cpu_host_unregister(void *ctx, void *host) {
    mg_cpu_backend *c = ctx;
    if (!mg_ledger_remove(&c->registered_ranges, (uintptr_t)host, NULL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu host_unregister: %p is not the base of a range from "
                        "mg_host_register",
                        host);
    return MG_OK;
}

bool mg_cpu_host_registered(void *ctx, mg_devptr p, size_t bytes) {
    mg_cpu_backend *c = ctx;
    mg_ledger_entry found;
    return mg_ledger_find(&c->registered_ranges, p, &found) &&
           bytes <= found.base + found.bytes - p;
}

void mg_cpu_release_all_ranges(mg_cpu_backend *c) {
    mg_ledger_entry e;
    while (mg_ledger_pop(&c->host_ranges, true, &e))
        mg_host_heap_free((void *)(uintptr_t)e.base);
    while (mg_ledger_pop(&c->device_ranges, true, &e))
        free((void *)(uintptr_t)e.base);
    pthread_mutex_lock(&c->lock);
    c->live_device_bytes = 0;
    pthread_mutex_unlock(&c->lock);
}
