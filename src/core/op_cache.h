/*
 * op_cache.h - private: the per-backend cache the ops stand on.
 *  - Kernel handles memoised by (module, function): the first lookup asks the backend, later
 *    ones return the same handle with no driver call. Safe under concurrent lookups.
 *  - Grow-only tagged device scratch: a request larger than the tag's buffer allocates a new
 *    one and retires the old behind an event on the caller's stream; retired buffers are
 *    freed as soon as that event has completed (checked on every scratch call), so an
 *    outgrown buffer is freed once no queued work can still use it, not leaked.
 *  - Diagnostic gates, process-wide: once per key, the first N calls per key, the first call
 *    of each (name, m, n, k). Diagnostics print only when their environment switch is "1":
 *      METRALE_DEBUG_GEMM=1    the cuBLASLt algorithm chosen for the first plan of each
 *                              (kind, M, N, K) (src/ops/gemm/gemm_cublaslt.c)
 *      METRALE_DEBUG_COPIES=1  once per process, the first host-to-device copy from pageable
 *                              memory staged through pinned buffers
 *                              (src/backends/cuda/cuda_memory.c)
 */
#ifndef METRALE_OP_CACHE_H
#define METRALE_OP_CACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/gpu.h"

typedef struct mg_op_cache mg_op_cache;

mg_status mg_op_cache_create(mg_backend *b, mg_op_cache **out);
/* The op cache of a live backend, or NULL. */
mg_op_cache *mg_backend_op_cache(mg_backend *b);
/* The op cache of a backend the caller has already validated (mg_backend_check_live or a check
 * built on it): no handle lookup, never NULL, so it must not be given an unchecked handle. */
mg_op_cache *mg_backend_live_op_cache(mg_backend *b);
/* Waits for retired scratch, frees all scratch, forgets every kernel. NULL is a no-op; a
 * second call on the same pointer is not allowed (the backend owns exactly one). */
void mg_op_cache_release(mg_op_cache *c);

/* The memoised handle of (module, function). `hold` counts a public hold
 * (mg_kernel_lookup); internal users of the cache pass false. */
mg_status mg_op_cache_kernel(mg_op_cache *c, const char *module, const char *function, bool hold,
                             mg_kernel **out);
/* Forgets the kernels of the given modules; MG_ERR_BUSY (forgetting nothing) while any of
 * them is held. */
mg_status mg_op_cache_forget_modules(mg_op_cache *c, const char *const *modules, size_t count);
size_t mg_op_cache_kernel_count(mg_op_cache *c);

/* Device scratch of at least `bytes` for `tag`, valid until the next call with the same tag
 * asks for more. Use it only on stream `s` (retirement is ordered on it). Growth is refused
 * while `s` is capturing. */
mg_status mg_op_cache_scratch(mg_op_cache *c, const char *tag, size_t bytes, mg_stream *s,
                              mg_devptr *out);
/* Like mg_op_cache_scratch, but private to the created stream `s`: the buffer is freed when
 * `s` is destroyed (mg_op_cache_stream_destroyed). For the default stream (or NULL), which
 * lives as long as the backend, it is ordinary scratch freed at close. */
mg_status mg_op_cache_stream_scratch(mg_op_cache *c, const char *tag, size_t bytes, mg_stream *s,
                                     mg_devptr *out);
/* Frees the scratch private to `s`. mg_stream_destroy calls it after the stream's work has
 * completed, so nothing queued can still use the buffers. */
void mg_op_cache_stream_destroyed(mg_op_cache *c, mg_stream *s);
/* Scratch buffers live and retired (tests, diagnostics). */
void mg_op_cache_scratch_counts(mg_op_cache *c, size_t *live, size_t *retired);

/* Whether environment variable `name` is exactly "1", read once and kept in *cached (a
 * static of the caller, initialised to -1; racing first calls agree). */
bool mg_diag_env_enabled(const char *name, atomic_int *cached);

bool mg_gate_once(const char *key);
bool mg_gate_first_n(const char *key, uint32_t n);
bool mg_gate_first_shape(const char *name, uint64_t m, uint64_t n, uint64_t k);

#endif
