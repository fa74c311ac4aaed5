/*
 * metrale/gpu.h - the backend interface: one device, its memory, streams, events, graphs
 * and kernels. Every backend implements the same calls; this tree builds the CPU backend
 * (always), the CUDA backend (where nvcc is found) and the Metal backend (every OS; libobjc and
 * Metal.framework are opened at run time, so without them probing reports it unusable and
 * opening it fails with MG_ERR_UNAVAILABLE and the reason). The Metal backend is UNVERIFIED ON
 * HARDWARE: it has only run against a test double (tests/metal/), never on a Mac. The CPU
 * backend really computes and is the reference the others are checked against.
 *
 * Typical call sequence of an inference engine:
 *
 *   mg_backend *b;
 *   mg_backend_open(MG_BACKEND_AUTO, 0, &b);          // best backend present
 *   mg_devptr w;  mg_alloc(b, bytes, &w);             // weights; ledger records file:line
 *   mg_copy_h2d(b, w, host_weights, bytes);
 *   mg_stream *s;  mg_stream_create(b, &s);
 *   mg_kernel *k;  mg_kernel_lookup(b, "metrale", "vector_add", &k);
 *   mg_launch l;   mg_launch_init(&l, grid, block, 0);   // see metrale/launch.h
 *   mg_launch_arg_ptr(&l, x); ...; mg_launch_run(b, k, s, &l);
 *   mg_graph_begin_capture(s); ...step...; mg_graph_end_capture(s, &g);
 *   for each step: mg_graph_launch(g, s); mg_stream_synchronize(s);
 *   mg_backend_close(b);                              // frees what is still live
 *
 * Conventions a caller may rely on:
 *  - Handles are opaque. Passing a handle of another backend, or NULL where one is required,
 *    is MG_ERR_INVALID_ARGUMENT and touches nothing.
 *  - Device memory is addressed by mg_devptr; 0 is null. An interior pointer (base + offset)
 *    is a valid argument everywhere a device pointer is taken, except mg_free.
 *  - Calls named *_async are ordered on their stream and return before the work is done;
 *    everything else is blocking. A NULL stream means the backend's default stream, which is
 *    non-blocking with respect to other streams.
 *  - While any stream of a backend is capturing a graph, that backend refuses blocking calls
 *    (synchronize of the capturing stream, blocking copies and memsets) and allocations with
 *    MG_ERR_CAPTURING instead of attempting them (CUDA would fail with error 901 and
 *    invalidate the capture). The rule is per backend, not per stream, so one thread's
 *    capture can never be broken by another thread's blocking call: set up memory before
 *    mg_graph_begin_capture.
 *  - After a sticky device fault every call on that backend fails fast with
 *    MG_ERR_DEVICE_FAULT and the original message; free paths still succeed.
 */
#ifndef METRALE_GPU_H
#define METRALE_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/export.h"
#include "metrale/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this API: raised whenever a public struct's layout, a function's signature
 * or a documented meaning changes incompatibly. A program or binding that loads the library at
 * run time checks mg_api_version() == MG_API_VERSION (the headers it was written against)
 * before any other call. */
#define MG_API_VERSION 2 /* 2: mg_gemm_plan and mg_gemm_tensors grew their fusion fields */

/* The MG_API_VERSION the library was built with. Needs no backend and never fails. */
MG_API uint32_t mg_api_version(void);

typedef uint64_t mg_devptr; /* device address; 0 is null */

typedef struct mg_backend mg_backend; /* one device of one backend kind */
typedef struct mg_stream mg_stream;   /* in-order queue of work */
typedef struct mg_event mg_event;     /* a point in a stream's work, with a timestamp */
typedef struct mg_graph mg_graph;     /* an executable captured graph */
typedef struct mg_kernel mg_kernel;   /* a launchable function, owned by its backend */
typedef struct mg_launch mg_launch;   /* launch builder, metrale/launch.h */

typedef struct mg_dim3 {
    uint32_t x, y, z;
} mg_dim3;

/* ------------------------------------------------------------------ backends */

typedef enum mg_backend_kind {
    MG_BACKEND_CPU = 0,
    MG_BACKEND_CUDA = 1,
    MG_BACKEND_METAL = 2,
    MG_BACKEND_AUTO = 3, /* mg_backend_open only: CUDA, then Metal, then CPU */
} mg_backend_kind;

