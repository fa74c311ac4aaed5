/*
 * backend.c - the public backend API (metrale/gpu.h): argument checks once, handle
 * wrapping, the ledger, capture and sticky-fault rules, then dispatch to the backend's ops
 * (backend_impl.h).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "error.h"
#include "metrale/host_heap.h"
#include "metrale/pinned.h"
#include "metrale/timing.h"
#include "op_cache.h"
#include "ops_attention_impl.h"
#include "ops_gemm_impl.h"

/* ------------------------------------------------------------------ kinds and drivers */

const char *mg_backend_kind_name(mg_backend_kind kind) {
    switch (kind) {
    case MG_BACKEND_CPU:
        return "cpu";
    case MG_BACKEND_CUDA:
        return "cuda";
    case MG_BACKEND_METAL:
        return "metal";
    case MG_BACKEND_AUTO:
        return "auto";
    }
    return "?";
}

mg_status mg_backend_kind_parse(const char *name, mg_backend_kind *out) {
    static const mg_backend_kind kinds[] = {MG_BACKEND_CPU, MG_BACKEND_CUDA, MG_BACKEND_METAL,
                                            MG_BACKEND_AUTO};
    if (name && out)
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (!strcmp(name, mg_backend_kind_name(kinds[i]))) {
                *out = kinds[i];
                return MG_OK;
            }
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                    "unknown backend '%s' (expected cpu, cuda, metal or auto)", name ? name : "");
}

static const mg_backend_driver *driver_of(mg_backend_kind kind) {
    switch (kind) {
    case MG_BACKEND_CPU:
        return &mg_cpu_backend_driver;
#ifdef METRALE_HAVE_CUDA
    case MG_BACKEND_CUDA:
        return &mg_cuda_backend_driver;
#endif
#ifdef METRALE_HAVE_METAL
    case MG_BACKEND_METAL:
        return &mg_metal_backend_driver;
#endif
    default:
        return NULL;
    }
}

mg_status mg_backend_probe_kind(mg_backend_kind kind, mg_backend_probe *out) {
    if (!out || kind > MG_BACKEND_METAL)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_probe_kind: %s",
                        out ? "kind must be cpu, cuda or metal" : "NULL output");
    memset(out, 0, sizeof *out);
    const mg_backend_driver *d = driver_of(kind);
    if (!d) {
        snprintf(out->reason, sizeof out->reason, "%s",
                 kind == MG_BACKEND_METAL
                     ? "not compiled in (this tree has no Metal backend; the kind is only declared)"
                     : "not compiled in (built without nvcc or with -DMETRALE_CUDA=OFF)");
        return MG_OK;
    }
    out->compiled_in = true;
    d->probe(out);
    out->compiled_in = true;
    return MG_OK;
}

/* ------------------------------------------------------------------ open backends */

#define MG_MAX_OPEN_BACKENDS 64

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    mg_backend_kind kind;
    int device;
    bool used;
} open_table[MG_MAX_OPEN_BACKENDS];

/* Claims (kind, device); MG_ERR_BUSY when it is already open. */
static mg_status claim_device(mg_backend_kind kind, int device) {
    pthread_mutex_lock(&open_lock);
    int free_slot = -1;
    for (int i = 0; i < MG_MAX_OPEN_BACKENDS; i++) {
        if (open_table[i].used && open_table[i].kind == kind && open_table[i].device == device) {
            pthread_mutex_unlock(&open_lock);
            return MG_ERROR(MG_ERR_BUSY, "mg_backend_open: %s device %d is already open",
                            mg_backend_kind_name(kind), device);
        }
        if (!open_table[i].used && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0) {
        pthread_mutex_unlock(&open_lock);
        return MG_ERROR(MG_ERR_BUSY, "mg_backend_open: %d backends already open",
                        MG_MAX_OPEN_BACKENDS);
    }
    open_table[free_slot].kind = kind;
    open_table[free_slot].device = device;
    open_table[free_slot].used = true;
    pthread_mutex_unlock(&open_lock);
    return MG_OK;
}

static void release_device(mg_backend_kind kind, int device) {
    pthread_mutex_lock(&open_lock);
    for (int i = 0; i < MG_MAX_OPEN_BACKENDS; i++)
        if (open_table[i].used && open_table[i].kind == kind && open_table[i].device == device)
            open_table[i].used = false;
    pthread_mutex_unlock(&open_lock);
}

/* ------------------------------------------------------------------ small helpers */

/* Appends `item` to a growable pointer array. */
static mg_status list_push(void ***items, size_t *count, size_t *capacity, void *item) {
    if (*count == *capacity) {
        size_t cap = *capacity ? *capacity * 2 : 16;
        void **grown = realloc(*items, cap * sizeof *grown);
        if (!grown)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "handle list growth to %zu", cap);
        *items = grown;
        *capacity = cap;
    }
    (*items)[(*count)++] = item;
    return MG_OK;
}

static bool list_remove(void **items, size_t *count, const void *item) {
    for (size_t i = 0; i < *count; i++)
        if (items[i] == item) {
            items[i] = items[--*count];
            return true;
        }
    return false;
}

#define LIST_PUSH(b, name, item)                                                                   \
    list_push((void ***)&(b)->name##s, &(b)->name##_count, &(b)->name##_capacity, (item))
#define LIST_REMOVE(b, name, item) list_remove((void **)(b)->name##s, &(b)->name##_count, (item))

/* The end of every destroy: drop the handle from its backend's list and the registry, then
 * free it. */
#define FORGET_HANDLE(b, name, handle)                                                             \
    do {                                                                                           \
        pthread_mutex_lock(&(b)->lock);                                                            \
        LIST_REMOVE(b, name, handle);                                                              \
        pthread_mutex_unlock(&(b)->lock);                                                          \
        mg_handle_unregister(handle);                                                              \
        free(handle);                                                                              \
    } while (0)

mg_status mg_backend_check_fault(mg_backend *b) {
    if (!atomic_load(&b->faulted))
        return MG_OK;
    char text[sizeof b->fault_message];
    pthread_mutex_lock(&b->lock);
    memcpy(text, b->fault_message, sizeof text);
    pthread_mutex_unlock(&b->lock);
    return mg_error_set(MG_ERR_DEVICE_FAULT, NULL, 0,
                        "%s (sticky device fault: the %s backend "
                        "is unusable until closed)",
                        text, mg_backend_kind_name(b->kind));
}

void mg_backend_set_fault(mg_backend *b, const char *message) {
    pthread_mutex_lock(&b->lock);
    if (!atomic_load(&b->faulted)) {
        snprintf(b->fault_message, sizeof b->fault_message, "%s", message ? message : "");
        atomic_store(&b->faulted, true);
    }
    pthread_mutex_unlock(&b->lock);
}

/* Entry check of every call taking a backend: live handle, no sticky fault. */
static mg_status enter(mg_backend *b, const char *fn) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s backend handle %p", fn,
                        b ? "invalid or closed" : "NULL", (void *)b);
    return mg_backend_check_fault(b);
}

