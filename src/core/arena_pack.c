/*
 * arena_pack.c - lifetime-aware interval packing for the buffer arena.
 *
 * For one placement order and one gap rule, items are placed one by one. For an item, the
 * already placed items of a chunk whose lifetimes intersect its own are its "conflicts";
 * their byte ranges, sorted by offset, leave gaps. The item goes into a gap that holds it at
 * its alignment (best fit: the smallest such gap; first fit: the lowest), else on top of the
 * highest conflict, provided it stays under the chunk limit; otherwise the next chunk is
 * tried, and a new chunk is opened when none fits. Every (order, rule) pair is run and the
 * layout with the fewest total bytes (then fewest chunks) wins; ties keep the earlier pair,
 * so the result is deterministic.
 *
 * Cost: O(n^2 log n) per pair; model plans have tens of buffers.
 */
#include "arena_pack.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef enum pack_order {
    ORDER_SIZE_DESC,  /* largest first: big buffers claim the bottom */
    ORDER_AREA_DESC,  /* size x lifetime length: long-lived big buffers first */
    ORDER_FIRST_STEP, /* timeline order, larger first within a step */
    ORDER_ALIGN_DESC, /* most aligned first: they start at 0 and waste no padding */
    ORDER_COUNT
} pack_order;

typedef enum pack_fit { FIT_BEST, FIT_FIRST, FIT_COUNT } pack_fit;

typedef struct range {
    uint64_t begin, end;
} range;

static bool lifetimes_intersect(const mg_pack_item *a, const mg_pack_item *b) {
    return a->first_step <= b->last_step && b->first_step <= a->last_step;
}

/* Rounds up to a power-of-two alignment; false on overflow. */
static bool align_up(uint64_t value, uint64_t alignment, uint64_t *out) {
    uint64_t mask = alignment - 1;
    if (value > UINT64_MAX - mask)
        return false;
    *out = (value + mask) & ~mask;
    return true;
}

/* Sort key of one item for one order: two words compared in turn (smaller first), then the
 * plan index, so the order is total and the result deterministic. */
typedef struct order_key {
    uint64_t word[2];
    size_t index;
} order_key;

static uint64_t lifetime_length(const mg_pack_item *it) {
    return (uint64_t)(it->last_step - it->first_step) + 1;
}

/* bytes x lifetime length as a 128-bit (hi, lo) pair, multiplied in 32-bit limbs. */
static void area_of(const mg_pack_item *it, uint64_t *hi, uint64_t *lo) {
    uint64_t len = lifetime_length(it);
    uint64_t b0 = it->bytes & 0xffffffffu, b1 = it->bytes >> 32;
    uint64_t l0 = len & 0xffffffffu, l1 = len >> 32;
    uint64_t p00 = b0 * l0, p01 = b0 * l1, p10 = b1 * l0, p11 = b1 * l1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    *lo = (p00 & 0xffffffffu) | (mid << 32);
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

static order_key key_of(const mg_pack_item *it, size_t index, pack_order order) {
    order_key k = {{0, 0}, index};
    switch (order) {
    case ORDER_SIZE_DESC:
        k.word[0] = UINT64_MAX - it->bytes;
        k.word[1] = it->first_step;
        break;
    case ORDER_AREA_DESC: {
        uint64_t hi, lo;
        area_of(it, &hi, &lo);
        k.word[0] = UINT64_MAX - hi;
        k.word[1] = UINT64_MAX - lo;
        break;
    }
    case ORDER_FIRST_STEP:
        k.word[0] = it->first_step;
        k.word[1] = UINT64_MAX - it->bytes;
        break;
    case ORDER_ALIGN_DESC:
        k.word[0] = UINT64_MAX - it->alignment;
        k.word[1] = UINT64_MAX - it->bytes;
        break;
    case ORDER_COUNT:
        break;
    }
    return k;
}

static int compare_key(const void *pa, const void *pb) {
    const order_key *a = pa, *b = pb;
    for (int w = 0; w < 2; w++)
        if (a->word[w] != b->word[w])
            return a->word[w] < b->word[w] ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

static int compare_range(const void *pa, const void *pb) {
    const range *a = pa, *b = pb;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

typedef struct pack_scratch {
    order_key *order;      /* n: placement order */
    bool *placed;          /* n */
    range *conflicts;      /* n */
    mg_pack_place *places; /* n: candidate layout */
    uint64_t *chunk_bytes; /* n: candidate chunk sizes */
} pack_scratch;

/* Where `item` fits in chunk `chunk` given the placed items; false if it does not fit under
 * the limit. */
static bool fit_in_chunk(const mg_pack_item *items, size_t n, size_t item, uint32_t chunk,
                         pack_fit fit, uint64_t limit, pack_scratch *s, uint64_t *offset_out) {
    const mg_pack_item *it = &items[item];
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        if (!s->placed[j] || s->places[j].chunk != chunk || !lifetimes_intersect(it, &items[j]))
            continue;
        s->conflicts[k++] = (range){s->places[j].offset, s->places[j].offset + items[j].bytes};
    }
    qsort(s->conflicts, k, sizeof *s->conflicts, compare_range);

    bool found = false;
    uint64_t best_offset = 0, best_gap = UINT64_MAX;
    uint64_t frontier = 0; /* highest end among conflicts seen so far */
    for (size_t c = 0; c < k; c++) {
        uint64_t start;
        if (s->conflicts[c].begin > frontier && align_up(frontier, it->alignment, &start) &&
            start <= s->conflicts[c].begin && s->conflicts[c].begin - start >= it->bytes) {
            uint64_t gap = s->conflicts[c].begin - frontier;
            if (!found || (fit == FIT_BEST && gap < best_gap)) {
                found = true;
                best_offset = start;
                best_gap = gap;
                if (fit == FIT_FIRST)
                    break;
            }
        }
        if (s->conflicts[c].end > frontier)
            frontier = s->conflicts[c].end;
    }
    if (!found) {
        if (!align_up(frontier, it->alignment, &best_offset) ||
            best_offset > UINT64_MAX - it->bytes)
            return false;
    }
    if (limit && best_offset + it->bytes > limit)
        return false;
    *offset_out = best_offset;
    return true;
}

/* One (order, fit) run into s->places / s->chunk_bytes. */
static mg_status pack_once(const mg_pack_item *items, size_t n, uint64_t limit, pack_order order,
                           pack_fit fit, pack_scratch *s, uint32_t *chunk_count) {
    for (size_t i = 0; i < n; i++) {
        s->order[i] = key_of(&items[i], i, order);
        s->placed[i] = false;
        s->places[i] = (mg_pack_place){0, 0};
    }
    qsort(s->order, n, sizeof *s->order, compare_key);

    uint32_t chunks = 0;
    for (size_t o = 0; o < n; o++) {
        size_t i = s->order[o].index;
        if (items[i].bytes == 0)
            continue;
        bool done = false;
        for (uint32_t c = 0; c < chunks && !done; c++) {
            uint64_t offset;
            if (fit_in_chunk(items, n, i, c, fit, limit, s, &offset)) {
                s->places[i] = (mg_pack_place){c, offset};
                done = true;
            }
        }
        if (!done) {
            /* a fresh chunk starts at offset 0, which every alignment divides */
            if (limit && items[i].bytes > limit)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "mg_arena_plan_pack: buffer '%s' of %llu bytes exceeds the "
                                "per-allocation limit of %llu bytes",
                                items[i].name ? items[i].name : "?",
                                (unsigned long long)items[i].bytes, (unsigned long long)limit);
            if (!limit) {
                /* no limit: a single chunk, so "does not fit" means the offsets overflowed */
                if (chunks > 0)
                    return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                    "mg_arena_plan_pack: layout exceeds 2^64 bytes at buffer "
                                    "'%s'",
                                    items[i].name ? items[i].name : "?");
            }
            s->places[i] = (mg_pack_place){chunks, 0};
            chunks++;
        }
        s->placed[i] = true;
    }
    for (uint32_t c = 0; c < chunks; c++)
        s->chunk_bytes[c] = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].bytes == 0)
            continue;
        uint64_t end = s->places[i].offset + items[i].bytes;
        if (end > s->chunk_bytes[s->places[i].chunk])
            s->chunk_bytes[s->places[i].chunk] = end;
    }
    *chunk_count = chunks;
    return MG_OK;
}