/* "cpu", "cuda", "metal", "auto". */
MG_API const char *mg_backend_kind_name(mg_backend_kind kind);
/* Parses the names above; MG_ERR_INVALID_ARGUMENT for anything else. */
MG_API mg_status mg_backend_kind_parse(const char *name, mg_backend_kind *out);

/* What a backend kind is on this machine, without opening it. */
typedef struct mg_backend_probe {
    bool compiled_in; /* this build contains the backend */
    bool usable;      /* it can be opened here (driver found, a device present) */
    int device_count; /* devices it can open; 0 when not usable */
    char reason[256]; /* when not usable, why: e.g. "libcuda.so.1 not found" */
} mg_backend_probe;

/* Never fails for a valid kind (not AUTO): unusable is reported through the struct. */
MG_API mg_status mg_backend_probe_kind(mg_backend_kind kind, mg_backend_probe *out);

/* Opens device `device` of `kind`. AUTO picks the first usable kind: CUDA, then Metal (device
 * 0 is the system default Metal device, the only one), then CPU.
 * One backend per (kind, device) at a time within a process: opening it again while open
 * is MG_ERR_BUSY. Backends of different devices coexist. */
MG_API mg_status mg_backend_open(mg_backend_kind kind, int device, mg_backend **out);

/* Synchronizes, destroys every stream, event, graph and kernel handle, frees every live
 * allocation (reporting nothing; call mg_ledger_sweep first to see them) and the backend.
 * NULL is a no-op. Returns the first error met, but always releases everything. */
MG_API mg_status mg_backend_close(mg_backend *b);

MG_API mg_backend_kind mg_backend_get_kind(const mg_backend *b);

typedef struct mg_device_info {
    char name[128];                      /* e.g. "NVIDIA H200", "CPU (x86_64, 2 threads)" */
    uint64_t total_bytes;                /* device memory */
    int multiprocessors;                 /* SMs; CPU: logical cores */
    int cc_major, cc_minor;              /* compute capability; 0.0 for non-CUDA */
    bool integrated;                     /* shares memory with the host */
    uint64_t l2_bytes;                   /* 0 if unknown */
    uint32_t max_shared_per_block_optin; /* bytes of dynamic shared memory a launch may ask */
    char driver[64];                     /* driver / runtime version text */
} mg_device_info;

MG_API mg_status mg_device_get_info(mg_backend *b, mg_device_info *out);

/* Memory the backend can still hand out. For integrated GPUs this is
 * max(driver free, host MemAvailable), because the driver undercounts shared memory. */
MG_API mg_status mg_memory_free_bytes(mg_backend *b, uint64_t *free_bytes, uint64_t *total_bytes);
/* The driver's own free figure, without the integrated-GPU adjustment. */
MG_API mg_status mg_memory_device_free_bytes(mg_backend *b, uint64_t *free_bytes);

/* Capabilities of the backend itself are asked, never discovered by failing; what ops a
 * backend can run is asked of the op registry (metrale/ops.h: mg_op_supported). */
typedef enum mg_capability {
    MG_CAP_MANAGED_MEMORY = 0,  /* mg_alloc_managed */
    MG_CAP_GRAPHS,              /* stream capture and graph replay */
    MG_CAP_GRAPH_UPDATE,        /* in-place update of an executable graph */
    MG_CAP_PINNED_HOST,         /* mg_host_alloc returns page-locked memory */
    MG_CAP_HOST_DEVICE_POINTER, /* mg_host_device_pointer works */
    MG_CAP_MODULES,             /* mg_module_load of PTX / cubin / fatbin */
    MG_CAP_EVENT_TIMING,        /* mg_event_elapsed_ms */
    MG_CAP_COUNT
} mg_capability;

MG_API bool mg_backend_supports(const mg_backend *b, mg_capability cap);

/* ------------------------------------------------------------------ memory */

typedef enum mg_alloc_kind {
    MG_ALLOC_DEVICE = 0,  /* plain device memory */
    MG_ALLOC_MANAGED = 1, /* unified memory (MG_CAP_MANAGED_MEMORY) */
    MG_ALLOC_ARENA = 2,   /* device memory backing a buffer arena; one ledger entry each */
} mg_alloc_kind;

/* Allocates `bytes` (> 0) of device memory, aligned to at least 256 bytes, contents
 * undefined. The ledger records the bytes and the call site (file, line); use the macros
 * below so the site is the caller's. Not allowed while any stream of `b` is capturing
 * (MG_ERR_CAPTURING). */
