/* comm.c - the front of metrale/comm.h: every argument checked once, the communicator's
 * failure state, the timeout, the groups of each thread, then the transport the op registry
 * chooses for the backend (comm_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_impl.h"
#include "comm_internal.h"
#include "error.h"
#include "op_builtin.h"

#define DEFAULT_TIMEOUT_MS 60000u
#define MAX_GROUP_COMMS 256

uint64_t mg_comm_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The transports, one per backend kind that has one. */
static const mg_op_provider *const comm_providers[] = {
    &mg_comm_cpu_provider.base,
#if defined(METRALE_HAVE_CUDA)
    &mg_comm_nccl_provider.base,
#endif
    NULL,
};

const mg_op_def mg_comm_op = {MG_OP_COMM, "comm", comm_providers};

/* The transport for backends of `kind`, NULL when this build has none. Only the calls that
 * take a kind ask this (a communicator id is made before any backend); every call with a
 * backend lets the op registry choose (choose_transport). */
static const mg_comm_provider *transport_of_kind(mg_backend_kind kind) {
    for (const mg_op_provider *const *p = comm_providers; *p; p++)
        if ((*p)->backend == kind)
            return (const mg_comm_provider *)*p;
    return NULL;
}

static mg_status no_provider(const char *fn, mg_backend_kind kind) {
    if ((unsigned)kind > MG_BACKEND_AUTO || kind == MG_BACKEND_AUTO)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: no backend kind %d", fn, (int)kind);
    return MG_ERROR(MG_ERR_UNAVAILABLE, "%s: no communicators for the %s backend in this build", fn,
                    mg_backend_kind_name(kind));
}

const char *mg_comm_reduce_name(mg_comm_reduce op) {
    switch (op) {
    case MG_COMM_SUM:
        return "sum";
    case MG_COMM_MAX:
        return "max";
    }
    return "?";
}

bool mg_comm_available(mg_backend_kind kind, char *reason, size_t reason_bytes) {
    const mg_comm_provider *p = transport_of_kind(kind);
    if (!p) {
        if (reason && reason_bytes)
            snprintf(reason, reason_bytes, "no communicators for backend kind %d in this build",
                     (int)kind);
        return false;
    }
    char scratch[8];
    if (!reason || !reason_bytes) {
        reason = scratch;
        reason_bytes = sizeof scratch;
    }
    return p->available(reason, reason_bytes);
}

mg_status mg_comm_get_id(mg_backend_kind kind, mg_comm_id *out) {
    static const char fn[] = "mg_comm_get_id";
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL out", fn);
    const mg_comm_provider *p = transport_of_kind(kind);
    if (!p)
        return no_provider(fn, kind);
    char reason[384];
    if (!p->available(reason, sizeof reason))
        return MG_ERROR(MG_ERR_UNAVAILABLE, "%s: %s communicators unavailable: %s", fn,
                        p->base.name, reason);
    return p->get_id(out);
}

/* ------------------------------------------------------------------ failure state */

void mg_comm_fail(mg_comm *c, const char *message) {
    pthread_mutex_lock(&c->failure_lock);
    if (!atomic_load(&c->failed)) {
        snprintf(c->failure, sizeof c->failure, "%s", message);
        atomic_store(&c->failed, true);
    }
    pthread_mutex_unlock(&c->failure_lock);
}

mg_status mg_comm_check_failed(mg_comm *c, const char *fn) {
    if (!atomic_load(&c->failed))
        return MG_OK;
    pthread_mutex_lock(&c->failure_lock);
    mg_status st = MG_ERROR(MG_ERR_DEVICE, "%s: rank %d of %d: communicator failed: %s", fn,
                            c->rank, c->size, c->failure);
    pthread_mutex_unlock(&c->failure_lock);
    return st;
}

/* A failure a provider reported (message set): recorded on `c` so later calls see it. */
static mg_status record_failure(mg_comm *c, mg_status st) {
    if (st == MG_ERR_DEVICE || st == MG_ERR_DEVICE_FAULT)
        mg_comm_fail(c, mg_last_error());
    return st;
}

/* ------------------------------------------------------------------ creation */

static uint32_t timeout_of(const mg_comm_options *o) {
    if (o && o->timeout_ms)
        return o->timeout_ms;
    const char *env = getenv("METRALE_COMM_TIMEOUT_MS");
    if (env && *env) {
        char *end;
        unsigned long v = strtoul(env, &end, 10);
        if (*end == '\0' && v > 0 && v <= UINT32_MAX)
            return (uint32_t)v;
    }
    return DEFAULT_TIMEOUT_MS;
}

