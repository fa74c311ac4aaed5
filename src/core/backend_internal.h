/*
 * backend_internal.h - private to src/core: the objects behind the public handles and the
 * checks the public calls share. Only the core (backend.c, memory.c, stream.c, module.c and
 * the utilities built on them: op cache, op state, arena) looks inside.
 */
#ifndef METRALE_BACKEND_INTERNAL_H
#define METRALE_BACKEND_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h> /* free, in FORGET_HANDLE */

#include "backend_impl.h"
#include "ledger.h"

typedef struct mg_op_cache mg_op_cache;
typedef struct mg_op_state_slot mg_op_state_slot;

/* Type tags of the handle registry: a handle is dereferenced only after the registry
 * confirms it is live and of the expected type. */
typedef enum mg_handle_type {
    MG_HANDLE_BACKEND = 1,
    MG_HANDLE_STREAM,
    MG_HANDLE_EVENT,
    MG_HANDLE_GRAPH,
    MG_HANDLE_KERNEL,
} mg_handle_type;

struct mg_stream {
    mg_backend *owner;
    void *impl;
    bool is_default;
    atomic_bool capturing; /* begun through mg_graph_begin_capture, not yet ended */
};

struct mg_event {
    mg_backend *owner;
    void *impl;
};

struct mg_graph {
    mg_backend *owner;
    void *impl;
};

struct mg_kernel {
    mg_backend *owner;
    void *impl;
    atomic_uint_fast64_t holds; /* public lookups not yet released */
    char module[96];
    char function[128];
    char name[226]; /* "module:function" */
};

/* A live block from mg_host_alloc. `mapped` is its device address once
 * mg_host_device_pointer handed it out (0 before): device ranges inside it are then valid
 * arguments even on backends that check pointers strictly. */
typedef struct mg_host_block {
    void *host;
    size_t bytes;
    mg_devptr mapped;
} mg_host_block;

/* A module loaded through mg_module_load, remembered for unload-by-model. */
typedef struct mg_module_record {
    char model[96];
    char name[96];
} mg_module_record;

struct mg_backend {
    const mg_backend_ops *ops;
    void *ctx;
    mg_backend_kind kind;
    int device;
    mg_ledger ledger;
    mg_stream *default_stream;
    mg_op_cache *op_cache;
    /* Per-backend op state (op_state.h), in creation order; guarded by op_state_lock, which
     * is held while a state is created so each type is created once. */
    pthread_mutex_t op_state_lock;
    mg_op_state_slot *op_states;
    size_t op_state_count, op_state_capacity;
    atomic_int capturing_streams;

    pthread_mutex_t lock; /* guards the lists below and the fault text */
    mg_stream **streams;
    size_t stream_count, stream_capacity;
    mg_event **events;
    size_t event_count, event_capacity;
    mg_graph **graphs;
    size_t graph_count, graph_capacity;
    struct mg_host_block **host_blocks; /* from mg_host_alloc, still live */
    size_t host_block_count, host_block_capacity;
    mg_module_record *modules;
    size_t module_count, module_capacity;

    _Atomic(struct mg_timing *) launch_timing; /* mg_timing_trace_launches, or NULL */

    atomic_bool faulted;
    char fault_message[768];
};

/* Kernel spans around every mg_launch_run (metrale/timing.h). Attach fails with
 * MG_ERR_BUSY when another timing object is attached; detach only detaches `t`. */
mg_status mg_backend_attach_launch_timing(mg_backend *b, struct mg_timing *t);
void mg_backend_detach_launch_timing(mg_backend *b, struct mg_timing *t);

/* ---- shared by the public calls of the core */

/* Entry check of every call taking a backend: live handle, no sticky fault. */
mg_status mg_core_enter(mg_backend *b, const char *fn);
/* Validates `s` (NULL = default stream) as a live stream of `b`. */
mg_status mg_core_resolve_stream(mg_backend *b, mg_stream *s, const char *fn, mg_stream **out);
/* MG_ERR_CAPTURING while any stream of `b` captures: blocking work would wait on (or, on
 * CUDA, invalidate) the capture. */
mg_status mg_core_refuse_while_capturing(mg_backend *b, const char *fn);
/* MG_ERR_INVALID_ARGUMENT for a NULL host pointer with a non-zero size. */
mg_status mg_core_check_host(const void *p, size_t bytes, const char *fn, const char *what);
/* Unregisters (before anyone else can reuse the memory) and frees one mg_host_alloc block. */
mg_status mg_core_release_host_block(mg_backend *b, void *host);
/* Wraps a backend stream in a registered handle (listed on `b` unless it is the default). */
mg_status mg_core_wrap_stream(mg_backend *b, void *impl, bool is_default, mg_stream **out);

/* Growable pointer arrays of handles, guarded by b->lock. */
mg_status mg_core_list_push(void ***items, size_t *count, size_t *capacity, void *item);
bool mg_core_list_remove(void **items, size_t *count, const void *item);
#define LIST_PUSH(b, name, item)                                                                   \
    mg_core_list_push((void ***)&(b)->name##s, &(b)->name##_count, &(b)->name##_capacity, (item))
#define LIST_REMOVE(b, name, item)                                                                 \
    mg_core_list_remove((void **)(b)->name##s, &(b)->name##_count, (item))

/* The end of every destroy: drop the handle from its backend's list and the registry, then
 * free it. */
#define FORGET_HANDLE(b, name, handle)                                                             \
    do {                                                                                           \
        pthread_mutex_lock(&(b)->lock);                                                            \
        LIST_REMOVE(b, name, handle);                                                              \
        pthread_mutex_unlock(&(b)->lock);                                                          \
        mg_handle_unregister(handle);                                                              \
        free(handle);                                                                              \
    } while (0)

/* Registry of live handles (process-wide). */
mg_status mg_handle_register(const void *handle, mg_handle_type type);
void mg_handle_unregister(const void *handle);
bool mg_handle_is(const void *handle, mg_handle_type type);

#endif
