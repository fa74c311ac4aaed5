/* kv_append.c - mg_kv_append (metrale/ops_kv_cache.h): every argument checked once, then the
 * kernel "metrale:kv_append" ("metrale:kv_append_fp8" for FP8 pools, with the per-head scales
 * after the same arguments) launched by name with the same arguments on every backend (CUDA:
 * kernels/cuda/kv_cache/kv_append.cu; CPU: kv_append_reference.c, which also checks the page
 * table's contents before writing). */
#include <math.h>

#include "backend_impl.h"
#include "error.h"
#include "kv_cache_internal.h"
#include "metrale/launch.h"
#include "op_builtin.h"

#define WHAT "mg_kv_append"
#define THREADS 128u
#define MAX_BLOCKS 65535u
/* The CUDA kernel's items per thread and token (kItemsPerThread in kv_append.cu), and the token
 * count below which a thread takes one item, so that small batches (decode) spread over more
 * blocks. */
#define ITEMS_PER_THREAD 4u
#define FEW_TOKENS 1024u

/* A row stride (0: packed) of a [tokens] x row_elements BF16 matrix: at least the row and a
 * multiple of 8 (16-byte rows). */
static mg_status check_stride(const char *name, uint32_t row_elements, uint32_t *stride) {
    if (!*stride)
        *stride = row_elements;
    if (*stride < row_elements || *stride % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": %s row stride %u must be >= %u (heads x head_dim) and a multiple "
                             "of 8",
                        name, *stride, row_elements);
    return MG_OK;
}

static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_kv_append_cpu_kernels_register, MG_KV_APPEND_KERNEL);

static const mg_op_provider *const append_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_kv_append_op = {MG_OP_KV_APPEND, "kv_append", append_providers};

mg_status mg_kv_append_check(mg_backend *b, const mg_kv_cache_desc *cache,
                             const mg_kv_append_args *a) {
    mg_status st = mg_op_enter(b, WHAT);
    if (st || (st = mg_kv_cache_desc_check(cache, WHAT)))
        return st;
    if (!a)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": NULL arguments");
    if (!a->batch_size || a->batch_size > MG_KV_MAX_BATCH)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": batch_size %u must be in 1..%u",
                        a->batch_size, MG_KV_MAX_BATCH);
    if (a->num_tokens > (uint32_t)INT32_MAX || a->num_kv_indices > (uint32_t)INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": num_tokens %u / num_kv_indices %u exceed %d", a->num_tokens,
                        a->num_kv_indices, INT32_MAX);
    if (a->rope && !a->rope_inv_freq && (!isfinite(a->rope_theta) || !(a->rope_theta > 0.0f)))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": rope_theta %g must be finite and > 0",
                        (double)a->rope_theta);
    if (a->q && !a->rope)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": q is only for RoPE (set rope, or pass q = 0)");
    if (a->rope_inv_freq && !a->rope)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": rope_inv_freq is only for RoPE (set rope, or pass 0)");
    if (a->q && (!a->num_qo_heads || a->num_qo_heads > MG_KV_MAX_HEADS))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": num_qo_heads %u must be in 1..%u with q",
                        a->num_qo_heads, MG_KV_MAX_HEADS);
    const bool fp8 = cache->kv_dtype == MG_KV_FP8_E4M3;
    if (!fp8 && (a->k_scale || a->v_scale))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": k_scale / v_scale are for FP8 pools (kv_dtype MG_KV_FP8_E4M3); "
                             "pass 0 for BF16");
    const uint32_t row = cache->num_kv_heads * cache->head_dim;
    uint32_t k_stride = a->k_stride, v_stride = a->v_stride, q_stride = a->q_stride;
    const uint32_t qo_heads = a->q ? a->num_qo_heads : 0;
    size_t pool_bytes;
    if ((st = mg_kv_cache_bytes(cache, &pool_bytes)))
        return st;
    if (a->num_tokens &&
        ((st = check_stride("k", row, &k_stride)) || (st = check_stride("v", row, &v_stride)) ||
         (a->q && (st = check_stride("q", qo_heads * cache->head_dim, &q_stride)))))
        return st;
    /* The token tensors matter only with tokens; the FP8 scales' values are checked by the
     * CPU kernel only. The pages are the outputs: they overlap nothing. q is rewritten in
     * place but may share rows with k and v (one fused QKV matrix, strided), so it is checked
     * as an input. */
    const uint32_t tokens = a->num_tokens;
    const size_t heads = cache->num_kv_heads, batch = a->batch_size;
    const size_t q_cols = (size_t)qo_heads * cache->head_dim;
    const unsigned per_token = tokens ? MG_OP_IN : MG_OP_OPTIONAL; /* required with tokens */
    mg_op_tensor t[] = {
        {"k_scale", a->k_scale, heads * 4, 4, fp8 ? MG_OP_IN : MG_OP_OPTIONAL},
        {"v_scale", a->v_scale, heads * 4, 4, fp8 ? MG_OP_IN : MG_OP_OPTIONAL},
        {"k", tokens ? a->k : 0, mg_op_matrix_bytes(tokens, row, k_stride, 2), 16, per_token},
        {"v", tokens ? a->v : 0, mg_op_matrix_bytes(tokens, row, v_stride, 2), 16, per_token},
        {"q", tokens ? a->q : 0, mg_op_matrix_bytes(tokens, q_cols, q_stride, 2), 16,
         MG_OP_OPTIONAL},
        {"positions", tokens ? a->positions : 0, (size_t)tokens * 4, 4, MG_OP_OPTIONAL},
        {"qo_indptr", a->qo_indptr, (batch + 1) * 4, 4, MG_OP_IN},
        {"kv_indptr", a->kv_indptr, (batch + 1) * 4, 4, MG_OP_IN},
        {"kv_last_page_len", a->kv_last_page_len, batch * 4, 4, MG_OP_IN},
        {"kv_indices", a->kv_indices, (size_t)a->num_kv_indices * 4, 4,
         a->num_kv_indices ? MG_OP_IN : MG_OP_OPTIONAL},
        {"rope_inv_freq", a->rope_inv_freq, (size_t)cache->head_dim / 2 * 4, 4, MG_OP_OPTIONAL},
        {"k_pages", a->k_pages, pool_bytes / 2, 16, MG_OP_OUT},
        {"v_pages", a->v_pages, pool_bytes / 2, 16, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, WHAT, t, 13, -1, -1)))
        return st;
    const mg_op_provider *provider;
    return mg_op_choose(b, MG_OP_KV_APPEND, cache, WHAT, &provider);
}

