/*
 * cuda_memory.c - device allocation, copies and memsets of the CUDA backend.
 *
 * Which path a host copy takes (the promise of each public call is in metrale/gpu.h):
 *
 *   call                         source / destination            path
 *   copy_h2d_async_retained      registered pinned               direct DMA, capture-safe
 *   copy_h2d_async_retained      pageable                        staged (not during capture)
 *   copy_h2d_async               pageable or registered pinned   staged (not during capture)
 *   copy_h2d (blocking)          registered pinned               direct DMA, then wait
 *   copy_h2d (blocking)          pageable                        staged, then wait
 *   copy_d2h_async               registered pinned               direct DMA, capture-safe
 *   copy_d2h_async, copy_d2h     pageable                        staged, returns when done
 *
 * Staged means: chunks are copied into the pinned staging ring (cuda_internal.h) and DMA'd
 * from there, pipelined, so a host-to-device call returns as soon as the source has been
 * consumed into staging and never waits for unrelated earlier work on the stream, unlike the
 * driver's own pageable path, which synchronizes the stream first.
 *
 * A registered pinned source without the retained promise is staged too: the library cannot
 * know when the caller reuses the memory, and a direct DMA would have to wait for the stream
 * (all its earlier work) before returning. Zero-copy transfers are what the retained variant
 * is for.
 *
 * Blocking copies and memsets run on the backend's default stream and wait for it, so they
 * are ordered after work issued there (e.g. a d2h of a kernel's output).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_internal.h"
#include "metrale/pinned.h"
#include "op_cache.h"

#define STAGING_ALIGN_BYTES 256
/* A copy smaller than this is done by the calling thread alone. */
#define PARALLEL_COPY_MIN_BYTES ((size_t)2 << 20)
/* A host-to-device chunk that would be smaller than this moves on to a fresh slot. */
#define STAGING_MIN_CHUNK_BYTES ((size_t)256 << 10)

/* ------------------------------------------------------------------ allocation */

mg_status mg_cuda_alloc(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    CUdeviceptr p = 0;
    CUresult r;
    const char *call;
    char free_text[32], total_text[32];
    if (kind == MG_ALLOC_MANAGED) {
        if (!c->managed_memory || !c->drv->MemAllocManaged)
            return mg_error_set(MG_ERR_UNSUPPORTED, NULL, 0,
                                "cuMemAllocManaged: CUDA device %d has no managed memory",
                                c->ordinal);
        /* Asking for more managed memory than the device has free can hang the GPU instead
         * of failing: refuse it up front. */
        size_t free_b = 0, total_b = 0;
        r = c->drv->MemGetInfo(&free_b, &total_b);
        if (r != CUDA_SUCCESS)
            return MG_CUDA_FAIL(c, r, "cuMemGetInfo", "before a managed allocation");
        if (bytes > free_b)
            return mg_error_set(MG_ERR_OUT_OF_MEMORY, NULL, 0,
                                "cuMemAllocManaged not attempted: more than CUDA device %d has "
                                "free (%s of %s)",
                                c->ordinal, mg_format_bytes(free_b, free_text, sizeof free_text),
                                mg_format_bytes(total_b, total_text, sizeof total_text));
        call = "cuMemAllocManaged";
        r = c->drv->MemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    } else {
        call = "cuMemAlloc";
        r = c->drv->MemAlloc(&p, bytes);
    }
    if (r != CUDA_SUCCESS) {
        /* No location: the core appends the requested size and the caller's file:line. */
        size_t free_b = 0, total_b = 0;
        if (r == CUDA_ERROR_OUT_OF_MEMORY && c->drv->MemGetInfo(&free_b, &total_b) == CUDA_SUCCESS)
            return mg_cuda_fail(c, r, call, NULL, 0, "%s free of %s on CUDA device %d",
                                mg_format_bytes(free_b, free_text, sizeof free_text),
                                mg_format_bytes(total_b, total_text, sizeof total_text),
                                c->ordinal);
        return mg_cuda_fail(c, r, call, NULL, 0, "CUDA device %d", c->ordinal);
    }
    *out = (mg_devptr)p;
    return MG_OK;
}