MG_API mg_status mg_alloc_at(mg_backend *b, size_t bytes, mg_alloc_kind kind, mg_devptr *out,
                             const char *file, int line);
#define mg_alloc(b, bytes, out)                                                                    \
    mg_alloc_at((b), (bytes), MG_ALLOC_DEVICE, (out), __FILE__, __LINE__)
#define mg_alloc_managed(b, bytes, out)                                                            \
    mg_alloc_at((b), (bytes), MG_ALLOC_MANAGED, (out), __FILE__, __LINE__)

/* Frees an allocation by its base address. 0 is a no-op. An interior pointer, an address
 * never allocated or one already freed is MG_ERR_INVALID_ARGUMENT and frees nothing. */
MG_API mg_status mg_free(mg_backend *b, mg_devptr ptr);

/* ------------------------------------------------------------------ ledger */

/* Bytes and count of live allocations (device, managed and arena). */
MG_API mg_status mg_ledger_live(mg_backend *b, uint64_t *live_bytes, uint64_t *live_count);

typedef struct mg_ledger_site {
    const char *file; /* as passed to mg_alloc_at; static storage */
    int line;
    uint64_t bytes; /* live bytes allocated from this site */
    uint64_t count; /* live allocations from this site */
} mg_ledger_site;

/* The call sites holding at least `min_bytes` live, largest first. Writes up to `max_sites`
 * entries to `out` and the number written to `*written` (0 on failure: MG_ERR_OUT_OF_MEMORY
 * when the host scratch for the grouping cannot be allocated). */
MG_API mg_status mg_ledger_top_sites(mg_backend *b, uint64_t min_bytes, mg_ledger_site *out,
                                     size_t max_sites, size_t *written);

/* Prints the top-N sites (as above) and the totals to `f`, one line each. */
MG_API mg_status mg_ledger_report(mg_backend *b, FILE *f, size_t top_n, uint64_t min_bytes);

/* Frees every live allocation the caller made (mg_alloc, mg_alloc_managed) and says how much
 * that was: for teardown and leak tests. Memory that library objects own (buffer arenas, op
 * scratch and workspaces) stays live and counted until its owner releases it or the backend
 * closes, so no owner can later free an address the sweep gave away. */
MG_API mg_status mg_ledger_sweep(mg_backend *b, uint64_t *freed_bytes, uint64_t *freed_count);

/* ------------------------------------------------------------------ copies and memsets */

/* Blocking copies: on return the data has arrived. Device ranges must lie inside one live
 * allocation (backends that can tell check this; the CPU backend always does). bytes == 0
 * is a no-op that still validates the handles.
 *
 * Ordering (CUDA): blocking copies and mg_memset are queued on the backend's default stream
 * (mg_stream_default) and wait for it, so they run after the work already queued there, and
 * only after that: they neither wait for nor order themselves after work on streams from
 * mg_stream_create, which is non-blocking with respect to the default stream. To read or
 * overwrite memory another stream is still using, synchronize that stream first (or make the
 * default stream wait on an event recorded there). The CPU backend runs each call's work
 * when it is queued, so no earlier work is pending when a blocking copy runs. */
MG_API mg_status mg_copy_h2d(mg_backend *b, mg_devptr dst, const void *src, size_t bytes);
MG_API mg_status mg_copy_d2h(mg_backend *b, void *dst, mg_devptr src, size_t bytes);
MG_API mg_status mg_copy_d2d(mg_backend *b, mg_devptr dst, mg_devptr src, size_t bytes);

/* Stream-ordered host-to-device copy. The caller may reuse or free `src` as soon as this
 * returns. On CUDA every source is staged: copied on the host into the backend's pinned
 * staging buffers before this returns (waiting, if the buffers are all in use, for earlier
 * staged copies to drain), and the device copies from there in stream order. That holds for
 * registered page-locked sources (metrale/pinned.h, mg_host_alloc) too. Because it copies on
 * the host now, it is refused with MG_ERR_CAPTURING while `s` is capturing. The CPU backend
 * snapshots `src` when the call is made (when recorded, under capture).
 *
 *   source \ call      mg_copy_h2d_async          mg_copy_h2d_async_retained
 *   pageable           staged; refused in capture  staged; refused in capture
 *   registered pinned  staged; refused in capture  DMA from src in stream order, no host
 *                                                  wait; captured (read at each replay)
 */