/* Validates `s` (NULL = default stream) as a live stream of `b`. */
static mg_status resolve_stream(mg_backend *b, mg_stream *s, const char *fn, mg_stream **out) {
    if (!s) {
        *out = b->default_stream;
        return MG_OK;
    }
    if (!mg_handle_is(s, MG_HANDLE_STREAM))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: invalid or destroyed stream handle %p", fn,
                        (void *)s);
    if (s->owner != b)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: stream %p belongs to another backend (%s device %d)", fn, (void *)s,
                        mg_backend_kind_name(s->owner->kind), s->owner->device);
    *out = s;
    return MG_OK;
}

/* Blocking work would wait on (or, on CUDA, invalidate) an active capture. */
static mg_status refuse_while_capturing(mg_backend *b, const char *fn) {
    if (atomic_load(&b->capturing_streams) > 0)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "%s: not allowed while a stream of this backend is capturing a graph "
                        "(blocking calls and allocations would break the capture; do them "
                        "before mg_graph_begin_capture or after mg_graph_end_capture)",
                        fn);
    return MG_OK;
}

/* Unregisters (before anyone else can reuse the memory) and frees one host block. */
static mg_status release_host_block(mg_backend *b, void *host) {
    if (b->ops->supports(b->ctx, MG_CAP_PINNED_HOST))
        mg_pinned_unregister(host);
    if (b->ops->host_free)
        return b->ops->host_free(b->ctx, host);
    mg_host_heap_free(host);
    return MG_OK;
}

/* Is [p, p + bytes) inside a host block whose device address was handed out? */
static bool in_mapped_host_block(mg_backend *b, mg_devptr p, size_t bytes) {
    bool hit = false;
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < b->host_block_count && !hit; i++) {
        const mg_host_block *h = b->host_blocks[i];
        hit = h->mapped && p >= h->mapped && p - h->mapped < h->bytes &&
              bytes <= h->bytes - (p - h->mapped);
    }
    pthread_mutex_unlock(&b->lock);
    return hit;
}

/* A device range must be non-null, must not wrap, and must lie inside one live allocation
 * when its start is in the ledger (always, for backends with strict pointers). */
mg_status mg_backend_check_device_range(mg_backend *b, mg_devptr p, size_t bytes, const char *fn,
                                        const char *what) {
    if (p == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL device pointer for %s", fn, what);
    if (bytes > UINT64_MAX - p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s range 0x%llx + %zu wraps around", fn, what,
                        (unsigned long long)p, bytes);
    mg_ledger_entry e;
    if (mg_ledger_find(&b->ledger, p, &e)) {
        uint64_t room = e.base + e.bytes - p;
        if (bytes > room)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: %s range [0x%llx, +%zu) overruns its allocation [0x%llx, +%llu) "
                            "(made at %s:%d) by %llu bytes",
                            fn, what, (unsigned long long)p, bytes, (unsigned long long)e.base,
                            (unsigned long long)e.bytes, mg_path_basename(e.file), e.line,
                            (unsigned long long)(bytes - room));
        return MG_OK;
    }
    if (b->ops->pointers_checked_strictly && !in_mapped_host_block(b, p, bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s 0x%llx is not inside any live allocation of this backend "
                        "(never allocated, or already freed)",
                        fn, what, (unsigned long long)p);
    return MG_OK;
}

static mg_status check_host(const void *p, size_t bytes, const char *fn, const char *what) {
    if (!p && bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL host pointer for %s (%zu bytes)", fn,
                        what, bytes);
    return MG_OK;
}

/* ------------------------------------------------------------------ open and close */

static mg_status wrap_stream(mg_backend *b, void *impl, bool is_default, mg_stream **out) {
    mg_stream *s = calloc(1, sizeof *s);
    if (!s)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "stream handle");
    s->owner = b;
    s->impl = impl;
    s->is_default = is_default;
    mg_status st = mg_handle_register(s, MG_HANDLE_STREAM);
    if (st == MG_OK && !is_default) {
        pthread_mutex_lock(&b->lock);
        st = LIST_PUSH(b, stream, s);
        pthread_mutex_unlock(&b->lock);
        if (st)
            mg_handle_unregister(s);
    }
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return MG_OK;
}

static void free_backend_struct(mg_backend *b) {
    mg_ledger_destroy(&b->ledger);
    pthread_mutex_destroy(&b->lock);
    free(b->streams);
    free(b->events);
    free(b->graphs);
    free(b->host_blocks); /* the records themselves were freed with their blocks */
    free(b->modules);
    free(b);
}

static mg_status open_kind(mg_backend_kind kind, int device, mg_backend **out) {
    const mg_backend_driver *d = driver_of(kind);
    if (!d)
        return MG_ERROR(MG_ERR_UNAVAILABLE, "mg_backend_open: the %s backend is not compiled in",
                        mg_backend_kind_name(kind));
    mg_status st = claim_device(kind, device);
    if (st)
        return st;
    const mg_backend_ops *ops = NULL;
    void *ctx = NULL;
    st = d->open(device, &ops, &ctx);
    if (st) {
        release_device(kind, device);
        return st;
    }
    if (!ops || ops->version != MG_BACKEND_OPS_VERSION) {
        if (ops && ops->destroy)
            ops->destroy(ctx);
        release_device(kind, device);
        return MG_ERROR(MG_ERR_INTERNAL, "mg_backend_open: %s backend ops version mismatch",
                        mg_backend_kind_name(kind));
    }
    mg_backend *b = calloc(1, sizeof *b);
    if (!b) {
        ops->destroy(ctx);
        release_device(kind, device);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_backend_open: backend struct");
    }
    b->ops = ops;
    b->ctx = ctx;
    b->kind = kind;
    b->device = device;
    mg_ledger_init(&b->ledger);
    pthread_mutex_init(&b->lock, NULL);
    st = mg_handle_register(b, MG_HANDLE_BACKEND);
    if (st == MG_OK) {
        st = mg_op_cache_create(b, &b->op_cache);
        void *stream_impl = NULL;
        if (st == MG_OK)
            st = ops->stream_create(ctx, true, &stream_impl);
        if (st == MG_OK) {
            st = wrap_stream(b, stream_impl, true, &b->default_stream);
            if (st)
                ops->stream_destroy(ctx, stream_impl);
        }
        if (st) {
            mg_op_cache_release(b->op_cache);
            mg_handle_unregister(b);
        }
    }
    if (st) {
        ops->destroy(ctx);
        free_backend_struct(b);
        release_device(kind, device);
        return st;
    }
    if (ops->attach)
        ops->attach(ctx, b);
    *out = b;
    return MG_OK;
}

mg_status mg_backend_open(mg_backend_kind kind, int device, mg_backend **out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_open: NULL output pointer");
    *out = NULL;
    if (device < 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_open: device %d is negative", device);
    if (kind == MG_BACKEND_AUTO) {
        static const mg_backend_kind order[] = {MG_BACKEND_CUDA, MG_BACKEND_METAL, MG_BACKEND_CPU};
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
            mg_backend_probe p;
            mg_backend_probe_kind(order[i], &p);
            if (p.usable && device < p.device_count)
                return open_kind(order[i], device, out);
        }
        return MG_ERROR(MG_ERR_UNAVAILABLE, "mg_backend_open: no usable backend has device %d",
                        device);
    }
    if (kind > MG_BACKEND_METAL)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_open: unknown backend kind %d",
                        (int)kind);
    return open_kind(kind, device, out);
}

