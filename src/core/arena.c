/*
 * arena.c - buffer arena plans and arenas (metrale/arena.h). The packing itself is in
 * arena_pack.c. No model is sized here: a model's table of buffers is the model's own.
 */
#include "metrale/arena.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "arena_pack.h"
#include "backend_impl.h"
#include "error.h"

typedef struct plan_buffer {
    char name[MG_ARENA_NAME_BYTES];
    uint64_t bytes;
    uint64_t alignment;
    bool has_lifetime;
    mg_arena_lifetime lifetime;
    mg_pack_place place; /* valid when the plan is packed */
} plan_buffer;

struct mg_arena_plan {
    plan_buffer *buffers;
    size_t count, capacity;
    uint64_t max_chunk_bytes; /* 0: no limit */
    bool packed;
    uint64_t *chunk_bytes; /* chunk_count entries once packed */
    uint32_t chunk_count;
    mg_arena_summary summary; /* valid when packed */
};

typedef struct arena_chunk {
    mg_devptr raw;        /* what mg_alloc_at returned; 0 once freed */
    mg_devptr base;       /* raw rounded up to the chunk's largest alignment */
    uint64_t alloc_bytes; /* bytes requested from the backend */
} arena_chunk;

struct mg_arena {
    mg_backend *backend;
    mg_arena_plan plan; /* a packed private copy */
    arena_chunk *chunks;
    bool released;
};

/* ------------------------------------------------------------------ plans */

mg_status mg_arena_plan_create(mg_arena_plan **out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_create: NULL output pointer");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_arena_plan_create: %zu bytes of host memory",
                        sizeof **out);
    return MG_OK;
}

static void plan_free_contents(mg_arena_plan *plan) {
    free(plan->buffers);
    free(plan->chunk_bytes);
    memset(plan, 0, sizeof *plan);
}

void mg_arena_plan_destroy(mg_arena_plan *plan) {
    if (!plan)
        return;
    plan_free_contents(plan);
    free(plan);
}

static bool is_power_of_two(uint64_t v) {
    return v && !(v & (v - 1));
}

/* Index of `name` or SIZE_MAX. */
static size_t plan_index_of(const mg_arena_plan *plan, const char *name) {
    if (!name)
        return SIZE_MAX;
    for (size_t i = 0; i < plan->count; i++)
        if (strcmp(plan->buffers[i].name, name) == 0)
            return i;
    return SIZE_MAX;
}

mg_status mg_arena_plan_add(mg_arena_plan *plan, const char *name, uint64_t bytes,
                            uint64_t alignment, const mg_arena_lifetime *lifetime,
                            size_t *index_out) {
    if (!plan || !name)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_add: NULL %s",
                        plan ? "name" : "plan");
    size_t len = strlen(name);
    if (len == 0 || len >= MG_ARENA_NAME_BYTES)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_add: name '%.60s' has %zu characters (1..%d allowed)", name,
                        len, MG_ARENA_NAME_BYTES - 1);
    if (alignment == 0)
        alignment = MG_ARENA_DEFAULT_ALIGNMENT;
    if (!is_power_of_two(alignment) || alignment > MG_ARENA_MAX_ALIGNMENT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_add: buffer '%s': alignment %" PRIu64
                        " is not a power of two <= %llu",
                        name, alignment, (unsigned long long)MG_ARENA_MAX_ALIGNMENT);
    if (lifetime && lifetime->first_step > lifetime->last_step)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_add: buffer '%s': lifetime [%u, %u] ends before it "
                        "starts",
                        name, lifetime->first_step, lifetime->last_step);
    if (plan_index_of(plan, name) != SIZE_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_add: buffer '%s' already planned",
                        name);
    if (plan->count == plan->capacity) {
        size_t cap = plan->capacity ? plan->capacity * 2 : 32;
        plan_buffer *grown = realloc(plan->buffers, cap * sizeof *grown);
        if (!grown)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                            "mg_arena_plan_add: growing the plan to %zu "
                            "buffers",
                            cap);
        plan->buffers = grown;
        plan->capacity = cap;
    }
    plan_buffer *pb = &plan->buffers[plan->count];
    memset(pb, 0, sizeof *pb);
    memcpy(pb->name, name, len + 1);
    pb->bytes = bytes;
    pb->alignment = alignment;
    pb->has_lifetime = lifetime != NULL;
    if (lifetime)
        pb->lifetime = *lifetime;
    if (index_out)
        *index_out = plan->count;
    plan->count++;
    plan->packed = false;
    return MG_OK;
}

