/*
 * metrale/arena.h - a buffer arena: every intermediate tensor of a forward pass, planned once,
 * allocated once, and reused by every step. The arena knows buffers, sizes and lifetimes, not
 * models: what a model's pass needs is the model's own table (src/model/model_plan.c).
 *
 *   mg_arena_plan *plan;
 *   mg_arena_plan_create(&plan); mg_arena_plan_add(plan, "qkv", bytes, 0, &lifetime, NULL);
 *   mg_arena *arena;
 *   mg_arena_create(backend, plan, &arena);                 // the only device allocation(s)
 *   mg_arena_plan_destroy(plan);                            // the arena keeps its own copy
 *   mg_devptr qkv = mg_arena_ptr(arena, mg_arena_index(arena, "qkv"));
 *   ... every step, every layer: launch against the same addresses, capture graphs ...
 *   mg_arena_destroy(arena);                                // before mg_backend_close
 *
 * What a caller may rely on:
 *  - Addresses never change between mg_arena_create and mg_arena_release, so CUDA graphs
 *    captured against them stay valid. Nothing is allocated after creation.
 *  - A buffer of 0 bytes has address 0 (null) and occupies nothing; never dereference it.
 *  - Every buffer's address is a multiple of its alignment (default 256, any power of two
 *    up to 1 GiB) and [ptr, ptr + bytes) lies inside one device allocation.
 *  - Two buffers that are live at a common step never overlap. Buffers planned without a
 *    lifetime are live at every step, so they never share bytes with anything.
 *
 * Packing (design): a buffer with a lifetime [first_step, last_step] (inclusive) may share
 * bytes with buffers whose lifetimes do not intersect its own. Offsets are assigned by a
 * greedy interval packer: buffers are placed one at a time, each at the best gap among the
 * byte ranges of already placed buffers whose lifetimes intersect its own (or on top of
 * them). Several deterministic orders (largest first; largest size x lifetime first;
 * earliest first step first; most aligned first) and two gap rules (best fit: the smallest gap that
 * holds it; first fit: the lowest) are tried and the layout with the fewest total bytes is kept.
 * Finding the optimum is NP-hard (dynamic storage allocation); the summary reports the
 * lower bound peak_live_bytes (the most bytes live at one step) to show how close a layout is.
 *
 * Chunks: with a per-allocation limit (mg_arena_plan_set_max_chunk_bytes; 0 = none) the
 * layout is split into several chunks, each at most the limit, each one device allocation;
 * a buffer never straddles two chunks. A buffer larger than the limit is an error.
 */
#ifndef METRALE_ARENA_H
#define METRALE_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_ARENA_DEFAULT_ALIGNMENT 256
#define MG_ARENA_MAX_ALIGNMENT (1ull << 30)
#define MG_ARENA_NAME_BYTES 48 /* names are at most 47 characters */

/* Inclusive range of forward-pass steps during which a buffer holds data someone will read. */
typedef struct mg_arena_lifetime {
    uint32_t first_step;
    uint32_t last_step; /* >= first_step */
} mg_arena_lifetime;

/* One buffer as planned and, after packing, where it lives. */
typedef struct mg_arena_buffer_info {
    const char *name; /* owned by the plan / arena */
    uint64_t bytes;
    uint64_t alignment;
    bool has_lifetime;          /* false: live at every step */
    mg_arena_lifetime lifetime; /* meaningful when has_lifetime */
    uint32_t chunk;             /* which device allocation (0 when bytes == 0) */
    uint64_t offset;            /* from the chunk's aligned base (0 when bytes == 0) */
    mg_devptr ptr;              /* arena only: the address; 0 in a plan, for 0 bytes, or released */
} mg_arena_buffer_info;

typedef struct mg_arena_summary {
    size_t buffer_count;
    uint64_t sum_bytes;       /* sum of all buffer sizes: the unpacked footprint */
    uint64_t arena_bytes;     /* sum of chunk sizes after packing */
    uint64_t peak_live_bytes; /* most bytes live at any one step: no layout can be smaller */
    uint64_t device_bytes;    /* what creation allocates: arena_bytes plus alignment slack
                                 for buffers aligned above 256 bytes */
    uint32_t chunk_count;
    uint64_t largest_chunk_bytes;
} mg_arena_summary;

/* ------------------------------------------------------------------ plans */

typedef struct mg_arena_plan mg_arena_plan;

