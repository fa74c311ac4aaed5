/*
 * moe_gemm_provider.h - private to src/ops/moe_gemm: one grouped MoE GEMM call after the front
 * (moe_gemm.c) checked it, and what a provider implements (metrale/ops_moe_gemm.h). The
 * providers are listed in moe_gemm.c's op definition, in order of preference.
 */
#ifndef METRALE_MOE_GEMM_PROVIDER_H
#define METRALE_MOE_GEMM_PROVIDER_H

#include <stddef.h>

#include "metrale/ops_moe_gemm.h"
#include "op_registry.h"

/* The registry's `supports` hook and workspace_bytes get the checked descriptor alone (tensors
 * zero) when sizing the workspace; run gets every field checked. */
typedef struct mg_moe_gemm_call {
    mg_moe_gemm_desc d; /* act_pitch and ldc resolved (never 0) */
    uint32_t n_w;       /* weight rows per expert: n, or 2n in the gate_up form */
    mg_moe_gemm_tensors t;
} mg_moe_gemm_call;

typedef struct mg_moe_gemm_provider {
    mg_op_provider base; /* first: the registry hands this back as an mg_op_provider */
    /* Bytes of device workspace the checked call `c` needs (its tensors are not read). */
    mg_status (*workspace_bytes)(mg_backend *b, const mg_moe_gemm_call *c, size_t *bytes);
    /* Enqueues `c` on `s` (checked, the workspace big enough). */
    mg_status (*run)(mg_backend *b, mg_stream *s, const mg_moe_gemm_call *c);
} mg_moe_gemm_provider;

/* The providers: moe_gemm_reference.c, moe_gemm_cuda.c. */
extern const mg_moe_gemm_provider mg_moe_gemm_reference_provider;
#ifdef METRALE_HAVE_CUDA
extern const mg_moe_gemm_provider mg_moe_gemm_cutlass_provider;
#endif

#endif
