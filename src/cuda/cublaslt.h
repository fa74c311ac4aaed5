/*
 * cublaslt.h - private: the CUDA implementation of metrale/ops_gemm.h through cuBLASLt,
 * loaded with dlopen at first use (libcublasLt.so.13; env METRALE_LIBCUBLASLT names another
 * file), so the library loads and runs on machines without it.
 *
 * Per backend it keeps one cuBLASLt handle, a cache of plans (matmul descriptor, layouts and
 * the heuristic's algorithm per shape key) and one workspace per stream (op-cache scratch).
 * Everything is created on first use outside a capture (or by mg_gemm_prewarm); handle and
 * plans are released by mg_cublaslt_release when the backend closes (mg_gemm_release); a
 * stream's workspace goes when the stream is destroyed (mg_cublaslt_stream_destroyed).
 */
#ifndef METRALE_CUBLASLT_H
#define METRALE_CUBLASLT_H

#include <stdbool.h>

#include "core/ops_gemm_impl.h"
#include "metrale/gpu.h"

/* Bytes of each stream's workspace (the size cuBLAS recommends for Hopper). */
#define MG_CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)

/* Token count at which batch-invariant mode picks its one algorithm per (N, K, types). */
#define MG_CUBLASLT_INVARIANT_REFERENCE_M 256u

/* Whether cuBLASLt can be loaded; on false, `reason` says why. Never crashes without it. */
bool mg_cublaslt_available(char *reason, size_t reason_bytes);

/* A checked GEMM call (ops_gemm.c) on CUDA backend `b`. */
mg_status mg_cublaslt_gemm(mg_backend *b, mg_stream *s, const mg_gemm_call *call);
mg_status mg_cublaslt_prewarm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans, size_t count);
mg_status mg_cublaslt_set_batch_invariant(mg_backend *b, bool enabled);
bool mg_cublaslt_batch_invariant(mg_backend *b);

/* Frees the handle and plans kept for `b` (the workspaces are the op cache's). Called by
 * mg_backend_close through mg_gemm_release; a no-op for a backend never used here. */
void mg_cublaslt_release(mg_backend *b);

/* Forgets the workspace record of stream `s` (mg_gemm_stream_destroyed); the workspace
 * memory is stream-private op-cache scratch, freed by the op cache with the stream. */
void mg_cublaslt_stream_destroyed(mg_backend *b, mg_stream *s);

/* Plans and workspaces currently cached for `b`, for tests and benchmarks. */
void mg_cublaslt_cache_counts(mg_backend *b, size_t *plans, size_t *workspaces);

#endif
