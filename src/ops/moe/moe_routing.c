/* moe_routing.c - the MoE routing helpers of metrale/ops_moe.h: every argument checked once,
 * then the kernels of module "metrale" launched by name with the same arguments on every backend
 * (CUDA: kernels/cuda/moe/moe_routing.cu; CPU: moe_routing_reference.c). */

#include "backend_impl.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops.h"
#include "metrale/ops_moe.h"
#include "moe_routing_reference.h"
#include "op_builtin.h"

/* Grid cap of the grid-stride kernels (top-k over tokens, combine's tokens). */
#define MAX_BLOCKS 65535u
#define WARP 32u

/* ------------------------------------------------------------------ provider */

/* One module ships all routing kernels: the first stands for them (a missing one is still
 * refused before anything is written, by mg_op_run_builtin). */
static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_moe_routing_cpu_kernels_register, MG_MOE_KERNEL_TOPK);

static const mg_op_provider *const routing_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_moe_routing_op = {MG_OP_MOE_ROUTING, "moe_routing", routing_providers};

static mg_status run_kernels(mg_backend *b, mg_stream *s, const char *fn, const char *const *names,
                             mg_launch *launches, int count) {
    return mg_op_run_builtin(b, s, MG_OP_MOE_ROUTING, fn, names, launches, count);
}

/* ------------------------------------------------------------------ argument checks */

/* T >= 1, 1 <= k <= MG_MOE_MAX_TOPK, T * k < 2^31. */
static mg_status check_pairs(const char *fn, uint32_t tokens, uint32_t k) {
    if (tokens == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: tokens is 0", fn);
    if (k == 0 || k > MG_MOE_MAX_TOPK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: k=%u is outside [1, %u]", fn, k,
                        MG_MOE_MAX_TOPK);
    if ((uint64_t)tokens * k > INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tokens=%u * k=%u pairs do not fit the int32 row indices", fn, tokens,
                        k);
    return MG_OK;
}

static mg_status check_experts(const char *fn, uint32_t experts) {
    if (experts == 0 || experts > MG_MOE_MAX_EXPERTS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: experts=%u is outside [1, %u]", fn, experts,
                        MG_MOE_MAX_EXPERTS);
    return MG_OK;
}

/* What every call checks first: a live backend, a descriptor, its tokens and k, and (experts
 * not 0) its expert count. */
static mg_status check_call(mg_backend *b, const char *fn, const void *d, uint32_t tokens,
                            uint32_t k, uint32_t experts) {
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL descriptor", fn);
    st = check_pairs(fn, tokens, k);
    return st || experts == 0 ? st : check_experts(fn, experts);
}

static uint32_t min_u64(uint64_t a, uint32_t b) {
    return a < b ? (uint32_t)a : b;
}

/* ------------------------------------------------------------------ top-k */

mg_status mg_moe_topk(mg_backend *b, mg_stream *s, const mg_moe_topk_desc *d, mg_devptr logits,
                      mg_devptr topk_ids, mg_devptr topk_weights) {
    static const char fn[] = "mg_moe_topk";
    mg_status st = check_call(b, fn, d, d ? d->tokens : 0, d ? d->k : 0, d ? d->experts : 1);
    if (st)
        return st;
    if (d->k > d->experts)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: k=%u exceeds experts=%u", fn, d->k,
                        d->experts);
    if (d->logits_dtype != MG_DTYPE_BF16 && d->logits_dtype != MG_DTYPE_F32)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: logits_dtype %s is neither BF16 nor F32", fn,
                        mg_dtype_name(d->logits_dtype));
    uint32_t pitch = d->logits_pitch ? d->logits_pitch : d->experts;
    if (pitch < d->experts)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: logits_pitch=%u is less than experts=%u", fn,
                        pitch, d->experts);
    size_t size = mg_dtype_bytes(d->logits_dtype), pairs = (size_t)d->tokens * d->k;
    mg_op_tensor t[] = {
        {"logits", logits, ((size_t)(d->tokens - 1) * pitch + d->experts) * size, (uint32_t)size,
         MG_OP_IN},
        {"topk_ids", topk_ids, pairs * 4, 4, MG_OP_OUT},
        {"topk_weights", topk_weights, pairs * 4, 4, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 3, -1, -1)))
        return st;
    uint32_t tokens_per_block = MG_MOE_TOPK_THREADS / WARP;
    mg_dim3 grid = {
        min_u64(((uint64_t)d->tokens + tokens_per_block - 1) / tokens_per_block, MAX_BLOCKS), 1, 1};
    mg_dim3 block = {MG_MOE_TOPK_THREADS, 1, 1};
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, logits);
    mg_launch_arg_ptr(&l, topk_ids);
    mg_launch_arg_ptr(&l, topk_weights);
    mg_launch_arg_u32(&l, d->tokens);
    mg_launch_arg_u32(&l, d->experts);
    mg_launch_arg_u32(&l, d->k);
    mg_launch_arg_u32(&l, pitch);
    mg_launch_arg_u32(&l, d->logits_dtype == MG_DTYPE_BF16);
    mg_launch_arg_u32(&l, d->renormalize);
    const char *name = MG_MOE_KERNEL_TOPK;
    return run_kernels(b, s, fn, &name, &l, 1);
}

/* ------------------------------------------------------------------ sort */

static uint32_t sort_chunks(uint32_t pairs) {
    return (pairs + MG_MOE_SORT_CHUNK - 1) / MG_MOE_SORT_CHUNK;
}

