/* gemm_decode_gemv_cuda.c - the "decode_gemv" provider of the GEMM ops: our tensor-core GEMV for
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
 * sm_90a image: the portable PTX image has no FP8 MMA).
 *
 * Fusions (metrale/ops_gemm.h): for BF16 and row-wise FP8 weights it runs the RMSNorm prologue
 * and the residual-add, SiLU-mul and KV-append epilogues (the last into BF16 pools only), alone
 * or together (one kernel per pair, mg_decode_gemv_bf16_<prologue>_<epilogue> and
 * mg_decode_gemv_fp8_row_<prologue>_<epilogue>). The FP8 RMSNorm prologue quantizes the normed
 * rows once per block into shared memory, so it takes M x (K + 16) <= 40 KiB of codes (M <= 9
 * at K = 4096); larger ones are refused. No other CUDA provider
 * fuses, so a fusion it passes over is refused (MG_ERR_UNSUPPORTED, and a caller such as the
 * forward model then runs the ops apart): in the automatic choice it takes the fused calls where
 * its plain GEMV wins (decode_gemv_wins) and every call of one token row, where it is 0.87-1.06x
 * cuBLASLt on the Llama-3-8B shapes and the fusion saves a launch (about 4-5 us) and a round trip
 * of the intermediate; at 4 to 16 rows of the large shapes it is 0.67-0.86x cuBLASLt, more than the
 * fusion saves. Forced by name it takes every fused call its kernels can run. Outside
 * batch-invariant mode only (there cuBLASLt runs every shape), with the norm weight 16-byte
 * aligned too. The argmax epilogue and the per-tensor FP8 fusions are not implemented here
 * (refused, so the front reports the fusion as unsupported). */
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
/* ... and at the RMSNorm kernels' 80 (their launch bounds in decode_gemv.cu), except their
 * "_m8" forms for M <= 8, which keep 64 */
#define DECODE_GEMV_NORM_BLOCKS_PER_SM 3
#define DECODE_GEMV_NORM_M8_MAX_M 8
#define KERNEL_BF16 "mg_decode_gemv_bf16"
#define KERNEL_FP8 "mg_decode_gemv_fp8"
#define KERNEL_FUSED_PREFIX KERNEL_BF16 "_" /* then "<prologue>_<epilogue>" */
#define KERNEL_FP8_FUSED_PREFIX KERNEL_FP8 "_row_"
/* The FP8 RMSNorm kernels' dynamic shared memory: M rows of K codes at a pitch of K + 16
 * (decode_gemv.cu, staged_pitch), under the 48 KiB a launch gets without an attribute with the
 * kernels' static 4.6 KiB; at 4 blocks per SM it leaves the SM's shared memory to spare. */
#define DECODE_GEMV_FP8_STAGE_MAX_BYTES (40u << 10)
/* The FP8 KV-append kernels' blocks per SM (80 registers) */
#define DECODE_GEMV_FP8_KV_APPEND_BLOCKS_PER_SM 3
#define FUSIONS                                                                                    \
    (MG_GEMM_FUSES_PROLOGUE(MG_GEMM_PROLOGUE_RMSNORM) |                                            \
     MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_RESIDUAL_ADD) |                                       \
     MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_SILU_MUL) |                                           \
     MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_KV_APPEND))

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

static bool is_fused(const mg_gemm_plan *p) {
    return p->fusion.prologue != MG_GEMM_PROLOGUE_NONE ||
           p->fusion.epilogue != MG_GEMM_EPILOGUE_NONE;
}

/* The FP8 RMSNorm kernels' dynamic shared memory for `p` (decode_gemv.cu, staged_pitch). */
static uint64_t fp8_stage_bytes(const mg_gemm_plan *p) {
    return (uint64_t)p->m * ((p->k + 15u) / 16u * 16u + 16u);
}