mg_status mg_arena_plan_set_max_chunk_bytes(mg_arena_plan *plan, uint64_t max_chunk_bytes) {
    if (!plan)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_set_max_chunk_bytes: NULL plan");
    if (max_chunk_bytes != plan->max_chunk_bytes)
        plan->packed = false;
    plan->max_chunk_bytes = max_chunk_bytes;
    return MG_OK;
}

size_t mg_arena_plan_count(const mg_arena_plan *plan) {
    return plan ? plan->count : 0;
}

/* Largest alignment among the non-empty buffers of chunk `c` (at least the default). */
static uint64_t chunk_alignment(const mg_arena_plan *plan, uint32_t c) {
    uint64_t a = MG_ARENA_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < plan->count; i++)
        if (plan->buffers[i].bytes && plan->buffers[i].place.chunk == c &&
            plan->buffers[i].alignment > a)
            a = plan->buffers[i].alignment;
    return a;
}

mg_status mg_arena_plan_pack(mg_arena_plan *plan) {
    if (!plan)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_pack: NULL plan");
    if (plan->packed)
        return MG_OK;
    size_t n = plan->count;
    mg_pack_item *items = calloc(n ? n : 1, sizeof *items);
    mg_pack_place *places = malloc((n ? n : 1) * sizeof *places);
    uint64_t *chunk_bytes = malloc((n ? n : 1) * sizeof *chunk_bytes);
    mg_status st = MG_OK;
    if (!items || !places || !chunk_bytes) {
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_arena_plan_pack: scratch for %zu buffers", n);
        goto done;
    }
    mg_arena_summary sum = {.buffer_count = n};
    for (size_t i = 0; i < n; i++) {
        const plan_buffer *pb = &plan->buffers[i];
        items[i] = (mg_pack_item){
            .bytes = pb->bytes,
            .alignment = pb->alignment,
            .first_step = pb->has_lifetime ? pb->lifetime.first_step : 0,
            .last_step = pb->has_lifetime ? pb->lifetime.last_step : UINT32_MAX,
            .name = pb->name,
        };
        if (pb->bytes > UINT64_MAX - sum.sum_bytes) {
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                          "mg_arena_plan_pack: sizes add up to more than 2^64 bytes at '%s'",
                          pb->name);
            goto done;
        }
        sum.sum_bytes += pb->bytes;
    }
    uint32_t chunks = 0;
    st = mg_pack_items(items, n, plan->max_chunk_bytes, places, chunk_bytes, &chunks);
    if (st != MG_OK)
        goto done;

    for (size_t i = 0; i < n; i++)
        plan->buffers[i].place = places[i];
    /* The backend guarantees 256-byte alignment, so a chunk holding a buffer aligned above
     * that is over-allocated by the difference and its base rounded up (mg_arena_create). */
    sum.chunk_count = chunks;
    for (uint32_t c = 0; c < chunks; c++) {
        sum.arena_bytes += chunk_bytes[c];
        sum.device_bytes +=
            chunk_bytes[c] + (chunk_alignment(plan, c) - MG_ARENA_DEFAULT_ALIGNMENT);
        if (chunk_bytes[c] > sum.largest_chunk_bytes)
            sum.largest_chunk_bytes = chunk_bytes[c];
    }
    sum.peak_live_bytes = mg_pack_peak_live_bytes(items, n);

    free(plan->chunk_bytes);
    plan->chunk_bytes = chunk_bytes;
    chunk_bytes = NULL;
    plan->chunk_count = chunks;
    plan->summary = sum;
    plan->packed = true;