mg_status mg_backend_close(mg_backend *b) {
    if (!b)
        return MG_OK;
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_close: invalid or closed backend %p",
                        (void *)b);
    mg_handle_unregister(b); /* no new calls get in from here on */
    const mg_backend_ops *ops = b->ops;
    mg_status first = MG_OK;
#define KEEP_FIRST(expr)                                                                           \
    do {                                                                                           \
        mg_status st_ = (expr);                                                                    \
        if (st_ && !first)                                                                         \
            first = st_;                                                                           \
    } while (0)

    /* Captures are abandoned, then all work is waited for before anything is freed. */
    for (size_t i = 0; i < b->stream_count; i++)
        if (atomic_load(&b->streams[i]->capturing) && ops->graph_abort_capture)
            ops->graph_abort_capture(b->ctx, b->streams[i]->impl);
    if (atomic_load(&b->default_stream->capturing) && ops->graph_abort_capture)
        ops->graph_abort_capture(b->ctx, b->default_stream->impl);
    if (!atomic_load(&b->faulted)) {
        for (size_t i = 0; i < b->stream_count; i++)
            KEEP_FIRST(ops->stream_synchronize(b->ctx, b->streams[i]->impl));
        KEEP_FIRST(ops->stream_synchronize(b->ctx, b->default_stream->impl));
    }
    /* The op cache frees scratch through the public API, which needs the handle live. */
    mg_handle_register(b, MG_HANDLE_BACKEND);
    atomic_store(&b->capturing_streams, 0);
    mg_gemm_release(b); /* cuBLASLt handle and plans; its workspaces are op-cache scratch */
    mg_op_cache_release(b->op_cache);
    mg_handle_unregister(b);

    for (size_t i = 0; i < b->graph_count; i++) {
        KEEP_FIRST(ops->graph_destroy(b->ctx, b->graphs[i]->impl));
        mg_handle_unregister(b->graphs[i]);
        free(b->graphs[i]);
    }
    for (size_t i = 0; i < b->event_count; i++) {
        KEEP_FIRST(ops->event_destroy(b->ctx, b->events[i]->impl));
        mg_handle_unregister(b->events[i]);
        free(b->events[i]);
    }
    for (size_t i = 0; i < b->stream_count; i++) {
        KEEP_FIRST(ops->stream_destroy(b->ctx, b->streams[i]->impl));
        mg_handle_unregister(b->streams[i]);
        free(b->streams[i]);
    }
    KEEP_FIRST(ops->stream_destroy(b->ctx, b->default_stream->impl));
    mg_handle_unregister(b->default_stream);
    free(b->default_stream);

    for (size_t i = 0; i < b->host_block_count; i++) {
        KEEP_FIRST(release_host_block(b, b->host_blocks[i]->host));
        free(b->host_blocks[i]);
    }
    mg_ledger_entry e;
    while (mg_ledger_pop(&b->ledger, true, &e))
        KEEP_FIRST(ops->free(b->ctx, e.base, e.kind));
    if (b->module_count && ops->module_unload_model)
        for (size_t i = 0; i < b->module_count; i++)
            ops->module_unload_model(b->ctx, b->modules[i].model); /* repeated models: no-op */
    ops->destroy(b->ctx);
    release_device(b->kind, b->device);
    free_backend_struct(b);
#undef KEEP_FIRST
    return first;
}

mg_backend_kind mg_backend_get_kind(const mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->kind : MG_BACKEND_AUTO;
}

mg_status mg_device_get_info(mg_backend *b, mg_device_info *out) {
    mg_status st = enter(b, "mg_device_get_info");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_device_get_info: NULL output");
    memset(out, 0, sizeof *out);
    return b->ops->device_info(b->ctx, out);
}

mg_status mg_memory_free_bytes(mg_backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    mg_status st = enter(b, "mg_memory_free_bytes");
    if (st)
        return st;
    if (!free_bytes && !total_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_memory_free_bytes: no output pointer");
    uint64_t f = 0, t = 0, d = 0;
    st = b->ops->memory_info(b->ctx, &f, &t, &d);
    if (st == MG_OK) {
        if (free_bytes)
            *free_bytes = f;
        if (total_bytes)
            *total_bytes = t;
    }
    return st;
}

mg_status mg_memory_device_free_bytes(mg_backend *b, uint64_t *free_bytes) {
    mg_status st = enter(b, "mg_memory_device_free_bytes");
    if (st)
        return st;
    if (!free_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_memory_device_free_bytes: NULL output");
    uint64_t f = 0, t = 0;
    return b->ops->memory_info(b->ctx, &f, &t, free_bytes);
}

bool mg_backend_supports(const mg_backend *b, mg_capability cap) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND) || cap >= MG_CAP_COUNT)
        return false;
    if (cap == MG_CAP_OP_GEMM_BF16 || cap == MG_CAP_OP_GEMM_FP8) /* the op layer knows */
        return mg_gemm_supports((mg_backend *)b, cap);
    if (cap == MG_CAP_OP_ATTENTION_RAGGED)
        return mg_attention_supports((mg_backend *)b);
    return b->ops->supports(b->ctx, cap);
}

/* ------------------------------------------------------------------ memory and ledger */

static mg_status alloc_impl(mg_backend *b, size_t bytes, mg_alloc_kind kind, bool owned,
                            mg_devptr *out, const char *file, int line) {
    mg_status st = enter(b, "mg_alloc");
    if (st)
        return st;
    if (!out)
        return mg_error_set(MG_ERR_INVALID_ARGUMENT, file, line, "mg_alloc: NULL output pointer");
    *out = 0;
    if (bytes == 0)
        return mg_error_set(MG_ERR_INVALID_ARGUMENT, file, line, "mg_alloc: zero bytes requested");
    if (kind > MG_ALLOC_ARENA)
        return mg_error_set(MG_ERR_INVALID_ARGUMENT, file, line, "mg_alloc: unknown kind %d",
                            (int)kind);
    if (kind == MG_ALLOC_MANAGED && !b->ops->supports(b->ctx, MG_CAP_MANAGED_MEMORY))
        return mg_error_set(MG_ERR_UNSUPPORTED, file, line,
                            "mg_alloc_managed: the %s backend has no managed memory",
                            mg_backend_kind_name(b->kind));
    if ((st = refuse_while_capturing(b, "mg_alloc")))
        return st;
    mg_devptr p = 0;
    st = b->ops->alloc(b->ctx, bytes, kind, &p);
    if (st) {
        /* The backend names the failing call; the caller learns the size and its own site. */
        char size[32], reason[640];
        snprintf(reason, sizeof reason, "%s", mg_last_error());
        return mg_error_set(st, file, line, "%s, requested %s", reason,
                            mg_format_bytes(bytes, size, sizeof size));
    }
    mg_ledger_entry e = {p, bytes, kind, file, line, owned};
    st = mg_ledger_add(&b->ledger, &e);
    if (st) {
        b->ops->free(b->ctx, p, kind);
        return st;
    }
    *out = p;
    return MG_OK;
}