static bool gemv_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mg_gemm_plan *p = call;
    if (!mg_gemm_fusion_declared(&mg_gemm_decode_gemv_provider, p, reason, reason_bytes))
        return false;
    if (is_fused(p) && p->kind != MG_GEMM_BF16 && p->kind != MG_GEMM_FP8_ROWWISE) {
        snprintf(reason, reason_bytes, "the decode GEMV fuses BF16 and row-wise FP8 weights only");
        return false;
    }
    if (p->kind == MG_GEMM_FP8_ROWWISE && p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM &&
        fp8_stage_bytes(p) > DECODE_GEMV_FP8_STAGE_MAX_BYTES) {
        snprintf(reason, reason_bytes,
                 "the decode GEMV's FP8 RMSNorm prologue stages M x (K + 16) codes in at most "
                 "%u bytes of shared memory, M=%u K=%u needs %llu",
                 DECODE_GEMV_FP8_STAGE_MAX_BYTES, p->m, p->k,
                 (unsigned long long)fp8_stage_bytes(p));
        return false;
    }
    if (!kernels_fit(b, p, reason, reason_bytes))
        return false;
    if (is_forced(b, p->kind))
        return true;
    if (mg_gemm_cublaslt_provider.batch_invariant(b)) {
        snprintf(reason, reason_bytes, "batch-invariant mode keeps every shape on cuBLASLt");
        return false;
    }
    /* The FP8 RMSNorm prologue makes every row's codes in each block: at one row that costs
     * less than the norm and quantizer kernels it replaces (8B batch 1: 3.86 against 3.92 ms
     * a step), at 8 rows it doubled the step (8.18 against 4.35 ms; bench/results/
     * 2026-12-04-h200-fp8-fusion.md), so the automatic choice takes it at M = 1 only. */
    if (p->kind == MG_GEMM_FP8_ROWWISE && p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM &&
        p->m > 1) {
        snprintf(reason, reason_bytes,
                 "the FP8 RMSNorm prologue is chosen at M=1 only (measured slower than the "
                 "unfused ops at M=8), got M=%u",
                 p->m);
        return false;
    }
    if (is_fused(p) && p->m == 1)
        return true;
    if (!decode_gemv_wins(p)) {
        snprintf(reason, reason_bytes, "cuBLASLt was measured faster for M=%u N=%u K=%u", p->m,
                 p->n, p->k);
        return false;
    }
    return true;
}

/* The RMSNorm kernel of at most 8 rows (4 blocks per SM). */
static bool norm_m8(const mg_gemm_plan *p) {
    return p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM && p->m <= DECODE_GEMV_NORM_M8_MAX_M;
}

/* The KV-append kernel's arguments after (act, weight, out, norm_weight; u32 m, n, k, ldc; f32
 * eps): the append's page table, positions and pools, u32 batch, num_kv_indices, num_pages,
 * page_size, qo_heads, kv_heads, head_dim, rope; f32 rope_theta; rope_inv_freq (FP32 or 0).
 * BF16 pools only: an FP8 pool
 * is refused here, before anything is launched (the plan, which the choice of provider sees,
 * does not name the pool's type). */
static mg_status kv_append_arguments(const mg_gemm_call *call, mg_launch *l) {
    const mg_kv_cache_desc *cache = call->t.fusion.kv_cache;
    if (cache->kv_dtype != MG_KV_BF16)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s with fusion epilogue kv_append: the decode GEMV appends "
                        "to BF16 pools only (this cache is FP8): run the GEMM and mg_kv_append "
                        "apart",
                        mg_gemm_kind_describe(call->plan.kind)->function);
    mg_kv_append_args a;
    mg_gemm_kv_append_args(call, &a);
    mg_launch_arg_ptr(l, a.qo_indptr);
    mg_launch_arg_ptr(l, a.kv_indptr);
    mg_launch_arg_ptr(l, a.kv_indices);
    mg_launch_arg_ptr(l, a.kv_last_page_len);
    mg_launch_arg_ptr(l, a.positions);
    mg_launch_arg_ptr(l, a.k_pages);
    mg_launch_arg_ptr(l, a.v_pages);
    mg_launch_arg_u32(l, a.batch_size);
    mg_launch_arg_u32(l, a.num_kv_indices);
    mg_launch_arg_u32(l, cache->num_pages);
    mg_launch_arg_u32(l, cache->page_size ? cache->page_size : MG_KV_PAGE_SIZE_DEFAULT);
    mg_launch_arg_u32(l, a.num_qo_heads);
    mg_launch_arg_u32(l, cache->num_kv_heads);
    mg_launch_arg_u32(l, cache->head_dim);
    mg_launch_arg_u32(l, a.rope);
    mg_launch_arg_f32(l, a.rope_theta);
    mg_launch_arg_ptr(l, a.rope ? a.rope_inv_freq : 0);
    return MG_OK;
}

/* The fused BF16 kernel: (act, weight, out, norm_weight, residual; u32 m, n, k, ldc, out_f32;
 * f32 eps), or the KV-append one's arguments (kv_append_arguments), named after the fusion;
 * the FP8 ones take act_scale and weight_scale first. */
