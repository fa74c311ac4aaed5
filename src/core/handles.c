/* handles.c - the process-wide registry of live handles: a handle is dereferenced only after
 * the registry confirms it is live and of the expected type, so NULL, stale (destroyed) and
 * wrong-type handles are reported instead of crashing. Open addressing with tombstones under
 * a rwlock; lookups take the read lock. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend_internal.h"
#include "error.h"

#define TOMBSTONE ((uintptr_t)1)

typedef struct handle_slot {
    uintptr_t key; /* 0 empty, TOMBSTONE deleted */
    mg_handle_type type;
} handle_slot;

static pthread_rwlock_t handle_lock = PTHREAD_RWLOCK_INITIALIZER;
static handle_slot *slots;
static size_t slot_capacity, slot_used; /* used counts live + tombstones */

static size_t hash_ptr(uintptr_t p) {
    uint64_t x = (uint64_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

/* Slot holding `key`, or SIZE_MAX. Caller holds the lock. */
static size_t find_slot(uintptr_t key) {
    if (!slot_capacity)
        return SIZE_MAX;
    size_t mask = slot_capacity - 1;
    for (size_t i = hash_ptr(key) & mask, n = 0; n < slot_capacity; i = (i + 1) & mask, n++) {
        if (slots[i].key == key)
            return i;
        if (slots[i].key == 0)
            return SIZE_MAX;
    }
    return SIZE_MAX;
}

static void insert_slot(handle_slot *table, size_t capacity, uintptr_t key, mg_handle_type type) {
    size_t mask = capacity - 1;
    size_t i = hash_ptr(key) & mask;
    while (table[i].key != 0 && table[i].key != TOMBSTONE)
        i = (i + 1) & mask;
    table[i] = (handle_slot){key, type};
}

mg_status mg_handle_register(const void *handle, mg_handle_type type) {
    uintptr_t key = (uintptr_t)handle;
    pthread_rwlock_wrlock(&handle_lock);
    if ((slot_used + 1) * 2 > slot_capacity) {
        /* Rehash, dropping the tombstones: sized for the live handles (at most a quarter
         * full), so churn of short-lived handles does not grow the table. */
        size_t live = 0;
        for (size_t i = 0; i < slot_capacity; i++)
            live += slots[i].key > TOMBSTONE;
        size_t cap = 256;
        while ((live + 1) * 4 > cap)
            cap *= 2;
        handle_slot *table = calloc(cap, sizeof *table);
        if (!table) {
            pthread_rwlock_unlock(&handle_lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "handle registry: %zu slots", cap);
        }
        for (size_t i = 0; i < slot_capacity; i++)
            if (slots[i].key > TOMBSTONE)
                insert_slot(table, cap, slots[i].key, slots[i].type);
        free(slots);
        slots = table;
        slot_capacity = cap;
        slot_used = live;
    }
    insert_slot(slots, slot_capacity, key, type);
    slot_used++;
    pthread_rwlock_unlock(&handle_lock);
    return MG_OK;
}

void mg_handle_unregister(const void *handle) {
    pthread_rwlock_wrlock(&handle_lock);
    size_t i = find_slot((uintptr_t)handle);
    if (i != SIZE_MAX)
        slots[i].key = TOMBSTONE;
    pthread_rwlock_unlock(&handle_lock);
}

bool mg_handle_is(const void *handle, mg_handle_type type) {
    if (!handle)
        return false;
    pthread_rwlock_rdlock(&handle_lock);
    size_t i = find_slot((uintptr_t)handle);
    bool ok = i != SIZE_MAX && slots[i].type == type;
    pthread_rwlock_unlock(&handle_lock);
    return ok;
}