mg_status mg_alloc_at(mg_backend *b, size_t bytes, mg_alloc_kind kind, mg_devptr *out,
                      const char *file, int line) {
    return alloc_impl(b, bytes, kind, false, out, file, line);
}

mg_status mg_alloc_owned_at(mg_backend *b, size_t bytes, mg_alloc_kind kind, mg_devptr *out,
                            const char *file, int line) {
    return alloc_impl(b, bytes, kind, true, out, file, line);
}

mg_status mg_free(mg_backend *b, mg_devptr ptr) {
    /* Frees work on a faulted backend too: teardown must be able to release memory. */
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_free: invalid or closed backend %p",
                        (void *)b);
    if (ptr == 0)
        return MG_OK;
    mg_ledger_entry e;
    if (!mg_ledger_remove(&b->ledger, ptr, &e)) {
        if (mg_ledger_find(&b->ledger, ptr, &e))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_free: 0x%llx is an interior pointer, %llu bytes into the "
                            "allocation at 0x%llx made at %s:%d; free the base address",
                            (unsigned long long)ptr, (unsigned long long)(ptr - e.base),
                            (unsigned long long)e.base, mg_path_basename(e.file), e.line);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_free: 0x%llx is not a live allocation (never allocated, or already "
                        "freed)",
                        (unsigned long long)ptr);
    }
    return b->ops->free(b->ctx, e.base, e.kind);
}

mg_status mg_ledger_live(mg_backend *b, uint64_t *live_bytes, uint64_t *live_count) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_ledger_live: invalid backend %p", (void *)b);
    mg_ledger_totals(&b->ledger, live_bytes, live_count);
    return MG_OK;
}

mg_status mg_ledger_top_sites(mg_backend *b, uint64_t min_bytes, mg_ledger_site *out,
                              size_t max_sites, size_t *written) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_ledger_top_sites: invalid backend %p",
                        (void *)b);
    if ((!out && max_sites) || !written)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_ledger_top_sites: NULL output");
    return mg_ledger_sites(&b->ledger, min_bytes, out, max_sites, written);
}

mg_status mg_ledger_report(mg_backend *b, FILE *f, size_t top_n, uint64_t min_bytes) {
    if (!f)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_ledger_report: NULL FILE");
    mg_ledger_site sites[64];
    size_t n = 0;
    mg_status st = mg_ledger_top_sites(b, min_bytes, sites, top_n < 64 ? top_n : 64, &n);
    if (st)
        return st;
    uint64_t bytes = 0, count = 0;
    mg_ledger_totals(&b->ledger, &bytes, &count);
    char size[32];
    fprintf(f, "ledger: %llu live allocations, %s\n", (unsigned long long)count,
            mg_format_bytes(bytes, size, sizeof size));
    for (size_t i = 0; i < n; i++)
        fprintf(f, "  %12s in %4llu allocations at %s:%d\n",
                mg_format_bytes(sites[i].bytes, size, sizeof size),
                (unsigned long long)sites[i].count, mg_path_basename(sites[i].file), sites[i].line);
    return MG_OK;
}

mg_status mg_ledger_sweep(mg_backend *b, uint64_t *freed_bytes, uint64_t *freed_count) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_ledger_sweep: invalid backend %p", (void *)b);
    uint64_t bytes = 0, count = 0;
    mg_status first = MG_OK;
    mg_ledger_entry e;
    while (mg_ledger_pop(&b->ledger, false, &e)) {
        mg_status st = b->ops->free(b->ctx, e.base, e.kind);
        if (st && !first)
            first = st;
        bytes += e.bytes;
        count++;
    }
    if (freed_bytes)
        *freed_bytes = bytes;
    if (freed_count)
        *freed_count = count;
    return first;
}

/* ------------------------------------------------------------------ copies */

/* What one copy or memset touches. Every transfer makes the same checks (check_transfer),
 * then dispatches; `bytes` 0 is validated and does nothing. */
typedef struct transfer {
    const char *fn;
    bool async;            /* stream-ordered, else blocking (refused during a capture) */
    mg_stream *stream;     /* async: NULL is the default stream */
    const char *host_role; /* "source" / "destination", NULL when no host side */
    const void *host;
    const char *dst_role, *src_role; /* non-NULL for each device side */
    mg_devptr dst, src;
    size_t dst_span, src_span;
} transfer;

/* Validates a transfer; *rs receives the backend's stream object of an async one. */
static mg_status check_transfer(mg_backend *b, const transfer *t, size_t bytes, void **rs) {
    mg_status st = enter(b, t->fn);
    if (st)
        return st;
    if (t->async) {
        mg_stream *resolved = NULL;
        if ((st = resolve_stream(b, t->stream, t->fn, &resolved)))
            return st;
        *rs = resolved->impl;
    } else if ((st = refuse_while_capturing(b, t->fn))) {
        return st;
    }
    if (t->host_role && (st = check_host(t->host, bytes, t->fn, t->host_role)))
        return st;
    if (t->dst_role &&
        (st = mg_backend_check_device_range(b, t->dst, t->dst_span, t->fn, t->dst_role)))
        return st;
    if (t->src_role &&
        (st = mg_backend_check_device_range(b, t->src, t->src_span, t->fn, t->src_role)))
        return st;
    return MG_OK;
}

#define H2D(name, d, h, n)                                                                         \
    .fn = name, .host_role = "source", .host = h, .dst_role = "destination", .dst = d, .dst_span = n
#define D2H(name, h, sp, n)                                                                        \
    .fn = name, .host_role = "destination", .host = h, .src_role = "source", .src = sp,            \
    .src_span = n
#define D2D(name, d, sp, n)                                                                        \
    .fn = name, .dst_role = "destination", .dst = d, .dst_span = n, .src_role = "source",          \
    .src = sp, .src_span = n

mg_status mg_copy_h2d(mg_backend *b, mg_devptr dst, const void *src, size_t bytes) {
    mg_status st = check_transfer(b, &(transfer){H2D("mg_copy_h2d", dst, src, bytes)}, bytes, NULL);
    return st || !bytes ? st : b->ops->copy_h2d(b->ctx, dst, src, bytes);
}

mg_status mg_copy_d2h(mg_backend *b, void *dst, mg_devptr src, size_t bytes) {
    mg_status st = check_transfer(b, &(transfer){D2H("mg_copy_d2h", dst, src, bytes)}, bytes, NULL);
    return st || !bytes ? st : b->ops->copy_d2h(b->ctx, dst, src, bytes);
}

mg_status mg_copy_d2d(mg_backend *b, mg_devptr dst, mg_devptr src, size_t bytes) {
    mg_status st = check_transfer(b, &(transfer){D2D("mg_copy_d2d", dst, src, bytes)}, bytes, NULL);
    return st || !bytes ? st : b->ops->copy_d2d(b->ctx, dst, src, bytes);
}