MG_API mg_status mg_arena_plan_create(mg_arena_plan **out);
/* NULL is a no-op. */
MG_API void mg_arena_plan_destroy(mg_arena_plan *plan);

/* Adds a buffer. `name` is unique within the plan, 1..47 characters. `alignment` 0 means
 * MG_ARENA_DEFAULT_ALIGNMENT, otherwise a power of two <= MG_ARENA_MAX_ALIGNMENT.
 * `lifetime` NULL means live at every step (never shares). `bytes` may be 0 (a null buffer).
 * The buffer's index (its position in the plan, counting from 0) goes to *index_out when
 * that is not NULL. On error the plan is unchanged. */
MG_API mg_status mg_arena_plan_add(mg_arena_plan *plan, const char *name, uint64_t bytes,
                                   uint64_t alignment, const mg_arena_lifetime *lifetime,
                                   size_t *index_out);

/* Largest size of one device allocation; 0 (the default) is no limit. */
MG_API mg_status mg_arena_plan_set_max_chunk_bytes(mg_arena_plan *plan, uint64_t max_chunk_bytes);

MG_API size_t mg_arena_plan_count(const mg_arena_plan *plan);

/* Computes the layout (done implicitly by the queries below and by mg_arena_create; adding
 * a buffer or changing the chunk limit invalidates it). Fails when a buffer is larger than
 * the chunk limit (the message names it) or host memory runs out. */
MG_API mg_status mg_arena_plan_pack(mg_arena_plan *plan);
MG_API mg_status mg_arena_plan_summary(mg_arena_plan *plan, mg_arena_summary *out);
MG_API mg_status mg_arena_plan_buffer(mg_arena_plan *plan, size_t index, mg_arena_buffer_info *out);
/* Index of `name`; MG_ERR_NOT_FOUND (message names it) when there is none. */
MG_API mg_status mg_arena_plan_find(const mg_arena_plan *plan, const char *name, size_t *index_out);

/* Prints one line per buffer (index, name, bytes, alignment, lifetime, chunk, offset) and the
 * totals: sum, packed, ratio, peak live. Packs first. */
MG_API mg_status mg_arena_plan_print(mg_arena_plan *plan, FILE *f);

/* ------------------------------------------------------------------ arenas */

typedef struct mg_arena mg_arena;

/* Packs `plan` if needed, then takes the device memory: one mg_alloc_at(MG_ALLOC_ARENA) per
 * chunk, recorded in the ledger at the caller's file:line. If any allocation fails, every
 * chunk already taken is freed, *out stays NULL, and the message names the chunk, its bytes,
 * how many buffers it holds and the largest of them, followed by the backend's reason.
 * The arena copies what it needs: the plan may be destroyed afterwards. */
MG_API mg_status mg_arena_create_at(mg_backend *b, mg_arena_plan *plan, mg_arena **out,
                                    const char *file, int line);
#define mg_arena_create(b, plan, out) mg_arena_create_at((b), (plan), (out), __FILE__, __LINE__)

/* Frees the device memory; every address reads 0 afterwards. Idempotent: a second call (and
 * NULL) is a no-op returning MG_OK. Frees every chunk even when one free fails, and returns
 * the first failure. Call it before closing the backend. */
MG_API mg_status mg_arena_release(mg_arena *arena);
/* mg_arena_release, then frees the arena object itself. NULL is a no-op. */
MG_API mg_status mg_arena_destroy(mg_arena *arena);

MG_API size_t mg_arena_count(const mg_arena *arena);
/* Address of buffer `index`; 0 for a 0-byte buffer, an index out of range, or after release. */
MG_API mg_devptr mg_arena_ptr(const mg_arena *arena, size_t index);
/* Index of `name`, or SIZE_MAX when there is none (then mg_arena_ptr reads 0). */
MG_API size_t mg_arena_index(const mg_arena *arena, const char *name);
/* Address and size by name; MG_ERR_NOT_FOUND (message names it) when there is none. */
MG_API mg_status mg_arena_find(const mg_arena *arena, const char *name, mg_devptr *ptr_out,
                               uint64_t *bytes_out);
MG_API mg_status mg_arena_buffer(const mg_arena *arena, size_t index, mg_arena_buffer_info *out);
MG_API mg_status mg_arena_summary_get(const mg_arena *arena, mg_arena_summary *out);

#ifdef __cplusplus
}
#endif
#endif
