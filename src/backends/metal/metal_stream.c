/* metal_stream.c - the Metal backend's copies, memsets, streams, events and graphs.
 *
 * Stream work is an mg_command (src/core/command_list.h). On a stream that is not capturing
 * it is encoded at once into the stream's open command buffer: kernels into a compute
 * encoder, device copies and fills into a blit encoder. Each encoder is ended before another
 * is made and before the command buffer is committed, and a command buffer is committed
 * before anything waits for it. Host copies need the GPU's earlier work finished, so they
 * commit and wait, then copy through the shared memory. On a capturing stream the command is
 * recorded instead and encoded each time the graph is launched; device ranges are resolved
 * when it is encoded, so a graph replayed after a buffer was freed fails with a message.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "metal_internal.h"

struct mg_metal_stream {
    mg_metal_stream *prev, *next;
    pthread_mutex_t lock; /* orders the stream's work and guards everything below */
    mg_id queue;          /* id<MTLCommandQueue>, owned */
    mg_id open;           /* the command buffer work is encoded into, retained; or nil */
    mg_id encoder;        /* its open compute encoder, retained; or nil */
    mg_id last;           /* the last committed command buffer, retained; or nil */
    bool capturing;
    mg_command_list capture;
};

struct mg_metal_event {
    mg_metal_event *prev, *next;
    mg_metal_backend *owner;
    _Atomic int refs;     /* the handle's and one per recorded command naming it */
    mg_id shared;         /* id<MTLSharedEvent>, owned */
    pthread_mutex_t lock; /* guards value and signaller */
    uint64_t value;       /* the value the last record signals; 0: never recorded */
    mg_id signaller;      /* the committed command buffer that signals it, retained */
};

struct mg_metal_graph {
    mg_metal_graph *prev, *next;
    pthread_mutex_t lock; /* a launch and an update of the same graph do not interleave */
    mg_command_list commands;
};

#define LIST_LINK(head, obj)                                                                       \
    do {                                                                                           \
        (obj)->prev = NULL;                                                                        \
        (obj)->next = (head);                                                                      \
        if (head)                                                                                  \
            (head)->prev = (obj);                                                                  \
        (head) = (obj);                                                                            \
    } while (0)

#define LIST_UNLINK(head, obj)                                                                     \
    do {                                                                                           \
        if ((obj)->prev)                                                                           \
            (obj)->prev->next = (obj)->next;                                                       \
        else                                                                                       \
            (head) = (obj)->next;                                                                  \
        if ((obj)->next)                                                                           \
            (obj)->next->prev = (obj)->prev;                                                       \
    } while (0)

/* ------------------------------------------------------------------ events: references */