static mg_status h2d_async(mg_backend *b, mg_devptr dst, const void *src, size_t bytes,
                           mg_stream *s, bool retained, const char *fn) {
    void *rs = NULL;
    mg_status st = check_transfer(
        b, &(transfer){H2D(fn, dst, src, bytes), .async = true, .stream = s}, bytes, &rs);
    return st || !bytes ? st : b->ops->copy_h2d_async(b->ctx, dst, src, bytes, rs, retained);
}

mg_status mg_copy_h2d_async(mg_backend *b, mg_devptr dst, const void *src, size_t bytes,
                            mg_stream *s) {
    return h2d_async(b, dst, src, bytes, s, false, "mg_copy_h2d_async");
}

mg_status mg_copy_h2d_async_retained(mg_backend *b, mg_devptr dst, const void *src, size_t bytes,
                                     mg_stream *s) {
    return h2d_async(b, dst, src, bytes, s, true, "mg_copy_h2d_async_retained");
}

mg_status mg_copy_d2h_async(mg_backend *b, void *dst, mg_devptr src, size_t bytes, mg_stream *s) {
    void *rs = NULL;
    mg_status st = check_transfer(
        b, &(transfer){D2H("mg_copy_d2h_async", dst, src, bytes), .async = true, .stream = s},
        bytes, &rs);
    return st || !bytes ? st : b->ops->copy_d2h_async(b->ctx, dst, src, bytes, rs);
}

mg_status mg_copy_d2d_async(mg_backend *b, mg_devptr dst, mg_devptr src, size_t bytes,
                            mg_stream *s) {
    void *rs = NULL;
    mg_status st = check_transfer(
        b, &(transfer){D2D("mg_copy_d2d_async", dst, src, bytes), .async = true, .stream = s},
        bytes, &rs);
    return st || !bytes ? st : b->ops->copy_d2d_async(b->ctx, dst, src, bytes, rs);
}

mg_status mg_copy_2d_d2d_async(mg_backend *b, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                               size_t src_pitch, size_t width_bytes, size_t height, mg_stream *s) {
    const char *fn = "mg_copy_2d_d2d_async";
    if (dst_pitch < width_bytes || src_pitch < width_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: pitches (dst %zu, src %zu) must be >= the row width %zu bytes", fn,
                        dst_pitch, src_pitch, width_bytes);
    size_t widest = dst_pitch > src_pitch ? dst_pitch : src_pitch;
    if (height > 1 && height - 1 > (SIZE_MAX - width_bytes) / widest)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %zu rows of pitch %zu overflow", fn, height,
                        widest);
    /* The last row needs only width_bytes, not a whole pitch. */
    bool empty = width_bytes == 0 || height == 0;
    transfer t = {D2D(fn, dst, src, 0), .async = true, .stream = s};
    t.dst_span = empty ? 0 : dst_pitch * (height - 1) + width_bytes;
    t.src_span = empty ? 0 : src_pitch * (height - 1) + width_bytes;
    void *rs = NULL;
    mg_status st = check_transfer(b, &t, 0, &rs);
    if (st || empty)
        return st;
    return b->ops->copy_2d_d2d_async(b->ctx, dst, dst_pitch, src, src_pitch, width_bytes, height,
                                     rs);
}

mg_status mg_memset(mg_backend *b, mg_devptr dst, uint8_t value, size_t bytes) {
    transfer t = {.fn = "mg_memset", .dst_role = "destination", .dst = dst, .dst_span = bytes};
    mg_status st = check_transfer(b, &t, bytes, NULL);
    return st || !bytes ? st : b->ops->memset(b->ctx, dst, value, bytes);
}

mg_status mg_memset_async(mg_backend *b, mg_devptr dst, uint8_t value, size_t bytes, mg_stream *s) {
    transfer t = {.fn = "mg_memset_async",
                  .async = true,
                  .stream = s,
                  .dst_role = "destination",
                  .dst = dst,
                  .dst_span = bytes};
    void *rs = NULL;
    mg_status st = check_transfer(b, &t, bytes, &rs);
    return st || !bytes ? st : b->ops->memset_async(b->ctx, dst, value, bytes, rs);
}

#undef H2D
#undef D2H
#undef D2D

/* ------------------------------------------------------------------ streams */

mg_stream *mg_stream_default(mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->default_stream : NULL;
}

mg_status mg_stream_create(mg_backend *b, mg_stream **out) {
    mg_status st = enter(b, "mg_stream_create");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_stream_create: NULL output");
    *out = NULL;
    void *impl = NULL;
    if ((st = b->ops->stream_create(b->ctx, false, &impl)))
        return st;
    if ((st = wrap_stream(b, impl, false, out)))
        b->ops->stream_destroy(b->ctx, impl);
    return st;
}

/* Validates a stream handle on its own (calls that take no backend). */
static mg_status stream_enter(mg_stream *s, const char *fn) {
    if (!mg_handle_is(s, MG_HANDLE_STREAM))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s stream handle %p", fn,
                        s ? "invalid or destroyed" : "NULL", (void *)s);
    return mg_backend_check_fault(s->owner);
}

mg_status mg_stream_destroy(mg_stream *s) {
    if (!s)
        return MG_OK;
    if (!mg_handle_is(s, MG_HANDLE_STREAM))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_stream_destroy: invalid or destroyed stream %p", (void *)s);
    mg_backend *b = s->owner;
    if (s->is_default)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_stream_destroy: the default stream belongs to the backend");
    if (atomic_load(&s->capturing))
        return MG_ERROR(MG_ERR_CAPTURING,
                        "mg_stream_destroy: stream is capturing; end or abort the capture first");
    mg_status st = MG_OK;
    if (!atomic_load(&b->faulted))
        st = b->ops->stream_synchronize(b->ctx, s->impl);
    /* The stream's work has completed (or the backend faulted and its memory is gone with
     * it): what the ops keep per stream can be freed before the stream goes. */
    mg_gemm_stream_destroyed(b, s);
    mg_op_cache_stream_destroyed(b->op_cache, s);
    mg_status destroyed = b->ops->stream_destroy(b->ctx, s->impl);
    FORGET_HANDLE(b, stream, s);
    return st ? st : destroyed;
}

mg_status mg_stream_synchronize(mg_stream *s) {
    mg_status st = stream_enter(s, "mg_stream_synchronize");
    if (st)
        return st;
    if (atomic_load(&s->capturing))
        return MG_ERROR(MG_ERR_CAPTURING,
                        "mg_stream_synchronize: the stream is capturing a graph; synchronize "
                        "after mg_graph_end_capture");
    return s->owner->ops->stream_synchronize(s->owner->ctx, s->impl);
}

mg_status mg_stream_is_capturing(mg_stream *s, bool *capturing) {
    mg_status st = stream_enter(s, "mg_stream_is_capturing");
    if (st)
        return st;
    if (!capturing)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_stream_is_capturing: NULL output");
    bool c = true; /* a failed query counts as capturing */
    st = s->owner->ops->stream_is_capturing(s->owner->ctx, s->impl, &c);
    *capturing = st ? true : (c || atomic_load(&s->capturing));
    return st;
}

/* ------------------------------------------------------------------ events */

static mg_status event_enter(mg_event *e, const char *fn) {
    if (!mg_handle_is(e, MG_HANDLE_EVENT))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s event handle %p", fn,
                        e ? "invalid or destroyed" : "NULL", (void *)e);
    return mg_backend_check_fault(e->owner);
}

