/*
 * backend_internal.h - private to src/core: the objects behind the public handles. Only
 * backend.c and the core utilities built on it (op cache, arena) look inside.
 */
#ifndef METRALE_BACKEND_INTERNAL_H
#define METRALE_BACKEND_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend_impl.h"
#include "ledger.h"

typedef struct mg_op_cache mg_op_cache;

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

/* Registry of live handles (process-wide). */
mg_status mg_handle_register(const void *handle, mg_handle_type type);
void mg_handle_unregister(const void *handle);
bool mg_handle_is(const void *handle, mg_handle_type type);

#endif
