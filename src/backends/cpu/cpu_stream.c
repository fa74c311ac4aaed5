/* cpu_stream.c - the CPU backend's copies, memsets, streams, events and graphs.
 *
 * Every piece of stream work is a command. On a stream that is not capturing the command
 * runs at once in the calling thread, under the stream's lock, so a stream's work is in
 * order and complete when the enqueueing call returns; events are therefore complete as
 * soon as they are recorded. On a capturing stream the command is recorded instead (taking
 * its own copy of anything the caller may drop on return) and runs each time the graph is
 * launched (the list is src/core/command_list.h, shared with the Metal backend). Commands
 * check their device ranges when they run, not when they are recorded.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "command_list.h"
#include "cpu_backend.h"
#include "error.h"

struct mg_cpu_stream {
    mg_cpu_stream *prev, *next; /* the backend's list of live streams */
    pthread_mutex_t lock;       /* orders the stream's work and guards the capture */
    bool is_default;
    bool capturing;
    mg_command_list capture;
};

struct mg_cpu_event {
    mg_cpu_event *prev, *next;
    mg_cpu_backend *owner;
    /* The handle holds one reference and every recorded command naming the event one more
     * (command_list.h), so destroying an event that a graph still names is safe. */
    _Atomic int refs;
    /* CLOCK_MONOTONIC time at which the recorded work completed; 0 while never recorded. */
    _Atomic uint64_t completed_ns;
};

struct mg_cpu_graph {
    mg_cpu_graph *prev, *next;
    pthread_mutex_t lock; /* a launch and an update of the same graph do not interleave */
    mg_command_list commands;
};

