/* comm_cuda.c - communicators of CUDA backends through NCCL, loaded with dlopen at first use
 * ("libnccl.so.2", or env METRALE_NCCL_PATH), so the library loads and runs without it.
 *
 * Every communicator is non-blocking (ncclConfig_t.blocking = 0): NCCL calls return at once
 * with ncclInProgress while they connect, and we poll ncclCommGetAsyncError with the
 * communicator's timeout, aborting (ncclCommAbort) when it runs out or an error arrives, so
 * a peer that died or never joined makes the others fail instead of hang. The polls wait for
 * NCCL's host-side enqueue only, never for the device, so the collectives can be captured.
 */
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "cuda_backend.h"
#include "error.h"

/* ------------------------------------------------------------------ the library */

typedef struct nccl_api {
    ncclResult_t (*get_version)(int *);
    const char *(*get_error_string)(ncclResult_t);
    const char *(*get_last_error)(ncclComm_t);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*finalize)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                   ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} nccl_api;

static nccl_api nccl;
static int nccl_version;
static bool nccl_loaded;
static char nccl_failure[320];
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

/* Non-blocking communicators and ncclCommGetAsyncError polling arrived in 2.14; FP8 in 2.24. */
#define NCCL_OLDEST 21400
#define NCCL_FP8 22400

static void load_library(void) {
    const char *path = getenv("METRALE_NCCL_PATH");
    if (!path || !*path)
        path = "libnccl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(nccl_failure, sizeof nccl_failure,
                 "dlopen %s: %s (set METRALE_NCCL_PATH to a libnccl.so.2, e.g. PyTorch's "
                 "nvidia/nccl/lib/libnccl.so.2)",
                 path, why ? why : "failed");
        return;
    }
    struct {
        void **slot;
        const char *name;
    } symbols[] = {
        {(void **)&nccl.get_version, "ncclGetVersion"},
        {(void **)&nccl.get_error_string, "ncclGetErrorString"},
        {(void **)&nccl.get_last_error, "ncclGetLastError"},
        {(void **)&nccl.get_unique_id, "ncclGetUniqueId"},
        {(void **)&nccl.init_rank_config, "ncclCommInitRankConfig"},
        {(void **)&nccl.finalize, "ncclCommFinalize"},
        {(void **)&nccl.destroy, "ncclCommDestroy"},
        {(void **)&nccl.abort, "ncclCommAbort"},
        {(void **)&nccl.get_async_error, "ncclCommGetAsyncError"},
        {(void **)&nccl.all_reduce, "ncclAllReduce"},
        {(void **)&nccl.all_gather, "ncclAllGather"},
        {(void **)&nccl.reduce_scatter, "ncclReduceScatter"},
        {(void **)&nccl.broadcast, "ncclBroadcast"},
        {(void **)&nccl.send, "ncclSend"},
        {(void **)&nccl.recv, "ncclRecv"},
        {(void **)&nccl.group_start, "ncclGroupStart"},
        {(void **)&nccl.group_end, "ncclGroupEnd"},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name);
        if (!*symbols[i].slot) {
            snprintf(nccl_failure, sizeof nccl_failure, "%s: symbol %s not found", path,
                     symbols[i].name);
            dlclose(lib);
            return;
        }
    }
    if (nccl.get_version(&nccl_version) != ncclSuccess || nccl_version < NCCL_OLDEST) {
        snprintf(nccl_failure, sizeof nccl_failure,
                 "%s is NCCL version %d; 2.14 or newer is needed (non-blocking communicators)",
                 path, nccl_version);
        dlclose(lib);
        return;
    }
    nccl_loaded = true; /* open for the life of the process: graphs may hold its kernels */
}

static bool nccl_available(char *reason, size_t reason_bytes) {
    pthread_once(&nccl_once, load_library);
    if (!nccl_loaded)
        snprintf(reason, reason_bytes, "%s", nccl_failure);
    return nccl_loaded;
}

/* "ncclAllReduce: ncclRemoteError (6): remote process exited or there was a network error;
 * <NCCL's last message>" */
static mg_status nccl_error(ncclResult_t r, const char *call, ncclComm_t comm, int rank) {
    const char *last = nccl.get_last_error ? nccl.get_last_error(comm) : NULL;
    return MG_ERROR(MG_ERR_DEVICE, "%s (rank %d): NCCL error %d: %s%s%s", call, rank, (int)r,
                    nccl.get_error_string(r), last && *last ? "; " : "", last ? last : "");
}