static void event_free(mg_metal_event *e) {
    mg_metal_release(e->owner->rt, e->signaller);
    mg_metal_release(e->owner->rt, e->shared);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

static void event_release(mg_metal_event *e) {
    if (atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    mg_metal_backend *c = e->owner;
    pthread_mutex_lock(&c->lock);
    LIST_UNLINK(c->events, e);
    pthread_mutex_unlock(&c->lock);
    event_free(e);
}

static void event_retain_hook(void *event) {
    atomic_fetch_add(&((mg_metal_event *)event)->refs, 1);
}

static void event_release_hook(void *event) {
    event_release(event);
}

static const char *kernel_name_hook(const void *kernel) {
    return mg_metal_kernel_full_name(kernel);
}

static const mg_command_hooks hooks = {event_retain_hook, event_release_hook, kernel_name_hook};

/* ------------------------------------------------------------------ command buffers */

/* The stream's open command buffer, made on first use. Caller holds s->lock. */
static mg_status open_buffer(mg_metal_backend *c, mg_metal_stream *s, const char *call) {
    if (s->open)
        return MG_OK;
    const mg_metal_runtime *rt = c->rt;
    void *pool = mg_metal_pool_push(rt);
    /* `commandBuffer`, not the unretained variant: it keeps every buffer it uses alive
     * until it completes, so mg_free during flight is safe. */
    s->open =
        mg_metal_retain(rt, MG_MSG(rt, mg_id, (mg_id, mg_sel))(s->queue, rt->sel.commandBuffer));
    mg_metal_pool_pop(rt, pool);
    if (!s->open)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal %s: commandBuffer returned nil", call);
    return MG_OK;
}

static void end_encoder(mg_metal_backend *c, mg_metal_stream *s) {
    if (!s->encoder)
        return;
    MG_MSG(c->rt, void, (mg_id, mg_sel))(s->encoder, c->rt->sel.endEncoding);
    mg_metal_release(c->rt, s->encoder);
    s->encoder = NULL;
}

static mg_status compute_encoder(mg_metal_backend *c, mg_metal_stream *s, mg_id *out) {
    mg_status st = open_buffer(c, s, "launch");
    if (st)
        return st;
    if (!s->encoder) {
        const mg_metal_runtime *rt = c->rt;
        void *pool = mg_metal_pool_push(rt);
        s->encoder = mg_metal_retain(
            rt, MG_MSG(rt, mg_id, (mg_id, mg_sel))(s->open, rt->sel.computeCommandEncoder));
        mg_metal_pool_pop(rt, pool);
        if (!s->encoder)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                            "metal launch: computeCommandEncoder returned nil");
    }
    *out = s->encoder;
    return MG_OK;
}

/* Ends the encoder and commits the open command buffer (it becomes s->last). */
static void commit(mg_metal_backend *c, mg_metal_stream *s) {
    end_encoder(c, s);
    if (!s->open)
        return;
    MG_MSG(c->rt, void, (mg_id, mg_sel))(s->open, c->rt->sel.commit);
    mg_metal_release(c->rt, s->last);
    s->last = s->open;
    s->open = NULL;
}

/* Checks a completed command buffer: MG_ERR_DEVICE_FAULT with Metal's description when it
 * failed. */
static mg_status check_completed(mg_metal_backend *c, mg_id cb, const char *call) {
    const mg_metal_runtime *rt = c->rt;
    mg_nsuint status = MG_MSG(rt, mg_nsuint, (mg_id, mg_sel))(cb, rt->sel.status);
    if (status != MG_MTL_CB_STATUS_ERROR)
        return MG_OK;
    char why[512];
    mg_metal_describe_error(rt, MG_MSG(rt, mg_id, (mg_id, mg_sel))(cb, rt->sel.error), why,
                            sizeof why);
    return MG_ERROR(MG_ERR_DEVICE_FAULT, "metal %s: a command buffer failed: %s", call, why);
}

/* Commits and waits for all of the stream's work. Caller holds s->lock. */
static mg_status drain(mg_metal_backend *c, mg_metal_stream *s, const char *call) {
    commit(c, s);
    if (!s->last)
        return MG_OK;
    MG_MSG(c->rt, void, (mg_id, mg_sel))(s->last, c->rt->sel.waitUntilCompleted);
    mg_status st = check_completed(c, s->last, call);
    mg_metal_release(c->rt, s->last);
    s->last = NULL;
    return st;
}

/* A blit encoder on the open command buffer (autoreleased: used and ended at once, inside
 * the caller's pool). */
static mg_status blit_encoder(mg_metal_backend *c, mg_metal_stream *s, const char *call,
                              mg_id *out) {
    end_encoder(c, s);
    mg_status st = open_buffer(c, s, call);
    if (st)
        return st;
    *out = MG_MSG(c->rt, mg_id, (mg_id, mg_sel))(s->open, c->rt->sel.blitCommandEncoder);
    if (!*out)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal %s: blitCommandEncoder returned nil", call);
    return MG_OK;
}

/* ------------------------------------------------------------------ encoding a command */

typedef void (*copy_msg)(mg_id, mg_sel, mg_id, mg_nsuint, mg_id, mg_nsuint, mg_nsuint);

static mg_status encode_2d(mg_metal_backend *c, mg_metal_stream *s, const mg_command *cmd) {
    if (cmd->bytes == 0 || cmd->height == 0)
        return MG_OK;
    if (cmd->dst_pitch < cmd->bytes || cmd->src_pitch < cmd->bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal %s: pitches (dst %zu, src %zu) below the row width %zu", cmd->call,
                        cmd->dst_pitch, cmd->src_pitch, cmd->bytes);
    uint64_t rows_before_last = cmd->height - 1;
    if (rows_before_last > (UINT64_MAX - cmd->bytes) / cmd->dst_pitch ||
        rows_before_last > (UINT64_MAX - cmd->bytes) / cmd->src_pitch)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "metal %s: %zu rows of pitch %zu/%zu overflow",
                        cmd->call, cmd->height, cmd->dst_pitch, cmd->src_pitch);
    mg_id dst, src, blit;
    uint64_t dst_off, src_off;
    mg_status st;
    if ((st = mg_metal_resolve(c, cmd->dst, rows_before_last * cmd->dst_pitch + cmd->bytes,
                               cmd->call, "dst", &dst, &dst_off)) ||
        (st = mg_metal_resolve(c, cmd->src, rows_before_last * cmd->src_pitch + cmd->bytes,
                               cmd->call, "src", &src, &src_off)) ||
        (st = blit_encoder(c, s, cmd->call, &blit)))
        return st;
    copy_msg copy = (copy_msg)c->rt->objc_msgSend;
    for (size_t row = 0; row < cmd->height; row++)
        copy(blit, c->rt->sel.copyFromBuffer, src, src_off + row * cmd->src_pitch, dst,
             dst_off + row * cmd->dst_pitch, cmd->bytes);
    MG_MSG(c->rt, void, (mg_id, mg_sel))(blit, c->rt->sel.endEncoding);
    return MG_OK;
}

