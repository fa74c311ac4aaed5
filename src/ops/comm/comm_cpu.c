/* comm_cpu.c - communicators across CPU backends of one process: the reference the NCCL
 * results are checked against.
 *
 * Each call is a CPU kernel ("comm_cpu_call" of module "metrale") on the rank's stream, so it
 * is ordered with the rank's other work and can be captured and replayed like any kernel.
 * When it runs it contributes the rank's host buffers to an instance shared by the ranks (the
 * n-th collective of every rank, or the n-th message from one rank to another); the rank that
 * completes an instance computes every rank's output, under the world's lock, reading all
 * inputs of a chunk before writing its outputs (so in-place calls are safe). Outside a group
 * the contributing rank then waits (at most the timeout) until the instance is complete;
 * inside one it goes on, and the group's end waits. A timeout or a mismatched call fails the
 * world: every rank's later calls fail at once instead of waiting.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"
#include "cpu_kernels.h"
#include "error.h"
#include "metrale/launch.h"
#include "op_builtin.h"

#define KERNEL_NAME "comm_cpu_call"
#define CHUNK 1024 /* elements reduced at a time */
#define ID_MAGIC "metrale-cpu-comm"

typedef struct cpu_instance cpu_instance;
struct cpu_instance {
    cpu_instance *next;
    uint64_t channel, seq; /* channel 0: collectives; 1 + src * size + dst: messages */
    mg_comm_call call;     /* the first contributor's call (recv for messages: the RECV) */
    int expected, arrived, released;
    bool done;
    bool have_send_call, have_recv_call;
    struct {
        const void *send;
        void *recv;
    } part[MG_COMM_MAX_RANKS]; /* messages: part[0] sender, part[1] receiver */
};

typedef struct cpu_world {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int size;
    int refs;   /* ranks holding it (and the rendezvous while it fills) */
    int joined; /* create_rank: ranks that joined */
    bool failed;
    char failure[384];
    cpu_instance *instances;
    uint8_t id[MG_COMM_ID_BYTES]; /* create_rank's rendezvous key */
    struct cpu_world *next_pending;
} cpu_world;

typedef struct cpu_rank {
    cpu_world *world;
    int rank;
    /* Sequence numbers of this rank's calls, advanced when its kernels run (in stream order,
     * so replays of a captured call take the next numbers like fresh calls). Only this rank's
     * executing thread touches them, under the world's lock. */
    uint64_t collective_seq;
    uint64_t send_seq[MG_COMM_MAX_RANKS], recv_seq[MG_COMM_MAX_RANKS];
} cpu_rank;

/* ------------------------------------------------------------------ worlds */

static cpu_world *world_new(int size) {
    cpu_world *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->changed, &attr);
    pthread_condattr_destroy(&attr);
    w->size = size;
    return w;
}

/* Caller holds w->lock; returns true when the caller must free w (after unlocking). */
static bool world_unref_locked(cpu_world *w) {
    return --w->refs == 0;
}

static void world_free(cpu_world *w) {
    while (w->instances) {
        cpu_instance *i = w->instances;
        w->instances = i->next;
        free(i);
    }
    pthread_cond_destroy(&w->changed);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

/* Caller holds w->lock. */
static void world_fail_locked(cpu_world *w, const char *message) {
    if (!w->failed) {
        snprintf(w->failure, sizeof w->failure, "%s", message);
        w->failed = true;
    }
    pthread_cond_broadcast(&w->changed);
}

static mg_status world_error_locked(cpu_world *w, int rank) {
    return MG_ERROR(MG_ERR_DEVICE, "cpu communicator: rank %d: %s", rank, w->failure);
}

/* Waits on w->changed until `deadline_ms`; false when it passed. Caller holds w->lock. */
static bool wait_until(cpu_world *w, uint64_t deadline_ms) {
    if (mg_comm_now_ms() >= deadline_ms)
        return false;
    struct timespec ts = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000L};
    pthread_cond_timedwait(&w->changed, &w->lock, &ts);
    return true;
}

/* ------------------------------------------------------------------ arithmetic */