/* ------------------------------------------------------------------ ranks */

typedef struct nccl_rank {
    pthread_mutex_t lock; /* orders NCCL calls on the handle with an abort from another thread */
    ncclComm_t comm;      /* NULL once aborted or destroyed */
    int device_cc_major;
} nccl_rank;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls until NCCL's background work on the rank is done (not ncclInProgress). On an error
 * or after the deadline, aborts the rank and returns MG_ERR_DEVICE naming `call`. Caller
 * holds r->lock. */
static mg_status settle_locked(mg_comm *c, nccl_rank *r, const char *call, uint64_t deadline) {
    /* A collective's enqueue settles in microseconds: poll without sleeping for the first
     * SPIN_POLLS rounds (yielding the core), and only then in 1 ms sleeps, which suit
     * connection set-up and a dead peer. Sleeping from the first round made every collective
     * cost at least a millisecond of host time, and the device waited for it. */
    enum { SPIN_POLLS = 20000 };
    for (unsigned polls = 0;; polls++) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t q = nccl.get_async_error(r->comm, &state);
        if (q != ncclSuccess)
            state = q;
        if (state == ncclSuccess)
            return MG_OK;
        mg_status st;
        if (state != ncclInProgress) {
            st = nccl_error(state, call, r->comm, c->rank);
        } else if (mg_comm_now_ms() >= deadline) {
            st = MG_ERROR(MG_ERR_DEVICE,
                          "%s (rank %d of %d): NCCL did not finish within %u ms (a peer died or "
                          "never joined); aborted",
                          call, c->rank, c->size, c->timeout_ms);
        } else {
            if (polls < SPIN_POLLS)
                sched_yield();
            else
                sleep_ms(1);
            continue;
        }
        mg_comm_fail(c, mg_last_error());
        nccl.abort(r->comm);
        r->comm = NULL;
        return st;
    }
}

static mg_status rank_alloc(mg_comm *c) {
    nccl_rank *r = calloc(1, sizeof *r);
    if (!r)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "nccl communicator: out of host memory");
    pthread_mutex_init(&r->lock, NULL);
    mg_device_info info;
    if (mg_device_get_info(c->backend, &info) == MG_OK)
        r->device_cc_major = info.cc_major;
    c->impl = r;
    return MG_OK;
}

static void rank_free(mg_comm *c) {
    nccl_rank *r = c->impl;
    if (!r)
        return;
    pthread_mutex_destroy(&r->lock);
    free(r);
    c->impl = NULL;
}

static ncclConfig_t nonblocking_config(void) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
}

static mg_status nccl_get_id(mg_comm_id *out) {
    _Static_assert(sizeof(ncclUniqueId) <= MG_COMM_ID_BYTES, "mg_comm_id holds an ncclUniqueId");
    ncclUniqueId id;
    ncclResult_t r = nccl.get_unique_id(&id);
    if (r != ncclSuccess)
        return nccl_error(r, "ncclGetUniqueId", NULL, -1);
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &id, sizeof id);
    return MG_OK;
}

/* Starts rank `c` (its device current on this thread); does not wait. */
static mg_status init_rank(mg_comm *c, const ncclUniqueId *id) {
    mg_cuda_context *ctx;
    mg_status st = mg_cuda_bind(c->backend, &ctx);
    if (st || (st = rank_alloc(c)))
        return st;
    nccl_rank *r = c->impl;
    ncclConfig_t config = nonblocking_config();
    ncclResult_t res = nccl.init_rank_config(&r->comm, c->size, *id, c->rank, &config);
    if (res != ncclSuccess && res != ncclInProgress) {
        st = nccl_error(res, "ncclCommInitRankConfig", r->comm, c->rank);
        if (r->comm)
            nccl.abort(r->comm);
        rank_free(c);
    }
    return st;
}

static mg_status nccl_create_rank(mg_comm *c, const mg_comm_id *id) {
    ncclUniqueId nid;
    memcpy(&nid, id->bytes, sizeof nid);
    mg_status st = init_rank(c, &nid);
    if (st)
        return st;
    nccl_rank *r = c->impl;
    pthread_mutex_lock(&r->lock);
    st = settle_locked(c, r, "ncclCommInitRankConfig", mg_comm_now_ms() + c->timeout_ms);
    pthread_mutex_unlock(&r->lock);
    if (st)
        rank_free(c);
    return st;
}

