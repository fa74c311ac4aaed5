/* pinned.c - the page-locked host range registry: a sorted array under a rwlock. */
#include "metrale/pinned.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef struct pinned_range {
    uintptr_t base;
    size_t bytes;
} pinned_range;

static pthread_rwlock_t registry_lock = PTHREAD_RWLOCK_INITIALIZER;
static pinned_range *ranges; /* sorted by base, non-overlapping */
static size_t range_count, range_capacity;

/* Index of the first range whose base is > addr. Caller holds the lock. */
static size_t upper_bound(uintptr_t addr) {
    size_t lo = 0, hi = range_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

mg_status mg_pinned_register(const void *base, size_t bytes) {
    if (!base || bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_pinned_register: %s",
                        base ? "zero length" : "NULL base");
    uintptr_t b = (uintptr_t)base;
    if (bytes > UINTPTR_MAX - b)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_pinned_register: range wraps the address space");
    mg_status st = MG_OK;
    pthread_rwlock_wrlock(&registry_lock);
    size_t i = upper_bound(b); /* ranges[i-1].base <= b < ranges[i].base */
    bool replace = i > 0 && ranges[i - 1].base == b;
    size_t prev = replace ? i - 1 : i; /* index the new range takes */
    if (!replace && i > 0 && ranges[i - 1].base + ranges[i - 1].bytes > b) {
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "mg_pinned_register: %p overlaps the registered range at %p", base,
                      (void *)ranges[i - 1].base);
    } else if (i < range_count && b + bytes > ranges[i].base) {
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "mg_pinned_register: [%p, +%zu) overlaps the registered range at %p", base,
                      bytes, (void *)ranges[i].base);
    } else if (replace) {
        ranges[prev].bytes = bytes;
    } else {
        if (range_count == range_capacity) {
            size_t cap = range_capacity ? range_capacity * 2 : 64;
            pinned_range *grown = realloc(ranges, cap * sizeof *grown);
            if (!grown) {
                pthread_rwlock_unlock(&registry_lock);
                return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_pinned_register: registry growth");
            }
            ranges = grown;
            range_capacity = cap;
        }
        memmove(&ranges[prev + 1], &ranges[prev], (range_count - prev) * sizeof *ranges);
        ranges[prev] = (pinned_range){b, bytes};
        range_count++;
    }
    pthread_rwlock_unlock(&registry_lock);
    return st;
}

mg_status mg_pinned_unregister(const void *base) {
    uintptr_t b = (uintptr_t)base;
    pthread_rwlock_wrlock(&registry_lock);
    size_t i = upper_bound(b);
    if (!base || i == 0 || ranges[i - 1].base != b) {
        pthread_rwlock_unlock(&registry_lock);
        return MG_ERROR(MG_ERR_NOT_FOUND, "mg_pinned_unregister: %p is not a registered base",
                        base);
    }
    memmove(&ranges[i - 1], &ranges[i], (range_count - i) * sizeof *ranges);
    range_count--;
    pthread_rwlock_unlock(&registry_lock);
    return MG_OK;
}

bool mg_pinned_contains(const void *ptr, size_t bytes) {
    if (!ptr || bytes == 0)
        return false;
    uintptr_t p = (uintptr_t)ptr;
    if (bytes > UINTPTR_MAX - p)
        return false;
    pthread_rwlock_rdlock(&registry_lock);
    size_t i = upper_bound(p);
    bool hit = i > 0 && p + bytes <= ranges[i - 1].base + ranges[i - 1].bytes;
    pthread_rwlock_unlock(&registry_lock);
    return hit;
}

size_t mg_pinned_count(void) {
    pthread_rwlock_rdlock(&registry_lock);
    size_t n = range_count;
    pthread_rwlock_unlock(&registry_lock);
    return n;
}
