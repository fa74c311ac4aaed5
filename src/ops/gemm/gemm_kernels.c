/* gemm_kernels.c - the BF16 GEMM as one kernel of module "metrale" launched by name
 * (MG_GEMM_BF16_KERNEL, gemm_bf16_ref's argument list): provider "kernels", for the backends
 * that have no GEMM library (Metal: kernels/metal/gemm.metal). Unfused and BF16 only; the
 * other calls go to the providers before it or are refused naming this reason. */
#include <stdio.h>

#include "gemm_provider.h"
#include "gemm_reference.h"

/* The launch shape the device kernels share: a threadgroup of TILE x TILE threads computes a
 * TILE x TILE block of out (x: columns, y: rows). */
#define TILE 16u

static bool kernels_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    const mg_gemm_plan *p = call;
    if (p->kind != MG_GEMM_BF16) {
        snprintf(reason, reason_bytes, "BF16 only");
        return false;
    }
    return mg_gemm_fusion_declared(&mg_gemm_kernels_provider, p, reason, reason_bytes);
}

static mg_status kernels_run(mg_backend *b, mg_stream *s, const mg_gemm_call *c) {
    const mg_gemm_plan *p = &c->plan;
    const mg_dim3 grid = {(p->n + TILE - 1) / TILE, (p->m + TILE - 1) / TILE, 1};
    return mg_gemm_bf16_launch(b, s, c, MG_GEMM_BF16_KERNEL, grid, (mg_dim3){TILE, TILE, 1});
}

const mg_gemm_provider mg_gemm_kernels_provider = {
    .base = {.name = "kernels",
             .backend = MG_OP_ANY_BACKEND,
             .supports = kernels_supports,
             .kernels = MG_OP_KERNEL_NAMES(MG_GEMM_BF16_KERNEL),
             .register_cpu_kernels = mg_gemm_reference_kernels_register},
    .run = kernels_run,
};
