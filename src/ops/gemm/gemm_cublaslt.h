/*
 * gemm_cublaslt.h - private: the CUDA provider of metrale/ops_gemm.h through cuBLASLt,
 * loaded with dlopen at first use (libcublasLt.so.13; env METRALE_LIBCUBLASLT names another
 * file), so the library loads and runs on machines without it.
 *
 * Per backend it keeps one cuBLASLt handle, a cache of plans (matmul descriptor, layouts and
 * the heuristic's algorithm per shape key) and one workspace per stream (op-cache scratch).
 * Everything is created on first use outside a capture (or by mg_gemm_prewarm); handle and
 * plans live in the backend's op state (op_state.h) and go when the backend closes; a stream's
 * workspace goes when the stream is destroyed. A caller may supply the workspace instead.
 */
#ifndef METRALE_CUBLASLT_H
#define METRALE_CUBLASLT_H

#include <stdbool.h>

#include "gemm_provider.h"
#include "metrale/gpu.h"

/* Bytes of each stream's workspace (the size cuBLAS recommends for Hopper). */
#define MG_CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)

/* Token count at which batch-invariant mode picks its one algorithm per (N, K, types). */
#define MG_CUBLASLT_INVARIANT_REFERENCE_M 256u

/* Whether cuBLASLt can be loaded; on false, `reason` says why. Never crashes without it. */
bool mg_cublaslt_available(char *reason, size_t reason_bytes);

/* The workspace of stream `s` on `b` (MG_CUBLASLT_WORKSPACE_BYTES), created on the stream's
 * first GEMM outside a capture (MG_ERR_CAPTURING inside one: mg_gemm_prewarm first). For the
 * other CUDA GEMM providers, whose calls may fall back to cuBLASLt and so share its
 * per-stream workspace. */
mg_status mg_cublaslt_stream_workspace(mg_backend *b, mg_stream *s, mg_devptr *out);

#endif