done:
    free(items);
    free(places);
    free(chunk_bytes);
    return st;
}

mg_status mg_arena_plan_summary(mg_arena_plan *plan, mg_arena_summary *out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_summary: NULL output");
    mg_status st = mg_arena_plan_pack(plan);
    if (st == MG_OK)
        *out = plan->summary;
    return st;
}

static void buffer_info_of(const plan_buffer *pb, mg_arena_buffer_info *out) {
    *out = (mg_arena_buffer_info){
        .name = pb->name,
        .bytes = pb->bytes,
        .alignment = pb->alignment,
        .has_lifetime = pb->has_lifetime,
        .lifetime = pb->lifetime,
        .chunk = pb->bytes ? pb->place.chunk : 0,
        .offset = pb->bytes ? pb->place.offset : 0,
        .ptr = 0,
    };
}

mg_status mg_arena_plan_buffer(mg_arena_plan *plan, size_t index, mg_arena_buffer_info *out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_buffer: NULL output");
    mg_status st = mg_arena_plan_pack(plan);
    if (st != MG_OK)
        return st;
    if (index >= plan->count)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_buffer: index %zu out of range (%zu buffers)", index,
                        plan->count);
    buffer_info_of(&plan->buffers[index], out);
    return MG_OK;
}

mg_status mg_arena_plan_find(const mg_arena_plan *plan, const char *name, size_t *index_out) {
    if (!plan || !name || !index_out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_find: NULL argument");
    size_t i = plan_index_of(plan, name);
    if (i == SIZE_MAX)
        return MG_ERROR(MG_ERR_NOT_FOUND, "mg_arena_plan_find: no buffer named '%.60s'", name);
    *index_out = i;
    return MG_OK;
}

/* "[2, 5]" or "always". */
static const char *format_lifetime(const plan_buffer *pb, char *buf, size_t buf_bytes) {
    if (pb->has_lifetime)
        snprintf(buf, buf_bytes, "[%u, %u]", pb->lifetime.first_step, pb->lifetime.last_step);
    else
        snprintf(buf, buf_bytes, "always");
    return buf;
}

mg_status mg_arena_plan_print(mg_arena_plan *plan, FILE *f) {
    if (!f)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_print: NULL stream");
    mg_status st = mg_arena_plan_pack(plan);
    if (st != MG_OK)
        return st;
    fprintf(f, "%4s  %-24s %16s %10s  %6s  %-10s %5s %16s\n", "#", "buffer", "bytes", "", "align",
            "steps", "chunk", "offset");
    for (size_t i = 0; i < plan->count; i++) {
        const plan_buffer *pb = &plan->buffers[i];
        char size[32], steps[32];
        fprintf(f, "%4zu  %-24s %16" PRIu64 " %10s  %6" PRIu64 "  %-10s %5u %16" PRIu64 "\n", i,
                pb->name, pb->bytes, mg_format_bytes(pb->bytes, size, sizeof size), pb->alignment,
                format_lifetime(pb, steps, sizeof steps), pb->bytes ? pb->place.chunk : 0,
                pb->bytes ? pb->place.offset : 0);
    }
    const mg_arena_summary *s = &plan->summary;
    char a[32], b[32], c[32];
    fprintf(f, "buffers %zu, chunks %u\n", s->buffer_count, s->chunk_count);
    fprintf(f, "total (unpacked) %" PRIu64 " bytes (%s)\n", s->sum_bytes,
            mg_format_bytes(s->sum_bytes, a, sizeof a));
    fprintf(f, "packed arena     %" PRIu64 " bytes (%s), packed/unpacked %.4f\n", s->arena_bytes,
            mg_format_bytes(s->arena_bytes, b, sizeof b),
            s->sum_bytes ? (double)s->arena_bytes / (double)s->sum_bytes : 1.0);
    fprintf(f, "peak live (lower bound) %" PRIu64 " bytes (%s)\n", s->peak_live_bytes,
            mg_format_bytes(s->peak_live_bytes, c, sizeof c));
    return MG_OK;
}

/* Deep copy of a packed plan into `dst` (zeroed on failure). */
static mg_status plan_copy(const mg_arena_plan *src, mg_arena_plan *dst) {
    memset(dst, 0, sizeof *dst);
    size_t n = src->count ? src->count : 1;
    uint32_t chunks = src->chunk_count ? src->chunk_count : 1;
    dst->buffers = malloc(n * sizeof *dst->buffers);
    dst->chunk_bytes = malloc(chunks * sizeof *dst->chunk_bytes);
    if (!dst->buffers || !dst->chunk_bytes) {
        plan_free_contents(dst);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_arena_create: copying a plan of %zu buffers",
                        src->count);
    }
    memcpy(dst->buffers, src->buffers, src->count * sizeof *dst->buffers);
    memcpy(dst->chunk_bytes, src->chunk_bytes, src->chunk_count * sizeof *dst->chunk_bytes);
    dst->count = dst->capacity = src->count;
    dst->max_chunk_bytes = src->max_chunk_bytes;
    dst->packed = src->packed;
    dst->chunk_count = src->chunk_count;
    dst->summary = src->summary;
    return MG_OK;
}

