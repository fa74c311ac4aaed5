/*
 * gemm_provider.h - private to src/ops/gemm: one GEMM call after the front (gemm.c) checked
 * it, and what a GEMM provider implements. The providers are listed in gemm.c's op
 * definitions, in order of preference.
 */
#ifndef METRALE_GEMM_PROVIDER_H
#define METRALE_GEMM_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>

#include "metrale/ops_gemm.h"
#include "op_registry.h"

typedef struct mg_gemm_call {
    mg_gemm_plan plan; /* shape, types, scale modes; pointer_alignment from the pointers */
    mg_gemm_tensors t; /* checked: every range inside its buffer, the workspace big enough */
} mg_gemm_call;

typedef struct mg_gemm_provider {
    mg_op_provider base; /* first: the registry hands this back as an mg_op_provider */
    /* Enqueues `call` on `s` (validated; NULL is the default stream). */
    mg_status (*run)(mg_backend *b, mg_stream *s, const mg_gemm_call *call);
    /* Optional: plans the shapes ahead of a capture (mg_gemm_prewarm). */
    mg_status (*prewarm)(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans, size_t count);
    /* Bytes of device workspace a call needs when the caller supplies it; 0 or NULL: none. */
    size_t (*workspace_bytes)(mg_backend *b);
    /* Optional (NULL: always batch-invariant): mg_gemm_set_batch_invariant and its query. */
    mg_status (*set_batch_invariant)(mg_backend *b, bool enabled);
    bool (*batch_invariant)(mg_backend *b);
    /* The fusions it runs whole (metrale/ops_gemm.h), MG_GEMM_FUSES_* bits: 0 (the default)
     * runs none. Its supports hook calls mg_gemm_fusion_declared first, so the registry passes
     * it over for any other fusion; the front checks the chosen one again. */
    unsigned fusions;
} mg_gemm_provider;

#define MG_GEMM_FUSES_PROLOGUE(p) (1u << (unsigned)(p))
#define MG_GEMM_FUSES_EPILOGUE(e) (1u << (8u + (unsigned)(e)))

/* The mg_kv_append arguments of a call with the KV_APPEND epilogue (metrale/ops_gemm.h): the
 * caller's, with the token rows taken from out. False (nothing written) for another call. */
bool mg_gemm_kv_append_args(const mg_gemm_call *c, mg_kv_append_args *out);

/* Whether provider `g` declares the plan's fusion (no fusion: always); on false writes the
 * reason, naming the fusion. For the supports hooks (cheap; sets no error). */
bool mg_gemm_fusion_declared(const mg_gemm_provider *g, const mg_gemm_plan *p, char *reason,
                             size_t reason_bytes);

/* The providers, in gemm_reference.c, gemm_cpu_fast.c, gemm_cublaslt.c, gemm_cutlass_cuda.c and
 * gemm_decode_gemv_cuda.c. */
extern const mg_gemm_provider mg_gemm_reference_provider;
extern const mg_gemm_provider mg_gemm_cpu_avx2_provider;     /* BF16 only; where the CPU has AVX2 */
extern const mg_gemm_provider mg_gemm_cpu_portable_provider; /* BF16 only; any CPU */
/* gemm_kernels.c: the BF16 GEMM kernel MG_GEMM_BF16_KERNEL, unfused, on any backend that ships
 * it (Metal: kernels/metal/gemm.metal; the CPU backend: the reference under that name). */
extern const mg_gemm_provider mg_gemm_kernels_provider;
#ifdef METRALE_HAVE_CUDA
extern const mg_gemm_provider mg_gemm_cublaslt_provider;
extern const mg_gemm_provider mg_gemm_cutlass_provider;     /* gemm_cutlass_cuda.c */
extern const mg_gemm_provider mg_gemm_decode_gemv_provider; /* gemm_decode_gemv_cuda.c */
#endif

/* The device kernel of the "kernels" provider, with gemm_bf16_ref's argument list. */
#define MG_GEMM_BF16_KERNEL "gemm_bf16"

/* Launches the BF16 GEMM kernel `kernel` (module "metrale") with the argument list of
 * gemm_bf16_ref, which every implementation shares (gemm_reference.h unpacks it on the CPU),
 * on `grid` x `block`; the CPU form launches one thread, which the CPU kernels ignore anyway. */
mg_status mg_gemm_bf16_launch(mg_backend *b, mg_stream *s, const mg_gemm_call *c,
                              const char *kernel, mg_dim3 grid, mg_dim3 block);
mg_status mg_gemm_bf16_cpu_launch(mg_backend *b, mg_stream *s, const mg_gemm_call *c,
                                  const char *kernel);

#endif
