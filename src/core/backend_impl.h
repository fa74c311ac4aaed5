/*
 * backend_impl.h - private: what a backend implements, and the objects the core wraps
 * around it. Public calls (src/core/backend.c) check every argument once, wrap/unwrap
 * handles, keep the ledger, enforce capture and sticky-fault rules, then dispatch here.
 * A backend therefore receives only validated arguments of its own objects.
 *
 * Backend-side objects are `void *` owned by the backend; the core pairs each with its owner
 * in mg_stream / mg_event / mg_graph / mg_kernel so a foreign or stale handle is caught
 * before it reaches a driver.
 */
#ifndef METRALE_BACKEND_IMPL_H
#define METRALE_BACKEND_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"

#define MG_BACKEND_OPS_VERSION 1

/* Every member takes the backend's own context first. Members marked optional may be NULL;
 * the core then returns MG_ERR_UNSUPPORTED (or uses the documented default). On failure a
 * member sets the error message (mg_error_set) before returning its status. */
typedef struct mg_backend_ops {
    uint32_t version; /* MG_BACKEND_OPS_VERSION */
    mg_backend_kind kind;
    /* true: every device pointer must lie inside a live ledger allocation, so the core
     * rejects unknown addresses and overruns before dispatch (the CPU backend, whose device
     * memory is host memory). false: pointers outside the ledger (module symbols, memory
     * from other libraries) pass through to the driver, which validates them. */
    bool pointers_checked_strictly;

    /* ---- lifetime and queries (required) */
    void (*destroy)(void *ctx);
    mg_status (*device_info)(void *ctx, mg_device_info *out);
    mg_status (*memory_info)(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes,
                             uint64_t *device_free_bytes);
    bool (*supports)(void *ctx, mg_capability cap);

    /* ---- memory (required except managed). The core keeps the ledger and checks for a
     * capturing stream before calling alloc; free receives only live bases. On failure alloc
     * sets a message without a location (mg_error_set(st, NULL, 0, "cuMemAlloc: ...")): the
     * core appends the requested size and the caller's file:line. free must treat "context
     * already gone" teardown codes as success. */
    mg_status (*alloc)(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out);
    mg_status (*free)(void *ctx, mg_devptr base, mg_alloc_kind kind);

    /* ---- copies (required). Ranges already checked against the ledger where the pointer
     * is in it. `stream` is the backend's stream object, never NULL (the core resolves the
     * default stream). */
    mg_status (*copy_h2d)(void *ctx, mg_devptr dst, const void *src, size_t bytes);
    mg_status (*copy_d2h)(void *ctx, void *dst, mg_devptr src, size_t bytes);
    mg_status (*copy_d2d)(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes);
    mg_status (*copy_h2d_async)(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                void *stream, bool retained);
    mg_status (*copy_d2h_async)(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream);
    mg_status (*copy_d2d_async)(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                void *stream);
    mg_status (*copy_2d_d2d_async)(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                   size_t src_pitch, size_t width_bytes, size_t height,
                                   void *stream);
    mg_status (*memset)(void *ctx, mg_devptr dst, uint8_t value, size_t bytes);
    mg_status (*memset_async)(void *ctx, mg_devptr dst, uint8_t value, size_t bytes, void *stream);

    /* ---- streams and events (required) */
    mg_status (*stream_create)(void *ctx, bool is_default, void **out);
    mg_status (*stream_destroy)(void *ctx, void *stream);
    mg_status (*stream_synchronize)(void *ctx, void *stream);
    mg_status (*stream_is_capturing)(void *ctx, void *stream, bool *capturing);
    mg_status (*event_create)(void *ctx, void **out);
    mg_status (*event_record)(void *ctx, void *event, void *stream);
    mg_status (*stream_wait_event)(void *ctx, void *stream, void *event);
    mg_status (*event_synchronize)(void *ctx, void *event);
    mg_status (*event_query)(void *ctx, void *event); /* MG_OK or MG_ERR_NOT_READY */
    mg_status (*event_elapsed_ms)(void *ctx, void *start, void *end, float *ms);
    mg_status (*event_destroy)(void *ctx, void *event);

    /* ---- graphs (optional as a group: MG_CAP_GRAPHS) */
    mg_status (*graph_begin_capture)(void *ctx, void *stream);
    mg_status (*graph_end_capture)(void *ctx, void *stream, void **graph_out);
    mg_status (*graph_end_capture_update)(void *ctx, void *stream, void *graph,
                                          bool *updated_in_place);
    mg_status (*graph_abort_capture)(void *ctx, void *stream);
    mg_status (*graph_launch)(void *ctx, void *graph, void *stream);
    mg_status (*graph_destroy)(void *ctx, void *graph);
    /* optional: the kernel launches and all work items of one replay */
    mg_status (*graph_count_nodes)(void *ctx, void *graph, size_t *kernels, size_t *nodes);

    /* ---- pinned host memory (optional: default is the host heap, metrale/host_heap.h) */
    mg_status (*host_alloc)(void *ctx, size_t bytes, void **out);
    mg_status (*host_free)(void *ctx, void *host);
    mg_status (*host_device_pointer)(void *ctx, void *host, mg_devptr *out);
    /* Caller-owned host memory (mg_host_register; optional, as a group). A strict backend says
     * through host_registered whether a device range lies inside one registered range, so the
     * core's checks accept it. */
    mg_status (*host_register)(void *ctx, void *host, size_t bytes, mg_devptr *out);
    mg_status (*host_unregister)(void *ctx, void *host);
    bool (*host_registered)(void *ctx, mg_devptr p, size_t bytes);

    /* ---- modules and kernels. kernel_lookup is required; the core memoises its result in
     * the op cache so it is called once per (module, function). */
    mg_status (*module_load)(void *ctx, const char *model, const char *name, const void *image,
                             size_t bytes);
    mg_status (*module_unload_model)(void *ctx, const char *model);
    mg_status (*module_symbol)(void *ctx, const char *module, const char *symbol, mg_devptr *ptr,
                               size_t *bytes);
    mg_status (*kernel_lookup)(void *ctx, const char *module, const char *function, void **out);
    /* `kernel_name` is "module:function", for error messages. */
    mg_status (*launch)(void *ctx, void *kernel, const char *kernel_name, void *stream,
                        const mg_launch *launch);

    /* ---- optional: told the public handle once it exists, so a backend that detects sticky
     * faults inside its ops can record them with mg_backend_set_fault. */
    void (*attach)(void *ctx, mg_backend *b);
} mg_backend_ops;