static uint64_t total_of(const uint64_t *chunk_bytes, uint32_t chunks, bool *overflow) {
    uint64_t total = 0;
    for (uint32_t c = 0; c < chunks; c++) {
        if (chunk_bytes[c] > UINT64_MAX - total)
            *overflow = true;
        total += chunk_bytes[c];
    }
    return total;
}

mg_status mg_pack_items(const mg_pack_item *items, size_t n, uint64_t max_chunk_bytes,
                        mg_pack_place *places, uint64_t *chunk_bytes, uint32_t *chunk_count) {
    *chunk_count = 0;
    if (n == 0)
        return MG_OK;
    if (n > SIZE_MAX / sizeof(range) || n > UINT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_pack: %zu buffers", n);
    pack_scratch s = {
        .order = malloc(n * sizeof *s.order),
        .placed = malloc(n * sizeof *s.placed),
        .conflicts = malloc(n * sizeof *s.conflicts),
        .places = malloc(n * sizeof *s.places),
        .chunk_bytes = malloc(n * sizeof *s.chunk_bytes),
    };
    mg_status st = MG_OK;
    if (!s.order || !s.placed || !s.conflicts || !s.places || !s.chunk_bytes) {
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_arena_plan_pack: scratch for %zu buffers", n);
        goto done;
    }
    bool have_best = false;
    uint64_t best_total = 0;
    uint32_t best_chunks = 0;
    for (int order = 0; order < ORDER_COUNT; order++) {
        for (int fit = 0; fit < FIT_COUNT; fit++) {
            uint32_t chunks = 0;
            st =
                pack_once(items, n, max_chunk_bytes, (pack_order)order, (pack_fit)fit, &s, &chunks);
            if (st != MG_OK)
                goto done; /* the same item fails in every order: report it once */
            bool overflow = false;
            uint64_t total = total_of(s.chunk_bytes, chunks, &overflow);
            if (overflow)
                continue;
            if (!have_best || total < best_total || (total == best_total && chunks < best_chunks)) {
                have_best = true;
                best_total = total;
                best_chunks = chunks;
                memcpy(places, s.places, n * sizeof *places);
                memcpy(chunk_bytes, s.chunk_bytes, chunks * sizeof *chunk_bytes);
            }
        }
    }
    if (!have_best) {
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_pack: layout exceeds 2^64 bytes");
        goto done;
    }
    *chunk_count = best_chunks;
done:
    free(s.order);
    free(s.placed);
    free(s.conflicts);
    free(s.places);
    free(s.chunk_bytes);
    return st;
}

uint64_t mg_pack_peak_live_bytes(const mg_pack_item *items, size_t n) {
    /* The live set only grows at some item's first step, so the peak is at one of those. */
    uint64_t peak = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t step = items[i].first_step;
        uint64_t live = 0;
        for (size_t j = 0; j < n; j++)
            if (items[j].first_step <= step && step <= items[j].last_step)
                live = live > UINT64_MAX - items[j].bytes ? UINT64_MAX : live + items[j].bytes;
        if (live > peak)
            peak = live;
    }
    return peak;
}