static void comm_free(mg_comm *c) {
    if (!c)
        return;
    if (c->wait_event)
        mg_event_destroy(c->wait_event);
    pthread_mutex_destroy(&c->failure_lock);
    free(c);
}

static mg_status comm_new(mg_backend *b, int size, int rank, uint32_t timeout_ms,
                          const mg_comm_provider *p, mg_comm **out) {
    mg_comm *c = calloc(1, sizeof *c);
    if (!c)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_comm: out of host memory");
    c->provider = p;
    c->backend = b;
    c->size = size;
    c->rank = rank;
    c->timeout_ms = timeout_ms;
    pthread_mutex_init(&c->failure_lock, NULL);
    mg_status st = mg_event_create(b, &c->wait_event);
    if (st) {
        comm_free(c);
        return st;
    }
    *out = c;
    return MG_OK;
}

/* A live backend (`fn` names it in the kit's message) without a fault, of a kind this build
 * has a transport for: MG_ERR_UNAVAILABLE otherwise, before the other arguments are read. */
static mg_status check_backend(mg_backend *b, const char *fn) {
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    mg_backend_kind kind = mg_backend_get_kind(b);
    if (!mg_op_providers(MG_OP_COMM, kind, NULL, 0))
        return no_provider(fn, kind);
    return mg_backend_check_fault(b);
}

/* The transport the op registry chooses for `b` (a forced provider is honoured, statistics
 * follow it). A transport that cannot run here (NCCL does not load) is MG_ERR_UNAVAILABLE
 * with its reason, as metrale/comm.h promises, not the registry's MG_ERR_UNSUPPORTED. */
static mg_status choose_transport(mg_backend *b, const char *fn, const mg_comm_provider **p) {
    const mg_op_provider *chosen;
    mg_status st = mg_op_choose(b, MG_OP_COMM, NULL, fn, &chosen);
    if (st == MG_ERR_UNSUPPORTED) {
        char why[MG_ERROR_MESSAGE_BYTES];
        snprintf(why, sizeof why, "%s", mg_last_error());
        return mg_error_set(MG_ERR_UNAVAILABLE, NULL, 0, "%s", why);
    }
    if (!st)
        *p = (const mg_comm_provider *)chosen;
    return st;
}

/* Depth of this thread's open group (mg_comm_group_begin); creation is refused inside one. */
static _Thread_local int tls_group_depth;

mg_status mg_comm_create_rank(mg_backend *b, const mg_comm_id *id, int size, int rank,
                              const mg_comm_options *options, mg_comm **out) {
    static const char fn[] = "mg_comm_create_rank";
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL out", fn);
    *out = NULL;
    mg_status st = check_backend(b, fn);
    if (st)
        return st;
    if (!id)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL id", fn);
    if (size < 1 || size > MG_COMM_MAX_RANKS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: size %d is not in 1..%d", fn, size,
                        MG_COMM_MAX_RANKS);
    if (rank < 0 || rank >= size)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: rank %d is not in 0..%d", fn, rank, size - 1);
    if (tls_group_depth)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: not inside mg_comm_group_begin/end", fn);
    const mg_comm_provider *p = NULL;
    if ((st = choose_transport(b, fn, &p)))
        return st;
    mg_comm *c;
    if ((st = comm_new(b, size, rank, timeout_of(options), p, &c)))
        return st;
    if ((st = p->create_rank(c, id))) {
        comm_free(c);
        return st;
    }
    *out = c;
    return MG_OK;
}

mg_status mg_comm_create_local(mg_backend *const *backends, int count,
                               const mg_comm_options *options, mg_comm **comms_out) {
    static const char fn[] = "mg_comm_create_local";
    if (!backends || !comms_out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn,
                        !backends ? "backends" : "comms_out");
    if (count < 1 || count > MG_COMM_MAX_RANKS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: count %d is not in 1..%d", fn, count,
                        MG_COMM_MAX_RANKS);
    for (int i = 0; i < count; i++)
        comms_out[i] = NULL;
    if (tls_group_depth)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: not inside mg_comm_group_begin/end", fn);
    mg_status st;
    for (int i = 0; i < count; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s: backends[%d]", fn, i);
        if ((st = check_backend(backends[i], what)))
            return st;
        mg_backend_kind kind = mg_backend_get_kind(backends[i]);
        if (kind != mg_backend_get_kind(backends[0]))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: backends[%d] is %s, backends[0] %s: one kind per communicator", fn,
                            i, mg_backend_kind_name(kind),
                            mg_backend_kind_name(mg_backend_get_kind(backends[0])));
        for (int j = 0; j < i; j++)
            if (backends[j] == backends[i])
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: backends[%d] and backends[%d] are the same backend", fn, j, i);
    }
    const mg_comm_provider *p = NULL;
    if ((st = choose_transport(backends[0], fn, &p)))
        return st;
    uint32_t timeout_ms = timeout_of(options);
    mg_comm *comms[MG_COMM_MAX_RANKS] = {0};
    for (int i = 0; i < count && !st; i++)
        st = comm_new(backends[i], count, i, timeout_ms, p, &comms[i]);
    if (!st)
        st = p->create_local(comms, count);
    if (st) {
        for (int i = 0; i < count; i++)
            comm_free(comms[i]);
        return st;
    }
    memcpy(comms_out, comms, (size_t)count * sizeof comms[0]);
    return MG_OK;
}