/* Opening a backend kind: each backend exports one of these; the backend registry
 * (src/backends/registry.c) lists them, probes them, holds the AUTO order and hands the chosen
 * one to mg_core_backend_open. The core names none. */
typedef struct mg_backend_driver {
    mg_backend_kind kind;
    /* Fills `out` without opening anything heavy; must not crash without a driver. */
    void (*probe)(mg_backend_probe *out);
    /* Creates the backend context for `device`; *ops_out points to static storage. */
    mg_status (*open)(int device, const mg_backend_ops **ops_out, void **ctx_out);
} mg_backend_driver;

/* Opens `device` of driver `d` (the backend registry's choice): claims the device
 * (MG_ERR_BUSY when it is open already), opens the context, checks the ops version and wraps
 * it in a public handle with its default stream and op cache, reporting as mg_backend_open.
 * Arguments are the registry's checked ones. */
mg_status mg_core_backend_open(const mg_backend_driver *d, int device, mg_backend **out);

/* Whether `b` is a live (opened, not closed) backend handle. Never sets an error. */
bool mg_backend_is_live(const mg_backend *b);

/* The one message for a handle that is not a live backend, in every layer: "`fn`: NULL,
 * invalid or closed backend handle (NULL backend)" for NULL, "`fn`: invalid or closed backend
 * handle 0x... (invalid backend: never opened, or closed)" otherwise. Callers may match
 * "invalid or closed backend" in either. Written into `buf` (truncated to `bytes`); sets no
 * error, for reasons reported without mg_last_error. */
void mg_backend_dead_message(const mg_backend *b, const char *fn, char *buf, size_t bytes);
/* MG_OK when `b` is a live backend; otherwise MG_ERR_INVALID_ARGUMENT with the message above.
 * One handle lookup; no sticky-fault check (teardown calls such as mg_free use it alone).
 * Later code of the call may rely on `b` being live. */
mg_status mg_backend_check_live(const mg_backend *b, const char *fn);
/* The kind of a backend the caller has already validated (mg_backend_check_live or a check
 * built on it): no handle lookup, so it must not be given an unchecked handle. */
mg_backend_kind mg_backend_live_kind(const mg_backend *b);

/* Accessors the op layers (GEMM, attention, ...) use to reach a backend's own objects after
 * the core has validated the public handles. Implemented in src/core/backend.c. */
void *mg_backend_context(mg_backend *b);
/* Resolves NULL to the default stream; returns NULL (with the error set) when `s` is foreign
 * or stale. */
void *mg_stream_impl(mg_backend *b, mg_stream *s);
mg_backend *mg_stream_backend(mg_stream *s);
/* MG_ERR_CAPTURING (message names `what`) when `s` is capturing, MG_OK otherwise. */
mg_status mg_stream_check_not_capturing(mg_backend *b, mg_stream *s, const char *what);
/* mg_alloc_at for memory a library object owns and frees itself (op-cache scratch, op
 * workspaces, arena chunks): it counts in the ledger like any allocation, but
 * mg_ledger_sweep leaves it to its owner, so the owner never frees an address the sweep
 * already released (and someone else may have been given since). */
mg_status mg_alloc_owned_at(mg_backend *b, size_t bytes, mg_alloc_kind kind, mg_devptr *out,
                            const char *file, int line);

/* The check every public call makes of a device range: non-null, not wrapping, inside one
 * live allocation when its start is in the ledger (always, on strict backends), so op layers
 * reject a tensor that overruns its buffer before anything is launched. */
mg_status mg_backend_check_device_range(mg_backend *b, mg_devptr p, size_t bytes, const char *fn,
                                        const char *what);
/* Is any stream of `b` capturing? Allocation paths refuse then. */
bool mg_backend_any_capturing(mg_backend *b);
/* Records a sticky device fault: every later call on `b` fails with MG_ERR_DEVICE_FAULT and
 * this message. */
void mg_backend_set_fault(mg_backend *b, const char *message);
/* MG_ERR_DEVICE_FAULT with the recorded message when `b` has faulted, MG_OK otherwise. */
mg_status mg_backend_check_fault(mg_backend *b);

#endif
