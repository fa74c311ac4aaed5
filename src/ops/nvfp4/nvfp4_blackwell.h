/*
 * nvfp4_blackwell.h - private to src/ops/nvfp4: the Blackwell provider of the NVFP4 GEMMs
 * (nvfp4_gemm_blackwell_cuda.c), native block-scaled FP4 x FP4 tensor-core GEMMs from the
 * CUTLASS plugin (kernels/cuda/cutlass/cutlass_nvfp4.h), the activation quantized per call.
 * The provider and functions exist in CUDA builds only (METRALE_HAVE_CUDA); the call
 * description is the front's in every build.
 *
 * A weight's prepared layout depends on where it will run: mg_nvfp4_blackwell_layout(b, n, k)
 * says whether mg_nvfp4_prepare writes the Blackwell layout (codes unchanged, scales in the
 * 128x4 layout) and the GEMMs use this provider, so the two always agree. It fits in the sizes
 * mg_nvfp4_prepared_*_bytes give (n a multiple of 128 is one of its conditions).
 */
#ifndef METRALE_OPS_NVFP4_BLACKWELL_H
#define METRALE_OPS_NVFP4_BLACKWELL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/ops.h"
#include "metrale/ops_nvfp4.h"
#include "op_registry.h"

/* One checked GEMM call of the NVFP4 ops, as the front (nvfp4_gemm.c) hands it to the
 * providers' supports hooks: dense (op MG_OP_NVFP4_GEMM) or grouped (MG_OP_NVFP4_MOE_GEMM);
 * `up` non-NULL: the fused gate_up form. The workspace fields are the caller's
 * (mg_nvfp4_gemm_with_workspace); this provider uses its own. */
typedef struct mg_nvfp4_gemm_problem {
    const char *fn;
    mg_op op;
    uint32_t experts, rows, act_rows, n, k, act_pitch, ldc;
    mg_devptr act, token_ids, offsets, out;
    mg_nvfp4_weight w;
    const mg_nvfp4_weight *up;
    mg_devptr workspace;
    size_t workspace_bytes;
    /* mg_nvfp4_gemm_fused's fusion (zero: none) and its operands */
    mg_gemm_fusion fusion;
    mg_devptr norm_weight, residual;
} mg_nvfp4_gemm_problem;

/* What an NVFP4 GEMM provider implements (both ops); nvfp4_gemm.c lists them. */
typedef struct mg_nvfp4_provider {
    mg_op_provider base; /* first: the registry hands this back as an mg_op_provider */
    /* Whether it reads weights in the Blackwell layout (mg_nvfp4_blackwell_layout); a weight
     * prepared for one layout is unreadable to the providers of the other. */
    bool blackwell_layout;
    /* Whether its calls use the caller's workspace (mg_op_stats). */
    bool caller_workspace;
    /* Runs a checked call it supports on `s`. */
    mg_status (*run)(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *p);
} mg_nvfp4_provider;

#ifdef METRALE_HAVE_CUDA
extern const mg_nvfp4_provider mg_nvfp4_blackwell_provider;

/* True on a CUDA device of compute capability 10.0 (sm_100a kernels) or 12.0 (sm_120a), when
 * the plugin holds that family, for n a multiple of 128 and k a multiple of 32. Never sets an
 * error. */
bool mg_nvfp4_blackwell_layout(mg_backend *b, uint32_t n, uint32_t k);

/* mg_nvfp4_prepare's work on such a device (arguments already checked by the front). */
mg_status mg_nvfp4_blackwell_prepare(mg_backend *b, mg_stream *s, const char *fn, uint32_t n,
                                     uint32_t k, uint32_t experts, mg_devptr codes,
                                     mg_devptr scales, mg_devptr prepared_values,
                                     mg_devptr prepared_scales);

/* The provider's run hook. Its workspace (the quantized activation, the grouped arguments,
 * CUTLASS's own, and for gate_up the two products) is stream-private op-cache scratch that only
 * grows: grown outside a capture, so make one call of the largest shape before capturing. */
mg_status mg_nvfp4_blackwell_gemm(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *c);

#endif /* METRALE_HAVE_CUDA */
#endif
