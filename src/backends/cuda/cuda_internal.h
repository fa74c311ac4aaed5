/*
 * cuda_internal.h - private to src/cuda: the CUDA backend's context and the objects behind
 * the core's handles, shared by the files of the backend:
 *
 *   cuda_backend.c  driver probe/open, context binding, errors and sticky faults, device and
 *                   memory queries, streams, events, pinned host memory, the ops table
 *   cuda_memory.c   device allocation, copies (the pinned staging ring), memsets
 *   cuda_graph.c    stream capture and executable graphs
 *   cuda_module.c   the module registry, kernel lookup and launch
 *
 * Backend objects handed to the core: a stream is its CUstream, an event its CUevent, a
 * graph an mg_cuda_graph, a kernel an mg_cuda_kernel. The core validates handles, names,
 * ranges it knows, capture rules for blocking calls, pinned-registry bookkeeping of
 * mg_host_alloc, module-name uniqueness and the debug-sync mode before calling in.
 */
#ifndef METRALE_CUDA_INTERNAL_H
#define METRALE_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend_impl.h"
#include "cuda_backend.h"
#include "cuda_driver.h"
#include "cuda_image.h"
#include "error.h"

/* ------------------------------------------------------------------ staging ring */

/* Pinned buffers that pageable host data passes through on its way to or from the device.
 * Allocated on first use, reused for the life of the backend.
 *
 * Host-to-device copies fill the current slot from the front, several small copies sharing
 * it, all on one stream; a copy on another stream, or one that does not fit, moves on to the
 * next slot, first waiting for that slot's event. Each slot's event is recorded after every
 * DMA that reads the slot, on the slot's one stream, so the event completing means every
 * DMA out of the slot has finished and the slot may be rewritten. Device-to-host staging
 * takes whole slots. */
#define MG_CUDA_STAGING_SLOTS 4
#define MG_CUDA_STAGING_DEFAULT_SLOT_BYTES ((size_t)8 << 20)

typedef struct mg_cuda_staging_slot {
    void *host;      /* cuMemHostAlloc'ed, slot_bytes */
    CUevent done;    /* recorded after the last DMA that used `host` */
    bool pending;    /* `done` was recorded and not yet waited for */
    size_t used;     /* bytes handed out since the slot was last recycled */
    CUstream stream; /* the stream of those DMAs; NULL when the slot is fresh */
} mg_cuda_staging_slot;

/* Helper threads that split a large host memcpy into or out of a staging slot, so staging
 * is not limited by one core's copy bandwidth. */
typedef struct mg_cuda_copy_pool mg_cuda_copy_pool;

typedef struct mg_cuda_staging {
    pthread_mutex_t lock; /* held for a whole staged copy */
    mg_cuda_staging_slot slots[MG_CUDA_STAGING_SLOTS];
    size_t slot_bytes;
    unsigned current; /* the slot host-to-device copies are filling */
    bool allocated;
    unsigned copy_threads;   /* threads that copy one chunk, the caller included */
    mg_cuda_copy_pool *pool; /* NULL until a chunk large enough to split is staged */
} mg_cuda_staging;

/* ------------------------------------------------------------------ modules and kernels */

typedef struct mg_cuda_module {
    char model[96]; /* "" for the built-in kernels */
    char name[96];  /* "metrale" for the built-in kernels (several images share it) */
    CUmodule module;
    struct mg_cuda_module *next;
} mg_cuda_module;

typedef struct mg_cuda_kernel {
    CUfunction function;
    CUmodule module;       /* the module it came from */
    _Atomic bool unloaded; /* its module was unloaded: launching it is an error */
    /* Dynamic shared memory the function may use; raised on demand past the 48 KiB default.
     * Only ever raised, under shared_limit_lock, and only after the driver attribute is set:
     * a launch that reads a value here may rely on the function allowing that much. */
    _Atomic uint32_t shared_limit_bytes;
    pthread_mutex_t shared_limit_lock;
    struct mg_cuda_kernel *next; /* every kernel object of the context, freed at destroy */
    char name[226];              /* "module:function" */
} mg_cuda_kernel;

typedef struct mg_cuda_graph {
    CUgraph graph; /* the captured graph the executable was made from */
    CUgraphExec exec;
} mg_cuda_graph;

/* ------------------------------------------------------------------ the backend context */

struct mg_cuda_context {
    const mg_cuda_driver *drv;
    int ordinal;
    CUdevice device;
    CUcontext primary;       /* the device's primary context, retained while the backend lives */
    CUstream default_stream; /* non-blocking; blocking copies and memsets are ordered on it */
    _Atomic(mg_backend *) owner; /* the public handle (ops.attach), for sticky faults */
    mg_device_info info;
    bool managed_memory;  /* CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY */
    bool map_host_memory; /* CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY */

    /* Sticky fault: set once, read by every entry point. */
    _Atomic bool faulted;
    pthread_mutex_t fault_lock;
    char fault_message[768];
    _Atomic(mg_cuda_kernel *) last_kernel; /* the kernel launched last, for fault reports */

    mg_cuda_staging staging;

    pthread_mutex_t module_lock; /* modules and kernels */
    mg_cuda_module *modules;
    mg_cuda_kernel *kernels;
};

/* ------------------------------------------------------------------ shared helpers */

/* Makes the primary context current on this thread when it is not (one driver query when it
 * already is). Other libraries on the thread (the CUDA runtime, cuBLASLt) may switch
 * contexts, so the driver is asked rather than a cached value trusted. */
