/*
 * metal_internal.h - private: the Metal backend's context and what its files share.
 *
 * UNVERIFIED ON HARDWARE: the backend has only run against the test double of tests/metal/
 * (a stand-in for libobjc and Metal.framework that executes kernels through the CPU
 * reference kernels), never on a Mac.
 *
 * Memory is MTLBuffer in shared storage (Apple silicon: one memory for CPU and GPU), so a
 * device pointer is the buffer's `contents` address; a table maps it back to the buffer and
 * offset a launch binds. A stream is a command queue with one open command buffer that
 * work is encoded into; it is committed when the stream synchronizes, an event is recorded
 * or host memory must see the results. Events are MTLSharedEvents. Graphs are command lists
 * (src/core/command_list.h) replayed through the same encoding path, as on the CPU backend.
 */
#ifndef METRALE_METAL_INTERNAL_H
#define METRALE_METAL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend_impl.h"
#include "command_list.h"
#include "metal_runtime.h"

typedef struct mg_metal_stream mg_metal_stream;
typedef struct mg_metal_event mg_metal_event;
typedef struct mg_metal_graph mg_metal_graph;
typedef struct mg_metal_kernel mg_metal_kernel;

typedef struct mg_metal_buffer {
    mg_devptr base; /* [buffer contents] */
    uint64_t bytes;
    mg_id buffer; /* owned (one reference) */
} mg_metal_buffer;

typedef struct mg_metal_backend {
    const mg_metal_runtime *rt;
    int device;
    mg_id dev; /* id<MTLDevice>, owned */
    uint64_t working_set_bytes;
    uint32_t max_threadgroup_memory;
    bool unified_memory;

    /* Live buffers sorted by base; guarded by buffers_lock, which is taken last of all. */
    pthread_mutex_t buffers_lock;
    mg_metal_buffer *buffers;
    size_t buffer_count, buffer_capacity;
    uint64_t live_bytes;

    /* Guards the object lists; taken before any stream's lock. */
    pthread_mutex_t lock;
    mg_metal_stream *streams, *default_stream;
    mg_metal_event *events;
    mg_metal_graph *graphs;

    /* The library compiled from the embedded MSL at the first kernel lookup, and the
     * pipelines made from it, one per function. */
    pthread_mutex_t library_lock;
    mg_id library;
    mg_metal_kernel *kernels;
} mg_metal_backend;

/* ---- metal_memory.c */
mg_status mg_metal_alloc(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out);
mg_status mg_metal_free(void *ctx, mg_devptr base, mg_alloc_kind kind);
/* [ptr, ptr + bytes) inside one live buffer: its buffer and the offset of ptr in it. The
 * message names "metal <call> <what>". */
mg_status mg_metal_resolve(mg_metal_backend *c, mg_devptr ptr, uint64_t bytes, const char *call,
                           const char *what, mg_id *buffer, uint64_t *offset);
void mg_metal_release_all_buffers(mg_metal_backend *c);

/* ---- metal_stream.c */
mg_status mg_metal_copy_h2d(void *ctx, mg_devptr dst, const void *src, size_t bytes);
mg_status mg_metal_copy_d2h(void *ctx, void *dst, mg_devptr src, size_t bytes);
mg_status mg_metal_copy_d2d(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes);
mg_status mg_metal_copy_h2d_async(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                  void *stream, bool retained);
mg_status mg_metal_copy_d2h_async(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream);
mg_status mg_metal_copy_d2d_async(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                  void *stream);
mg_status mg_metal_copy_2d_d2d_async(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                     size_t src_pitch, size_t width_bytes, size_t height,
                                     void *stream);
mg_status mg_metal_memset(void *ctx, mg_devptr dst, uint8_t value, size_t bytes);
mg_status mg_metal_memset_async(void *ctx, mg_devptr dst, uint8_t value, size_t bytes,
                                void *stream);
mg_status mg_metal_stream_create(void *ctx, bool is_default, void **out);
mg_status mg_metal_stream_destroy(void *ctx, void *stream);
mg_status mg_metal_stream_synchronize(void *ctx, void *stream);
mg_status mg_metal_stream_is_capturing(void *ctx, void *stream, bool *capturing);
mg_status mg_metal_event_create(void *ctx, void **out);
mg_status mg_metal_event_record(void *ctx, void *event, void *stream);
mg_status mg_metal_stream_wait_event(void *ctx, void *stream, void *event);
mg_status mg_metal_event_synchronize(void *ctx, void *event);
mg_status mg_metal_event_query(void *ctx, void *event);
mg_status mg_metal_event_elapsed_ms(void *ctx, void *start, void *end, float *ms);
mg_status mg_metal_event_destroy(void *ctx, void *event);
mg_status mg_metal_graph_begin_capture(void *ctx, void *stream);
mg_status mg_metal_graph_end_capture(void *ctx, void *stream, void **graph_out);
mg_status mg_metal_graph_end_capture_update(void *ctx, void *stream, void *graph,
                                            bool *updated_in_place);
mg_status mg_metal_graph_abort_capture(void *ctx, void *stream);
mg_status mg_metal_graph_launch(void *ctx, void *graph, void *stream);
mg_status mg_metal_graph_destroy(void *ctx, void *graph);
mg_status mg_metal_graph_count_nodes(void *ctx, void *graph, size_t *kernels, size_t *nodes);
/* Enqueues a checked launch on `s` (recorded while capturing). */
mg_status mg_metal_stream_launch(mg_metal_backend *c, mg_metal_stream *s, mg_metal_kernel *k,
                                 const mg_launch *launch);
void mg_metal_release_all_objects(mg_metal_backend *c);

/* ---- metal_kernels.c */
mg_status mg_metal_kernel_lookup(void *ctx, const char *module, const char *function, void **out);
mg_status mg_metal_launch(void *ctx, void *kernel, const char *kernel_name, void *stream,
                          const mg_launch *launch);
/* Encodes one launch into `encoder` (an open compute command encoder). */
mg_status mg_metal_encode_launch(mg_metal_backend *c, mg_id encoder, const mg_metal_kernel *k,
                                 const mg_launch *launch);
const char *mg_metal_kernel_full_name(const mg_metal_kernel *k);
void mg_metal_release_kernels(mg_metal_backend *c);

/* The embedded MSL of kernels/metal/ (generated at build time), NUL-terminated. */
extern const char mg_metal_kernel_source[];

#endif
