/* host_heap.c - zeroed, 64-byte aligned host allocations (metrale/host_heap.h). */
#include "metrale/host_heap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

mg_status mg_host_heap_alloc(size_t bytes, void **out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_heap_alloc: NULL output pointer");
    *out = NULL;
    if (bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_heap_alloc: zero bytes");
    if (bytes > SIZE_MAX - (MG_HOST_HEAP_ALIGNMENT - 1))
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_host_heap_alloc: %zu bytes is too large", bytes);
    size_t rounded = (bytes + MG_HOST_HEAP_ALIGNMENT - 1) & ~(size_t)(MG_HOST_HEAP_ALIGNMENT - 1);
    void *p = aligned_alloc(MG_HOST_HEAP_ALIGNMENT, rounded);
    if (!p) {
        char size[32];
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "aligned_alloc: out of memory, requested %s",
                        mg_format_bytes(rounded, size, sizeof size));
    }
    memset(p, 0, rounded);
    *out = p;
    return MG_OK;
}

void mg_host_heap_free(void *p) {
    free(p);
}
