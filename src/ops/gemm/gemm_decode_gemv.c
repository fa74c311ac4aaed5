/* gemm_decode_gemv.c - the "decode_gemv" provider of the GEMM ops: our tensor-core GEMV for
 * decode batches of at most 16 token rows (kernels/cuda/gemm/decode_gemv.cu), BF16 weights
 * (BF16 or F32 out) and FP8 E4M3 weights with per-tensor or row-wise scales.
 *
 * Each weight byte is read once per call whatever M is, and the result of a row does not depend
 * on the other rows (fixed reduction order), so a captured call equals an eager one bit for bit.
 *
 * In the automatic choice it takes the calls of decode_gemv_wins() (measured on the H200 against
 * cuBLASLt: bench/results/), and nothing while batch-invariant mode is on, since cuBLASLt runs
 * the larger batches of the same shape. Forced by name
 * (mg_op_force_provider(b, op, "decode_gemv")) it takes every call its kernels can run. What
 * they need: M <= 16; rows of 16-byte multiples (K % 8 == 0 for BF16; the FP8 front already
 * asks K % 16 == 0); act, weight and out 16-byte aligned; FP8 on compute capability 9.0 (the
 * sm_90a image: the portable PTX image has no FP8 MMA). */
#include <stdio.h>

#include "error.h"
#include "gemm_cublaslt.h"
#include "gemm_provider.h"
#include "op_builtin.h"

#define DECODE_GEMV_MAX_M 16
#define DECODE_GEMV_ROWS_PER_BLOCK 8 /* weight rows per tile, as decode_gemv.cu walks them */
#define DECODE_GEMV_THREADS 256
/* Blocks resident per SM at the kernels' 64 registers per thread: the grid, which walks the
 * row tiles grid-stride, is this many per SM at most. */
#define DECODE_GEMV_BLOCKS_PER_SM 4
#define KERNEL_BF16 "mg_decode_gemv_bf16"
#define KERNEL_FP8 "mg_decode_gemv_fp8"

/* The device's facts (the backend holds them: a copy, no driver call); false, with the caller's
 * error state untouched, when the backend cannot tell them. */
static bool device_of(mg_backend *b, mg_device_info *info) {
    mg_error_state saved;
    mg_error_save(&saved);
    bool ok = mg_device_get_info(b, info) == MG_OK;
    mg_error_restore(&saved);
    return ok;
}

/* The kernels field has the registry test that the backend ships both kernels first. */
static bool gemv_available(mg_backend *b, char *reason, size_t reason_bytes) {
    mg_device_info info;
    if (!device_of(b, &info)) {
        snprintf(reason, reason_bytes, "the device's compute capability could not be read");
        return false;
    }
    if (info.cc_major < 8) {
        snprintf(reason, reason_bytes,
                 "the decode GEMV needs compute capability 8.0, the device "
                 "has %d.%d",
                 info.cc_major, info.cc_minor);
        return false;
    }
    return true;
}

static bool is_forced(mg_backend *b, mg_gemm_kind kind) {
    return mg_op_forced(b, mg_gemm_kind_describe(kind)->op) == &mg_gemm_decode_gemv_provider.base;
}

/* What the kernels can run at all (the forced provider's rule). */
static bool kernels_fit(mg_backend *b, const mg_gemm_plan *p, char *reason, size_t reason_bytes) {
    if (p->kind == MG_GEMM_FP8_BLOCKSCALED) {
        snprintf(reason, reason_bytes, "the decode GEMV has no block-scaled FP8 form");
        return false;
    }
    if (p->m > DECODE_GEMV_MAX_M) {
        snprintf(reason, reason_bytes, "the decode GEMV takes M <= %d, got M=%u", DECODE_GEMV_MAX_M,
                 p->m);
        return false;
    }
    if (p->kind == MG_GEMM_BF16 && p->k % 8) {
        snprintf(reason, reason_bytes, "the decode GEMV needs K %% 8 == 0 for BF16, got K=%u",
                 p->k);
        return false;
    }
    if (p->pointer_alignment && p->pointer_alignment < 16) {
        snprintf(reason, reason_bytes,
                 "the decode GEMV needs 16-byte aligned act, weight and "
                 "out (they are %u-byte aligned)",
                 p->pointer_alignment);
        return false;
    }
    mg_device_info info;
    if (p->kind != MG_GEMM_BF16 &&
        (!device_of(b, &info) || info.cc_major != 9 || info.cc_minor != 0)) {
        snprintf(reason, reason_bytes, "the FP8 decode GEMV runs on compute capability 9.0 only");
        return false;
    }
    return true;
}