/* ------------------------------------------------------------------ arenas */

/* Sets the failure message of chunk `c`: which chunk, its size, what it holds. */
static mg_status report_chunk_failure(const mg_arena_plan *plan, uint32_t c, uint64_t alloc_bytes,
                                      mg_status st, const char *file, int line) {
    char reason[768];
    snprintf(reason, sizeof reason, "%s", mg_last_error());
    size_t held = 0;
    const plan_buffer *largest = NULL;
    for (size_t i = 0; i < plan->count; i++) {
        const plan_buffer *pb = &plan->buffers[i];
        if (!pb->bytes || pb->place.chunk != c)
            continue;
        held++;
        if (!largest || pb->bytes > largest->bytes)
            largest = pb;
    }
    char size[32], big[32];
    return mg_error_set(
        st, reason[0] ? NULL : file, line,
        "mg_arena_create: chunk %u of %u, %" PRIu64
        " bytes (%s) for %zu buffers, largest '%s' of %" PRIu64 " bytes (%s), failed: %s",
        c + 1, plan->chunk_count, alloc_bytes, mg_format_bytes(alloc_bytes, size, sizeof size),
        held, largest ? largest->name : "?", largest ? largest->bytes : 0,
        mg_format_bytes(largest ? largest->bytes : 0, big, sizeof big),
        reason[0] ? reason : mg_status_name(st));
}

mg_status mg_arena_create_at(mg_backend *b, mg_arena_plan *plan, mg_arena **out, const char *file,
                             int line) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_create: NULL output pointer");
    *out = NULL;
    if (!b || !plan)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_create: NULL %s",
                        b ? "plan" : "backend");
    mg_status st = mg_arena_plan_pack(plan);
    if (st != MG_OK)
        return st;
    mg_arena *arena = calloc(1, sizeof *arena);
    if (!arena)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_arena_create: %zu bytes of host memory",
                        sizeof *arena);
    arena->backend = b;
    st = plan_copy(plan, &arena->plan);
    if (st == MG_OK) {
        arena->chunks = calloc(plan->chunk_count ? plan->chunk_count : 1, sizeof *arena->chunks);
        if (!arena->chunks)
            st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_arena_create: table of %u chunks",
                          plan->chunk_count);
    }
    for (uint32_t c = 0; st == MG_OK && c < arena->plan.chunk_count; c++) {
        uint64_t align = chunk_alignment(&arena->plan, c);
        uint64_t alloc_bytes = arena->plan.chunk_bytes[c] + (align - MG_ARENA_DEFAULT_ALIGNMENT);
        if (alloc_bytes > SIZE_MAX) {
            st = report_chunk_failure(&arena->plan, c, alloc_bytes,
                                      MG_ERROR(MG_ERR_OUT_OF_MEMORY, "larger than size_t"), file,
                                      line);
            break;
        }
        mg_devptr raw = 0;
        mg_status a = mg_alloc_owned_at(b, (size_t)alloc_bytes, MG_ALLOC_ARENA, &raw, file, line);
        if (a != MG_OK) {
            st = report_chunk_failure(&arena->plan, c, alloc_bytes, a, file, line);
            break;
        }
        arena->chunks[c] = (arena_chunk){
            .raw = raw,
            .base = (raw + (align - 1)) & ~(mg_devptr)(align - 1),
            .alloc_bytes = alloc_bytes,
        };
    }
    if (st != MG_OK) {
        /* Free what was taken; keep the creation failure's message, not a free's. */
        char message[1024];
        snprintf(message, sizeof message, "%s", mg_last_error());
        mg_arena_destroy(arena);
        return mg_error_set(st, NULL, 0, "%s", message);
    }
    *out = arena;
    return MG_OK;
}