/* ------------------------------------------------------------------ object lists */

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

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void event_release(mg_cpu_event *e) {
    if (atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    mg_cpu_backend *c = e->owner;
    pthread_mutex_lock(&c->lock);
    LIST_UNLINK(c->events, e);
    pthread_mutex_unlock(&c->lock);
    free(e);
}

/* ------------------------------------------------------------------ commands */

static void event_retain_hook(void *event) {
    atomic_fetch_add(&((mg_cpu_event *)event)->refs, 1);
}

static void event_release_hook(void *event) {
    event_release(event);
}

static const char *kernel_name_hook(const void *kernel) {
    return mg_cpu_kernel_full_name(kernel);
}

static const mg_command_hooks hooks = {event_retain_hook, event_release_hook, kernel_name_hook};

/* Runs one command now. Device ranges are checked here, so a graph replayed after one of
 * its buffers was freed fails with a message instead of touching freed memory. */
static mg_status command_execute(mg_cpu_backend *c, const mg_command *cmd) {
    void *dst, *src;
    mg_status st = MG_OK;
    switch (cmd->kind) {
    case MG_CMD_COPY_H2D:
        if (cmd->bytes == 0)
            return MG_OK;
        if ((st = mg_cpu_resolve(c, cmd->dst, cmd->bytes, cmd->call, "dst", &dst)))
            return st;
        memmove(dst, cmd->host_src, cmd->bytes);
        return MG_OK;
    case MG_CMD_COPY_D2H:
        if (cmd->bytes == 0)
            return MG_OK;
        if ((st = mg_cpu_resolve(c, cmd->src, cmd->bytes, cmd->call, "src", &src)))
            return st;
        memmove(cmd->host_dst, src, cmd->bytes);
        return MG_OK;
    case MG_CMD_COPY_D2D:
        if (cmd->bytes == 0)
            return MG_OK;
        if ((st = mg_cpu_resolve(c, cmd->dst, cmd->bytes, cmd->call, "dst", &dst)) ||
            (st = mg_cpu_resolve(c, cmd->src, cmd->bytes, cmd->call, "src", &src)))
            return st;
        memmove(dst, src, cmd->bytes);
        return MG_OK;
    case MG_CMD_COPY_2D: {
        if (cmd->bytes == 0 || cmd->height == 0)
            return MG_OK;
        if (cmd->dst_pitch < cmd->bytes || cmd->src_pitch < cmd->bytes)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "cpu %s: pitches (dst %zu, src %zu) below the row width %zu", cmd->call,
                            cmd->dst_pitch, cmd->src_pitch, cmd->bytes);
        /* The last row ends at (height - 1) * pitch + width: only those bytes are touched. */
        uint64_t rows_before_last = cmd->height - 1;
        if (rows_before_last > (UINT64_MAX - cmd->bytes) / cmd->dst_pitch ||
            rows_before_last > (UINT64_MAX - cmd->bytes) / cmd->src_pitch)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu %s: %zu rows of pitch %zu/%zu overflow",
                            cmd->call, cmd->height, cmd->dst_pitch, cmd->src_pitch);
        uint64_t dst_span = rows_before_last * cmd->dst_pitch + cmd->bytes;
        uint64_t src_span = rows_before_last * cmd->src_pitch + cmd->bytes;
        if ((st = mg_cpu_resolve(c, cmd->dst, dst_span, cmd->call, "dst", &dst)) ||
            (st = mg_cpu_resolve(c, cmd->src, src_span, cmd->call, "src", &src)))
            return st;
        for (size_t row = 0; row < cmd->height; row++)
            memmove((char *)dst + row * cmd->dst_pitch, (const char *)src + row * cmd->src_pitch,
                    cmd->bytes);
        return MG_OK;
    }
    case MG_CMD_MEMSET:
        if (cmd->bytes == 0)
            return MG_OK;
        if ((st = mg_cpu_resolve(c, cmd->dst, cmd->bytes, cmd->call, "dst", &dst)))
            return st;
        memset(dst, cmd->value, cmd->bytes);
        return MG_OK;
    case MG_CMD_LAUNCH:
        return mg_cpu_kernel_execute(c, cmd->kernel, cmd->launch);
    case MG_CMD_EVENT_RECORD:
        atomic_store(&((mg_cpu_event *)cmd->event)->completed_ns, monotonic_ns());
        return MG_OK;
    case MG_CMD_WAIT_EVENT:
        return MG_OK; /* the event's work completed when it was recorded */
    }
    return MG_ERROR(MG_ERR_INTERNAL, "cpu backend: unknown command kind %d", (int)cmd->kind);
}

/* Runs `cmd` on `s` now, or records it when `s` is capturing. */
static mg_status stream_submit(mg_cpu_backend *c, mg_cpu_stream *s, mg_command cmd) {
    mg_status st;
    pthread_mutex_lock(&s->lock);
    if (s->capturing) {
        st = mg_command_list_record(&s->capture, cmd, &hooks);
    } else {
        st = command_execute(c, &cmd);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ------------------------------------------------------------------ copies and memsets */

mg_status mg_cpu_copy_h2d(void *ctx, mg_devptr dst, const void *src, size_t bytes) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_h2d);
    return command_execute(c, &(mg_command){.kind = MG_CMD_COPY_H2D,
                                            .call = "copy_h2d",
                                            .dst = dst,
                                            .host_src = src,
                                            .bytes = bytes});
}

mg_status mg_cpu_copy_d2h(void *ctx, void *dst, mg_devptr src, size_t bytes) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_d2h);
    return command_execute(c, &(mg_command){.kind = MG_CMD_COPY_D2H,
                                            .call = "copy_d2h",
                                            .host_dst = dst,
                                            .src = src,
                                            .bytes = bytes});
}

mg_status mg_cpu_copy_d2d(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_d2d);
    return command_execute(
        c,
        &(mg_command){
            .kind = MG_CMD_COPY_D2D, .call = "copy_d2d", .dst = dst, .src = src, .bytes = bytes});
}