/* Free paths succeed after a sticky fault and during teardown: the memory is gone with the
 * context either way. Any other failure, making the context current included, is reported. */
mg_status mg_cuda_free(void *ctx, mg_devptr base, mg_alloc_kind kind) {
    (void)kind;
    mg_cuda_context *c = ctx;
    bool gone = false;
    mg_status st = mg_cuda_enter_to_free(c, &gone);
    if (st || gone)
        return st;
    CUresult r = c->drv->MemFree((CUdeviceptr)base);
    if (r == CUDA_SUCCESS || mg_cuda_result_is_teardown(r) || mg_cuda_result_is_sticky(r) ||
        c->faulted)
        return MG_OK;
    return MG_CUDA_FAIL(c, r, "cuMemFree", "0x%llx", (unsigned long long)base);
}

/* ------------------------------------------------------------------ parallel host copy */

struct mg_cuda_copy_pool {
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    unsigned helpers; /* threads besides the caller */
    pthread_t *threads;
    unsigned started;
    uint64_t generation; /* bumped for each job */
    bool quit;
    /* the current job: part i of `parts` is [i * part_bytes, ...) */
    char *dst;
    const char *src;
    size_t bytes, part_bytes;
    unsigned remaining; /* helper parts not finished */
};

static void copy_part(char *dst, const char *src, size_t bytes, size_t part_bytes, unsigned i) {
    size_t off = (size_t)i * part_bytes;
    if (off < bytes)
        memcpy(dst + off, src + off, bytes - off < part_bytes ? bytes - off : part_bytes);
}

typedef struct helper_arg {
    mg_cuda_copy_pool *pool;
    unsigned part; /* 1..helpers; the caller copies part 0 */
} helper_arg;