static mg_status nccl_create_local(mg_comm *const *comms, int count) {
    mg_comm_id id;
    mg_status st = nccl_get_id(&id);
    if (st)
        return st;
    ncclUniqueId nid;
    memcpy(&nid, id.bytes, sizeof nid);
    /* One thread starts every rank, so they go in one group (NCCL would wait in the first
     * rank's init for the others otherwise). */
    ncclResult_t res = nccl.group_start();
    if (res != ncclSuccess)
        return nccl_error(res, "ncclGroupStart", NULL, -1);
    int started = 0;
    for (; started < count && !st; started++)
        st = init_rank(comms[started], &nid);
    if (st)
        started--; /* the failed one cleaned up after itself */
    res = nccl.group_end();
    if (!st && res != ncclSuccess && res != ncclInProgress)
        st = nccl_error(res, "ncclGroupEnd", NULL, -1);
    uint64_t deadline = mg_comm_now_ms() + comms[0]->timeout_ms;
    for (int i = 0; i < started; i++) {
        nccl_rank *r = comms[i]->impl;
        pthread_mutex_lock(&r->lock);
        if (st) {
            nccl.abort(r->comm);
            r->comm = NULL;
        } else {
            st = settle_locked(comms[i], r, "ncclCommInitRankConfig", deadline);
            if (st) /* abort the ones already settled too */
                for (int j = 0; j < i; j++) {
                    nccl_rank *o = comms[j]->impl;
                    nccl.abort(o->comm);
                    o->comm = NULL;
                }
        }
        pthread_mutex_unlock(&r->lock);
    }
    if (st)
        for (int i = 0; i < started; i++)
            rank_free(comms[i]);
    return st;
}

static ncclDataType_t nccl_type(mg_dtype dtype) {
    switch (dtype) {
    case MG_DTYPE_BF16:
        return ncclBfloat16;
    case MG_DTYPE_F16:
        return ncclFloat16;
    case MG_DTYPE_FP8_E4M3:
        return ncclFloat8e4m3;
    default:
        return ncclFloat32;
    }
}

static mg_status nccl_enqueue(mg_comm *c, mg_stream *s, const mg_comm_call *call, bool grouped) {
    mg_cuda_context *ctx;
    CUstream stream;
    mg_status st = mg_cuda_bind(c->backend, &ctx);
    if (st || (st = mg_cuda_stream(c->backend, s, &stream)))
        return st;
    nccl_rank *r = c->impl;
    pthread_mutex_lock(&r->lock);
    if (!r->comm) {
        pthread_mutex_unlock(&r->lock);
        return mg_comm_check_failed(c, "nccl");
    }
    ncclDataType_t t = nccl_type(call->dtype);
    ncclRedOp_t op = call->op == MG_COMM_MAX ? ncclMax : ncclSum;
    const void *send = (const void *)(uintptr_t)call->send;
    void *recv = (void *)(uintptr_t)call->recv;
    cudaStream_t cs = (cudaStream_t)stream;
    const char *name = "?";
    ncclResult_t res = ncclInvalidArgument;
    switch (call->kind) {
    case MG_COMM_CALL_ALL_REDUCE:
        name = "ncclAllReduce";
        res = nccl.all_reduce(send, recv, call->count, t, op, r->comm, cs);
        break;
    case MG_COMM_CALL_ALL_GATHER:
        name = "ncclAllGather";
        res = nccl.all_gather(send, recv, call->count, t, r->comm, cs);
        break;
    case MG_COMM_CALL_REDUCE_SCATTER:
        name = "ncclReduceScatter";
        res = nccl.reduce_scatter(send, recv, call->count, t, op, r->comm, cs);
        break;
    case MG_COMM_CALL_BROADCAST:
        name = "ncclBroadcast";
        res = nccl.broadcast(send, recv, call->count, t, call->peer, r->comm, cs);
        break;
    case MG_COMM_CALL_SEND:
        name = "ncclSend";
        res = nccl.send(send, call->count, t, call->peer, r->comm, cs);
        break;
    case MG_COMM_CALL_RECV:
        name = "ncclRecv";
        res = nccl.recv(recv, call->count, t, call->peer, r->comm, cs);
        break;
    }
    if (res == ncclInProgress && !grouped)
        st = settle_locked(c, r, name, mg_comm_now_ms() + c->timeout_ms);
    else if (res != ncclSuccess && res != ncclInProgress)
        st = nccl_error(res, name, r->comm, c->rank);
    pthread_mutex_unlock(&r->lock);
    return st;
}

