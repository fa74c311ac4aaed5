/*
 * metrale/ops.h - the ops a backend can run, which provider runs them, and what they did.
 *
 * An op (a GEMM family, attention, a quantizer) has a front that checks every argument and
 * one or more providers: the CPU reference ("reference"), a library (e.g. "cublaslt",
 * "flashinfer") or our own kernels ("kernels", which run on every backend that ships the
 * kernels under their names). For each call the front takes the first provider, in the
 * op's order of preference, that works on the backend and supports the call's shape, or the
 * one a caller forced.
 *
 *   if (!mg_op_supported(b, MG_OP_GEMM_FP8)) ...                  // no error message set
 *   mg_op_force_provider(b, MG_OP_GEMM_BF16, "cublaslt");         // tests and benchmarks
 *   mg_op_stats st;
 *   mg_op_stats_get(b, MG_OP_GEMM_BF16, &st);                     // calls, plans, workspace
 *
 * What a caller may rely on:
 *  - mg_op_supported and mg_op_provider_available never change mg_last_error().
 *  - Forcing applies to calls made after it on that backend, from any thread. Forcing a
 *    provider the op does not have, or one of another backend, is MG_ERR_INVALID_ARGUMENT; a
 *    forced provider that is unavailable on the backend or does not support a call's shape
 *    makes that call fail with MG_ERR_UNSUPPORTED naming the provider and the reason, and
 *    nothing is launched.
 *  - Statistics count per backend since it was opened; they are updated by successful calls.
 */
#ifndef METRALE_OPS_H
#define METRALE_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_op {
    MG_OP_GEMM_BF16 = 0,    /* metrale/ops_gemm.h: BF16 GEMMs */
    MG_OP_GEMM_FP8,         /* metrale/ops_gemm.h: FP8 E4M3 GEMMs, every scale mode */
    MG_OP_ATTENTION_RAGGED, /* metrale/ops_attention.h */
    MG_OP_FP8_QUANTIZE,     /* metrale/ops_quantize.h: BF16 -> FP8 activation quantizers */
    MG_OP_SILU_MUL,         /* metrale/ops_activation.h: SiLU(gate) * up */
    MG_OP_NVFP4_FORMAT,     /* metrale/nvfp4.h: NVFP4 weight quantize, dequantize, layouts */
    MG_OP_MOE_ROUTING,      /* metrale/ops_moe.h: MoE top-k, expert sort, weighted combine */
    MG_OP_NVFP4_GEMM,       /* metrale/ops_nvfp4.h: NVFP4 weights x BF16, dense (and prepare) */
    MG_OP_NVFP4_MOE_GEMM,   /* metrale/ops_nvfp4.h: the grouped per-expert form */
    MG_OP_MLX_QUANT,        /* metrale/mlx.h: MLX affine-quantized dequant, GEMVs, GEMM */
    MG_OP_KV_APPEND,        /* metrale/ops_kv_cache.h: new keys/values into the paged cache */
    MG_OP_ATTENTION_PAGED,  /* metrale/ops_kv_cache.h: decode / prefill attention over pages */
    MG_OP_GATHER_ROWS,      /* metrale/ops_elementwise.h: row gather (embedding, last tokens) */
    MG_OP_RMSNORM,          /* metrale/ops_elementwise.h: RMSNorm with the residual add */
    MG_OP_ARGMAX,           /* metrale/ops_elementwise.h: greedy argmax over FP32 rows */
    MG_OP_MOE_GEMM,         /* metrale/ops_moe_gemm.h: BF16 / FP8 grouped per-expert GEMMs */
    MG_OP_SAMPLE,           /* metrale/ops_sample.h: sampled / greedy next token, penalties */
    MG_OP_COMM,             /* metrale/comm.h: communicators' collectives and send / recv */
    MG_OP_FILL_UNIFORM,     /* metrale/ops_elementwise.h: reproducible pseudo-random BF16 */
    MG_OP_AMAX,             /* metrale/ops_elementwise.h: largest finite |x| of a BF16 tensor */
    MG_OP_COUNT
} mg_op;

/* "gemm_bf16", "gemm_fp8", "attention_ragged", "fp8_quantize", "nvfp4_gemm", ...; "?" for an
 * unknown op. */
MG_API const char *mg_op_name(mg_op op);
/* The op named `name` (as mg_op_name spells it). MG_ERR_INVALID_ARGUMENT for another name. */
MG_API mg_status mg_op_parse(const char *name, mg_op *out);

/* Whether some provider of `op` can run on `b` (its library loads, the device is new enough).
 * A particular shape may still be refused by the call. False for a NULL or closed backend. */
MG_API bool mg_op_supported(mg_backend *b, mg_op op);
/* Whether provider `provider` of `op` can run on `b`; if not, `reason` (when not NULL) says
 * why: no such provider, another backend, or what it lacks here. */
MG_API bool mg_op_provider_available(mg_backend *b, mg_op op, const char *provider, char *reason,
                                     size_t reason_bytes);
/* The names of the providers of `op` for backend kind `kind`, in order of preference, into
 * names[0 .. max); returns how many there are (which may exceed max). */
MG_API size_t mg_op_providers(mg_op op, mg_backend_kind kind, const char **names, size_t max);

/* Makes every later call of `op` on `b` use `provider`; NULL or "auto" restores the
 * automatic choice. */
MG_API mg_status mg_op_force_provider(mg_backend *b, mg_op op, const char *provider);

typedef struct mg_op_stats {
    uint64_t calls;                  /* calls that were enqueued */
    uint64_t plans;                  /* plans created (per shape, per batch layout) */
    uint64_t workspace_bytes;        /* device workspace the op's providers hold now for `b` */
    uint64_t caller_workspace_calls; /* calls that ran in a workspace the caller supplied */
    char provider[32];               /* provider of the latest call; "" before the first */
    char forced[32];                 /* the forced provider; "" when automatic */
} mg_op_stats;

MG_API mg_status mg_op_stats_get(mg_backend *b, mg_op op, mg_op_stats *out);

#ifdef __cplusplus
}
#endif
#endif
