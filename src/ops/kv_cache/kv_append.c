/* kv_append.c - mg_kv_append (metrale/ops_kv_cache.h): every argument checked once, then the
 * kernel "metrale:kv_append" ("metrale:kv_append_fp8" for FP8 pools, with the per-head scales
 * after the same arguments) launched by name with the same arguments on every backend (CUDA:
 * kernels/cuda/kv_cache/kv_append.cu; CPU: kv_append_reference.c, which also checks the page
 * table's contents before writing). The checks are mg_kv_append_check (kv_cache_host.h), which the
 * GEMM's KV-append epilogue makes too. */
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

static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_kv_append_cpu_kernels_register, MG_KV_APPEND_KERNEL);

static const mg_op_provider *const append_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_kv_append_op = {MG_OP_KV_APPEND, "kv_append", append_providers};

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
