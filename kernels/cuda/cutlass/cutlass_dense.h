/*
 * cutlass_dense.h - private: the dense BF16 GEMMs of the CUTLASS plugin (unit
 * kernels/cuda/cutlass/cutlass_dense_sm90.cu, family MG_CUTLASS_UNITS_SM90_DENSE), behind the
 * CUTLASS provider of the BF16 GEMM op (src/ops/gemm/gemm_cutlass_cuda.c).
 *
 *   out[M, N] (BF16, row pitch ldc) = act[M, K] · weight[N, K]ᵀ, FP32 accumulation
 *
 * with one of a few fixed Hopper (sm_90a) TMA warp-specialized kernels. The caller passes only
 * calls the kernels can take (mg_cutlass_dense_fits); a call CUTLASS still refuses
 * (can_implement, a workspace larger than offered) returns MG_ERR_UNSUPPORTED with nothing
 * launched, so the caller can run it elsewhere.
 */
#ifndef METRALE_CUTLASS_DENSE_H
#define METRALE_CUTLASS_DENSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"
#include "plugin_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel configurations (CTA tile M x N x K, schedule). Values are part of the ABI. */
typedef enum mg_cutlass_dense_config {
    /* Cooperative (two consumer warp groups share one 128-row tile): the general config for
     * prefill-sized M, balanced tile for N and K of 4096..14336. */
    MG_CUTLASS_DENSE_COOP_128X128 = 0,
    /* Cooperative 128x256: twice the reuse of each activation tile, for large M (>= ~2048)
     * where the GEMM is compute-bound and fewer, wider tiles cut shared-memory traffic. */
    MG_CUTLASS_DENSE_COOP_128X256 = 1,
    /* Ping-pong 64x128 (each consumer warp group owns a 64-row tile, one's epilogue overlaps
     * the other's main loop): for small M (decode and short prefill), where a 128-row tile
     * computes mostly padding and more, narrower CTAs keep more SMs streaming weights. */
    MG_CUTLASS_DENSE_PINGPONG_64X128 = 2,
    MG_CUTLASS_DENSE_CONFIG_COUNT
} mg_cutlass_dense_config;

typedef struct mg_cutlass_dense_args {
    uint32_t config; /* mg_cutlass_dense_config */
    uint32_t m, n, k, ldc;
    const void *act, *weight; /* BF16, 16-byte aligned */
    void *out;                /* BF16, 16-byte aligned */
    void *workspace;          /* device memory the kernel may use; may be NULL when bytes is 0 */
    size_t workspace_bytes;
    int32_t sm_count; /* the device's SMs (the persistent grid size) */
} mg_cutlass_dense_args;

/* Whether the kernels take this shape at all: K, N and ldc multiples of 8 (16-byte TMA rows).
 * The pointers must also be 16-byte aligned. */
static inline bool mg_cutlass_dense_fits(uint32_t n, uint32_t k, uint32_t ldc) {
    return n % 8 == 0 && k % 8 == 0 && ldc % 8 == 0 && ldc >= n;
}

/* Enqueues one GEMM on `stream` (a CUstream / cudaStream_t). MG_ERR_INVALID_ARGUMENT for an
 * unknown config; MG_ERR_UNSUPPORTED (nothing launched) when CUTLASS refuses the call or needs
 * more workspace than offered; MG_ERR_DEVICE / MG_ERR_OUT_OF_MEMORY for a failed CUDA call.
 * Launches nothing else and allocates nothing, so it may be captured into a graph. */
typedef mg_status (*mg_cutlass_dense_sm90_fn)(const mg_cutlass_dense_args *args, void *stream,
                                              mg_plugin_error *err);

#ifdef __cplusplus
}
#endif
#endif
