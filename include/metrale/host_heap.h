/*
 * metrale/host_heap.h - the default "pinned host" allocation of a backend that cannot
 * page-lock memory (the CPU backend; Metal's shared memory is already host-visible):
 * zeroed, 64-byte aligned heap memory, freed through the same path.
 */
#ifndef METRALE_HOST_HEAP_H
#define METRALE_HOST_HEAP_H

#include <stddef.h>

#include "metrale/export.h"
#include "metrale/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_HOST_HEAP_ALIGNMENT 64

/* bytes > 0; the size is rounded up to a multiple of 64. */
MG_API mg_status mg_host_heap_alloc(size_t bytes, void **out);
/* NULL is a no-op. */
MG_API void mg_host_heap_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
