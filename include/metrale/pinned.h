/*
 * metrale/pinned.h - the process-wide registry of page-locked host ranges.
 *
 * The CUDA backend's mg_copy_h2d_async promises the caller may drop the source on return;
 * it consults this registry to know whether a source is page-locked (then it can be copied
 * from directly) or pageable (then it is staged). Backends register what mg_host_alloc
 * returns; callers register memory they page-locked themselves.
 *
 * Rules: a lookup of any sub-range of a registered range succeeds; a neighbouring range, a
 * range straddling the end, NULL or an empty range never matches. Registering a base again
 * replaces its length. Unregister before freeing the memory. Thread-safe (many readers, rare
 * writers); lookup is O(log n).
 */
#ifndef METRALE_PINNED_H
#define METRALE_PINNED_H

#include <stdbool.h>
#include <stddef.h>

#include "metrale/export.h"
#include "metrale/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MG_ERR_INVALID_ARGUMENT for NULL, zero length, or a range overlapping another base's. */
MG_API mg_status mg_pinned_register(const void *base, size_t bytes);
/* MG_ERR_NOT_FOUND if `base` is not a registered base. */
MG_API mg_status mg_pinned_unregister(const void *base);
/* True when [ptr, ptr + bytes) lies inside one registered range. */
MG_API bool mg_pinned_contains(const void *ptr, size_t bytes);
/* Number of registered ranges (tests, diagnostics). */
MG_API size_t mg_pinned_count(void);

#ifdef __cplusplus
}
#endif
#endif
