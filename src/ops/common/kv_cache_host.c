/* kv_cache_host.c - the paged KV cache's limits and host-side checks (kv_cache_host.h). */
#include "kv_cache_host.h"

#include <math.h>

#include "error.h"
#include "op_builtin.h"

#define APPEND "mg_kv_append"

mg_status mg_kv_cache_desc_check(const mg_kv_cache_desc *d, const char *fn) {
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL cache descriptor", fn);
    if (!d->num_kv_heads || d->num_kv_heads > MG_KV_MAX_HEADS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: num_kv_heads %u must be in 1..%u", fn,
                        d->num_kv_heads, MG_KV_MAX_HEADS);
    if (!d->head_dim || d->head_dim % 16 || d->head_dim > MG_KV_MAX_HEAD_DIM)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: head_dim %u must be a positive multiple of 16 up to %u", fn,
                        d->head_dim, MG_KV_MAX_HEAD_DIM);
    if (d->page_size > MG_KV_PAGE_SIZE_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: page_size %u must be in 1..%u (0: %u)", fn,
                        d->page_size, MG_KV_PAGE_SIZE_MAX, MG_KV_PAGE_SIZE_DEFAULT);
    if (!d->num_pages || d->num_pages > (uint32_t)INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: num_pages %u must be in 1..%d", fn,
                        d->num_pages, INT32_MAX);
    if (!mg_kv_dtype_bytes(d->kv_dtype))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: kv_dtype %d must be MG_KV_BF16 (0) or MG_KV_FP8_E4M3 (1)", fn,
                        (int)d->kv_dtype);
    return MG_OK;
}

uint32_t mg_kv_page_size(uint32_t page_size) {
    return page_size ? page_size : MG_KV_PAGE_SIZE_DEFAULT;
}

int64_t mg_kv_len(const int32_t *kv_indptr, const int32_t *last_page_len, uint32_t page_size,
                  uint32_t request) {
    int64_t pages = (int64_t)kv_indptr[request + 1] - kv_indptr[request];
    return pages ? (pages - 1) * page_size + last_page_len[request] : 0;
}

/* A row stride (0: packed) of a [tokens] x row_elements BF16 matrix: at least the row and a
 * multiple of 8 (16-byte rows). */
static mg_status check_stride(const char *name, uint32_t row_elements, uint32_t *stride) {
    if (!*stride)
        *stride = row_elements;
    if (*stride < row_elements || *stride % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        APPEND ": %s row stride %u must be >= %u (heads x head_dim) and a multiple "
                               "of 8",
                        name, *stride, row_elements);
    return MG_OK;
}

mg_status mg_kv_append_check(mg_backend *b, const mg_kv_cache_desc *cache,
                             const mg_kv_append_args *a) {
    mg_status st = mg_op_enter(b, APPEND);
    if (st || (st = mg_kv_cache_desc_check(cache, APPEND)))
        return st;
    if (!a)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, APPEND ": NULL arguments");
    if (!a->batch_size || a->batch_size > MG_KV_MAX_BATCH)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, APPEND ": batch_size %u must be in 1..%u",
                        a->batch_size, MG_KV_MAX_BATCH);
    if (a->num_tokens > (uint32_t)INT32_MAX || a->num_kv_indices > (uint32_t)INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        APPEND ": num_tokens %u / num_kv_indices %u exceed %d", a->num_tokens,
                        a->num_kv_indices, INT32_MAX);
    if (a->rope && !a->rope_inv_freq && (!isfinite(a->rope_theta) || !(a->rope_theta > 0.0f)))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, APPEND ": rope_theta %g must be finite and > 0",
                        (double)a->rope_theta);
    if (a->q && !a->rope)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        APPEND ": q is only for RoPE (set rope, or pass q = 0)");
    if (a->rope_inv_freq && !a->rope)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        APPEND ": rope_inv_freq is only for RoPE (set rope, or pass 0)");
    if (a->q && (!a->num_qo_heads || a->num_qo_heads > MG_KV_MAX_HEADS))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, APPEND ": num_qo_heads %u must be in 1..%u with q",
                        a->num_qo_heads, MG_KV_MAX_HEADS);
    const bool fp8 = cache->kv_dtype == MG_KV_FP8_E4M3;
    if (!fp8 && (a->k_scale || a->v_scale))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        APPEND ": k_scale / v_scale are for FP8 pools (kv_dtype MG_KV_FP8_E4M3); "
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
    if ((st = mg_op_check_tensors(b, APPEND, t, 13, -1, -1)))
        return st;
    const mg_op_provider *provider;
    return mg_op_choose(b, MG_OP_KV_APPEND, cache, APPEND, &provider);
}