mg_status mg_comm_destroy(mg_comm *c) {
    if (!c)
        return MG_OK;
    c->provider->destroy(c);
    comm_free(c);
    return MG_OK;
}

mg_status mg_comm_abort(mg_comm *c) {
    if (!c)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_abort: NULL communicator");
    mg_comm_fail(c, "aborted by mg_comm_abort");
    c->provider->abort(c);
    return MG_OK;
}

int mg_comm_rank(const mg_comm *c) {
    return c ? c->rank : -1;
}

int mg_comm_size(const mg_comm *c) {
    return c ? c->size : -1;
}

mg_backend *mg_comm_backend(const mg_comm *c) {
    return c ? c->backend : NULL;
}

static bool dtype_known(mg_dtype dtype) {
    return dtype == MG_DTYPE_BF16 || dtype == MG_DTYPE_F16 || dtype == MG_DTYPE_F32 ||
           dtype == MG_DTYPE_FP8_E4M3;
}

bool mg_comm_supports_dtype(mg_comm *c, mg_dtype dtype) {
    return c && dtype_known(dtype) && c->provider->supports_dtype(c, dtype);
}

/* ------------------------------------------------------------------ groups */

/* The communicators this thread's open group has used, and the providers whose group was
 * begun (lazily, at a provider's first call in the group). */
static _Thread_local int tls_group_count;
static _Thread_local mg_comm *tls_group_comms[MAX_GROUP_COMMS];
static _Thread_local const mg_comm_provider *tls_group_providers[2];
static _Thread_local int tls_group_provider_count;

int mg_comm_group_depth(void) {
    return tls_group_depth;
}

static bool group_begun(const mg_comm_provider *p) {
    for (int i = 0; i < tls_group_provider_count; i++)
        if (tls_group_providers[i] == p)
            return true;
    return false;
}

mg_status mg_comm_group_begin(void) {
    tls_group_depth++;
    return MG_OK;
}