static void *copy_helper(void *arg) {
    helper_arg a = *(helper_arg *)arg;
    free(arg);
    mg_cuda_copy_pool *p = a.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->generation == seen && !p->quit)
            pthread_cond_wait(&p->work, &p->lock);
        if (p->quit)
            break;
        seen = p->generation;
        char *dst = p->dst;
        const char *src = p->src;
        size_t bytes = p->bytes, part_bytes = p->part_bytes;
        pthread_mutex_unlock(&p->lock);
        copy_part(dst, src, bytes, part_bytes, a.part);
        pthread_mutex_lock(&p->lock);
        if (--p->remaining == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void pool_destroy(mg_cuda_copy_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->quit = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

/* NULL when threads cannot be had: the caller then copies alone. */
static mg_cuda_copy_pool *pool_create(unsigned helpers) {
    mg_cuda_copy_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->threads = calloc(helpers, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (unsigned i = 0; i < helpers; i++) {
        helper_arg *a = malloc(sizeof *a);
        if (!a)
            break;
        *a = (helper_arg){p, i + 1};
        if (pthread_create(&p->threads[i], NULL, copy_helper, a) != 0) {
            free(a);
            break;
        }
        p->started++;
    }
    if (p->started == 0) {
        pool_destroy(p);
        return NULL;
    }
    p->helpers = p->started;
    return p;
}

/* memcpy, split across the pool's threads when large. */
static void parallel_copy(mg_cuda_staging *st, void *dst, const void *src, size_t bytes) {
    if (bytes >= PARALLEL_COPY_MIN_BYTES && st->copy_threads > 1 && !st->pool)
        st->pool = pool_create(st->copy_threads - 1);
    mg_cuda_copy_pool *p = st->pool;
    if (!p || bytes < PARALLEL_COPY_MIN_BYTES) {
        memcpy(dst, src, bytes);
        return;
    }
    unsigned parts = p->helpers + 1;
    size_t per_part = (bytes + parts - 1) / parts; /* parts * part_bytes covers bytes */
    size_t part_bytes = (per_part + 4095) & ~(size_t)4095;
    pthread_mutex_lock(&p->lock);
    p->dst = dst;
    p->src = src;
    p->bytes = bytes;
    p->part_bytes = part_bytes;
    p->remaining = p->helpers;
    p->generation++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    copy_part(dst, src, bytes, part_bytes, 0);
    pthread_mutex_lock(&p->lock);
    while (p->remaining)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* ------------------------------------------------------------------ staging ring */

static size_t env_size(const char *name, size_t fallback, size_t min, size_t max) {
    const char *v = getenv(name);
    if (!v || !*v)
        return fallback;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end || n < min || n > max)
        return fallback;
    return (size_t)n;
}

void mg_cuda_staging_init(mg_cuda_staging *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->lock, NULL);
    /* METRALE_STAGING_SLOT_MIB and METRALE_STAGING_THREADS tune the ring (benchmarks). */
    st->slot_bytes =
        env_size("METRALE_STAGING_SLOT_MIB", MG_CUDA_STAGING_DEFAULT_SLOT_BYTES >> 20, 1, 1024)
        << 20;
    /* One core copies about 7 GB/s into pinned memory (H200 host, 2026-11-29): half the
     * cores, up to 8, make staging several times faster than the driver's pageable path.
     * The helpers sleep except during staged copies of 2 MiB or more. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cpus >= 16 ? 8 : cpus >= 2 ? (size_t)cpus / 2 : 1;
    st->copy_threads = (unsigned)env_size("METRALE_STAGING_THREADS", threads, 1, 64);
}

void mg_cuda_staging_destroy(mg_cuda_context *c) {
    mg_cuda_staging *st = &c->staging;
    pool_destroy(st->pool);
    st->pool = NULL;
    for (unsigned i = 0; i < MG_CUDA_STAGING_SLOTS; i++) {
        mg_cuda_staging_slot *s = &st->slots[i];
        if (s->done) {
            if (s->pending)
                (void)c->drv->EventSynchronize(s->done);
            (void)c->drv->EventDestroy(s->done);
        }
        if (s->host)
            (void)c->drv->MemFreeHost(s->host);
        memset(s, 0, sizeof *s);
    }
    st->allocated = false;
}

/* Allocates the ring on first use. Staging lock held. */
static mg_status staging_ensure(mg_cuda_context *c) {
    mg_cuda_staging *st = &c->staging;
    if (st->allocated)
        return MG_OK;
    for (unsigned i = 0; i < MG_CUDA_STAGING_SLOTS; i++) {
        mg_cuda_staging_slot *s = &st->slots[i];
        CUresult r = c->drv->MemHostAlloc(&s->host, st->slot_bytes, CU_MEMHOSTALLOC_PORTABLE);
        if (r != CUDA_SUCCESS) {
            s->host = NULL;
            char size[32];
            mg_status err = MG_CUDA_FAIL(c, r, "cuMemHostAlloc", "staging buffer %u of %s", i,
                                         mg_format_bytes(st->slot_bytes, size, sizeof size));
            mg_cuda_staging_destroy(c);
            return err;
        }
        r = c->drv->EventCreate(&s->done, CU_EVENT_DISABLE_TIMING);
        if (r != CUDA_SUCCESS) {
            s->done = NULL;
            mg_status err = MG_CUDA_FAIL(c, r, "cuEventCreate", "staging event %u", i);
            mg_cuda_staging_destroy(c);
            return err;
        }
    }
    st->current = 0;
    st->allocated = true;
    return MG_OK;
}

/* Waits until no DMA uses slot `s` any more, then marks it fresh. */
static mg_status slot_recycle(mg_cuda_context *c, mg_cuda_staging_slot *s) {
    if (s->pending) {
        CUresult r = c->drv->EventSynchronize(s->done);
        if (r != CUDA_SUCCESS)
            return MG_CUDA_FAIL(c, r, "cuEventSynchronize", "waiting for a staging buffer");
        s->pending = false;
    }
    s->used = 0;
    s->stream = NULL;
    return MG_OK;
}

/* Moves to the next slot of the ring, waiting for it to be free. */
static mg_status slot_advance(mg_cuda_context *c, mg_cuda_staging_slot **out) {
    mg_cuda_staging *st = &c->staging;
    st->current = (st->current + 1) % MG_CUDA_STAGING_SLOTS;
    *out = &st->slots[st->current];
    return slot_recycle(c, *out);
}

/* Records the slot's event after a DMA on `stream` that used it. */
static mg_status slot_mark(mg_cuda_context *c, mg_cuda_staging_slot *s, CUstream stream) {
    CUresult r = c->drv->EventRecord(s->done, stream);
    if (r != CUDA_SUCCESS)
        return MG_CUDA_FAIL(c, r, "cuEventRecord", "after a staged copy");
    s->pending = true;
    s->stream = stream;
    return MG_OK;
}

static mg_status staged_h2d(mg_cuda_context *c, CUdeviceptr dst, const char *src, size_t bytes,
                            CUstream stream) {
    static atomic_int debug_copies = -1;
    if (mg_diag_env_enabled("METRALE_DEBUG_COPIES", &debug_copies) &&
        mg_gate_once("cuda.pageable_h2d_staging"))
        fprintf(stderr,
                "metrale: a host-to-device copy of %zu bytes from %p is staged through pinned "
                "buffers (the source is not registered page-locked memory); mg_host_alloc or "
                "mg_pinned_register avoids the extra host copy (reported once per process)\n",
                bytes, (const void *)src);
    mg_cuda_staging *st = &c->staging;
    pthread_mutex_lock(&st->lock);
    mg_status status = staging_ensure(c);
    size_t off = 0;
    while (status == MG_OK && off < bytes) {
        size_t left = bytes - off;
        mg_cuda_staging_slot *s = &st->slots[st->current];
        size_t room = st->slot_bytes - s->used;
        size_t want_min = left < STAGING_MIN_CHUNK_BYTES ? left : STAGING_MIN_CHUNK_BYTES;
        /* A slot serves one stream at a time (its event must cover all its DMAs). */
        if ((s->stream && s->stream != stream) || room < want_min) {
            if ((status = slot_advance(c, &s)))
                break;
            room = st->slot_bytes;
        }
        size_t chunk = left < room ? left : room;
        char *staging = (char *)s->host + s->used;
        parallel_copy(st, staging, src + off, chunk);
        CUresult r = c->drv->MemcpyHtoDAsync(dst + off, staging, chunk, stream);
        if (r != CUDA_SUCCESS) {
            char size[32];
            status = MG_CUDA_FAIL(
                c, r, "cuMemcpyHtoDAsync", "staged chunk of %s at offset %zu to 0x%llx",
                mg_format_bytes(chunk, size, sizeof size), off, (unsigned long long)dst);
            break;
        }
        size_t taken = (chunk + STAGING_ALIGN_BYTES - 1) & ~(size_t)(STAGING_ALIGN_BYTES - 1);
        s->used = taken < room ? s->used + taken : st->slot_bytes;
        status = slot_mark(c, s, stream);
        off += chunk;
    }
    pthread_mutex_unlock(&st->lock);
    return status;
}

/* Device to pageable host through whole staging slots: up to all slots' DMAs in flight, each
 * drained into `dst` as it completes. Returns when the data has arrived. */
static mg_status staged_d2h(mg_cuda_context *c, char *dst, CUdeviceptr src, size_t bytes,
                            CUstream stream) {
    mg_cuda_staging *st = &c->staging;
    pthread_mutex_lock(&st->lock);
    mg_status status = staging_ensure(c);
    struct {
        mg_cuda_staging_slot *slot;
        size_t off, bytes;
    } flight[MG_CUDA_STAGING_SLOTS];
    unsigned head = 0, count = 0; /* ring of chunks in flight, oldest at head */
    size_t issued = 0;
    while (status == MG_OK && (issued < bytes || count)) {
        /* Fill every free slot with a DMA, then drain the oldest. */
        while (status == MG_OK && issued < bytes && count < MG_CUDA_STAGING_SLOTS) {
            mg_cuda_staging_slot *s;
            if ((status = slot_advance(c, &s)))
                break;
            size_t chunk = bytes - issued < st->slot_bytes ? bytes - issued : st->slot_bytes;
            CUresult r = c->drv->MemcpyDtoHAsync(s->host, src + issued, chunk, stream);
            if (r != CUDA_SUCCESS) {
                char size[32];
                status = MG_CUDA_FAIL(
                    c, r, "cuMemcpyDtoHAsync", "staged chunk of %s at offset %zu from 0x%llx",
                    mg_format_bytes(chunk, size, sizeof size), issued, (unsigned long long)src);
                break;
            }
            s->used = st->slot_bytes; /* whole slot: no h2d packs into it meanwhile */
            if ((status = slot_mark(c, s, stream)))
                break;
            unsigned tail = (head + count) % MG_CUDA_STAGING_SLOTS;
            flight[tail].slot = s;
            flight[tail].off = issued;
            flight[tail].bytes = chunk;
            count++;
            issued += chunk;
        }
        if (status != MG_OK || count == 0)
            break;
        mg_cuda_staging_slot *s = flight[head].slot;
        CUresult r = c->drv->EventSynchronize(s->done);
        if (r != CUDA_SUCCESS) {
            status = MG_CUDA_FAIL(c, r, "cuEventSynchronize", "waiting for a staged d2h chunk");
            break;
        }
        s->pending = false;
        parallel_copy(st, dst + flight[head].off, s->host, flight[head].bytes);
        head = (head + 1) % MG_CUDA_STAGING_SLOTS;
        count--;
    }
    pthread_mutex_unlock(&st->lock);
    return status;
}

/* ------------------------------------------------------------------ copies */

static mg_status dma_h2d(mg_cuda_context *c, mg_devptr dst, const void *src, size_t bytes,
                         CUstream stream) {
    CUresult r = c->drv->MemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, stream);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    char size[32];
    return MG_CUDA_FAIL(c, r, "cuMemcpyHtoDAsync", "%s from %p to 0x%llx",
                        mg_format_bytes(bytes, size, sizeof size), src, (unsigned long long)dst);
}

static mg_status dma_d2h(mg_cuda_context *c, void *dst, mg_devptr src, size_t bytes,
                         CUstream stream) {
    CUresult r = c->drv->MemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, stream);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    char size[32];
    return MG_CUDA_FAIL(c, r, "cuMemcpyDtoHAsync", "%s from 0x%llx to %p",
                        mg_format_bytes(bytes, size, sizeof size), (unsigned long long)src, dst);
}

static mg_status dma_d2d(mg_cuda_context *c, mg_devptr dst, mg_devptr src, size_t bytes,
                         CUstream stream) {
    CUresult r = c->drv->MemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, bytes, stream);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    char size[32];
    return MG_CUDA_FAIL(c, r, "cuMemcpyDtoDAsync", "%s from 0x%llx to 0x%llx",
                        mg_format_bytes(bytes, size, sizeof size), (unsigned long long)src,
                        (unsigned long long)dst);
}