mg_status mg_cpu_copy_h2d_async(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                void *stream, bool retained) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_h2d_async);
    return stream_submit(
        c, stream,
        (mg_command){.kind = MG_CMD_COPY_H2D,
                     .call = retained ? "copy_h2d_async_retained" : "copy_h2d_async",
                     .dst = dst,
                     .host_src = src,
                     .bytes = bytes,
                     .retained = retained});
}

mg_status mg_cpu_copy_d2h_async(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_d2h_async);
    return stream_submit(c, stream,
                         (mg_command){.kind = MG_CMD_COPY_D2H,
                                      .call = "copy_d2h_async",
                                      .host_dst = dst,
                                      .src = src,
                                      .bytes = bytes});
}

mg_status mg_cpu_copy_d2d_async(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_d2d_async);
    return stream_submit(c, stream,
                         (mg_command){.kind = MG_CMD_COPY_D2D,
                                      .call = "copy_d2d_async",
                                      .dst = dst,
                                      .src = src,
                                      .bytes = bytes});
}

mg_status mg_cpu_copy_2d_d2d_async(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                   size_t src_pitch, size_t width_bytes, size_t height,
                                   void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_copy_2d);
    return stream_submit(c, stream,
                         (mg_command){.kind = MG_CMD_COPY_2D,
                                      .call = "copy_2d_d2d_async",
                                      .dst = dst,
                                      .src = src,
                                      .bytes = width_bytes,
                                      .dst_pitch = dst_pitch,
                                      .src_pitch = src_pitch,
                                      .height = height});
}

mg_status mg_cpu_memset(void *ctx, mg_devptr dst, uint8_t value, size_t bytes) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_memset);
    return command_execute(
        c,
        &(mg_command){
            .kind = MG_CMD_MEMSET, .call = "memset", .dst = dst, .value = value, .bytes = bytes});
}

mg_status mg_cpu_memset_async(void *ctx, mg_devptr dst, uint8_t value, size_t bytes, void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_memset_async);
    return stream_submit(c, stream,
                         (mg_command){.kind = MG_CMD_MEMSET,
                                      .call = "memset_async",
                                      .dst = dst,
                                      .value = value,
                                      .bytes = bytes});
}

mg_status mg_cpu_stream_launch(mg_cpu_backend *c, mg_cpu_stream *s, mg_cpu_kernel *k,
                               const mg_launch *launch) {
    return stream_submit(
        c, s, (mg_command){.kind = MG_CMD_LAUNCH, .call = "launch", .kernel = k, .launch = launch});
}

/* ------------------------------------------------------------------ streams */

mg_status mg_cpu_stream_create(void *ctx, bool is_default, void **out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_stream_create);
    mg_cpu_stream *s = calloc(1, sizeof *s);
    if (!s)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu stream_create: out of host memory");
    pthread_mutex_init(&s->lock, NULL);
    s->is_default = is_default;
    pthread_mutex_lock(&c->lock);
    LIST_LINK(c->streams, s);
    pthread_mutex_unlock(&c->lock);
    *out = s;
    return MG_OK;
}

static void stream_free(mg_cpu_backend *c, mg_cpu_stream *s) {
    pthread_mutex_lock(&c->lock);
    LIST_UNLINK(c->streams, s);
    pthread_mutex_unlock(&c->lock);
    mg_command_list_clear(&s->capture, &hooks);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

mg_status mg_cpu_stream_destroy(void *ctx, void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_stream *s = stream;
    mg_cpu_count(c, MG_CPU_COUNT_stream_destroy);
    pthread_mutex_lock(&s->lock); /* waits for work another thread is running on it */
    bool capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    if (capturing)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "cpu stream_destroy: the stream is capturing; end or abort the capture "
                        "first");
    stream_free(c, s);
    return MG_OK;
}

mg_status mg_cpu_stream_synchronize(void *ctx, void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_stream *s = stream;
    mg_cpu_count(c, MG_CPU_COUNT_stream_synchronize);
    pthread_mutex_lock(&s->lock); /* work is done when its enqueueing call returns */
    bool capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    if (capturing)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "cpu stream_synchronize: not allowed while the stream is capturing");
    return MG_OK;
}

