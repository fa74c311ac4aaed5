/*
 * ops_gemm_impl.h - private: one GEMM call after its arguments were checked (ops_gemm.c), as
 * the backend implementations receive it.
 */
#ifndef METRALE_OPS_GEMM_IMPL_H
#define METRALE_OPS_GEMM_IMPL_H

#include "metrale/ops_gemm.h"

typedef struct mg_gemm_call {
    mg_gemm_plan plan; /* shape, types, scale modes; pointer_alignment from the pointers */
    mg_devptr act, weight, out;
    mg_devptr act_scale, weight_scale; /* FP8 only */
} mg_gemm_call;

/* Whether `b` can run the GEMM ops of capability `cap` (MG_CAP_OP_GEMM_BF16 or
 * MG_CAP_OP_GEMM_FP8): always on the CPU reference; on CUDA when cuBLASLt loads, and for FP8
 * on compute capability 9.0 or newer. mg_backend_supports answers these through it. */
bool mg_gemm_supports(mg_backend *b, mg_capability cap);

/* Releases what the GEMM ops keep for `b` (library handle, plans). mg_backend_close calls it
 * after the streams have drained and before the op cache (which owns the workspaces) goes. */
void mg_gemm_release(mg_backend *b);

/* Forgets what the GEMM ops keep for stream `s` of `b` (its cuBLASLt workspace record; the
 * workspace itself is stream-private op-cache scratch). mg_stream_destroy calls it after the
 * stream's work has completed and before the stream and its scratch go. */
void mg_gemm_stream_destroyed(mg_backend *b, mg_stream *s);

#endif
