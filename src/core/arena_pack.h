/*
 * arena_pack.h - private: the lifetime-aware offset packer behind mg_arena_plan_pack
 * (algorithm described in metrale/arena.h). Pure host code, no device calls.
 */
#ifndef METRALE_ARENA_PACK_H
#define METRALE_ARENA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"

typedef struct mg_pack_item {
    uint64_t bytes;                 /* 0: not placed (chunk 0, offset 0) */
    uint64_t alignment;             /* power of two */
    uint32_t first_step, last_step; /* inclusive; [0, UINT32_MAX] for "always live" */
    const char *name;               /* for error messages */
} mg_pack_item;

typedef struct mg_pack_place {
    uint32_t chunk;
    uint64_t offset;
} mg_pack_place;

/* Places `n` items. `places` has n entries; `chunk_bytes` has room for n entries (at most one
 * chunk per item) and receives the size of each chunk (the highest end of a buffer in it);
 * *chunk_count the number of chunks (0 when every item is empty). max_chunk_bytes 0 means
 * no limit. Errors: an item larger than the limit (MG_ERR_INVALID_ARGUMENT, named), a layout
 * whose offsets would overflow 64 bits, host memory for scratch (MG_ERR_OUT_OF_MEMORY). */
mg_status mg_pack_items(const mg_pack_item *items, size_t n, uint64_t max_chunk_bytes,
                        mg_pack_place *places, uint64_t *chunk_bytes, uint32_t *chunk_count);

/* Most bytes live at one step: the lower bound of any valid layout's size. */
uint64_t mg_pack_peak_live_bytes(const mg_pack_item *items, size_t n);

#endif
