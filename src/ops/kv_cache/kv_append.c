/* kv_append.c - mg_kv_append (metrale/ops_kv_cache.h): every argument checked once, then the
 * kernel "metrale:kv_append" ("metrale:kv_append_fp8" for FP8 pools, with the per-head scales
 * after the same arguments) launched by name with the same arguments on every backend (CUDA:
 * kernels/cuda/kv_cache/kv_append.cu; CPU: kv_append_reference.c, which also checks the page
 * table's contents before writing). */
#include <math.h>
#include <stdio.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "kv_cache_internal.h"
#include "metrale/launch.h"
#include "op_cache.h"
#include "op_builtin.h"
#include "op_registry.h"

#define WHAT "mg_kv_append"
#define THREADS 128u
#define MAX_BLOCKS 65535u
/* The CUDA kernel's items per thread and token (kItemsPerThread in kv_append.cu), and the token
 * count below which a thread takes one item, so that small batches (decode) spread over more
 * blocks. */
#define ITEMS_PER_THREAD 4u
#define FEW_TOKENS 1024u

static mg_status check_pointer(const char *name, mg_devptr p, uint32_t alignment) {
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s is null", name);
    if (p % alignment)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s 0x%llx is not %u-byte aligned", name,
                        (unsigned long long)p, alignment);
    return MG_OK;
}

/* A [rows] x row_elements BF16 matrix with row stride `stride` (0: packed) inside one live
 * allocation; the stride a multiple of 8 (16-byte rows). */
static mg_status check_rows(mg_backend *b, const char *name, mg_devptr p, uint32_t rows,
                            uint32_t row_elements, uint32_t *stride) {
    if (!*stride)
        *stride = row_elements;
    if (*stride < row_elements || *stride % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": %s row stride %u must be >= %u (heads x head_dim) and a multiple "
                             "of 8",
                        name, *stride, row_elements);
    mg_status st = check_pointer(name, p, 16);
    size_t bytes;
    if (!st && !mg_matrix_span_bytes(rows, row_elements, *stride, 2, &bytes))
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s spans more than the address space",
                      name);
    return st ? st : mg_backend_check_device_range(b, p, bytes, WHAT, name);
}

static mg_status check_ints(mg_backend *b, const char *name, mg_devptr p, uint64_t count) {
    mg_status st = check_pointer(name, p, 4);
    return st ? st : mg_backend_check_device_range(b, p, 4 * count, WHAT, name);
}

static bool kernels_available(mg_backend *b, char *reason, size_t reason_bytes) {
    return mg_op_builtin_available(b, MG_KV_APPEND_KERNEL, mg_kv_append_cpu_kernels_register, reason, reason_bytes);
}

static const mg_op_provider kernels_provider = {
    .name = "kernels", .backend = MG_OP_ANY_BACKEND, .available = kernels_available};

static const mg_op_provider *const append_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_kv_append_op = {MG_OP_KV_APPEND, "kv_append", append_providers};

mg_status mg_kv_append(mg_backend *b, mg_stream *s, const mg_kv_cache_desc *cache,
                       const mg_kv_append_args *a) {
    if (!mg_backend_is_live(b))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": NULL, invalid or closed backend %p",
                        (void *)b);
    mg_status st = mg_kv_cache_desc_check(cache, WHAT);
    if (st)
        return st;
    if (!a)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": NULL arguments");
    if (!a->batch_size || a->batch_size > MG_KV_MAX_BATCH)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": batch_size %u must be in 1..%u",
                        a->batch_size, MG_KV_MAX_BATCH);
    if (a->num_tokens > (uint32_t)INT32_MAX || a->num_kv_indices > (uint32_t)INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": num_tokens %u / num_kv_indices %u exceed %d",
                        a->num_tokens, a->num_kv_indices, INT32_MAX);
    if (a->rope && (!isfinite(a->rope_theta) || !(a->rope_theta > 0.0f)))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": rope_theta %g must be finite and > 0",
                        (double)a->rope_theta);
    if (a->q && !a->rope)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": q is only for RoPE (set rope, or pass q = 0)");
    if (a->q && (!a->num_qo_heads || a->num_qo_heads > MG_KV_MAX_HEADS))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": num_qo_heads %u must be in 1..%u with q",
                        a->num_qo_heads, MG_KV_MAX_HEADS);
    /* FP8 pools: the per-head scales (their values are checked by the CPU kernel only). */
    const bool fp8 = cache->kv_dtype == MG_KV_FP8_E4M3;
    if (fp8 && ((st = check_ints(b, "k_scale", a->k_scale, cache->num_kv_heads)) ||
                (st = check_ints(b, "v_scale", a->v_scale, cache->num_kv_heads))))
        return st;
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
        ((st = check_rows(b, "k", a->k, a->num_tokens, row, &k_stride)) ||
         (st = check_rows(b, "v", a->v, a->num_tokens, row, &v_stride)) ||
         (a->q && (st = check_rows(b, "q", a->q, a->num_tokens, qo_heads * cache->head_dim,
                                   &q_stride))) ||
         (a->positions && (st = check_ints(b, "positions", a->positions, a->num_tokens)))))
        return st;
    if ((st = check_ints(b, "qo_indptr", a->qo_indptr, a->batch_size + 1ull)) ||
        (st = check_ints(b, "kv_indptr", a->kv_indptr, a->batch_size + 1ull)) ||
        (st = check_ints(b, "kv_last_page_len", a->kv_last_page_len, a->batch_size)) ||
        (a->num_kv_indices && (st = check_ints(b, "kv_indices", a->kv_indices, a->num_kv_indices))) ||
        (st = check_pointer("k_pages", a->k_pages, 16)) ||
        (st = check_pointer("v_pages", a->v_pages, 16)) ||
        (st = mg_backend_check_device_range(b, a->k_pages, pool_bytes / 2, WHAT, "k_pages")) ||
        (st = mg_backend_check_device_range(b, a->v_pages, pool_bytes / 2, WHAT, "v_pages")))
        return st;
    const mg_op_provider *provider;
    if ((st = mg_op_choose(b, MG_OP_KV_APPEND, cache, WHAT, &provider)))
        return st;
    if (!a->num_tokens)
        return MG_OK;
    mg_op_cache *opc = mg_backend_op_cache(b);
    if (!opc)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": invalid or closed backend");
    mg_kv_append_cpu_kernels_register();
    mg_kernel *kernel;
    if ((st = mg_op_cache_kernel(opc, "metrale", fp8 ? MG_KV_APPEND_FP8_KERNEL : MG_KV_APPEND_KERNEL,
                                 false, &kernel)))
        return st;
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
    if (fp8) {
        mg_launch_arg_ptr(&l, a->k_scale);
        mg_launch_arg_ptr(&l, a->v_scale);
    }
    if ((st = mg_launch_run(b, kernel, s, &l)))
        return st;
    mg_op_count_call(b, MG_OP_KV_APPEND, provider, false);
    return MG_OK;
}