static double load(mg_dtype t, const void *p, size_t i) {
    switch (t) {
    case MG_DTYPE_F32:
        return ((const float *)p)[i];
    case MG_DTYPE_BF16:
        return mg_bf16_to_f32(((const uint16_t *)p)[i]);
    case MG_DTYPE_F16:
        return mg_f16_to_f32(((const uint16_t *)p)[i]);
    default:
        return mg_fp8_e4m3_to_f32(((const uint8_t *)p)[i]);
    }
}

static void store(mg_dtype t, void *p, size_t i, double v) {
    float f = (float)v;
    switch (t) {
    case MG_DTYPE_F32:
        ((float *)p)[i] = f;
        break;
    case MG_DTYPE_BF16:
        ((uint16_t *)p)[i] = mg_f32_to_bf16(f);
        break;
    case MG_DTYPE_F16:
        ((uint16_t *)p)[i] = mg_f32_to_f16(f);
        break;
    default:
        ((uint8_t *)p)[i] = mg_f32_to_fp8_e4m3(f);
        break;
    }
}

/* out_r[i] = op over ranks q of in_q[offset + i] for i < count, for every rank r that has an
 * output (all of them for all-reduce; reduce-scatter calls it once per output rank). A NaN
 * propagates through max as through sum. */
static void reduce_into(cpu_instance *in, int ranks, size_t in_offset, int only_out, size_t count) {
    const mg_comm_call *c = &in->call;
    size_t e = mg_dtype_bytes(c->dtype);
    double acc[CHUNK];
    for (size_t base = 0; base < count; base += CHUNK) {
        size_t n = count - base < CHUNK ? count - base : CHUNK;
        for (size_t j = 0; j < n; j++) {
            double a = load(c->dtype, in->part[0].send, in_offset + base + j);
            for (int q = 1; q < ranks; q++) {
                double v = load(c->dtype, in->part[q].send, in_offset + base + j);
                if (c->op == MG_COMM_SUM)
                    a += v;
                else if (v > a || v != v)
                    a = a != a ? a : v;
            }
            acc[j] = a;
        }
        for (int r = 0; r < ranks; r++) {
            if (only_out >= 0 && r != only_out)
                continue;
            uint8_t *out = (uint8_t *)in->part[r].recv + base * e;
            for (size_t j = 0; j < n; j++)
                store(c->dtype, out, j, acc[j]);
        }
    }
}

/* Computes every output of a complete instance. Caller holds the world's lock. */
static void execute(cpu_instance *in, int size) {
    const mg_comm_call *c = &in->call;
    size_t e = mg_dtype_bytes(c->dtype), bytes = c->count * e;
    switch (c->kind) {
    case MG_COMM_CALL_ALL_REDUCE:
        reduce_into(in, size, 0, -1, c->count);
        break;
    case MG_COMM_CALL_REDUCE_SCATTER:
        for (int r = 0; r < size; r++)
            reduce_into(in, size, (size_t)r * c->count, r, c->count);
        break;
    case MG_COMM_CALL_ALL_GATHER:
        for (int r = 0; r < size; r++)
            for (int q = 0; q < size; q++)
                memmove((uint8_t *)in->part[r].recv + (size_t)q * bytes, in->part[q].send, bytes);
        break;
    case MG_COMM_CALL_BROADCAST:
        for (int r = 0; r < size; r++)
            if (in->part[r].recv != in->part[c->peer].send)
                memmove(in->part[r].recv, in->part[c->peer].send, bytes);
        break;
    case MG_COMM_CALL_SEND:
    case MG_COMM_CALL_RECV:
        memmove(in->part[1].recv, in->part[0].send, bytes);
        break;
    }
}

/* ------------------------------------------------------------------ contributing */

static const char *kind_name(mg_comm_call_kind kind) {
    static const char *const names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast",  "send",       "recv"};
    return names[kind];
}

static bool calls_match(const mg_comm_call *a, const mg_comm_call *b) {
    bool reduces = a->kind == MG_COMM_CALL_ALL_REDUCE || a->kind == MG_COMM_CALL_REDUCE_SCATTER;
    return a->kind == b->kind && a->count == b->count && a->dtype == b->dtype &&
           (!reduces || a->op == b->op) &&
           (a->kind != MG_COMM_CALL_BROADCAST || a->peer == b->peer);
}