/* Ends a blocking call whose work was queued on the blocking stream `s` by its async form:
 * waits for it unless queuing failed or there was nothing to do. */
static mg_status wait_blocking(mg_cuda_context *c, CUstream s, mg_status queued, size_t bytes,
                               const char *what) {
    return queued || bytes == 0 ? queued : mg_cuda_sync_stream(c, s, what);
}

mg_status mg_cuda_copy_h2d(void *ctx, mg_devptr dst, const void *src, size_t bytes) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || bytes == 0)
        return st;
    CUstream s = mg_cuda_blocking_stream(c);
    st = mg_pinned_contains(src, bytes) ? dma_h2d(c, dst, src, bytes, s)
                                        : staged_h2d(c, (CUdeviceptr)dst, src, bytes, s);
    return wait_blocking(c, s, st, bytes, "a blocking host-to-device copy");
}

mg_status mg_cuda_copy_d2h(void *ctx, void *dst, mg_devptr src, size_t bytes) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || bytes == 0)
        return st;
    CUstream s = mg_cuda_blocking_stream(c);
    if (!mg_pinned_contains(dst, bytes))
        return staged_d2h(c, dst, (CUdeviceptr)src, bytes, s);
    st = dma_d2h(c, dst, src, bytes, s);
    return wait_blocking(c, s, st, bytes, "a blocking device-to-host copy");
}

