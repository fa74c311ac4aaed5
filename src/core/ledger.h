/*
 * ledger.h - private: the allocation ledger of one backend. Every live device allocation
 * with its bytes, kind and the call site that made it, sorted by base address so that an
 * interior pointer resolves to its allocation in O(log n). Thread-safe.
 */
#ifndef METRALE_LEDGER_H
#define METRALE_LEDGER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/gpu.h"

typedef struct mg_ledger_entry {
    mg_devptr base;
    uint64_t bytes;
    mg_alloc_kind kind;
    const char *file; /* call site; static storage (__FILE__) */
    int line;
    bool owned; /* made for a library object (scratch, workspace, arena), which frees it */
} mg_ledger_entry;

typedef struct mg_ledger {
    pthread_mutex_t lock;
    mg_ledger_entry *entries; /* sorted by base, non-overlapping */
    size_t count, capacity;
    uint64_t live_bytes;
} mg_ledger;

void mg_ledger_init(mg_ledger *l);
void mg_ledger_destroy(mg_ledger *l);

mg_status mg_ledger_add(mg_ledger *l, const mg_ledger_entry *e);
/* Finds the live allocation containing `ptr`; false when none does. */
bool mg_ledger_find(mg_ledger *l, mg_devptr ptr, mg_ledger_entry *out);
/* Removes the allocation whose base is exactly `base`; false when there is none. */
bool mg_ledger_remove(mg_ledger *l, mg_devptr base, mg_ledger_entry *out);
/* Removes and returns one live allocation (the highest base), skipping owned ones unless
 * `include_owned`; false when there is none. */
bool mg_ledger_pop(mg_ledger *l, bool include_owned, mg_ledger_entry *out);
void mg_ledger_totals(mg_ledger *l, uint64_t *bytes, uint64_t *count);
/* Aggregates live allocations by call site, keeps sites with >= min_bytes, largest first;
 * *written receives how many. MG_ERR_OUT_OF_MEMORY (nothing written) when its host scratch
 * cannot be allocated. */
mg_status mg_ledger_sites(mg_ledger *l, uint64_t min_bytes, mg_ledger_site *out, size_t max_sites,
                          size_t *written);

#endif