/* Pending instances of this thread's open group: the group's end waits for them. */
typedef struct pending {
    cpu_rank *rank;
    cpu_instance *instance;
    uint32_t timeout_ms;
} pending;
static _Thread_local pending *tls_pending;
static _Thread_local size_t tls_pending_count, tls_pending_capacity;

/* Waits for `in` (at most the timeout), then releases the caller's hold on it. Caller holds
 * the world's lock. */
static mg_status finish_locked(cpu_rank *me, cpu_instance *in, uint32_t timeout_ms) {
    cpu_world *w = me->world;
    uint64_t deadline = mg_comm_now_ms() + timeout_ms;
    while (!in->done && !w->failed)
        if (!wait_until(w, deadline)) {
            char why[256];
            snprintf(why, sizeof why,
                     "%s #%" PRIu64 " waited %u ms for its peers: %d of %d arrived (a rank "
                     "never made the matching call, or one thread drives several ranks "
                     "outside a group)",
                     kind_name(in->call.kind), in->seq, timeout_ms, in->arrived, in->expected);
            world_fail_locked(w, why);
        }
    if (!in->done)
        return world_error_locked(w, me->rank);
    if (++in->released == in->expected) {
        cpu_instance **link = &w->instances;
        while (*link != in)
            link = &(*link)->next;
        *link = in->next;
        free(in);
    }
    return MG_OK;
}