mg_status mg_event_create(mg_backend *b, mg_event **out) {
    mg_status st = enter(b, "mg_event_create");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_event_create: NULL output");
    *out = NULL;
    mg_event *e = calloc(1, sizeof *e);
    if (!e)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "event handle");
    e->owner = b;
    if ((st = b->ops->event_create(b->ctx, &e->impl))) {
        free(e);
        return st;
    }
    st = mg_handle_register(e, MG_HANDLE_EVENT);
    if (st == MG_OK) {
        pthread_mutex_lock(&b->lock);
        st = LIST_PUSH(b, event, e);
        pthread_mutex_unlock(&b->lock);
        if (st)
            mg_handle_unregister(e);
    }
    if (st) {
        b->ops->event_destroy(b->ctx, e->impl);
        free(e);
        return st;
    }
    *out = e;
    return MG_OK;
}

mg_status mg_event_record(mg_event *e, mg_stream *s) {
    mg_status st = event_enter(e, "mg_event_record");
    mg_stream *rs = NULL;
    if (!st)
        st = resolve_stream(e->owner, s, "mg_event_record", &rs);
    if (st)
        return st;
    return e->owner->ops->event_record(e->owner->ctx, e->impl, rs->impl);
}

mg_status mg_stream_wait_event(mg_stream *s, mg_event *e) {
    mg_status st = stream_enter(s, "mg_stream_wait_event");
    if (!st)
        st = event_enter(e, "mg_stream_wait_event");
    if (st)
        return st;
    if (e->owner != s->owner)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_stream_wait_event: stream and event belong to different backends");
    return s->owner->ops->stream_wait_event(s->owner->ctx, s->impl, e->impl);
}

mg_status mg_event_synchronize(mg_event *e) {
    mg_status st = event_enter(e, "mg_event_synchronize");
    if (st)
        return st;
    return e->owner->ops->event_synchronize(e->owner->ctx, e->impl);
}

mg_status mg_event_query(mg_event *e) {
    mg_status st = event_enter(e, "mg_event_query");
    if (st)
        return st;
    return e->owner->ops->event_query(e->owner->ctx, e->impl);
}

mg_status mg_event_elapsed_ms(mg_event *start, mg_event *end, float *ms) {
    mg_status st = event_enter(start, "mg_event_elapsed_ms");
    if (!st)
        st = event_enter(end, "mg_event_elapsed_ms");
    if (st)
        return st;
    if (!ms)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_event_elapsed_ms: NULL output");
    if (start->owner != end->owner)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_event_elapsed_ms: events belong to different backends");
    if (!start->owner->ops->supports(start->owner->ctx, MG_CAP_EVENT_TIMING))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "mg_event_elapsed_ms: the %s backend has no timing",
                        mg_backend_kind_name(start->owner->kind));
    return start->owner->ops->event_elapsed_ms(start->owner->ctx, start->impl, end->impl, ms);
}

mg_status mg_event_destroy(mg_event *e) {
    if (!e)
        return MG_OK;
    if (!mg_handle_is(e, MG_HANDLE_EVENT))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_event_destroy: invalid or destroyed event %p",
                        (void *)e);
    mg_backend *b = e->owner;
    mg_status st = b->ops->event_destroy(b->ctx, e->impl);
    FORGET_HANDLE(b, event, e);
    return st;
}

/* ------------------------------------------------------------------ graphs */

static mg_status graph_ops_present(mg_backend *b, const char *fn) {
    if (!b->ops->graph_begin_capture || !b->ops->supports(b->ctx, MG_CAP_GRAPHS))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend has no graphs", fn,
                        mg_backend_kind_name(b->kind));
    return MG_OK;
}

mg_status mg_graph_begin_capture(mg_stream *s) {
    mg_status st = stream_enter(s, "mg_graph_begin_capture");
    if (!st)
        st = graph_ops_present(s->owner, "mg_graph_begin_capture");
    if (st)
        return st;
    bool expected = false;
    if (!atomic_compare_exchange_strong(&s->capturing, &expected, true))
        return MG_ERROR(MG_ERR_CAPTURING,
                        "mg_graph_begin_capture: the stream is already capturing");
    atomic_fetch_add(&s->owner->capturing_streams, 1);
    st = s->owner->ops->graph_begin_capture(s->owner->ctx, s->impl);
    if (st) {
        atomic_store(&s->capturing, false);
        atomic_fetch_sub(&s->owner->capturing_streams, 1);
    }
    return st;
}

/* Clears the capture flag of `s`, which the caller saw set. */
static mg_status capture_ended(mg_stream *s, const char *fn) {
    bool expected = true;
    if (!atomic_compare_exchange_strong(&s->capturing, &expected, false))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the stream is not capturing", fn);
    atomic_fetch_sub(&s->owner->capturing_streams, 1);
    return MG_OK;
}

static mg_status wrap_graph(mg_backend *b, void *impl, mg_graph **out) {
    mg_graph *g = calloc(1, sizeof *g);
    mg_status st =
        g ? mg_handle_register(g, MG_HANDLE_GRAPH) : MG_ERROR(MG_ERR_OUT_OF_MEMORY, "graph handle");
    if (st == MG_OK) {
        g->owner = b;
        g->impl = impl;
        pthread_mutex_lock(&b->lock);
        st = LIST_PUSH(b, graph, g);
        pthread_mutex_unlock(&b->lock);
        if (st)
            mg_handle_unregister(g);
    }
    if (st) {
        free(g);
        b->ops->graph_destroy(b->ctx, impl);
        return st;
    }
    *out = g;
    return MG_OK;
}

mg_status mg_graph_end_capture(mg_stream *s, mg_graph **out) {
    /* Ending a capture is allowed on a faulted backend too, so the stream is not left in
     * capture mode; the backend's end call reports the fault. */
    if (!mg_handle_is(s, MG_HANDLE_STREAM))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_end_capture: invalid stream %p",
                        (void *)s);
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_end_capture: NULL output");
    *out = NULL;
    mg_status st = graph_ops_present(s->owner, "mg_graph_end_capture");
    if (!st)
        st = capture_ended(s, "mg_graph_end_capture");
    if (st)
        return st;
    mg_backend *b = s->owner;
    void *impl = NULL;
    if ((st = b->ops->graph_end_capture(b->ctx, s->impl, &impl)))
        return st;
    return wrap_graph(b, impl, out);
}

mg_status mg_graph_end_capture_update(mg_stream *s, mg_graph *g, bool *updated_in_place) {
    if (!mg_handle_is(s, MG_HANDLE_STREAM))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_end_capture_update: invalid stream %p",
                        (void *)s);
    mg_status st = graph_ops_present(s->owner, "mg_graph_end_capture_update");
    if (st)
        return st;
    if (!mg_handle_is(g, MG_HANDLE_GRAPH) || g->owner != s->owner) {
        /* The capture still ends, so the stream is not left capturing. */
        if (capture_ended(s, "mg_graph_end_capture_update") == MG_OK)
            s->owner->ops->graph_abort_capture(s->owner->ctx, s->impl);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_graph_end_capture_update: graph %p is invalid or of another backend "
                        "(the capture was aborted)",
                        (void *)g);
    }
    if ((st = capture_ended(s, "mg_graph_end_capture_update")))
        return st;
    bool in_place = false;
    st = s->owner->ops->graph_end_capture_update(s->owner->ctx, s->impl, g->impl, &in_place);
    if (updated_in_place)
        *updated_in_place = st == MG_OK && in_place;
    return st;
}