mg_status mg_cuda_copy_d2d(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes) {
    CUstream s = mg_cuda_blocking_stream(ctx);
    return wait_blocking(ctx, s, mg_cuda_copy_d2d_async(ctx, dst, src, bytes, s), bytes,
                         "a blocking device-to-device copy");
}

mg_status mg_cuda_copy_h2d_async(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                 void *stream, bool retained) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || bytes == 0)
        return st;
    bool pinned = mg_pinned_contains(src, bytes);
    if (retained && pinned)
        return dma_h2d(c, dst, src, bytes, stream);
    /* Staging waits on the host for ring slots and copies on the host now: neither can be
     * recorded into a graph. */
    if (mg_cuda_stream_capturing(c, stream)) {
        if (retained)
            return MG_ERROR(MG_ERR_CAPTURING,
                            "mg_copy_h2d_async_retained: the stream is capturing and the "
                            "%zu-byte source %p is not registered page-locked memory; "
                            "capture copies only from mg_host_alloc'ed or "
                            "mg_pinned_register'ed memory",
                            bytes, src);
        return MG_ERROR(MG_ERR_CAPTURING,
                        "mg_copy_h2d_async: the stream is capturing and this call stages "
                        "its %zu-byte source through host buffers, which a graph cannot "
                        "replay; use mg_copy_h2d_async_retained with page-locked memory "
                        "(mg_host_alloc) that stays valid while the graph is used",
                        bytes);
    }
    return staged_h2d(c, (CUdeviceptr)dst, src, bytes, stream);
}