static mg_status contribute(cpu_rank *me, uint32_t timeout_ms, const mg_comm_call *call,
                            const void *send, void *recv) {
    cpu_world *w = me->world;
    pthread_mutex_lock(&w->lock);
    if (w->failed) {
        mg_status st = world_error_locked(w, me->rank);
        pthread_mutex_unlock(&w->lock);
        return st;
    }
    uint64_t channel = 0, seq;
    int slot = me->rank, expected = w->size;
    if (call->kind == MG_COMM_CALL_SEND) {
        channel = 1 + (uint64_t)me->rank * (uint64_t)w->size + (uint64_t)call->peer;
        seq = me->send_seq[call->peer]++;
        slot = 0;
        expected = 2;
    } else if (call->kind == MG_COMM_CALL_RECV) {
        channel = 1 + (uint64_t)call->peer * (uint64_t)w->size + (uint64_t)me->rank;
        seq = me->recv_seq[call->peer]++;
        slot = 1;
        expected = 2;
    } else {
        seq = me->collective_seq++;
    }
    cpu_instance *in = w->instances;
    while (in && !(in->channel == channel && in->seq == seq))
        in = in->next;
    if (!in) {
        if (!(in = calloc(1, sizeof *in))) {
            world_fail_locked(w, "out of host memory for a collective");
            pthread_mutex_unlock(&w->lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu communicator: out of host memory");
        }
        in->channel = channel;
        in->seq = seq;
        in->call = *call;
        in->expected = expected;
        in->next = w->instances;
        w->instances = in;
    } else {
        mg_comm_call mine = *call, theirs = in->call;
        if (channel) /* a message: compare as one kind */
            mine.kind = theirs.kind = MG_COMM_CALL_SEND;
        if (!calls_match(&mine, &theirs)) {
            char why[256];
            snprintf(why, sizeof why,
                     "rank %d called %s(count %zu, %s) where a peer called %s(count %zu, %s) "
                     "as call #%" PRIu64,
                     me->rank, kind_name(call->kind), call->count, mg_dtype_name(call->dtype),
                     kind_name(in->call.kind), in->call.count, mg_dtype_name(in->call.dtype), seq);
            world_fail_locked(w, why);
            pthread_mutex_unlock(&w->lock);
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu communicator: %s", why);
        }
    }
    in->part[slot].send = send;
    in->part[slot].recv = recv;
    if (++in->arrived == in->expected) {
        execute(in, w->size);
        in->done = true;
        pthread_cond_broadcast(&w->changed);
    }
    mg_status st = MG_OK;
    if (mg_comm_group_depth() > 0) {
        if (tls_pending_count == tls_pending_capacity) {
            size_t cap = tls_pending_capacity ? 2 * tls_pending_capacity : 16;
            pending *grown = realloc(tls_pending, cap * sizeof *grown);
            if (!grown) {
                world_fail_locked(w, "out of host memory for a group");
                pthread_mutex_unlock(&w->lock);
                return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu communicator: out of host memory");
            }
            tls_pending = grown;
            tls_pending_capacity = cap;
        }
        tls_pending[tls_pending_count++] = (pending){me, in, timeout_ms};
    } else {
        st = finish_locked(me, in, timeout_ms);
    }
    pthread_mutex_unlock(&w->lock);
    return st;
}

/* ------------------------------------------------------------------ the CPU kernel */

/* Arguments: u64 rank, u64 timeout_ms, u32 kind, u32 dtype, u32 op, i32 peer, u64 count,
 * buffer send, buffer recv (0 where the call has none). */
static mg_status kernel_comm_call(const mg_launch *l) {
    static const char name[] = "metrale:" KERNEL_NAME;
    static const mg_arg_kind kinds[] = {MG_ARG_U64, MG_ARG_U64,    MG_ARG_U32,
                                        MG_ARG_U32, MG_ARG_U32,    MG_ARG_I32,
                                        MG_ARG_U64, MG_ARG_BUFFER, MG_ARG_BUFFER};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 9);
    if (st)
        return st;
    cpu_rank *me = (cpu_rank *)(uintptr_t)mg_launch_get_u64(l, 0);
    uint32_t timeout_ms = (uint32_t)mg_launch_get_u64(l, 1);
    mg_comm_call call = {.kind = (mg_comm_call_kind)mg_launch_get_u32(l, 2),
                         .dtype = (mg_dtype)mg_launch_get_u32(l, 3),
                         .op = (mg_comm_reduce)mg_launch_get_u32(l, 4),
                         .peer = mg_launch_get_i32(l, 5),
                         .count = (size_t)mg_launch_get_u64(l, 6),
                         .send = mg_launch_get_ptr(l, 7),
                         .recv = mg_launch_get_ptr(l, 8)};
    uint32_t e = (uint32_t)mg_dtype_bytes(call.dtype);
    uint64_t n = call.count * e, all = n * (uint64_t)me->world->size;
    uint64_t send_bytes = call.kind == MG_COMM_CALL_REDUCE_SCATTER ? all : n;
    uint64_t recv_bytes = call.kind == MG_COMM_CALL_ALL_GATHER ? all : n;
    void *send = NULL, *recv = NULL;
    if (call.send && (st = mg_cpu_kernel_buffer(l, 7, send_bytes, e, name, &send)))
        return st;
    if (call.recv && (st = mg_cpu_kernel_buffer(l, 8, recv_bytes, e, name, &recv)))
        return st;
    return contribute(me, timeout_ms, &call, send, recv);
}

static void register_kernel(void) {
    mg_cpu_kernel_register("metrale", KERNEL_NAME, kernel_comm_call);
}

static pthread_once_t kernel_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------------ the provider */

static bool cpu_available(char *reason, size_t reason_bytes) {
    (void)reason;
    (void)reason_bytes;
    return true;
}

/* The id: a magic, this process's id and a number no other id of this process has. */
typedef struct cpu_id {
    char magic[sizeof ID_MAGIC];
    int64_t pid;
    uint64_t serial, nanoseconds;
} cpu_id;

static mg_status cpu_get_id(mg_comm_id *out) {
    static _Atomic uint64_t serial;
    memset(out, 0, sizeof *out);
    cpu_id id = {ID_MAGIC, (int64_t)getpid(), atomic_fetch_add(&serial, 1) + 1, 0};
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    id.nanoseconds = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    memcpy(out->bytes, &id, sizeof id);
    return MG_OK;
}