static mg_status fused_run(mg_backend *b, mg_stream *s, const mg_gemm_call *call, mg_launch *l) {
    const mg_gemm_plan *p = &call->plan;
    const bool kv_append = p->fusion.epilogue == MG_GEMM_EPILOGUE_KV_APPEND;
    const bool fp8 = p->kind == MG_GEMM_FP8_ROWWISE;
    if (fp8) {
        mg_launch_arg_ptr(l, call->t.act_scale);
        mg_launch_arg_ptr(l, call->t.weight_scale);
    }
    mg_launch_arg_ptr(l, call->t.act);
    mg_launch_arg_ptr(l, call->t.weight);
    mg_launch_arg_ptr(l, call->t.out);
    mg_launch_arg_ptr(l, call->t.fusion.norm_weight);
    if (!kv_append)
        mg_launch_arg_ptr(l, call->t.fusion.residual);
    mg_launch_arg_u32(l, p->m);
    mg_launch_arg_u32(l, p->n);
    mg_launch_arg_u32(l, p->k);
    mg_launch_arg_u32(l, p->ldc);
    if (!kv_append)
        mg_launch_arg_u32(l, p->out_type == MG_DTYPE_F32);
    mg_launch_arg_f32(l, p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM ? p->fusion.eps : 0.0f);
    mg_status st = kv_append ? kv_append_arguments(call, l) : MG_OK;
    if (st)
        return st;
    char kernel[96];
    snprintf(kernel, sizeof kernel, "%s%s_%s%s",
             fp8 ? KERNEL_FP8_FUSED_PREFIX : KERNEL_FUSED_PREFIX,
             mg_gemm_prologue_name(p->fusion.prologue), mg_gemm_epilogue_name(p->fusion.epilogue),
             !fp8 && norm_m8(p) ? "_m8" : "");
    const char *name = kernel;
    return mg_op_launch_kernels(b, s, &name, l, 1);
}

static mg_status gemv_run(mg_backend *b, mg_stream *s, const mg_gemm_call *call) {
    const mg_gemm_plan *p = &call->plan;
    /* 8 weight rows per tile; with SiLU-mul they are 4 gate and 4 up rows of 4 outputs */
    const bool silu = p->fusion.epilogue == MG_GEMM_EPILOGUE_SILU_MUL;
    const uint32_t outputs = silu ? p->n / 2 : p->n;
    const uint32_t per_tile = silu ? DECODE_GEMV_ROWS_PER_BLOCK / 2 : DECODE_GEMV_ROWS_PER_BLOCK;
    uint32_t blocks = (outputs + per_tile - 1) / per_tile;
    mg_device_info info;
    mg_status st = mg_device_get_info(b, &info);
    if (st)
        return st;
    const bool fp8_fused = p->kind == MG_GEMM_FP8_ROWWISE && is_fused(p);
    const bool norm = p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM;
    uint32_t per_sm = DECODE_GEMV_BLOCKS_PER_SM;
    if (fp8_fused && p->fusion.epilogue == MG_GEMM_EPILOGUE_KV_APPEND)
        per_sm = DECODE_GEMV_FP8_KV_APPEND_BLOCKS_PER_SM;
    else if (!fp8_fused && norm && !norm_m8(p))
        per_sm = DECODE_GEMV_NORM_BLOCKS_PER_SM;
    uint32_t resident = (uint32_t)(info.multiprocessors > 0 ? info.multiprocessors : 1) * per_sm;
    if (blocks > resident)
        blocks = resident;
    /* gemv_supports bounded it */
    const uint32_t shared = fp8_fused && norm ? (uint32_t)fp8_stage_bytes(p) : 0;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){blocks, 1, 1}, (mg_dim3){DECODE_GEMV_THREADS, 1, 1}, shared);
    /* The kernel loads its first weights, then waits on the grid dependency (decode_gemv.cu). */
    mg_launch_set_flags(&l, MG_LAUNCH_PROGRAMMATIC);
    if (is_fused(p))
        return fused_run(b, s, call, &l);
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
    .base =
        {.name = "decode_gemv",
         .backend = MG_BACKEND_CUDA,
         .available = gemv_available,
         .supports = gemv_supports,
         .kernels = MG_OP_KERNEL_NAMES(
             KERNEL_BF16, KERNEL_FP8, KERNEL_FUSED_PREFIX "rmsnorm_none",
             KERNEL_FUSED_PREFIX "rmsnorm_residual_add", KERNEL_FUSED_PREFIX "rmsnorm_silu_mul",
             KERNEL_FUSED_PREFIX "rmsnorm_none_m8", KERNEL_FUSED_PREFIX "rmsnorm_residual_add_m8",
             KERNEL_FUSED_PREFIX "rmsnorm_silu_mul_m8", KERNEL_FUSED_PREFIX "none_residual_add",
             KERNEL_FUSED_PREFIX "none_silu_mul", KERNEL_FUSED_PREFIX "rmsnorm_kv_append",
             KERNEL_FUSED_PREFIX "rmsnorm_kv_append_m8", KERNEL_FUSED_PREFIX "none_kv_append",
             KERNEL_FP8_FUSED_PREFIX "rmsnorm_none", KERNEL_FP8_FUSED_PREFIX "rmsnorm_residual_add",
             KERNEL_FP8_FUSED_PREFIX "rmsnorm_silu_mul",
             KERNEL_FP8_FUSED_PREFIX "none_residual_add", KERNEL_FP8_FUSED_PREFIX "none_silu_mul",
             KERNEL_FP8_FUSED_PREFIX "rmsnorm_kv_append",
             KERNEL_FP8_FUSED_PREFIX "none_kv_append")},
    .run = gemv_run,
    .fusions = FUSIONS,
};