mg_status mg_arena_release(mg_arena *arena) {
    if (!arena || arena->released)
        return MG_OK;
    mg_status first = MG_OK;
    char message[1024] = "";
    for (uint32_t c = 0; arena->chunks && c < arena->plan.chunk_count; c++) {
        if (!arena->chunks[c].raw)
            continue;
        mg_status st = mg_free(arena->backend, arena->chunks[c].raw);
        if (st != MG_OK && first == MG_OK) {
            first = st;
            snprintf(message, sizeof message, "%s", mg_last_error());
        }
        arena->chunks[c].raw = 0;
        arena->chunks[c].base = 0;
    }
    arena->released = true;
    if (first != MG_OK)
        return mg_error_set(first, NULL, 0, "mg_arena_release: %s", message);
    return MG_OK;
}

mg_status mg_arena_destroy(mg_arena *arena) {
    if (!arena)
        return MG_OK;
    mg_status st = mg_arena_release(arena);
    plan_free_contents(&arena->plan);
    free(arena->chunks);
    free(arena);
    return st;
}

size_t mg_arena_count(const mg_arena *arena) {
    return arena ? arena->plan.count : 0;
}

mg_devptr mg_arena_ptr(const mg_arena *arena, size_t index) {
    if (!arena || arena->released || index >= arena->plan.count)
        return 0;
    const plan_buffer *pb = &arena->plan.buffers[index];
    if (!pb->bytes)
        return 0;
    return arena->chunks[pb->place.chunk].base + pb->place.offset;
}

size_t mg_arena_index(const mg_arena *arena, const char *name) {
    return arena ? plan_index_of(&arena->plan, name) : SIZE_MAX;
}

mg_status mg_arena_find(const mg_arena *arena, const char *name, mg_devptr *ptr_out,
                        uint64_t *bytes_out) {
    if (!arena || !name)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_find: NULL %s",
                        arena ? "name" : "arena");
    size_t i = plan_index_of(&arena->plan, name);
    if (i == SIZE_MAX)
        return MG_ERROR(MG_ERR_NOT_FOUND, "mg_arena_find: no buffer named '%.60s'", name);
    if (ptr_out)
        *ptr_out = mg_arena_ptr(arena, i);
    if (bytes_out)
        *bytes_out = arena->plan.buffers[i].bytes;
    return MG_OK;
}

mg_status mg_arena_buffer(const mg_arena *arena, size_t index, mg_arena_buffer_info *out) {
    if (!arena || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_buffer: NULL argument");
    if (index >= arena->plan.count)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_buffer: index %zu out of range (%zu buffers)", index,
                        arena->plan.count);
    buffer_info_of(&arena->plan.buffers[index], out);
    out->ptr = mg_arena_ptr(arena, index);
    return MG_OK;
}

mg_status mg_arena_summary_get(const mg_arena *arena, mg_arena_summary *out) {
    if (!arena || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_summary_get: NULL argument");
    *out = arena->plan.summary;
    return MG_OK;
}