/* The automatic choice, from `bench gemm_decode` on the H200 (graph replay, weights rotated
 * past L2; bench/results/2026-12-01-h200-decode-gemv.md). Row-wise FP8: everywhere, 1.1-2.9x
 * cuBLASLt, whose row-wise kernels are slow at decode sizes. BF16 and per-tensor FP8: where
 * the launch and ramp dominate, i.e. weights of at most 4 Mi elements (1024x4096, SmolLM2's
 * layers: 1.1-2x), and for BF16 also M = 1 up to 16 Mi elements (4096x4096: 12.0 vs 12.7 us);
 * cuBLASLt streams larger matrices closer to the copy bandwidth. */
static bool decode_gemv_wins(const mg_gemm_plan *p) {
    uint64_t elements = (uint64_t)p->n * p->k;
    if (p->kind == MG_GEMM_FP8_ROWWISE)
        return true;
    if (elements <= (4u << 20))
        return true;
    return p->kind == MG_GEMM_BF16 && p->m == 1 && elements <= (16u << 20);
}

static bool gemv_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mg_gemm_plan *p = call;
    if (!mg_gemm_fusion_declared(&mg_gemm_decode_gemv_provider, p, reason, reason_bytes))
        return false; /* no fused kernels yet */
    if (!kernels_fit(b, p, reason, reason_bytes))
        return false;
    if (is_forced(b, p->kind))
        return true;
    if (mg_gemm_cublaslt_provider.batch_invariant(b)) {
        snprintf(reason, reason_bytes, "batch-invariant mode keeps every shape on cuBLASLt");
        return false;
    }
    if (!decode_gemv_wins(p)) {
        snprintf(reason, reason_bytes, "cuBLASLt was measured faster for M=%u N=%u K=%u", p->m,
                 p->n, p->k);
        return false;
    }
    return true;
}

static mg_status gemv_run(mg_backend *b, mg_stream *s, const mg_gemm_call *call) {
    const mg_gemm_plan *p = &call->plan;
    uint32_t blocks = (p->n + DECODE_GEMV_ROWS_PER_BLOCK - 1) / DECODE_GEMV_ROWS_PER_BLOCK;
    mg_device_info info;
    mg_status st = mg_device_get_info(b, &info);
    if (st)
        return st;
    uint32_t resident =
        (uint32_t)(info.multiprocessors > 0 ? info.multiprocessors : 1) * DECODE_GEMV_BLOCKS_PER_SM;
    if (blocks > resident)
        blocks = resident;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){blocks, 1, 1}, (mg_dim3){DECODE_GEMV_THREADS, 1, 1}, 0);
    /* The kernel loads its first weights, then waits on the grid dependency (decode_gemv.cu). */
    mg_launch_set_flags(&l, MG_LAUNCH_PROGRAMMATIC);
    mg_launch_arg_ptr(&l, call->t.act);
    if (p->kind != MG_GEMM_BF16)
        mg_launch_arg_ptr(&l, call->t.act_scale);
    mg_launch_arg_ptr(&l, call->t.weight);
    if (p->kind != MG_GEMM_BF16)
        mg_launch_arg_ptr(&l, call->t.weight_scale);
    mg_launch_arg_ptr(&l, call->t.out);
    mg_launch_arg_u32(&l, p->m);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    mg_launch_arg_u32(&l, p->ldc);
    mg_launch_arg_u32(&l, p->kind == MG_GEMM_BF16 ? p->out_type == MG_DTYPE_F32
                                                  : p->kind == MG_GEMM_FP8_ROWWISE);
    const char *kernel = p->kind == MG_GEMM_BF16 ? KERNEL_BF16 : KERNEL_FP8;
    return mg_op_launch_kernels(b, s, &kernel, &l, 1);
}

const mg_gemm_provider mg_gemm_decode_gemv_provider = {
    .base = {.name = "decode_gemv",
             .backend = MG_BACKEND_CUDA,
             .available = gemv_available,
             .supports = gemv_supports,
             .kernels = MG_OP_KERNEL_NAMES(KERNEL_BF16, KERNEL_FP8)},
    .run = gemv_run,
};