mg_status mg_graph_abort_capture(mg_stream *s) {
    if (!mg_handle_is(s, MG_HANDLE_STREAM))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_abort_capture: invalid stream %p",
                        (void *)s);
    mg_status st = graph_ops_present(s->owner, "mg_graph_abort_capture");
    if (!st)
        st = capture_ended(s, "mg_graph_abort_capture");
    if (st)
        return st;
    return s->owner->ops->graph_abort_capture(s->owner->ctx, s->impl);
}

mg_status mg_graph_launch(mg_graph *g, mg_stream *s) {
    if (!mg_handle_is(g, MG_HANDLE_GRAPH))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_launch: %s graph handle %p",
                        g ? "invalid or destroyed" : "NULL", (void *)g);
    mg_backend *b = g->owner;
    mg_stream *rs = NULL;
    mg_status st = mg_backend_check_fault(b);
    if (!st)
        st = resolve_stream(b, s, "mg_graph_launch", &rs);
    if (st)
        return st;
    return b->ops->graph_launch(b->ctx, g->impl, rs->impl);
}

mg_status mg_graph_destroy(mg_graph *g) {
    if (!g)
        return MG_OK;
    if (!mg_handle_is(g, MG_HANDLE_GRAPH))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_destroy: invalid or destroyed graph %p",
                        (void *)g);
    mg_backend *b = g->owner;
    mg_status st = b->ops->graph_destroy(b->ctx, g->impl);
    FORGET_HANDLE(b, graph, g);
    return st;
}

/* ------------------------------------------------------------------ pinned host memory */

mg_status mg_host_alloc(mg_backend *b, size_t bytes, void **out) {
    mg_status st = enter(b, "mg_host_alloc");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_alloc: NULL output");
    *out = NULL;
    if (bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_alloc: zero bytes requested");
    if ((st = refuse_while_capturing(b, "mg_host_alloc")))
        return st;
    void *p = NULL;
    st = b->ops->host_alloc ? b->ops->host_alloc(b->ctx, bytes, &p) : mg_host_heap_alloc(bytes, &p);
    if (st)
        return st;
    mg_host_block *block = malloc(sizeof *block);
    bool pinned = b->ops->supports(b->ctx, MG_CAP_PINNED_HOST);
    if (!block)
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_host_alloc: block record");
    else if (pinned)
        st = mg_pinned_register(p, bytes);
    if (st == MG_OK) {
        *block = (mg_host_block){p, bytes, 0};
        pthread_mutex_lock(&b->lock);
        st = LIST_PUSH(b, host_block, block);
        pthread_mutex_unlock(&b->lock);
    }
    if (st) {
        if (block)
            release_host_block(b, p);
        else if (b->ops->host_free)
            b->ops->host_free(b->ctx, p);
        else
            mg_host_heap_free(p);
        free(block);
        return st;
    }
    *out = p;
    return MG_OK;
}

mg_status mg_host_free(mg_backend *b, void *host) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_free: invalid backend %p", (void *)b);
    if (!host)
        return MG_OK;
    pthread_mutex_lock(&b->lock);
    mg_host_block *block = NULL;
    for (size_t i = 0; i < b->host_block_count && !block; i++)
        if (b->host_blocks[i]->host == host)
            block = b->host_blocks[i];
    if (block)
        LIST_REMOVE(b, host_block, block);
    pthread_mutex_unlock(&b->lock);
    if (!block)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_host_free: %p was not returned by mg_host_alloc of this backend, or "
                        "was already freed",
                        host);
    free(block);
    return release_host_block(b, host);
}

mg_status mg_host_device_pointer(mg_backend *b, void *host, mg_devptr *out) {
    mg_status st = enter(b, "mg_host_device_pointer");
    if (st)
        return st;
    if (!host || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_device_pointer: NULL %s",
                        host ? "output" : "host pointer");
    if (!b->ops->host_device_pointer || !b->ops->supports(b->ctx, MG_CAP_HOST_DEVICE_POINTER))
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_host_device_pointer: the %s backend cannot map host memory",
                        mg_backend_kind_name(b->kind));
    pthread_mutex_lock(&b->lock);
    mg_host_block *block = NULL;
    for (size_t i = 0; i < b->host_block_count && !block; i++)
        if (b->host_blocks[i]->host == host)
            block = b->host_blocks[i];
    st = block
             ? b->ops->host_device_pointer(b->ctx, host, out)
             : MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_host_device_pointer: %p is not a live block from mg_host_alloc", host);
    if (st == MG_OK)
        block->mapped = *out;
    pthread_mutex_unlock(&b->lock);
    return st;
}

/* ------------------------------------------------------------------ modules and kernels */

static mg_status check_name(const char *name, size_t max_bytes, const char *fn, const char *what) {
    if (!name || !*name)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty %s name", fn, what);
    if (strlen(name) >= max_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s name longer than %zu bytes", fn, what,
                        max_bytes - 1);
    return MG_OK;
}

mg_status mg_module_load(mg_backend *b, const char *model, const char *name, const void *image,
                         size_t bytes) {
    const char *fn = "mg_module_load";
    mg_status st = enter(b, fn);
    if (!st)
        st = check_name(model, sizeof b->modules[0].model, fn, "model");
    if (!st)
        st = check_name(name, sizeof b->modules[0].name, fn, "module");
    if (st)
        return st;
    if (!image || bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty image for module '%s'", fn, name);
    if (!b->ops->module_load || !b->ops->supports(b->ctx, MG_CAP_MODULES))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend cannot load modules", fn,
                        mg_backend_kind_name(b->kind));
    if (!strcmp(name, "metrale"))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: module name 'metrale' is reserved", fn);
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < b->module_count; i++)
        if (!strcmp(b->modules[i].name, name)) {
            pthread_mutex_unlock(&b->lock);
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: a module named '%s' is already loaded (model '%s')", fn, name,
                            b->modules[i].model);
        }
    if (b->module_count == b->module_capacity) {
        size_t cap = b->module_capacity ? b->module_capacity * 2 : 8;
        mg_module_record *grown = realloc(b->modules, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&b->lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: module table", fn);
        }
        b->modules = grown;
        b->module_capacity = cap;
    }
    /* Loading under the lock keeps the name check and the insert one step. */
    st = b->ops->module_load(b->ctx, model, name, image, bytes);
    if (st == MG_OK) {
        mg_module_record *r = &b->modules[b->module_count++];
        snprintf(r->model, sizeof r->model, "%s", model);
        snprintf(r->name, sizeof r->name, "%s", name);
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}