static mg_status encode_event_record(mg_metal_backend *c, mg_metal_stream *s, mg_metal_event *e) {
    mg_status st = open_buffer(c, s, "event_record");
    if (st)
        return st;
    end_encoder(c, s);
    pthread_mutex_lock(&e->lock);
    uint64_t value = ++e->value;
    MG_MSG(c->rt, void, (mg_id, mg_sel, mg_id, uint64_t))
    (s->open, c->rt->sel.encodeSignalEvent, e->shared, value);
    mg_id cb = s->open;
    /* Committed now, so waiting on the event never waits for a buffer nobody commits. */
    commit(c, s);
    mg_metal_release(c->rt, e->signaller);
    e->signaller = mg_metal_retain(c->rt, cb);
    pthread_mutex_unlock(&e->lock);
    return MG_OK;
}

static mg_status encode_wait_event(mg_metal_backend *c, mg_metal_stream *s, mg_metal_event *e) {
    pthread_mutex_lock(&e->lock);
    uint64_t value = e->value;
    pthread_mutex_unlock(&e->lock);
    if (!value)
        return MG_OK; /* never recorded: nothing to wait for, as on CUDA */
    mg_status st = open_buffer(c, s, "stream_wait_event");
    if (st)
        return st;
    end_encoder(c, s);
    MG_MSG(c->rt, void, (mg_id, mg_sel, mg_id, uint64_t))
    (s->open, c->rt->sel.encodeWaitForEvent, e->shared, value);
    return MG_OK;
}

