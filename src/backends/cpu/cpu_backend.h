/*
 * cpu_backend.h - private: the CPU backend's context and the pieces its files share.
 *
 * Device memory is host memory, so a device pointer is a host address. Work is executed in
 * the calling thread when it is enqueued (streams therefore are trivially in order and
 * complete on return), except while a stream is capturing: then it is recorded as commands
 * and executed only when the graph is launched. Every command checks its device ranges
 * against the backend's table of live allocations when it executes, so replaying a graph
 * whose buffers were freed is an error, not a crash.
 */
#ifndef METRALE_CPU_BACKEND_H
#define METRALE_CPU_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend_impl.h"
#include "ledger.h"
#include "metrale/cpu.h"

#define MG_CPU_DEVICE_COUNT 8
#define MG_CPU_ALLOC_ALIGNMENT 256
/* Mirrors the opt-in dynamic shared memory of a Hopper GPU (227 KiB), so a launch written
 * for the GPU validates the same way on the reference backend. */
#define MG_CPU_MAX_SHARED_PER_BLOCK (227u * 1024u)

/* Every counter of metrale/cpu.h, once: the enum and mg_cpu_get_counters are generated. */
/* clang-format off */
#define MG_CPU_COUNTERS(X)                                                                         \
    X(alloc) X(free) X(copy_h2d) X(copy_d2h) X(copy_d2d) X(copy_h2d_async) X(copy_d2h_async)    \
    X(copy_d2d_async) X(copy_2d) X(memset) X(memset_async) X(stream_create) X(stream_destroy)   \
    X(stream_synchronize) X(event_create) X(event_record) X(event_wait) X(event_synchronize)    \
    X(event_query) X(event_destroy) X(graph_capture) X(graph_launch) X(graph_destroy)           \
    X(host_alloc) X(host_free) X(kernel_lookup) X(launch) X(graph_begin_capture)               \
    X(graph_abort_capture) X(stream_is_capturing) X(event_elapsed) X(host_device_pointer)       \
    X(device_info) X(memory_info)

typedef enum mg_cpu_counter {
#define MG_CPU_COUNTER_ENUM(name) MG_CPU_COUNT_##name,
    MG_CPU_COUNTERS(MG_CPU_COUNTER_ENUM)
#undef MG_CPU_COUNTER_ENUM
    MG_CPU_COUNTER_COUNT
} mg_cpu_counter;
/* clang-format on */

typedef struct mg_cpu_stream mg_cpu_stream;
typedef struct mg_cpu_event mg_cpu_event;
typedef struct mg_cpu_graph mg_cpu_graph;

typedef struct mg_cpu_backend {
    int device;
    _Atomic uint64_t counters[MG_CPU_COUNTER_COUNT];

    /* The ranges this device can address, each sorted by base (the core's ledger type, here
     * without call sites): device, managed and arena allocations, and host_alloc memory
     * (whose device address is its host address). Every device address is checked against
     * them when work runs. */
    mg_ledger device_ranges;
    mg_ledger host_ranges;
    /* Caller-owned host memory from mg_host_register: addressable like the above, never freed
     * here. */
    mg_ledger registered_ranges;

    /* Guards everything below. Work itself runs outside it. */
    pthread_mutex_t lock;
    uint64_t live_device_bytes;    /* device ranges, each rounded up to 256 bytes */
    uint64_t allocation_cap_bytes; /* 0: none */
    uint64_t fail_countdown;       /* 0: off; 1: the next allocation fails */
    /* Objects still alive, so destroy releases what the core did not. */
    mg_cpu_stream *streams;
    mg_cpu_event *events;
    mg_cpu_graph *graphs;
} mg_cpu_backend;

static inline void mg_cpu_count(mg_cpu_backend *c, mg_cpu_counter which) {
    atomic_fetch_add_explicit(&c->counters[which], 1, memory_order_relaxed);
}

/* ---- cpu_backend.c */

/* Physical memory of the host: the CPU device's total. */
uint64_t mg_cpu_physical_bytes(void);

/* ---- cpu_memory.c */

/* Checks that [ptr, ptr + bytes) lies inside one live range and returns its host address.
 * The message names "cpu <call> <what>" (e.g. "cpu copy_d2d_async src"); it is formatted
 * only on failure, so the check costs a table lookup. bytes == 0 still requires a live
 * address. */
mg_status mg_cpu_resolve(mg_cpu_backend *c, mg_devptr ptr, uint64_t bytes, const char *call,
                         const char *what, void **host_out);