mg_status mg_kv_append(mg_backend *b, mg_stream *s, const mg_kv_cache_desc *cache,
                       const mg_kv_append_args *a) {
    mg_status st = mg_kv_append_check(b, cache, a);
    if (st || !a->num_tokens)
        return st;
    const mg_op_provider *provider;
    if ((st = mg_op_choose(b, MG_OP_KV_APPEND, cache, WHAT, &provider)))
        return st;
    /* the checked values again (the checks above passed for them) */
    const bool fp8 = cache->kv_dtype == MG_KV_FP8_E4M3;
    const uint32_t row = cache->num_kv_heads * cache->head_dim;
    const uint32_t qo_heads = a->q ? a->num_qo_heads : 0;
    uint32_t k_stride = a->k_stride ? a->k_stride : row, v_stride = a->v_stride ? a->v_stride : row;
    uint32_t q_stride = a->q_stride ? a->q_stride : qo_heads * cache->head_dim;
    mg_launch l;
    /* Grid: tokens in x, slices of a token's items (8-element pairs of a head: K, V and q heads)
     * in y; see kv_append.cu. */
    const uint32_t blocks = a->num_tokens < MAX_BLOCKS ? a->num_tokens : MAX_BLOCKS;
    const uint32_t items = (2 * cache->num_kv_heads + qo_heads) * (cache->head_dim / 16);
    const uint32_t per_block = THREADS * (a->num_tokens < FEW_TOKENS ? 1u : ITEMS_PER_THREAD);
    const uint32_t slices = (items + per_block - 1) / per_block;
    mg_launch_init(&l, (mg_dim3){blocks, slices, 1}, (mg_dim3){THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, a->k);
    mg_launch_arg_ptr(&l, a->v);
    mg_launch_arg_ptr(&l, a->q);
    mg_launch_arg_ptr(&l, a->positions);
    mg_launch_arg_ptr(&l, a->qo_indptr);
    mg_launch_arg_ptr(&l, a->kv_indptr);
    mg_launch_arg_ptr(&l, a->kv_indices);
    mg_launch_arg_ptr(&l, a->kv_last_page_len);
    mg_launch_arg_ptr(&l, a->k_pages);
    mg_launch_arg_ptr(&l, a->v_pages);
    mg_launch_arg_u32(&l, a->batch_size);
    mg_launch_arg_u32(&l, a->num_tokens);
    mg_launch_arg_u32(&l, a->num_kv_indices);
    mg_launch_arg_u32(&l, cache->num_kv_heads);
    mg_launch_arg_u32(&l, qo_heads);
    mg_launch_arg_u32(&l, cache->head_dim);
    mg_launch_arg_u32(&l, mg_kv_page_size(cache->page_size));
    mg_launch_arg_u32(&l, cache->num_pages);
    mg_launch_arg_u32(&l, k_stride);
    mg_launch_arg_u32(&l, v_stride);
    mg_launch_arg_u32(&l, qo_heads ? q_stride : 0);
    mg_launch_arg_u32(&l, a->rope ? 1u : 0u);
    mg_launch_arg_f32(&l, a->rope ? a->rope_theta : 1.0f);
    mg_launch_arg_ptr(&l, a->rope ? a->rope_inv_freq : 0);
    if (fp8) {
        mg_launch_arg_ptr(&l, a->k_scale);
        mg_launch_arg_ptr(&l, a->v_scale);
    }
    const char *kernel = fp8 ? MG_KV_APPEND_FP8_KERNEL : MG_KV_APPEND_KERNEL;
    if ((st = mg_op_launch_kernels(b, s, &kernel, &l, 1)))
        return st;
    mg_op_count_call(b, MG_OP_KV_APPEND, provider, false);
    return MG_OK;
}