/* Encodes (or, for host copies, performs) one command on `s`. Caller holds s->lock. */
static mg_status execute(mg_metal_backend *c, mg_metal_stream *s, const mg_command *cmd) {
    const mg_metal_runtime *rt = c->rt;
    mg_id dst, src, blit;
    uint64_t dst_off, src_off;
    mg_status st;
    switch (cmd->kind) {
    case MG_CMD_COPY_H2D:
    case MG_CMD_COPY_D2H: {
        if (cmd->bytes == 0)
            return MG_OK;
        bool h2d = cmd->kind == MG_CMD_COPY_H2D;
        mg_devptr dev = h2d ? cmd->dst : cmd->src;
        if ((st = mg_metal_resolve(c, dev, cmd->bytes, cmd->call, h2d ? "dst" : "src", &dst,
                                   &dst_off)) ||
            (st = drain(c, s, cmd->call)))
            return st;
        void *host = (void *)(uintptr_t)dev; /* shared storage: the contents address */
        if (h2d)
            memmove(host, cmd->host_src, cmd->bytes);
        else
            memmove(cmd->host_dst, host, cmd->bytes);
        return MG_OK;
    }
    case MG_CMD_COPY_D2D: {
        if (cmd->bytes == 0)
            return MG_OK;
        if ((st = mg_metal_resolve(c, cmd->dst, cmd->bytes, cmd->call, "dst", &dst, &dst_off)) ||
            (st = mg_metal_resolve(c, cmd->src, cmd->bytes, cmd->call, "src", &src, &src_off)))
            return st;
        void *pool = mg_metal_pool_push(rt);
        if (!(st = blit_encoder(c, s, cmd->call, &blit))) {
            ((copy_msg)rt->objc_msgSend)(blit, rt->sel.copyFromBuffer, src, src_off, dst, dst_off,
                                         cmd->bytes);
            MG_MSG(rt, void, (mg_id, mg_sel))(blit, rt->sel.endEncoding);
        }
        mg_metal_pool_pop(rt, pool);
        return st;
    }
    case MG_CMD_COPY_2D: {
        void *pool = mg_metal_pool_push(rt);
        st = encode_2d(c, s, cmd);
        mg_metal_pool_pop(rt, pool);
        return st;
    }
    case MG_CMD_MEMSET: {
        if (cmd->bytes == 0)
            return MG_OK;
        if ((st = mg_metal_resolve(c, cmd->dst, cmd->bytes, cmd->call, "dst", &dst, &dst_off)))
            return st;
        void *pool = mg_metal_pool_push(rt);
        if (!(st = blit_encoder(c, s, cmd->call, &blit))) {
            MG_MSG(rt, void, (mg_id, mg_sel, mg_id, mg_ns_range, uint8_t))
            (blit, rt->sel.fillBuffer, dst, (mg_ns_range){dst_off, cmd->bytes}, cmd->value);
            MG_MSG(rt, void, (mg_id, mg_sel))(blit, rt->sel.endEncoding);
        }
        mg_metal_pool_pop(rt, pool);
        return st;
    }
    case MG_CMD_LAUNCH: {
        mg_id encoder = NULL;
        if ((st = compute_encoder(c, s, &encoder)))
            return st;
        return mg_metal_encode_launch(c, encoder, cmd->kernel, cmd->launch);
    }
    case MG_CMD_EVENT_RECORD:
        return encode_event_record(c, s, cmd->event);
    case MG_CMD_WAIT_EVENT:
        return encode_wait_event(c, s, cmd->event);
    }
    return MG_ERROR(MG_ERR_INTERNAL, "metal backend: unknown command kind %d", (int)cmd->kind);
}

/* Encodes `cmd` on `s` now, or records it when `s` is capturing. */
static mg_status stream_submit(mg_metal_backend *c, mg_metal_stream *s, mg_command cmd) {
    mg_status st;
    pthread_mutex_lock(&s->lock);
    if (s->capturing)
        st = mg_command_list_record(&s->capture, cmd, &hooks);
    else
        st = execute(c, s, &cmd);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The synchronous calls: ordered after the default stream's work (as CUDA's legacy stream
 * orders them), then done by the host through the shared memory. */