mg_status mg_comm_group_end(void) {
    if (tls_group_depth <= 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_comm_group_end: no group open (mg_comm_group_begin first)");
    if (--tls_group_depth)
        return MG_OK;
    mg_status first = MG_OK;
    for (int pi = 0; pi < tls_group_provider_count; pi++) {
        const mg_comm_provider *p = tls_group_providers[pi];
        mg_comm *mine[MAX_GROUP_COMMS];
        int n = 0;
        for (int i = 0; i < tls_group_count; i++)
            if (tls_group_comms[i]->provider == p)
                mine[n++] = tls_group_comms[i];
        mg_status st = p->group_end(mine, n);
        if (st) {
            for (int i = 0; i < n; i++)
                record_failure(mine[i], st);
            if (!first)
                first = st;
        }
    }
    /* Work that joined the group without a call of it (graph replays). */
    for (const mg_op_provider *const *q = comm_providers; *q; q++) {
        const mg_comm_provider *p = (const mg_comm_provider *)*q;
        mg_status st = p->ends_every_group && !group_begun(p) ? p->group_end(NULL, 0) : MG_OK;
        if (st && !first)
            first = st;
    }
    tls_group_count = 0;
    tls_group_provider_count = 0;
    return first;
}

/* Joins `c` to this thread's open group, beginning its provider's group on first use. */
static mg_status group_join(mg_comm *c, const char *fn) {
    bool known = false;
    for (int i = 0; i < tls_group_count && !known; i++)
        known = tls_group_comms[i] == c;
    if (!known && tls_group_count == MAX_GROUP_COMMS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: more than %d communicators in one group", fn,
                        MAX_GROUP_COMMS);
    if (!group_begun(c->provider)) {
        mg_status st = c->provider->group_begin();
        if (st)
            return st;
        tls_group_providers[tls_group_provider_count++] = c->provider;
    }
    if (!known)
        tls_group_comms[tls_group_count++] = c;
    return MG_OK;
}

/* ------------------------------------------------------------------ collectives */

static const char *call_name(mg_comm_call_kind kind) {
    static const char *const names[] = {"mg_comm_all_reduce",     "mg_comm_all_gather",
                                        "mg_comm_reduce_scatter", "mg_comm_broadcast",
                                        "mg_comm_send",           "mg_comm_recv"};
    return names[kind];
}

static mg_status check_call(mg_comm *c, const mg_comm_call *call) {
    const char *fn = call_name(call->kind);
    if (call->count == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: count is 0", fn);
    if (!dtype_known(call->dtype))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: dtype %s is not one of bf16, f16, f32, fp8_e4m3", fn,
                        mg_dtype_name(call->dtype));
    if (!c->provider->supports_dtype(c, call->dtype))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: %s communicators cannot carry %s here", fn,
                        c->provider->base.name, mg_dtype_name(call->dtype));
    bool reduces =
        call->kind == MG_COMM_CALL_ALL_REDUCE || call->kind == MG_COMM_CALL_REDUCE_SCATTER;
    if (reduces && call->op != MG_COMM_SUM && call->op != MG_COMM_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown reduction %d", fn, (int)call->op);
    size_t e = mg_dtype_bytes(call->dtype), n = call->count, all;
    if (__builtin_mul_overflow(n, (size_t)c->size, &all) || all > SIZE_MAX / e)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: count %zu times %d ranks overflows", fn, n,
                        c->size);
    /* In place, the smaller buffer of an all-gather or reduce-scatter is this rank's slice of
     * the larger one (NCCL's rule): it lies inside the larger, so it is checked as part of it
     * and overlaps nothing else. Send and recv of an all-reduce or broadcast may be the same
     * range; any other overlap is refused. */
    size_t slice = (size_t)c->rank * n * e;
    mg_devptr send = call->send, recv = call->recv;
    switch (call->kind) {
    case MG_COMM_CALL_ALL_REDUCE: {
        mg_op_tensor t[] = {{"send", send, n * e, e, MG_OP_IN},
                            {"recv", recv, n * e, e, MG_OP_OUT}};
        return mg_op_check_tensors(c->backend, fn, t, 2, 0, 1);
    }
    case MG_COMM_CALL_ALL_GATHER: {
        bool in_place = send && send == recv + slice;
        mg_op_tensor t[] = {
            {"send", in_place ? 0 : send, n * e, e, in_place ? MG_OP_OPTIONAL : MG_OP_IN},
            {"recv", recv, all * e, e, MG_OP_OUT}};
        return mg_op_check_tensors(c->backend, fn, t, 2, -1, -1);
    }
    case MG_COMM_CALL_REDUCE_SCATTER: {
        bool in_place = recv && recv == send + slice;
        mg_op_tensor t[] = {
            {"send", send, all * e, e, MG_OP_IN},
            {"recv", in_place ? 0 : recv, n * e, e, in_place ? MG_OP_OPTIONAL : MG_OP_OUT}};
        return mg_op_check_tensors(c->backend, fn, t, 2, -1, -1);
    }
    case MG_COMM_CALL_BROADCAST: {
        if (call->peer < 0 || call->peer >= c->size)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: root %d is not in 0..%d", fn, call->peer,
                            c->size - 1);
        bool root = call->peer == c->rank; /* send is read on the root only */
        mg_op_tensor t[] = {{"recv", recv, n * e, e, MG_OP_OUT},
                            {"send", root ? send : 0, n * e, e, root ? MG_OP_IN : MG_OP_OPTIONAL}};
        return mg_op_check_tensors(c->backend, fn, t, 2, 0, 1);
    }
    case MG_COMM_CALL_SEND:
    case MG_COMM_CALL_RECV: {
        if (call->peer < 0 || call->peer >= c->size || call->peer == c->rank)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: peer %d is not another rank of 0..%d (this is rank %d)", fn,
                            call->peer, c->size - 1, c->rank);
        bool sends = call->kind == MG_COMM_CALL_SEND;
        mg_op_tensor t = {sends ? "send" : "recv", sends ? send : recv, n * e, e,
                          sends ? MG_OP_IN : MG_OP_OUT};
        return mg_op_check_tensors(c->backend, fn, &t, 1, -1, -1);
    }
    }
    return MG_ERROR(MG_ERR_INTERNAL, "comm: unknown call kind %d", (int)call->kind);
}

