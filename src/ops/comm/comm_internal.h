/*
 * comm_internal.h - private to src/ops/comm: the communicator object of metrale/comm.h and
 * what a transport provides (comm_cpu.c: threads of one process; comm_cuda.c: NCCL).
 *
 * The front (comm.c) checks every argument, keeps the failure state and the group
 * bookkeeping, and hands a provider only checked calls of its own backend kind.
 */
#ifndef METRALE_COMM_INTERNAL_H
#define METRALE_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/comm.h"
#include "op_registry.h"

typedef enum mg_comm_call_kind {
    MG_COMM_CALL_ALL_REDUCE = 0,
    MG_COMM_CALL_ALL_GATHER,
    MG_COMM_CALL_REDUCE_SCATTER,
    MG_COMM_CALL_BROADCAST,
    MG_COMM_CALL_SEND,
    MG_COMM_CALL_RECV,
} mg_comm_call_kind;

/* One checked call. `count` is the per-rank count of the public call (all-gather: send count;
 * reduce-scatter: recv count). `peer` is the root of a broadcast or the peer of send/recv. */
typedef struct mg_comm_call {
    mg_comm_call_kind kind;
    mg_devptr send, recv;
    size_t count;
    mg_dtype dtype;
    mg_comm_reduce op;
    int peer;
} mg_comm_call;

typedef struct mg_comm_provider mg_comm_provider;

struct mg_comm {
    const mg_comm_provider *provider;
    mg_backend *backend;
    int rank, size;
    uint32_t timeout_ms;
    mg_event *wait_event; /* recorded by mg_comm_wait */
    /* Set once, by the first failure (timeout, peer error, abort); the message is written
     * before the flag is raised. */
    _Atomic bool failed;
    pthread_mutex_t failure_lock;
    char failure[512];
    void *impl; /* the provider's rank */
};

/* A transport is the provider of op MG_OP_COMM (metrale/ops.h) for its backend kind: the op
 * registry lists it and chooses it for a backend, forcing and statistics apply (a call counts
 * once enqueued). */
struct mg_comm_provider {
    mg_op_provider base; /* first: name ("cpu", "nccl") and backend kind */
    /* Whether the transport can run at all (a communicator id needs no backend). Never sets
     * mg_last_error. */
    bool (*available)(char *reason, size_t reason_bytes);
    mg_status (*get_id)(mg_comm_id *out);
    /* `c` is filled but for impl; the provider sets c->impl. */
    mg_status (*create_rank)(mg_comm *c, const mg_comm_id *id);
    /* Every comms[i] filled but for impl; all or none get an impl. */
    mg_status (*create_local)(mg_comm *const *comms, int count);
    /* Enqueues one checked call on `s` (already resolved to c's backend). `grouped`: inside
     * a group of this thread (the provider's group_begin was called). */
    mg_status (*enqueue)(mg_comm *c, mg_stream *s, const mg_comm_call *call, bool grouped);
    /* The outermost group of this thread begins / ends; `comms` are this provider's
     * communicators used in the group. */
    mg_status (*group_begin)(void);
    mg_status (*group_end)(mg_comm *const *comms, int count);
    /* Whether group_end also runs at the end of every outermost group of this thread in which
     * none of its communicators made a call (comms NULL, count 0): for a transport whose
     * work joins a group without a call of the group (the CPU transport's graph replays). */
    bool ends_every_group;
    /* MG_OK while healthy; otherwise the error, with the message set. Never blocks. */
    mg_status (*async_error)(mg_comm *c);
    void (*abort)(mg_comm *c);
    /* Releases c->impl (after abort when c failed). */
    void (*destroy)(mg_comm *c);
    bool (*supports_dtype)(mg_comm *c, mg_dtype dtype);
};

extern const mg_comm_provider mg_comm_cpu_provider;
#if defined(METRALE_HAVE_CUDA)
extern const mg_comm_provider mg_comm_nccl_provider;
#endif

/* Records the first failure of `c` (later ones keep the first message). */
void mg_comm_fail(mg_comm *c, const char *message);
/* MG_ERR_DEVICE with "fn: communicator failed: <first failure>" when `c` has failed. */
mg_status mg_comm_check_failed(mg_comm *c, const char *fn);

/* How deep this thread's open groups nest (0: none). The CPU transport asks it when its
 * kernels run, so graph replays inside a group contribute without waiting too. */
int mg_comm_group_depth(void);

/* Milliseconds of CLOCK_MONOTONIC, for timeouts. */
uint64_t mg_comm_now_ms(void);

#endif