static mg_status nccl_group_begin(void) {
    ncclResult_t res = nccl.group_start();
    return res == ncclSuccess ? MG_OK : nccl_error(res, "ncclGroupStart", NULL, -1);
}

static mg_status nccl_group_end(mg_comm *const *comms, int count) {
    ncclResult_t res = nccl.group_end();
    if (res != ncclSuccess && res != ncclInProgress)
        return nccl_error(res, "ncclGroupEnd", NULL, -1);
    mg_status first = MG_OK;
    for (int i = 0; i < count; i++) {
        nccl_rank *r = comms[i]->impl;
        pthread_mutex_lock(&r->lock);
        mg_status st = r->comm ? settle_locked(comms[i], r, "ncclGroupEnd",
                                               mg_comm_now_ms() + comms[i]->timeout_ms)
                               : mg_comm_check_failed(comms[i], "ncclGroupEnd");
        pthread_mutex_unlock(&r->lock);
        if (st && !first)
            first = st;
    }
    return first;
}

static mg_status nccl_async_error(mg_comm *c) {
    nccl_rank *r = c->impl;
    pthread_mutex_lock(&r->lock);
    mg_status st = MG_OK;
    if (!r->comm) {
        st = mg_comm_check_failed(c, "ncclCommGetAsyncError");
    } else {
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = nccl.get_async_error(r->comm, &state);
        if (q != ncclSuccess)
            state = q;
        if (state != ncclSuccess && state != ncclInProgress)
            st = nccl_error(state, "ncclCommGetAsyncError", r->comm, c->rank);
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

static void nccl_abort(mg_comm *c) {
    nccl_rank *r = c->impl;
    mg_cuda_context *ctx;
    (void)mg_cuda_bind(c->backend, &ctx);
    pthread_mutex_lock(&r->lock);
    if (r->comm)
        nccl.abort(r->comm); /* tells the rank's kernels to stop, frees its resources */
    r->comm = NULL;
    pthread_mutex_unlock(&r->lock);
}

static void nccl_destroy(mg_comm *c) {
    nccl_rank *r = c->impl;
    if (!r)
        return;
    mg_cuda_context *ctx;
    (void)mg_cuda_bind(c->backend, &ctx);
    pthread_mutex_lock(&r->lock);
    if (r->comm) {
        /* Finalize flushes outstanding work; it is non-blocking here, so poll it with the
         * timeout (a dead peer then aborts instead of hanging). */
        ncclResult_t res = nccl.finalize(r->comm);
        mg_error_state saved;
        mg_error_save(&saved);
        if ((res == ncclSuccess || res == ncclInProgress) &&
            settle_locked(c, r, "ncclCommFinalize", mg_comm_now_ms() + c->timeout_ms) == MG_OK)
            nccl.destroy(r->comm);
        else if (r->comm)
            nccl.abort(r->comm);
        mg_error_restore(&saved);
        r->comm = NULL;
    }
    pthread_mutex_unlock(&r->lock);
    rank_free(c);
}

static bool nccl_supports_dtype(mg_comm *c, mg_dtype dtype) {
    if (dtype != MG_DTYPE_FP8_E4M3)
        return true;
    nccl_rank *r = c->impl;
    return nccl_version >= NCCL_FP8 && r && r->device_cc_major >= 9;
}

static bool nccl_available_on(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
    return nccl_available(reason, reason_bytes);
}

const mg_comm_provider mg_comm_nccl_provider = {
    .base = {.name = "nccl", .backend = MG_BACKEND_CUDA, .available = nccl_available_on},
    .available = nccl_available,
    .get_id = nccl_get_id,
    .create_rank = nccl_create_rank,
    .create_local = nccl_create_local,
    .enqueue = nccl_enqueue,
    .group_begin = nccl_group_begin,
    .group_end = nccl_group_end,
    .async_error = nccl_async_error,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .supports_dtype = nccl_supports_dtype,
};