static mg_status enqueue(mg_comm *c, mg_stream *s, const mg_comm_call *call) {
    const char *fn = call_name(call->kind);
    if (!c)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL communicator", fn);
    mg_status st = mg_op_enter(c->backend, fn);
    if (st)
        return st;
    if (s && mg_stream_backend(s) != c->backend)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: the stream belongs to another backend than rank %d's", fn, c->rank);
    if (!mg_stream_impl(c->backend, s))
        return MG_ERR_INVALID_ARGUMENT; /* message set: stale stream */
    if ((st = mg_comm_check_failed(c, fn)) || (st = mg_backend_check_fault(c->backend)) ||
        (st = check_call(c, call)))
        return st;
    bool grouped = tls_group_depth > 0;
    if (grouped && (st = group_join(c, fn)))
        return st;
    if ((st = record_failure(c, c->provider->enqueue(c, s, call, grouped))))
        return st;
    mg_op_count_call(c->backend, MG_OP_COMM, &c->provider->base, false);
    return MG_OK;
}

mg_status mg_comm_all_reduce(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv, size_t count,
                             mg_dtype dtype, mg_comm_reduce op) {
    mg_comm_call call = {MG_COMM_CALL_ALL_REDUCE, send, recv, count, dtype, op, 0};
    return enqueue(c, s, &call);
}

mg_status mg_comm_all_gather(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv,
                             size_t send_count, mg_dtype dtype) {
    mg_comm_call call = {MG_COMM_CALL_ALL_GATHER, send, recv, send_count, dtype, MG_COMM_SUM, 0};
    return enqueue(c, s, &call);
}

mg_status mg_comm_reduce_scatter(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv,
                                 size_t recv_count, mg_dtype dtype, mg_comm_reduce op) {
    mg_comm_call call = {MG_COMM_CALL_REDUCE_SCATTER, send, recv, recv_count, dtype, op, 0};
    return enqueue(c, s, &call);
}

mg_status mg_comm_broadcast(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv, size_t count,
                            mg_dtype dtype, int root) {
    mg_comm_call call = {MG_COMM_CALL_BROADCAST, send, recv, count, dtype, MG_COMM_SUM, root};
    return enqueue(c, s, &call);
}

mg_status mg_comm_send(mg_comm *c, mg_stream *s, mg_devptr send, size_t count, mg_dtype dtype,
                       int peer) {
    mg_comm_call call = {MG_COMM_CALL_SEND, send, 0, count, dtype, MG_COMM_SUM, peer};
    return enqueue(c, s, &call);
}

mg_status mg_comm_recv(mg_comm *c, mg_stream *s, mg_devptr recv, size_t count, mg_dtype dtype,
                       int peer) {
    mg_comm_call call = {MG_COMM_CALL_RECV, 0, recv, count, dtype, MG_COMM_SUM, peer};
    return enqueue(c, s, &call);
}

/* ------------------------------------------------------------------ waiting */

mg_status mg_comm_check(mg_comm *c) {
    if (!c)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_check: NULL communicator");
    mg_status st = mg_comm_check_failed(c, "mg_comm_check");
    return st ? st : record_failure(c, c->provider->async_error(c));
}

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

mg_status mg_comm_wait(mg_comm *c, mg_stream *s) {
    static const char fn[] = "mg_comm_wait";
    if (!c)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL communicator", fn);
    if (s && mg_stream_backend(s) != c->backend)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: the stream belongs to another backend than rank %d's", fn, c->rank);
    if (tls_group_depth)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: inside a group of this thread (its calls are issued at "
                        "mg_comm_group_end): end the group first",
                        fn);
    mg_status st = mg_comm_check_failed(c, fn);
    if (st || (st = mg_stream_check_not_capturing(c->backend, s, fn)) ||
        (st = mg_event_record(c->wait_event, s)))
        return st;
    uint64_t deadline = mg_comm_now_ms() + c->timeout_ms;
    for (long pause_us = 20;; pause_us = pause_us < 2000 ? pause_us * 2 : 2000) {
        st = mg_event_query(c->wait_event);
        if (st == MG_OK)
            return mg_comm_check(c);
        if (st != MG_ERR_NOT_READY)
            return record_failure(c, st);
        if ((st = c->provider->async_error(c))) {
            record_failure(c, st);
            c->provider->abort(c);
            return mg_comm_check_failed(c, fn);
        }
        if (mg_comm_now_ms() >= deadline) {
            char why[160];
            snprintf(why, sizeof why,
                     "rank %d: the stream's work did not finish within %u ms (a peer died, "
                     "never joined or never made the matching call); aborted",
                     c->rank, c->timeout_ms);
            mg_comm_fail(c, why);
            c->provider->abort(c);
            return mg_comm_check_failed(c, fn);
        }
        sleep_us(pause_us);
    }
}
