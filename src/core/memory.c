/*
 * memory.c - the memory half of metrale/gpu.h: device allocations and the ledger, copies and
 * memsets (one validation path for all of them), pinned host memory, and the device-range
 * check the ops use.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "error.h"
#include "metrale/host_heap.h"
#include "metrale/pinned.h"

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
    if (b->ops->pointers_checked_strictly && !in_mapped_host_block(b, p, bytes) &&
        !(b->ops->host_registered && b->ops->host_registered(b->ctx, p, bytes)))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s 0x%llx is not inside any live allocation of this backend "
                        "(never allocated, or already freed)",
                        fn, what, (unsigned long long)p);
    return MG_OK;
}

/* ------------------------------------------------------------------ memory and ledger */

static mg_status alloc_impl(mg_backend *b, size_t bytes, mg_alloc_kind kind, bool owned,
                            mg_devptr *out, const char *file, int line) {
    mg_status st = mg_core_enter(b, "mg_alloc");
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
    if ((st = mg_core_refuse_while_capturing(b, "mg_alloc")))
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
    mg_status live = mg_backend_check_live(b, "mg_free");
    if (live)
        return live;
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
    mg_status live = mg_backend_check_live(b, "mg_ledger_live");
    if (live)
        return live;
    mg_ledger_totals(&b->ledger, live_bytes, live_count);
    return MG_OK;
}

mg_status mg_ledger_top_sites(mg_backend *b, uint64_t min_bytes, mg_ledger_site *out,
                              size_t max_sites, size_t *written) {
    mg_status live = mg_backend_check_live(b, "mg_ledger_top_sites");
    if (live)
        return live;
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
    mg_status live = mg_backend_check_live(b, "mg_ledger_sweep");
    if (live)
        return live;
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
    mg_status st = mg_core_enter(b, t->fn);
    if (st)
        return st;
    if (t->async) {
        mg_stream *resolved = NULL;
        if ((st = mg_core_resolve_stream(b, t->stream, t->fn, &resolved)))
            return st;
        *rs = resolved->impl;
    } else if ((st = mg_core_refuse_while_capturing(b, t->fn))) {
        return st;
    }
    if (t->host_role && (st = mg_core_check_host(t->host, bytes, t->fn, t->host_role)))
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

/* ------------------------------------------------------------------ pinned host memory */

mg_status mg_host_alloc(mg_backend *b, size_t bytes, void **out) {
    mg_status st = mg_core_enter(b, "mg_host_alloc");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_alloc: NULL output");
    *out = NULL;
    if (bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_alloc: zero bytes requested");
    if ((st = mg_core_refuse_while_capturing(b, "mg_host_alloc")))
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
            mg_core_release_host_block(b, p);
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
    mg_status live = mg_backend_check_live(b, "mg_host_free");
    if (live)
        return live;
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
    return mg_core_release_host_block(b, host);
}

mg_status mg_host_device_pointer(mg_backend *b, void *host, mg_devptr *out) {
    mg_status st = mg_core_enter(b, "mg_host_device_pointer");
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

/* ------------------------------------------------------------------ caller-owned host memory */

mg_status mg_host_register(mg_backend *b, void *host, size_t bytes, mg_devptr *out) {
    mg_status st = mg_core_enter(b, "mg_host_register");
    if (st)
        return st;
    if (!host || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_register: NULL %s",
                        host ? "output" : "host pointer");
    *out = 0;
    if (bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_register: zero bytes at %p", host);
    if (!b->ops->host_register)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_host_register: the %s backend cannot address foreign host memory",
                        mg_backend_kind_name(b->kind));
    if ((st = mg_core_refuse_while_capturing(b, "mg_host_register")))
        return st;
    mg_ledger_entry e;
    if (mg_ledger_find(&b->ledger, (mg_devptr)(uintptr_t)host, &e) ||
        mg_ledger_find(&b->ledger, (mg_devptr)(uintptr_t)host + bytes - 1, &e))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_host_register: [%p, +%zu) overlaps the device allocation [0x%llx, "
                        "+%llu)",
                        host, bytes, (unsigned long long)e.base, (unsigned long long)e.bytes);
    return b->ops->host_register(b->ctx, host, bytes, out);
}

mg_status mg_host_unregister(mg_backend *b, void *host) {
    mg_status st = mg_core_enter(b, "mg_host_unregister");
    if (st)
        return st;
    if (!host)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_host_unregister: NULL host pointer");
    if (!b->ops->host_unregister)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_host_unregister: the %s backend cannot address foreign host memory",
                        mg_backend_kind_name(b->kind));
    return b->ops->host_unregister(b->ctx, host);
}