MG_API mg_status mg_copy_h2d_async(mg_backend *b, mg_devptr dst, const void *src, size_t bytes,
                                   mg_stream *s);
/* Same, but the caller promises `src` stays valid and unchanged until the stream has
 * finished this copy (e.g. until mg_stream_synchronize; for a captured copy, while the graph
 * is used). On CUDA a registered page-locked source is then copied from directly (no
 * staging, no host wait); a pageable one is still staged as above. The CPU backend reads
 * `src` when the copy executes (at each replay when captured). */
MG_API mg_status mg_copy_h2d_async_retained(mg_backend *b, mg_devptr dst, const void *src,
                                            size_t bytes, mg_stream *s);
/* `dst` must stay valid until the stream has finished the copy. On CUDA a registered
 * page-locked destination (metrale/pinned.h, mg_host_alloc) is written by DMA in stream
 * order and this returns at once; a pageable destination cannot be written by DMA later, so
 * the call stages it and waits: it returns after the stream's earlier work and this copy
 * have completed and the data is in `dst`. A pageable destination is refused with
 * MG_ERR_CAPTURING while `s` is capturing (a graph cannot replay the host-side copy). */
MG_API mg_status mg_copy_d2h_async(mg_backend *b, void *dst, mg_devptr src, size_t bytes,
                                   mg_stream *s);
MG_API mg_status mg_copy_d2d_async(mg_backend *b, mg_devptr dst, mg_devptr src, size_t bytes,
                                   mg_stream *s);
/* 2-D copy of `height` rows of `width_bytes`; pitches >= width_bytes. */
MG_API mg_status mg_copy_2d_d2d_async(mg_backend *b, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                      size_t src_pitch, size_t width_bytes, size_t height,
                                      mg_stream *s);

MG_API mg_status mg_memset(mg_backend *b, mg_devptr dst, uint8_t value, size_t bytes);
MG_API mg_status mg_memset_async(mg_backend *b, mg_devptr dst, uint8_t value, size_t bytes,
                                 mg_stream *s);

/* ------------------------------------------------------------------ streams and events */

/* The backend's default stream; owned by the backend, never destroyed by the caller. */
MG_API mg_stream *mg_stream_default(mg_backend *b);
MG_API mg_status mg_stream_create(mg_backend *b, mg_stream **out);
/* Waits for the stream's work, then destroys it. The default stream and a capturing stream
 * cannot be destroyed (MG_ERR_INVALID_ARGUMENT / MG_ERR_CAPTURING). NULL is a no-op. */
MG_API mg_status mg_stream_destroy(mg_stream *s);
MG_API mg_status mg_stream_synchronize(mg_stream *s);
/* A failed capture query counts as capturing. */
MG_API mg_status mg_stream_is_capturing(mg_stream *s, bool *capturing);

MG_API mg_status mg_event_create(mg_backend *b, mg_event **out);
MG_API mg_status mg_event_record(mg_event *e, mg_stream *s);
/* Makes future work of `s` wait until `e` completes, without blocking the host. */
MG_API mg_status mg_stream_wait_event(mg_stream *s, mg_event *e);
MG_API mg_status mg_event_synchronize(mg_event *e);
/* MG_OK when the recorded work has completed, MG_ERR_NOT_READY when not yet; never blocks. */
MG_API mg_status mg_event_query(mg_event *e);
/* Milliseconds between two completed events of the same backend. */
MG_API mg_status mg_event_elapsed_ms(mg_event *start, mg_event *end, float *ms);
MG_API mg_status mg_event_destroy(mg_event *e);

/* ------------------------------------------------------------------ graphs */

/* Starts capturing `s` (relaxed mode on CUDA): work issued to it is recorded, not run. */
MG_API mg_status mg_graph_begin_capture(mg_stream *s);
/* Ends the capture and instantiates the recorded work as an executable graph. */
MG_API mg_status mg_graph_end_capture(mg_stream *s, mg_graph **out);
/* Ends the capture and replaces the work of existing graph `g` with it: in place when only
 * kernel arguments, copy and memset parameters changed (*updated_in_place = true), by
 * re-instantiation otherwise. `g` stays valid either way. */
