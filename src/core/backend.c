/*
 * backend.c - opening (for the backend registry) and closing backends (metrale/gpu.h), the checks
 * every public call starts with, and the accessors the layers above use. The rest of the public
 * backend API is split by concern: memory.c (allocations, the ledger, copies, pinned host memory),
 * stream.c (streams, events, graphs), module.c (modules, kernels, launches). Each checks its
 * arguments once, wraps backend objects in handles, keeps the capture and sticky-fault rules,
 * then dispatches to the backend's table (backend_impl.h).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "error.h"
#include "metrale/host_heap.h"
#include "metrale/pinned.h"
#include "op_cache.h"
#include "op_state.h"

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
mg_status mg_core_list_push(void ***items, size_t *count, size_t *capacity, void *item) {
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

bool mg_core_list_remove(void **items, size_t *count, const void *item) {
    for (size_t i = 0; i < *count; i++)
        if (items[i] == item) {
            items[i] = items[--*count];
            return true;
        }
    return false;
}

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

void mg_backend_dead_message(const mg_backend *b, const char *fn, char *buf, size_t bytes) {
    if (!b)
        snprintf(buf, bytes, "%s: NULL, invalid or closed backend handle (NULL backend)", fn);
    else
        snprintf(buf, bytes,
                 "%s: invalid or closed backend handle %p (invalid backend: never opened, or "
                 "closed)",
                 fn, (const void *)b);
}

mg_status mg_backend_check_live(const mg_backend *b, const char *fn) {
    if (mg_handle_is(b, MG_HANDLE_BACKEND))
        return MG_OK;
    char text[320];
    mg_backend_dead_message(b, fn, text, sizeof text);
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s", text);
}

mg_backend_kind mg_backend_live_kind(const mg_backend *b) {
    return b->kind;
}

/* Entry check of every call taking a backend: live handle, no sticky fault. */
mg_status mg_core_enter(mg_backend *b, const char *fn) {
    mg_status st = mg_backend_check_live(b, fn);
    return st ? st : mg_backend_check_fault(b);
}

/* Validates `s` (NULL = default stream) as a live stream of `b`. */
mg_status mg_core_resolve_stream(mg_backend *b, mg_stream *s, const char *fn, mg_stream **out) {
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
mg_status mg_core_refuse_while_capturing(mg_backend *b, const char *fn) {
    if (atomic_load(&b->capturing_streams) > 0)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "%s: not allowed while a stream of this backend is capturing a graph "
                        "(blocking calls and allocations would break the capture; do them "
                        "before mg_graph_begin_capture or after mg_graph_end_capture)",
                        fn);
    return MG_OK;
}

/* Unregisters (before anyone else can reuse the memory) and frees one host block. */
mg_status mg_core_release_host_block(mg_backend *b, void *host) {
    if (b->ops->supports(b->ctx, MG_CAP_PINNED_HOST))
        mg_pinned_unregister(host);
    if (b->ops->host_free)
        return b->ops->host_free(b->ctx, host);
    mg_host_heap_free(host);
    return MG_OK;
}

mg_status mg_core_check_host(const void *p, size_t bytes, const char *fn, const char *what) {
    if (!p && bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL host pointer for %s (%zu bytes)", fn,
                        what, bytes);
    return MG_OK;
}

/* ------------------------------------------------------------------ open and close */

mg_status mg_core_wrap_stream(mg_backend *b, void *impl, bool is_default, mg_stream **out) {
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
    pthread_mutex_destroy(&b->op_state_lock);
    free(b->streams);
    free(b->events);
    free(b->graphs);
    free(b->host_blocks); /* the records themselves were freed with their blocks */
    free(b->modules);
    free(b);
}

mg_status mg_core_backend_open(const mg_backend_driver *d, int device, mg_backend **out) {
    const mg_backend_kind kind = d->kind;
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
    pthread_mutex_init(&b->op_state_lock, NULL);
    st = mg_handle_register(b, MG_HANDLE_BACKEND);
    if (st == MG_OK) {
        st = mg_op_cache_create(b, &b->op_cache);
        void *stream_impl = NULL;
        if (st == MG_OK)
            st = ops->stream_create(ctx, true, &stream_impl);
        if (st == MG_OK) {
            st = mg_core_wrap_stream(b, stream_impl, true, &b->default_stream);
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

mg_status mg_backend_close(mg_backend *b) {
    if (!b)
        return MG_OK;
    mg_status live = mg_backend_check_live(b, "mg_backend_close");
    if (live)
        return live;
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
    mg_op_state_release_all(b); /* ops' handles and plans; they may free through the API */
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
        KEEP_FIRST(mg_core_release_host_block(b, b->host_blocks[i]->host));
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

bool mg_backend_is_live(const mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND);
}

mg_backend_kind mg_backend_get_kind(const mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->kind : MG_BACKEND_AUTO;
}

mg_status mg_device_get_info(mg_backend *b, mg_device_info *out) {
    mg_status st = mg_core_enter(b, "mg_device_get_info");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_device_get_info: NULL output");
    memset(out, 0, sizeof *out);
    return b->ops->device_info(b->ctx, out);
}

mg_status mg_memory_free_bytes(mg_backend *b, uint64_t *free_bytes, uint64_t *total_bytes) {
    mg_status st = mg_core_enter(b, "mg_memory_free_bytes");
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
    mg_status st = mg_core_enter(b, "mg_memory_device_free_bytes");
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
    return b->ops->supports(b->ctx, cap);
}

/* ------------------------------------------------------------------ accessors for op layers */

void *mg_backend_context(mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->ctx : NULL;
}

void *mg_stream_impl(mg_backend *b, mg_stream *s) {
    mg_stream *rs = NULL;
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return NULL;
    return mg_core_resolve_stream(b, s, "stream", &rs) == MG_OK ? rs->impl : NULL;
}

mg_backend *mg_stream_backend(mg_stream *s) {
    return mg_handle_is(s, MG_HANDLE_STREAM) ? s->owner : NULL;
}

mg_status mg_stream_check_not_capturing(mg_backend *b, mg_stream *s, const char *what) {
    mg_stream *rs = NULL;
    mg_status st = mg_core_resolve_stream(b, s, what, &rs);
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

mg_op_cache *mg_backend_live_op_cache(mg_backend *b) {
    return b->op_cache;
}