static mg_status rank_new(mg_comm *c, cpu_world *w) {
    cpu_rank *r = calloc(1, sizeof *r);
    if (!r)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu communicator: out of host memory");
    r->world = w;
    r->rank = c->rank;
    c->impl = r;
    return MG_OK;
}

static pthread_mutex_t rendezvous_lock = PTHREAD_MUTEX_INITIALIZER;
static cpu_world *rendezvous; /* worlds of create_rank still filling */

static void rendezvous_unlink(cpu_world *w) {
    for (cpu_world **link = &rendezvous; *link; link = &(*link)->next_pending)
        if (*link == w) {
            *link = w->next_pending;
            return;
        }
}

static mg_status cpu_create_rank(mg_comm *c, const mg_comm_id *id) {
    pthread_once(&kernel_once, register_kernel);
    cpu_id parsed;
    memcpy(&parsed, id->bytes, sizeof parsed);
    if (memcmp(parsed.magic, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return MG_ERROR(
            MG_ERR_INVALID_ARGUMENT,
            "mg_comm_create_rank: the id was not made by mg_comm_get_id(MG_BACKEND_CPU)");
    if (parsed.pid != (int64_t)getpid())
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "mg_comm_create_rank: the id comes from process %" PRId64 "; CPU "
                        "communicators join ranks of one process only",
                        parsed.pid);
    pthread_mutex_lock(&rendezvous_lock);
    cpu_world *w = rendezvous;
    while (w && memcmp(w->id, id->bytes, MG_COMM_ID_BYTES) != 0)
        w = w->next_pending;
    if (!w) {
        if (!(w = world_new(c->size))) {
            pthread_mutex_unlock(&rendezvous_lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu communicator: out of host memory");
        }
        memcpy(w->id, id->bytes, MG_COMM_ID_BYTES);
        w->next_pending = rendezvous;
        rendezvous = w;
    }
    pthread_mutex_lock(&w->lock);
    pthread_mutex_unlock(&rendezvous_lock);
    mg_status st = MG_OK;
    if (w->size != c->size) {
        pthread_mutex_unlock(&w->lock);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_comm_create_rank: size %d, but a rank of this id said %d", c->size,
                        w->size);
    }
    w->refs++;
    w->joined++;
    pthread_cond_broadcast(&w->changed);
    uint64_t deadline = mg_comm_now_ms() + c->timeout_ms;
    while (w->joined < w->size && !w->failed)
        if (!wait_until(w, deadline)) {
            char why[160];
            snprintf(why, sizeof why, "%d of %d ranks joined within %u ms", w->joined, w->size,
                     c->timeout_ms);
            world_fail_locked(w, why);
        }
    if (w->failed)
        st = MG_ERROR(MG_ERR_DEVICE, "mg_comm_create_rank: rank %d: %s", c->rank, w->failure);
    bool last_joiner = w->joined == w->size;
    bool free_it = st && world_unref_locked(w);
    pthread_mutex_unlock(&w->lock);
    if (last_joiner || st) {
        pthread_mutex_lock(&rendezvous_lock);
        rendezvous_unlink(w); /* full or failed: later ranks with this id start afresh */
        pthread_mutex_unlock(&rendezvous_lock);
    }
    if (free_it)
        world_free(w);
    if (st)
        return st;
    if ((st = rank_new(c, w))) {
        pthread_mutex_lock(&w->lock);
        world_fail_locked(w, "a rank ran out of host memory while joining");
        free_it = world_unref_locked(w);
        pthread_mutex_unlock(&w->lock);
        if (free_it)
            world_free(w);
    }
    return st;
}

static mg_status cpu_create_local(mg_comm *const *comms, int count) {
    pthread_once(&kernel_once, register_kernel);
    cpu_world *w = world_new(count);
    if (!w)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu communicator: out of host memory");
    mg_status st = MG_OK;
    for (int i = 0; i < count && !st; i++)
        st = rank_new(comms[i], w);
    if (st) {
        for (int i = 0; i < count; i++) {
            free(comms[i]->impl);
            comms[i]->impl = NULL;
        }
        world_free(w);
        return st;
    }
    w->refs = count;
    w->joined = count;
    return MG_OK;
}

static mg_status cpu_enqueue(mg_comm *c, mg_stream *s, const mg_comm_call *call, bool grouped) {
    (void)grouped; /* the kernel asks the executing thread's group when it runs */
    pthread_once(&kernel_once, register_kernel);
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_u64(&l, (uint64_t)(uintptr_t)c->impl);
    mg_launch_arg_u64(&l, c->timeout_ms);
    mg_launch_arg_u32(&l, (uint32_t)call->kind);
    mg_launch_arg_u32(&l, (uint32_t)call->dtype);
    mg_launch_arg_u32(&l, (uint32_t)call->op);
    mg_launch_arg_i32(&l, call->peer);
    mg_launch_arg_u64(&l, call->count);
    bool root = call->kind == MG_COMM_CALL_BROADCAST && call->peer == c->rank;
    bool has_send =
        call->kind != MG_COMM_CALL_RECV && (call->kind != MG_COMM_CALL_BROADCAST || root);
    mg_launch_arg_ptr(&l, has_send ? call->send : 0);
    mg_launch_arg_ptr(&l, call->kind == MG_COMM_CALL_SEND ? 0 : call->recv);
    const char *kernel = KERNEL_NAME;
    return mg_op_launch_kernels(c->backend, s, &kernel, &l, 1);
}

static mg_status cpu_group_begin(void) {
    return MG_OK; /* the kernels ask mg_comm_group_depth when they run */
}

/* Also called by the front at the end of every outermost group, for calls that ran in it
 * without a call of the group's own (graph replays). */
static mg_status cpu_group_end(mg_comm *const *comms, int count) {
    (void)comms;
    (void)count;
    mg_status first = MG_OK;
    for (size_t i = 0; i < tls_pending_count; i++) {
        pending *p = &tls_pending[i];
        cpu_world *w = p->rank->world;
        pthread_mutex_lock(&w->lock);
        mg_status st = finish_locked(p->rank, p->instance, p->timeout_ms);
        pthread_mutex_unlock(&w->lock);
        if (st && !first)
            first = st;
    }
    /* Released with the group, so a thread that ends leaves nothing behind. */
    free(tls_pending);
    tls_pending = NULL;
    tls_pending_count = tls_pending_capacity = 0;
    return first;
}

static mg_status cpu_async_error(mg_comm *c) {
    cpu_rank *r = c->impl;
    pthread_mutex_lock(&r->world->lock);
    mg_status st = r->world->failed ? world_error_locked(r->world, r->rank) : MG_OK;
    pthread_mutex_unlock(&r->world->lock);
    return st;
}

static void cpu_abort(mg_comm *c) {
    cpu_rank *r = c->impl;
    char why[64];
    snprintf(why, sizeof why, "rank %d aborted the communicator", r->rank);
    pthread_mutex_lock(&r->world->lock);
    world_fail_locked(r->world, why);
    pthread_mutex_unlock(&r->world->lock);
}

static void cpu_destroy(mg_comm *c) {
    cpu_rank *r = c->impl;
    if (!r)
        return;
    cpu_world *w = r->world;
    pthread_mutex_lock(&w->lock);
    bool free_it = world_unref_locked(w);
    pthread_mutex_unlock(&w->lock);
    if (free_it)
        world_free(w);
    free(r);
    c->impl = NULL;
}

static bool cpu_supports_dtype(mg_comm *c, mg_dtype dtype) {
    (void)c;
    (void)dtype;
    return true;
}

static bool cpu_available_on(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
    return cpu_available(reason, reason_bytes);
}

const mg_comm_provider mg_comm_cpu_provider = {
    .base = {.name = "cpu", .backend = MG_BACKEND_CPU, .available = cpu_available_on},
    .available = cpu_available,
    .get_id = cpu_get_id,
    .create_rank = cpu_create_rank,
    .create_local = cpu_create_local,
    .enqueue = cpu_enqueue,
    .group_begin = cpu_group_begin,
    .group_end = cpu_group_end,
    .ends_every_group = true,
    .async_error = cpu_async_error,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
    .supports_dtype = cpu_supports_dtype,
};