mg_status mg_cpu_alloc(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out);
mg_status mg_cpu_free(void *ctx, mg_devptr base, mg_alloc_kind kind);
mg_status mg_cpu_host_alloc(void *ctx, size_t bytes, void **out);
mg_status mg_cpu_host_free(void *ctx, void *host);
mg_status mg_cpu_host_device_pointer(void *ctx, void *host, mg_devptr *out);
mg_status mg_cpu_host_register(void *ctx, void *host, size_t bytes, mg_devptr *out);
mg_status mg_cpu_host_unregister(void *ctx, void *host);
bool mg_cpu_host_registered(void *ctx, mg_devptr p, size_t bytes);
/* Frees every range still in the table (backend teardown). */
void mg_cpu_release_all_ranges(mg_cpu_backend *c);

/* ---- cpu_stream.c: copies, memsets, streams, events, graphs */

mg_status mg_cpu_copy_h2d(void *ctx, mg_devptr dst, const void *src, size_t bytes);
mg_status mg_cpu_copy_d2h(void *ctx, void *dst, mg_devptr src, size_t bytes);
mg_status mg_cpu_copy_d2d(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes);
mg_status mg_cpu_copy_h2d_async(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                void *stream, bool retained);
mg_status mg_cpu_copy_d2h_async(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream);
mg_status mg_cpu_copy_d2d_async(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                void *stream);
mg_status mg_cpu_copy_2d_d2d_async(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                   size_t src_pitch, size_t width_bytes, size_t height,
                                   void *stream);
mg_status mg_cpu_memset(void *ctx, mg_devptr dst, uint8_t value, size_t bytes);
mg_status mg_cpu_memset_async(void *ctx, mg_devptr dst, uint8_t value, size_t bytes, void *stream);

mg_status mg_cpu_stream_create(void *ctx, bool is_default, void **out);
mg_status mg_cpu_stream_destroy(void *ctx, void *stream);
mg_status mg_cpu_stream_synchronize(void *ctx, void *stream);
mg_status mg_cpu_stream_is_capturing(void *ctx, void *stream, bool *capturing);
mg_status mg_cpu_event_create(void *ctx, void **out);
mg_status mg_cpu_event_record(void *ctx, void *event, void *stream);
mg_status mg_cpu_stream_wait_event(void *ctx, void *stream, void *event);
mg_status mg_cpu_event_synchronize(void *ctx, void *event);
mg_status mg_cpu_event_query(void *ctx, void *event);
mg_status mg_cpu_event_elapsed_ms(void *ctx, void *start, void *end, float *ms);
mg_status mg_cpu_event_destroy(void *ctx, void *event);

mg_status mg_cpu_graph_begin_capture(void *ctx, void *stream);
mg_status mg_cpu_graph_end_capture(void *ctx, void *stream, void **graph_out);
mg_status mg_cpu_graph_end_capture_update(void *ctx, void *stream, void *graph,
                                          bool *updated_in_place);
mg_status mg_cpu_graph_abort_capture(void *ctx, void *stream);
mg_status mg_cpu_graph_launch(void *ctx, void *graph, void *stream);
mg_status mg_cpu_graph_destroy(void *ctx, void *graph);
mg_status mg_cpu_graph_count_nodes(void *ctx, void *graph, size_t *kernels, size_t *nodes);

/* Enqueues a kernel launch (cpu_kernels.c builds it; the stream runs or records it). */
typedef struct mg_cpu_kernel mg_cpu_kernel;
mg_status mg_cpu_stream_launch(mg_cpu_backend *c, mg_cpu_stream *s, mg_cpu_kernel *k,
                               const mg_launch *launch);
/* Frees every stream, event and graph still alive (backend teardown). */
void mg_cpu_release_all_objects(mg_cpu_backend *c);

/* ---- cpu_kernels.c */

mg_status mg_cpu_kernel_lookup(void *ctx, const char *module, const char *function, void **out);
mg_status mg_cpu_launch(void *ctx, void *kernel, const char *kernel_name, void *stream,
                        const mg_launch *launch);
/* Runs a kernel now, with `c` as the backend its buffer arguments resolve against. */
mg_status mg_cpu_kernel_execute(mg_cpu_backend *c, mg_cpu_kernel *k, const mg_launch *launch);
/* "module:function" of a kernel handle. */
const char *mg_cpu_kernel_full_name(const mg_cpu_kernel *k);
/* Registers the built-in kernels once per process. */
void mg_cpu_kernels_init(void);

/* ---- cpu_counters.c */

/* The CPU context behind a public backend, or MG_ERR_INVALID_ARGUMENT naming `call`. */
mg_status mg_cpu_from_backend(mg_backend *b, const char *call, mg_cpu_backend **out);

#endif