static mg_status sync_call(mg_metal_backend *c, const char *call) {
    mg_metal_stream *s = c->default_stream;
    if (!s)
        return MG_OK;
    pthread_mutex_lock(&s->lock);
    mg_status st = s->capturing ? MG_OK : drain(c, s, call);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static mg_status host_range(mg_metal_backend *c, mg_devptr p, size_t bytes, const char *call,
                            const char *what, void **host) {
    mg_id buffer;
    uint64_t offset;
    mg_status st = mg_metal_resolve(c, p, bytes, call, what, &buffer, &offset);
    *host = (void *)(uintptr_t)p;
    return st;
}

mg_status mg_metal_copy_h2d(void *ctx, mg_devptr dst, const void *src, size_t bytes) {
    mg_metal_backend *c = ctx;
    void *d;
    mg_status st;
    if (!bytes)
        return MG_OK;
    if ((st = host_range(c, dst, bytes, "copy_h2d", "dst", &d)) || (st = sync_call(c, "copy_h2d")))
        return st;
    memmove(d, src, bytes);
    return MG_OK;
}

mg_status mg_metal_copy_d2h(void *ctx, void *dst, mg_devptr src, size_t bytes) {
    mg_metal_backend *c = ctx;
    void *s;
    mg_status st;
    if (!bytes)
        return MG_OK;
    if ((st = host_range(c, src, bytes, "copy_d2h", "src", &s)) || (st = sync_call(c, "copy_d2h")))
        return st;
    memmove(dst, s, bytes);
    return MG_OK;
}

mg_status mg_metal_copy_d2d(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes) {
    mg_metal_backend *c = ctx;
    void *d, *s;
    mg_status st;
    if (!bytes)
        return MG_OK;
    if ((st = host_range(c, dst, bytes, "copy_d2d", "dst", &d)) ||
        (st = host_range(c, src, bytes, "copy_d2d", "src", &s)) || (st = sync_call(c, "copy_d2d")))
        return st;
    memmove(d, s, bytes);
    return MG_OK;
}

mg_status mg_metal_memset(void *ctx, mg_devptr dst, uint8_t value, size_t bytes) {
    mg_metal_backend *c = ctx;
    void *d;
    mg_status st;
    if (!bytes)
        return MG_OK;
    if ((st = host_range(c, dst, bytes, "memset", "dst", &d)) || (st = sync_call(c, "memset")))
        return st;
    memset(d, value, bytes);
    return MG_OK;
}

mg_status mg_metal_copy_h2d_async(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                  void *stream, bool retained) {
    return stream_submit(
        ctx, stream,
        (mg_command){.kind = MG_CMD_COPY_H2D,
                     .call = retained ? "copy_h2d_async_retained" : "copy_h2d_async",
                     .dst = dst,
                     .host_src = src,
                     .bytes = bytes,
                     .retained = retained});
}

mg_status mg_metal_copy_d2h_async(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream) {
    return stream_submit(ctx, stream,
                         (mg_command){.kind = MG_CMD_COPY_D2H,
                                      .call = "copy_d2h_async",
                                      .host_dst = dst,
                                      .src = src,
                                      .bytes = bytes});
}

mg_status mg_metal_copy_d2d_async(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                  void *stream) {
    return stream_submit(ctx, stream,
                         (mg_command){.kind = MG_CMD_COPY_D2D,
                                      .call = "copy_d2d_async",
                                      .dst = dst,
                                      .src = src,
                                      .bytes = bytes});
}

mg_status mg_metal_copy_2d_d2d_async(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                     size_t src_pitch, size_t width_bytes, size_t height,
                                     void *stream) {
    return stream_submit(ctx, stream,
                         (mg_command){.kind = MG_CMD_COPY_2D,
                                      .call = "copy_2d_d2d_async",
                                      .dst = dst,
                                      .src = src,
                                      .bytes = width_bytes,
                                      .dst_pitch = dst_pitch,
                                      .src_pitch = src_pitch,
                                      .height = height});
}

mg_status mg_metal_memset_async(void *ctx, mg_devptr dst, uint8_t value, size_t bytes,
                                void *stream) {
    return stream_submit(ctx, stream,
                         (mg_command){.kind = MG_CMD_MEMSET,
                                      .call = "memset_async",
                                      .dst = dst,
                                      .value = value,
                                      .bytes = bytes});
}

mg_status mg_metal_stream_launch(mg_metal_backend *c, mg_metal_stream *s, mg_metal_kernel *k,
                                 const mg_launch *launch) {
    return stream_submit(
        c, s, (mg_command){.kind = MG_CMD_LAUNCH, .call = "launch", .kernel = k, .launch = launch});
}

/* ------------------------------------------------------------------ streams */

mg_status mg_metal_stream_create(void *ctx, bool is_default, void **out) {
    mg_metal_backend *c = ctx;
    mg_metal_stream *s = calloc(1, sizeof *s);
    if (!s)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal stream_create: out of host memory");
    s->queue = MG_MSG(c->rt, mg_id, (mg_id, mg_sel))(c->dev, c->rt->sel.newCommandQueue);
    if (!s->queue) {
        free(s);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal stream_create: newCommandQueue returned nil");
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_lock(&c->lock);
    LIST_LINK(c->streams, s);
    if (is_default)
        c->default_stream = s;
    pthread_mutex_unlock(&c->lock);
    *out = s;
    return MG_OK;
}

static void stream_free(mg_metal_backend *c, mg_metal_stream *s) {
    pthread_mutex_lock(&c->lock);
    LIST_UNLINK(c->streams, s);
    if (c->default_stream == s)
        c->default_stream = NULL;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&s->lock);
    mg_status st = drain(c, s, "stream_destroy"); /* its work finishes before the queue goes */
    (void)st; /* a failed buffer was reported by whoever waited; teardown goes on */
    pthread_mutex_unlock(&s->lock);
    mg_command_list_clear(&s->capture, &hooks);
    mg_metal_release(c->rt, s->queue);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

mg_status mg_metal_stream_destroy(void *ctx, void *stream) {
    mg_metal_backend *c = ctx;
    mg_metal_stream *s = stream;
    pthread_mutex_lock(&s->lock);
    bool capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    if (capturing)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "metal stream_destroy: the stream is capturing; end or abort the capture "
                        "first");
    stream_free(c, s);
    return MG_OK;
}

mg_status mg_metal_stream_synchronize(void *ctx, void *stream) {
    mg_metal_stream *s = stream;
    pthread_mutex_lock(&s->lock);
    mg_status st = s->capturing
                       ? MG_ERROR(MG_ERR_CAPTURING, "metal stream_synchronize: not "
                                                    "allowed while the stream is capturing")
                       : drain(ctx, s, "stream_synchronize");
    pthread_mutex_unlock(&s->lock);
    return st;
}

mg_status mg_metal_stream_is_capturing(void *ctx, void *stream, bool *capturing) {
    (void)ctx;
    mg_metal_stream *s = stream;
    pthread_mutex_lock(&s->lock);
    *capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    return MG_OK;
}

/* ------------------------------------------------------------------ events */

mg_status mg_metal_event_create(void *ctx, void **out) {
    mg_metal_backend *c = ctx;
    mg_metal_event *e = calloc(1, sizeof *e);
    if (!e)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal event_create: out of host memory");
    e->shared = MG_MSG(c->rt, mg_id, (mg_id, mg_sel))(c->dev, c->rt->sel.newSharedEvent);
    if (!e->shared) {
        free(e);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal event_create: newSharedEvent returned nil");
    }
    e->owner = c;
    atomic_init(&e->refs, 1);
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_lock(&c->lock);
    LIST_LINK(c->events, e);
    pthread_mutex_unlock(&c->lock);
    *out = e;
    return MG_OK;
}

mg_status mg_metal_event_record(void *ctx, void *event, void *stream) {
    return stream_submit(
        ctx, stream,
        (mg_command){.kind = MG_CMD_EVENT_RECORD, .call = "event_record", .event = event});
}

mg_status mg_metal_stream_wait_event(void *ctx, void *stream, void *event) {
    return stream_submit(
        ctx, stream,
        (mg_command){.kind = MG_CMD_WAIT_EVENT, .call = "stream_wait_event", .event = event});
}

/* The committed command buffer that signals `e` (retained; caller releases), or nil. */
static mg_id event_signaller(mg_metal_backend *c, mg_metal_event *e) {
    pthread_mutex_lock(&e->lock);
    mg_id cb = mg_metal_retain(c->rt, e->signaller);
    pthread_mutex_unlock(&e->lock);
    return cb;
}

mg_status mg_metal_event_synchronize(void *ctx, void *event) {
    mg_metal_backend *c = ctx;
    mg_id cb = event_signaller(c, event);
    if (!cb)
        return MG_OK; /* never recorded: nothing to wait for */
    MG_MSG(c->rt, void, (mg_id, mg_sel))(cb, c->rt->sel.waitUntilCompleted);
    mg_status st = check_completed(c, cb, "event_synchronize");
    mg_metal_release(c->rt, cb);
    return st;
}

mg_status mg_metal_event_query(void *ctx, void *event) {
    mg_metal_backend *c = ctx;
    mg_metal_event *e = event;
    pthread_mutex_lock(&e->lock);
    uint64_t value = e->value;
    pthread_mutex_unlock(&e->lock);
    if (!value)
        return MG_OK;
    uint64_t signaled =
        MG_MSG(c->rt, uint64_t, (mg_id, mg_sel))(e->shared, c->rt->sel.signaledValue);
    return signaled >= value ? MG_OK : MG_ERR_NOT_READY;
}

mg_status mg_metal_event_elapsed_ms(void *ctx, void *start, void *end, float *ms) {
    mg_metal_backend *c = ctx;
    mg_id a = event_signaller(c, start), b = event_signaller(c, end);
    mg_status st = MG_OK;
    if (!a || !b) {
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "metal event_elapsed_ms: the %s event was never recorded (or only into a "
                      "graph that has not run)",
                      !a ? "start" : "end");
    } else {
        typedef mg_nsuint (*status_msg)(mg_id, mg_sel);
        status_msg status = (status_msg)c->rt->objc_msgSend;
        if (status(a, c->rt->sel.status) < MG_MTL_CB_STATUS_COMPLETED ||
            status(b, c->rt->sel.status) < MG_MTL_CB_STATUS_COMPLETED) {
            st = MG_ERR_NOT_READY;
        } else {
            /* GPUEndTime: seconds, of the command buffer that signalled each event. */
            typedef double (*time_msg)(mg_id, mg_sel);
            time_msg end_time = (time_msg)c->rt->objc_msgSend;
            *ms =
                (float)((end_time(b, c->rt->sel.GPUEndTime) - end_time(a, c->rt->sel.GPUEndTime)) *
                        1e3);
        }
    }
    mg_metal_release(c->rt, a);
    mg_metal_release(c->rt, b);
    return st;
}