mg_status mg_cpu_stream_is_capturing(void *ctx, void *stream, bool *capturing) {
    mg_cpu_count(ctx, MG_CPU_COUNT_stream_is_capturing);
    mg_cpu_stream *s = stream;
    pthread_mutex_lock(&s->lock);
    *capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    return MG_OK;
}

/* ------------------------------------------------------------------ events */

mg_status mg_cpu_event_create(void *ctx, void **out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_event_create);
    mg_cpu_event *e = calloc(1, sizeof *e);
    if (!e)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu event_create: out of host memory");
    e->owner = c;
    atomic_init(&e->refs, 1);
    atomic_init(&e->completed_ns, 0);
    pthread_mutex_lock(&c->lock);
    LIST_LINK(c->events, e);
    pthread_mutex_unlock(&c->lock);
    *out = e;
    return MG_OK;
}

mg_status mg_cpu_event_record(void *ctx, void *event, void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_event_record);
    return stream_submit(
        c, stream,
        (mg_command){.kind = MG_CMD_EVENT_RECORD, .call = "event_record", .event = event});
}

mg_status mg_cpu_stream_wait_event(void *ctx, void *stream, void *event) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_event_wait);
    return stream_submit(
        c, stream,
        (mg_command){.kind = MG_CMD_WAIT_EVENT, .call = "stream_wait_event", .event = event});
}

/* An event recorded on a stream is complete when the recording call returns; one that was
 * never recorded (or only into a graph not launched yet) has nothing to wait for, as on
 * CUDA. So synchronize returns at once and query is always MG_OK. */
mg_status mg_cpu_event_synchronize(void *ctx, void *event) {
    mg_cpu_backend *c = ctx;
    (void)event;
    mg_cpu_count(c, MG_CPU_COUNT_event_synchronize);
    return MG_OK;
}

mg_status mg_cpu_event_query(void *ctx, void *event) {
    mg_cpu_backend *c = ctx;
    (void)event;
    mg_cpu_count(c, MG_CPU_COUNT_event_query);
    return MG_OK;
}

mg_status mg_cpu_event_elapsed_ms(void *ctx, void *start, void *end, float *ms) {
    mg_cpu_count(ctx, MG_CPU_COUNT_event_elapsed);
    uint64_t start_ns = atomic_load(&((mg_cpu_event *)start)->completed_ns);
    uint64_t end_ns = atomic_load(&((mg_cpu_event *)end)->completed_ns);
    if (!start_ns || !end_ns)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu event_elapsed_ms: the %s event was never recorded (or only into a "
                        "graph that has not run)",
                        !start_ns ? "start" : "end");
    *ms = (float)(((double)end_ns - (double)start_ns) / 1e6);
    return MG_OK;
}

mg_status mg_cpu_event_destroy(void *ctx, void *event) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_event_destroy);
    event_release(event);
    return MG_OK;
}

/* ------------------------------------------------------------------ graphs */

mg_status mg_cpu_graph_begin_capture(void *ctx, void *stream) {
    mg_cpu_count(ctx, MG_CPU_COUNT_graph_begin_capture);
    mg_cpu_stream *s = stream;
    pthread_mutex_lock(&s->lock);
    bool already = s->capturing;
    s->capturing = true;
    pthread_mutex_unlock(&s->lock);
    if (already)
        return MG_ERROR(MG_ERR_CAPTURING,
                        "cpu graph_begin_capture: the stream is already capturing");
    return MG_OK;
}

/* Ends the capture of `s`, moving the recorded commands to `out`. */
static mg_status capture_take(mg_cpu_stream *s, const char *call, mg_command_list *out) {
    pthread_mutex_lock(&s->lock);
    bool was = s->capturing;
    *out = s->capture;
    s->capture = (mg_command_list){0};
    s->capturing = false;
    pthread_mutex_unlock(&s->lock);
    if (!was)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu %s: the stream is not capturing", call);
    return MG_OK;
}