size_t mg_moe_sort_workspace_bytes(const mg_moe_sort_desc *d) {
    if (!d || d->tokens == 0 || d->k == 0 || d->k > MG_MOE_MAX_TOPK || d->experts == 0 ||
        d->experts > MG_MOE_MAX_EXPERTS || (uint64_t)d->tokens * d->k > INT32_MAX)
        return 0;
    return (size_t)sort_chunks(d->tokens * d->k) * d->experts * 4;
}

mg_status mg_moe_sort(mg_backend *b, mg_stream *s, const mg_moe_sort_desc *d, mg_devptr topk_ids,
                      mg_devptr workspace, size_t workspace_bytes, mg_devptr expert_offsets,
                      mg_devptr sorted_token_ids, mg_devptr pair_positions) {
    static const char fn[] = "mg_moe_sort";
    mg_status st = check_call(b, fn, d, d ? d->tokens : 0, d ? d->k : 0, d ? d->experts : 1);
    if (st)
        return st;
    size_t need = mg_moe_sort_workspace_bytes(d);
    if (workspace_bytes < need)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: workspace_bytes=%zu is less than mg_moe_sort_workspace_bytes=%zu", fn,
                        workspace_bytes, need);
    uint32_t pairs = d->tokens * d->k;
    mg_op_tensor t[] = {
        {"topk_ids", topk_ids, (size_t)pairs * 4, 4, MG_OP_IN},
        {"workspace", workspace, need, 16, MG_OP_OUT},
        {"expert_offsets", expert_offsets, ((size_t)d->experts + 1) * 4, 4, MG_OP_OUT},
        {"sorted_token_ids", sorted_token_ids, (size_t)pairs * 4, 4, MG_OP_OUT},
        {"pair_positions", pair_positions, (size_t)pairs * 4, 4, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 5, -1, -1)))
        return st;
    mg_dim3 chunks = {sort_chunks(pairs), 1, 1}, one = {1, 1, 1};
    mg_dim3 block = {MG_MOE_SORT_THREADS, 1, 1};
    mg_launch l[3];
    mg_launch_init(&l[0], chunks, block, 0);
    mg_launch_arg_ptr(&l[0], topk_ids);
    mg_launch_arg_ptr(&l[0], workspace);
    mg_launch_arg_u32(&l[0], pairs);
    mg_launch_arg_u32(&l[0], d->experts);
    mg_launch_init(&l[1], one, block, 0);
    mg_launch_arg_ptr(&l[1], workspace);
    mg_launch_arg_ptr(&l[1], expert_offsets);
    mg_launch_arg_ptr(&l[1], sorted_token_ids);
    mg_launch_arg_u32(&l[1], pairs);
    mg_launch_arg_u32(&l[1], d->experts);
    mg_launch_init(&l[2], chunks, block, 0);
    mg_launch_arg_ptr(&l[2], topk_ids);
    mg_launch_arg_ptr(&l[2], workspace);
    mg_launch_arg_ptr(&l[2], sorted_token_ids);
    mg_launch_arg_ptr(&l[2], pair_positions);
    mg_launch_arg_u32(&l[2], pairs);
    mg_launch_arg_u32(&l[2], d->experts);
    mg_launch_arg_u32(&l[2], d->k);
    const char *names[3] = {MG_MOE_KERNEL_SORT_COUNT, MG_MOE_KERNEL_SORT_SCAN,
                            MG_MOE_KERNEL_SORT_SCATTER};
    return run_kernels(b, s, fn, names, l, 3);
}

/* ------------------------------------------------------------------ combine */

mg_status mg_moe_combine(mg_backend *b, mg_stream *s, const mg_moe_combine_desc *d, mg_devptr rows,
                         mg_devptr pair_positions, mg_devptr topk_weights, mg_devptr residual,
                         mg_devptr out) {
    static const char fn[] = "mg_moe_combine";
    mg_status st = check_call(b, fn, d, d ? d->tokens : 0, d ? d->k : 0, 0);
    if (st)
        return st;
    if (d->hidden == 0 || d->hidden % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: hidden=%u is not a positive multiple of 8 (16-byte rows)", fn,
                        d->hidden);
    size_t pairs = (size_t)d->tokens * d->k, token_bytes = (size_t)d->tokens * d->hidden * 2;
    mg_op_tensor t[] = {
        {"rows", rows, pairs * d->hidden * 2, 16, MG_OP_IN},
        {"pair_positions", pair_positions, pairs * 4, 4, MG_OP_IN},
        {"topk_weights", topk_weights, pairs * 4, 4, MG_OP_IN},
        {"out", out, token_bytes, 16, MG_OP_OUT},
        {"residual", residual, token_bytes, 16, MG_OP_IN},
    };
    if ((st = mg_op_check_tensors(b, fn, t, residual ? 5 : 4, 3, 4)))
        return st;
    uint32_t vectors = d->hidden / 8;
    mg_dim3 grid = {(vectors + MG_MOE_COMBINE_THREADS - 1) / MG_MOE_COMBINE_THREADS,
                    min_u64(d->tokens, MAX_BLOCKS), 1};
    mg_dim3 block = {MG_MOE_COMBINE_THREADS, 1, 1};
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, rows);
    mg_launch_arg_ptr(&l, pair_positions);
    mg_launch_arg_ptr(&l, topk_weights);
    mg_launch_arg_ptr(&l, residual ? residual : out);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, d->tokens);
    mg_launch_arg_u32(&l, d->k);
    mg_launch_arg_u32(&l, d->hidden);
    mg_launch_arg_u32(&l, residual != 0);
    const char *name = MG_MOE_KERNEL_COMBINE;
    return run_kernels(b, s, fn, &name, &l, 1);
}