mg_status mg_metal_event_destroy(void *ctx, void *event) {
    (void)ctx;
    event_release(event);
    return MG_OK;
}

/* ------------------------------------------------------------------ graphs */

mg_status mg_metal_graph_begin_capture(void *ctx, void *stream) {
    mg_metal_stream *s = stream;
    pthread_mutex_lock(&s->lock);
    bool already = s->capturing;
    s->capturing = true;
    pthread_mutex_unlock(&s->lock);
    (void)ctx;
    if (already)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "metal graph_begin_capture: the stream is already capturing");
    return MG_OK;
}

static mg_status capture_take(mg_metal_stream *s, const char *call, mg_command_list *out) {
    pthread_mutex_lock(&s->lock);
    bool was = s->capturing;
    *out = s->capture;
    s->capture = (mg_command_list){0};
    s->capturing = false;
    pthread_mutex_unlock(&s->lock);
    if (!was)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "metal %s: the stream is not capturing", call);
    return MG_OK;
}

mg_status mg_metal_graph_end_capture(void *ctx, void *stream, void **graph_out) {
    mg_metal_backend *c = ctx;
    mg_command_list recorded;
    mg_status st = capture_take(stream, "graph_end_capture", &recorded);
    if (st)
        return st;
    mg_metal_graph *g = calloc(1, sizeof *g);
    if (!g) {
        mg_command_list_clear(&recorded, &hooks);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal graph_end_capture: out of host memory");
    }
    pthread_mutex_init(&g->lock, NULL);
    g->commands = recorded;
    pthread_mutex_lock(&c->lock);
    LIST_LINK(c->graphs, g);
    pthread_mutex_unlock(&c->lock);
    *graph_out = g;
    return MG_OK;
}