mg_status mg_cuda_copy_d2h_async(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || bytes == 0)
        return st;
    if (mg_pinned_contains(dst, bytes))
        return dma_d2h(c, dst, src, bytes, stream);
    if (mg_cuda_stream_capturing(c, stream))
        return MG_ERROR(MG_ERR_CAPTURING,
                        "mg_copy_d2h_async: the stream is capturing and the %zu-byte "
                        "destination %p is not registered page-locked memory; capture "
                        "copies only into mg_host_alloc'ed or mg_pinned_register'ed memory",
                        bytes, dst);
    /* A pageable destination cannot be written by DMA later: stage and finish now. */
    return staged_d2h(c, dst, (CUdeviceptr)src, bytes, stream);
}

mg_status mg_cuda_copy_d2d_async(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                 void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || bytes == 0)
        return st;
    return dma_d2d(c, dst, src, bytes, stream);
}

mg_status mg_cuda_copy_2d_d2d_async(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                    size_t src_pitch, size_t width_bytes, size_t height,
                                    void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || width_bytes == 0 || height == 0)
        return st;
    CUDA_MEMCPY2D copy;
    memset(&copy, 0, sizeof copy);
    copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = (CUdeviceptr)src;
    copy.srcPitch = src_pitch;
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = (CUdeviceptr)dst;
    copy.dstPitch = dst_pitch;
    copy.WidthInBytes = width_bytes;
    copy.Height = height;
    CUresult r = c->drv->Memcpy2DAsync(&copy, stream);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    return MG_CUDA_FAIL(c, r, "cuMemcpy2DAsync",
                        "%zu rows of %zu bytes, pitches %zu (dst) and %zu (src)", height,
                        width_bytes, dst_pitch, src_pitch);
}

/* ------------------------------------------------------------------ memsets */

static mg_status memset_on(mg_cuda_context *c, mg_devptr dst, uint8_t value, size_t bytes,
                           CUstream stream) {
    CUresult r = c->drv->MemsetD8Async((CUdeviceptr)dst, value, bytes, stream);
    if (r == CUDA_SUCCESS)
        return MG_OK;
    char size[32];
    return MG_CUDA_FAIL(c, r, "cuMemsetD8Async", "%s at 0x%llx",
                        mg_format_bytes(bytes, size, sizeof size), (unsigned long long)dst);
}

mg_status mg_cuda_memset(void *ctx, mg_devptr dst, uint8_t value, size_t bytes) {
    CUstream s = mg_cuda_blocking_stream(ctx);
    return wait_blocking(ctx, s, mg_cuda_memset_async(ctx, dst, value, bytes, s), bytes,
                         "a blocking memset");
}

mg_status mg_cuda_memset_async(void *ctx, mg_devptr dst, uint8_t value, size_t bytes,
                               void *stream) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st || bytes == 0)
        return st;
    return memset_on(c, dst, value, bytes, stream);
}