mg_status mg_cpu_graph_end_capture(void *ctx, void *stream, void **graph_out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_graph_capture);
    mg_command_list recorded;
    mg_status st = capture_take(stream, "graph_end_capture", &recorded);
    if (st)
        return st;
    mg_cpu_graph *g = calloc(1, sizeof *g);
    if (!g) {
        mg_command_list_clear(&recorded, &hooks);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu graph_end_capture: out of host memory");
    }
    pthread_mutex_init(&g->lock, NULL);
    g->commands = recorded;
    pthread_mutex_lock(&c->lock);
    LIST_LINK(c->graphs, g);
    pthread_mutex_unlock(&c->lock);
    *graph_out = g;
    return MG_OK;
}

mg_status mg_cpu_graph_end_capture_update(void *ctx, void *stream, void *graph,
                                          bool *updated_in_place) {
    mg_cpu_backend *c = ctx;
    mg_cpu_graph *g = graph;
    mg_cpu_count(c, MG_CPU_COUNT_graph_capture);
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

mg_status mg_cpu_graph_abort_capture(void *ctx, void *stream) {
    mg_cpu_count(ctx, MG_CPU_COUNT_graph_abort_capture);
    mg_command_list recorded;
    mg_status st = capture_take(stream, "graph_abort_capture", &recorded);
    mg_command_list_clear(&recorded, &hooks);
    return st;
}

mg_status mg_cpu_graph_launch(void *ctx, void *graph, void *stream) {
    mg_cpu_backend *c = ctx;
    mg_cpu_graph *g = graph;
    mg_cpu_stream *s = stream;
    mg_cpu_count(c, MG_CPU_COUNT_graph_launch);
    mg_status st = MG_OK;
    pthread_mutex_lock(&s->lock);
    pthread_mutex_lock(&g->lock);
    const mg_command_list *nodes = &g->commands;
    for (size_t i = 0; i < nodes->count && !st; i++) {
        if (s->capturing) {
            /* Launching a graph into a capture records a copy of its nodes, as CUDA
             * records a child graph. */
            mg_command copy;
            st = mg_command_clone(&nodes->items[i], &copy, &hooks);
            if (!st && (st = mg_command_list_append(&s->capture, &copy)))
                mg_command_release(&copy, &hooks);
        } else if ((st = command_execute(c, &nodes->items[i]))) {
            mg_error_append(" (graph node %zu of %zu)", i + 1, nodes->count);
        }
    }
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void graph_free(mg_cpu_backend *c, mg_cpu_graph *g) {
    pthread_mutex_lock(&c->lock);
    LIST_UNLINK(c->graphs, g);
    pthread_mutex_unlock(&c->lock);
    mg_command_list_clear(&g->commands, &hooks);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

mg_status mg_cpu_graph_count_nodes(void *ctx, void *graph, size_t *kernels, size_t *nodes) {
    (void)ctx;
    mg_cpu_graph *g = graph;
    pthread_mutex_lock(&g->lock); /* not while an update replaces the commands */
    *kernels = mg_command_list_launches(&g->commands);
    *nodes = g->commands.count;
    pthread_mutex_unlock(&g->lock);
    return MG_OK;
}

mg_status mg_cpu_graph_destroy(void *ctx, void *graph) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_graph_destroy);
    graph_free(c, graph);
    return MG_OK;
}

void mg_cpu_release_all_objects(mg_cpu_backend *c) {
    /* Graphs and captures first: they hold event references. */
    while (c->graphs)
        graph_free(c, c->graphs);
    while (c->streams)
        stream_free(c, c->streams);
    while (c->events) {
        mg_cpu_event *e = c->events;
        pthread_mutex_lock(&c->lock);
        LIST_UNLINK(c->events, e);
        pthread_mutex_unlock(&c->lock);
        free(e);
    }
}
