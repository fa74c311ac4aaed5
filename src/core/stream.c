/*
 * stream.c - streams, events and graphs of metrale/gpu.h: handle checks, the capture rules
 * (a capturing stream refuses blocking work), and the per-stream cleanup of op state when a
 * stream is destroyed.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "error.h"
#include "op_cache.h"
#include "op_state.h"

/* ------------------------------------------------------------------ streams */

mg_stream *mg_stream_default(mg_backend *b) {
    return mg_handle_is(b, MG_HANDLE_BACKEND) ? b->default_stream : NULL;
}

mg_status mg_stream_create(mg_backend *b, mg_stream **out) {
    mg_status st = mg_core_enter(b, "mg_stream_create");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_stream_create: NULL output");
    *out = NULL;
    void *impl = NULL;
    if ((st = b->ops->stream_create(b->ctx, false, &impl)))
        return st;
    if ((st = mg_core_wrap_stream(b, impl, false, out)))
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
    mg_op_state_stream_destroyed(b, s);
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
    mg_status st = mg_core_enter(b, "mg_event_create");
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
        st = mg_core_resolve_stream(e->owner, s, "mg_event_record", &rs);
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
        st = mg_core_resolve_stream(b, s, "mg_graph_launch", &rs);
    if (st)
        return st;
    return b->ops->graph_launch(b->ctx, g->impl, rs->impl);
}

mg_status mg_graph_count_nodes(mg_graph *g, size_t *kernels, size_t *nodes) {
    if (!mg_handle_is(g, MG_HANDLE_GRAPH))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_graph_count_nodes: %s graph handle %p",
                        g ? "invalid or destroyed" : "NULL", (void *)g);
    mg_backend *b = g->owner;
    if (!b->ops->graph_count_nodes)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_graph_count_nodes: the %s backend cannot count "
                        "the nodes of its graphs",
                        mg_backend_kind_name(mg_backend_get_kind(b)));
    size_t k = 0, n = 0;
    mg_status st = b->ops->graph_count_nodes(b->ctx, g->impl, &k, &n);
    if (!st && kernels)
        *kernels = k;
    if (!st && nodes)
        *nodes = n;
    return st;
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