MG_API mg_status mg_graph_end_capture_update(mg_stream *s, mg_graph *g, bool *updated_in_place);
/* Ends and discards an active capture; the stream is usable again. */
MG_API mg_status mg_graph_abort_capture(mg_stream *s);
MG_API mg_status mg_graph_launch(mg_graph *g, mg_stream *s);
MG_API mg_status mg_graph_destroy(mg_graph *g);
/* What one replay of `g` runs: `kernels` kernel launches (library kernels included, e.g.
 * cuBLASLt's) and `nodes` work items in all (kernels, copies, memsets, event records and
 * waits). Either pointer may be NULL. Host-only; MG_ERR_UNSUPPORTED where the backend cannot
 * tell. */
MG_API mg_status mg_graph_count_nodes(mg_graph *g, size_t *kernels, size_t *nodes);

/* ------------------------------------------------------------------ pinned host memory */

/* Host memory, zeroed and 64-byte aligned; page-locked where the backend can
 * (MG_CAP_PINNED_HOST) and then registered in the pinned-host registry (metrale/pinned.h). */
MG_API mg_status mg_host_alloc(mg_backend *b, size_t bytes, void **out);
/* NULL is a no-op; a pointer not from mg_host_alloc is MG_ERR_INVALID_ARGUMENT. */
MG_API mg_status mg_host_free(mg_backend *b, void *host);
/* The device address of host memory from mg_host_alloc (MG_CAP_HOST_DEVICE_POINTER). */
MG_API mg_status mg_host_device_pointer(mg_backend *b, void *host, mg_devptr *out);

/* Caller-owned host memory made addressable by the device without a copy (e.g. a NumPy
 * array handed over through DLPack). On the CPU backend the device address of [host, host +
 * bytes) is `host` itself, and from now on device ranges inside it are valid arguments of every
 * call, ops included, until mg_host_unregister(b, host) or mg_backend_close. The memory stays
 * the caller's: the library never frees it, and the caller must keep it alive while it is
 * registered and while queued or captured work reads it. MG_ERR_UNSUPPORTED on backends that
 * cannot map foreign host memory (CUDA, whose foreign device pointers need no registration);
 * MG_ERR_INVALID_ARGUMENT for NULL, zero bytes, or a range whose first or last byte lies in
 * one already registered or allocated. Not while a stream of `b` is capturing (MG_ERR_CAPTURING).
 */
MG_API mg_status mg_host_register(mg_backend *b, void *host, size_t bytes, mg_devptr *out);
/* `host` must be the base of a registered range; MG_ERR_INVALID_ARGUMENT otherwise. */
MG_API mg_status mg_host_unregister(mg_backend *b, void *host);

/* ------------------------------------------------------------------ kernels and modules */

/* Loads a module image into the model group `model`. The format is detected by content:
 * PTX text, cubin (ELF) or fatbin. `name` must be unique within the backend. */
MG_API mg_status mg_module_load(mg_backend *b, const char *model, const char *name,
                                const void *image, size_t bytes);
/* Unloads every module of `model`. MG_ERR_BUSY, unloading nothing, while kernel handles
 * into those modules are still held (mg_kernel_release them first). */
MG_API mg_status mg_module_unload_model(mg_backend *b, const char *model);
/* Device address and size of a module's global symbol. */
MG_API mg_status mg_module_symbol(mg_backend *b, const char *module, const char *symbol,
                                  mg_devptr *ptr, size_t *bytes);

/* Finds `function` in `module`. The handle is memoised: the same (module, function) returns
 * the same handle, and a lookup after the first does no driver call. Built-in kernels live in
 * module "metrale" (e.g. "vector_add"). Safe under concurrent lookups. */
MG_API mg_status mg_kernel_lookup(mg_backend *b, const char *module, const char *function,
                                  mg_kernel **out);
/* Drops the caller's hold on a kernel handle (lookups count holds). */
MG_API mg_status mg_kernel_release(mg_kernel *k);
MG_API const char *mg_kernel_name(const mg_kernel *k); /* "module:function" */

/* Launches `k` with the builder's grid, block, dynamic shared bytes and arguments
 * (metrale/launch.h). Shared memory above 48 KiB raises the function's limit first.
 * With env METRALE_DEBUG_SYNC_KERNELS=1 every launch is followed by a synchronize and a
 * failure names the kernel and its arguments. */
MG_API mg_status mg_launch_run(mg_backend *b, mg_kernel *k, mg_stream *s, const mg_launch *launch);

/* 1-D launch configuration covering `n` elements with `block` threads per block
 * (0 picks 256). */
MG_API void mg_launch_config_1d(uint64_t n, uint32_t block, mg_dim3 *grid_out, mg_dim3 *block_out);

#ifdef __cplusplus
}
#endif
#endif