mg_status mg_metal_graph_end_capture_update(void *ctx, void *stream, void *graph,
                                            bool *updated_in_place) {
    (void)ctx;
    mg_metal_graph *g = graph;
    mg_command_list recorded;
    mg_status st = capture_take(stream, "graph_end_capture_update", &recorded);
    if (st)
        return st;
    pthread_mutex_lock(&g->lock);
    *updated_in_place = mg_command_list_same_topology(&g->commands, &recorded);
    mg_command_list old = g->commands;
    g->commands = recorded;
    pthread_mutex_unlock(&g->lock);
    mg_command_list_clear(&old, &hooks);
    return MG_OK;
}

mg_status mg_metal_graph_abort_capture(void *ctx, void *stream) {
    (void)ctx;
    mg_command_list recorded;
    mg_status st = capture_take(stream, "graph_abort_capture", &recorded);
    mg_command_list_clear(&recorded, &hooks);
    return st;
}

mg_status mg_metal_graph_launch(void *ctx, void *graph, void *stream) {
    mg_metal_backend *c = ctx;
    mg_metal_graph *g = graph;
    mg_metal_stream *s = stream;
    mg_status st = MG_OK;
    pthread_mutex_lock(&s->lock);
    pthread_mutex_lock(&g->lock);
    const mg_command_list *nodes = &g->commands;
    for (size_t i = 0; i < nodes->count && !st; i++) {
        if (s->capturing) {
            mg_command copy; /* a graph launched into a capture records a copy of its nodes */
            st = mg_command_clone(&nodes->items[i], &copy, &hooks);
            if (!st && (st = mg_command_list_append(&s->capture, &copy)))
                mg_command_release(&copy, &hooks);
        } else if ((st = execute(c, s, &nodes->items[i]))) {
            mg_error_append(" (graph node %zu of %zu)", i + 1, nodes->count);
        }
    }
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void graph_free(mg_metal_backend *c, mg_metal_graph *g) {
    pthread_mutex_lock(&c->lock);
    LIST_UNLINK(c->graphs, g);
    pthread_mutex_unlock(&c->lock);
    mg_command_list_clear(&g->commands, &hooks);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

mg_status mg_metal_graph_count_nodes(void *ctx, void *graph, size_t *kernels, size_t *nodes) {
    (void)ctx;
    mg_metal_graph *g = graph;
    pthread_mutex_lock(&g->lock);
    *kernels = mg_command_list_launches(&g->commands);
    *nodes = g->commands.count;
    pthread_mutex_unlock(&g->lock);
    return MG_OK;
}

mg_status mg_metal_graph_destroy(void *ctx, void *graph) {
    graph_free(ctx, graph);
    return MG_OK;
}

void mg_metal_release_all_objects(mg_metal_backend *c) {
    while (c->graphs)
        graph_free(c, c->graphs);
    while (c->streams)
        stream_free(c, c->streams);
    while (c->events) {
        mg_metal_event *e = c->events;
        LIST_UNLINK(c->events, e);
        event_free(e);
    }
}