mg_status mg_module_unload_model(mg_backend *b, const char *model) {
    const char *fn = "mg_module_unload_model";
    mg_status st = enter(b, fn);
    if (!st)
        st = check_name(model, sizeof b->modules[0].model, fn, "model");
    if (st)
        return st;
    if (!b->ops->module_unload_model)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend cannot load modules", fn,
                        mg_backend_kind_name(b->kind));
    pthread_mutex_lock(&b->lock);
    const char **names = calloc(b->module_count ? b->module_count : 1, sizeof *names);
    size_t n = 0;
    if (!names) {
        pthread_mutex_unlock(&b->lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: name list", fn);
    }
    for (size_t i = 0; i < b->module_count; i++)
        if (!strcmp(b->modules[i].model, model))
            names[n++] = b->modules[i].name;
    if (n == 0)
        st = MG_ERROR(MG_ERR_NOT_FOUND, "%s: no module of model '%s' is loaded", fn, model);
    if (!st)
        st = mg_op_cache_forget_modules(b->op_cache, names, n);
    if (!st)
        st = b->ops->module_unload_model(b->ctx, model);
    if (!st) {
        size_t kept = 0;
        for (size_t i = 0; i < b->module_count; i++)
            if (strcmp(b->modules[i].model, model))
                b->modules[kept++] = b->modules[i];
        b->module_count = kept;
    }
    pthread_mutex_unlock(&b->lock);
    free(names);
    return st;
}

mg_status mg_module_symbol(mg_backend *b, const char *module, const char *symbol, mg_devptr *ptr,
                           size_t *bytes) {
    const char *fn = "mg_module_symbol";
    mg_status st = enter(b, fn);
    if (!st)
        st = check_name(module, 96, fn, "module");
    if (!st)
        st = check_name(symbol, 256, fn, "symbol");
    if (st)
        return st;
    if (!ptr || !bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
    if (!b->ops->module_symbol)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend has no module symbols", fn,
                        mg_backend_kind_name(b->kind));
    return b->ops->module_symbol(b->ctx, module, symbol, ptr, bytes);
}

mg_status mg_kernel_lookup(mg_backend *b, const char *module, const char *function,
                           mg_kernel **out) {
    const char *fn = "mg_kernel_lookup";
    mg_status st = enter(b, fn);
    if (!st)
        st = check_name(module, 96, fn, "module");
    if (!st)
        st = check_name(function, 128, fn, "function");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
    *out = NULL;
    return mg_op_cache_kernel(b->op_cache, module, function, true, out);
}

mg_status mg_kernel_release(mg_kernel *k) {
    if (!mg_handle_is(k, MG_HANDLE_KERNEL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_kernel_release: %s kernel handle %p",
                        k ? "invalid or forgotten" : "NULL", (void *)k);
    uint_fast64_t holds = atomic_load(&k->holds);
    do {
        if (holds == 0)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_kernel_release: %s has no outstanding lookup to release", k->name);
    } while (!atomic_compare_exchange_weak(&k->holds, &holds, holds - 1));
    return MG_OK;
}

const char *mg_kernel_name(const mg_kernel *k) {
    return mg_handle_is(k, MG_HANDLE_KERNEL) ? k->name : "";
}

static bool debug_sync_enabled(void) {
    static atomic_int cached = -1; /* -1 unknown, else 0/1; racing first calls agree */
    int v = atomic_load(&cached);
    if (v < 0) {
        const char *env = getenv("METRALE_DEBUG_SYNC_KERNELS");
        v = env && !strcmp(env, "1");
        atomic_store(&cached, v);
    }
    return v == 1;
}

mg_status mg_launch_run(mg_backend *b, mg_kernel *k, mg_stream *s, const mg_launch *launch) {
    const char *fn = "mg_launch_run";
    mg_stream *rs = NULL;
    mg_status st = enter(b, fn);
    if (!st)
        st = resolve_stream(b, s, fn, &rs);
    if (st)
        return st;
    if (!mg_handle_is(k, MG_HANDLE_KERNEL) || k->owner != b)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: kernel %p is invalid or of another backend",
                        fn, (void *)k);
    if (!launch)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL launch builder for %s", fn, k->name);
    if (launch->error)
        return MG_ERROR(launch->error, "%s: the argument list of %s is invalid: %s", fn, k->name,
                        launch->error_message);
    if (!launch->grid.x || !launch->grid.y || !launch->grid.z || !launch->block.x ||
        !launch->block.y || !launch->block.z)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s has an empty grid (%u,%u,%u) or block (%u,%u,%u)", fn, k->name,
                        launch->grid.x, launch->grid.y, launch->grid.z, launch->block.x,
                        launch->block.y, launch->block.z);
    mg_timing *timing = atomic_load(&b->launch_timing);
    mg_timing_span span = 0;
    if (timing)
        mg_timing_kernel_begin(timing, k->name, rs,
                               &span); /* a timing failure never fails a launch */
    st = b->ops->launch(b->ctx, k->impl, k->name, rs->impl, launch);
    if (span)
        mg_timing_span_end(timing, span, rs);
    if (st == MG_OK && debug_sync_enabled() && !atomic_load(&rs->capturing)) {
        st = b->ops->stream_synchronize(b->ctx, rs->impl);
        if (st) {
            char desc[512];
            mg_launch_describe(launch, k->name, desc, sizeof desc);
            mg_error_append(" [METRALE_DEBUG_SYNC_KERNELS: failed in %s]", desc);
        }
    }
    return st;
}

mg_status mg_backend_attach_launch_timing(mg_backend *b, mg_timing *t) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_trace_launches: backend is closed");
    mg_timing *expected = NULL;
    if (!atomic_compare_exchange_strong(&b->launch_timing, &expected, t) && expected != t)
        return MG_ERROR(MG_ERR_BUSY,
                        "mg_timing_trace_launches: another timing object already traces this "
                        "backend's launches");
    return MG_OK;
}

void mg_backend_detach_launch_timing(mg_backend *b, mg_timing *t) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return;
    mg_timing *expected = t;
    atomic_compare_exchange_strong(&b->launch_timing, &expected, NULL);
}

/* ------------------------------------------------------------------ accessors for op layers */

void *mg_backend_context(mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->ctx : NULL;
}

void *mg_stream_impl(mg_backend *b, mg_stream *s) {
    mg_stream *rs = NULL;
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return NULL;
    return resolve_stream(b, s, "stream", &rs) == MG_OK ? rs->impl : NULL;
}

mg_backend *mg_stream_backend(mg_stream *s) {
    return mg_handle_is(s, MG_HANDLE_STREAM) ? s->owner : NULL;
}

mg_status mg_stream_check_not_capturing(mg_backend *b, mg_stream *s, const char *what) {
    mg_stream *rs = NULL;
    mg_status st = resolve_stream(b, s, what, &rs);
    if (st)
        return st;
    if (atomic_load(&rs->capturing))
        return MG_ERROR(MG_ERR_CAPTURING,
                        "%s: not allowed while the stream is capturing a graph (run it once "
                        "before capturing so it is planned)",
                        what);
    return MG_OK;
}

bool mg_backend_any_capturing(mg_backend *b) {
    return atomic_load(&b->capturing_streams) > 0;
}

mg_op_cache *mg_backend_op_cache(mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->op_cache : NULL;
}