mg_status mg_cuda_make_current(mg_cuda_context *c);

/* The free paths start here: makes the context current, or sets *gone (returning MG_OK)
 * when the context was torn down (driver results 4, 201, 709) or has a sticky fault, so the
 * memory is gone with it. Any other failure is returned with its message. */
mg_status mg_cuda_enter_to_free(mg_cuda_context *c, bool *gone);

/* Fills c->info and the capability flags from the driver (at open). A required attribute
 * the driver cannot answer fails, naming it; optional ones count as absent. */
mg_status mg_cuda_read_device_info(mg_cuda_context *c);

/* Every entry point but the free paths starts here: MG_ERR_DEVICE_FAULT after a sticky
 * fault, else the context is made current. */
mg_status mg_cuda_enter(mg_cuda_context *c);

/* Error for a failed driver call `call` with an optional detail (sizes, names) placed before
 * the location: "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory, requested 80.0 GiB
 * at cuda_memory.c:40". A sticky result records the fault (with the last kernel launched)
 * and returns MG_ERR_DEVICE_FAULT. */
mg_status mg_cuda_fail(mg_cuda_context *c, CUresult r, const char *call, const char *file, int line,
                       const char *detail_fmt, ...) MG_PRINTF(6, 7);
#define MG_CUDA_FAIL(c, r, call, ...)                                                              \
    mg_cuda_fail((c), (r), (call), __FILE__, __LINE__, __VA_ARGS__)

/* MG_ERR_DEVICE_FAULT with the recorded message when the context has faulted. */
mg_status mg_cuda_check_fault(mg_cuda_context *c);

/* Capture status of a stream; a failed query counts as capturing. */
bool mg_cuda_stream_capturing(mg_cuda_context *c, CUstream s);

/* The stream blocking copies and memsets use: the default stream. */
CUstream mg_cuda_blocking_stream(mg_cuda_context *c);

/* Waits for `s`; errors reported as a failure of `what`. */
mg_status mg_cuda_sync_stream(mg_cuda_context *c, CUstream s, const char *what);

/* ---- cuda_memory.c */
mg_status mg_cuda_alloc(void *ctx, size_t bytes, mg_alloc_kind kind, mg_devptr *out);
mg_status mg_cuda_free(void *ctx, mg_devptr base, mg_alloc_kind kind);
mg_status mg_cuda_copy_h2d(void *ctx, mg_devptr dst, const void *src, size_t bytes);
mg_status mg_cuda_copy_d2h(void *ctx, void *dst, mg_devptr src, size_t bytes);
mg_status mg_cuda_copy_d2d(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes);
mg_status mg_cuda_copy_h2d_async(void *ctx, mg_devptr dst, const void *src, size_t bytes,
                                 void *stream, bool retained);
mg_status mg_cuda_copy_d2h_async(void *ctx, void *dst, mg_devptr src, size_t bytes, void *stream);
mg_status mg_cuda_copy_d2d_async(void *ctx, mg_devptr dst, mg_devptr src, size_t bytes,
                                 void *stream);
mg_status mg_cuda_copy_2d_d2d_async(void *ctx, mg_devptr dst, size_t dst_pitch, mg_devptr src,
                                    size_t src_pitch, size_t width_bytes, size_t height,
                                    void *stream);
mg_status mg_cuda_memset(void *ctx, mg_devptr dst, uint8_t value, size_t bytes);
mg_status mg_cuda_memset_async(void *ctx, mg_devptr dst, uint8_t value, size_t bytes, void *stream);
void mg_cuda_staging_init(mg_cuda_staging *st);
/* Frees the staging buffers and helper threads; the context must be current. */
void mg_cuda_staging_destroy(mg_cuda_context *c);

/* ---- cuda_graph.c */
mg_status mg_cuda_graph_begin_capture(void *ctx, void *stream);
mg_status mg_cuda_graph_end_capture(void *ctx, void *stream, void **graph_out);
mg_status mg_cuda_graph_end_capture_update(void *ctx, void *stream, void *graph,
                                           bool *updated_in_place);
mg_status mg_cuda_graph_abort_capture(void *ctx, void *stream);
mg_status mg_cuda_graph_launch(void *ctx, void *graph, void *stream);
mg_status mg_cuda_graph_destroy(void *ctx, void *graph);
mg_status mg_cuda_graph_count_nodes(void *ctx, void *graph, size_t *kernels, size_t *nodes);

/* ---- cuda_module.c */
/* Loads the embedded kernel images as module "metrale". */
mg_status mg_cuda_modules_load_builtin(mg_cuda_context *c);
/* Unloads every module and frees every kernel object; the context must be current. */
void mg_cuda_modules_destroy(mg_cuda_context *c);
mg_status mg_cuda_module_load(void *ctx, const char *model, const char *name, const void *image,
                              size_t bytes);
mg_status mg_cuda_module_unload_model(void *ctx, const char *model);
mg_status mg_cuda_module_symbol(void *ctx, const char *module, const char *symbol, mg_devptr *ptr,
                                size_t *bytes);
mg_status mg_cuda_kernel_lookup(void *ctx, const char *module, const char *function, void **out);
mg_status mg_cuda_launch(void *ctx, void *kernel, const char *kernel_name, void *stream,
                         const mg_launch *launch);

#endif
