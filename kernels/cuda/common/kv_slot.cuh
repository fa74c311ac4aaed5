// kv_slot.cuh - where a new token's key and value go in the paged KV cache, and its RoPE
// angles: the rules of mg_kv_append (metrale/ops_kv_cache.h) shared by the append kernel
// (kv_cache/kv_append.cu) and the decode GEMV's KV-append epilogue (gemm/decode_gemv.cu), so
// that both place and rotate a token identically.
#pragma once

#include <stdint.h>

// Token t of a batch whose requests' new tokens are qo_indptr[0..batch] (t < the planned
// total): its request, kv position (kv_len - qo_len + its index among the request's new
// tokens) and the first element of its row in a pool of [num_pages][page_size][kv_heads x
// head_dim] (*row, in elements, times kv_row_elements). False when the table puts it out of
// range (a bad position, page entry or page id): such a token is not appended.
__device__ __forceinline__ bool kv_token_slot(uint32_t t, uint32_t batch, const int32_t *qo_indptr,
                                              const int32_t *kv_indptr, const int32_t *kv_indices,
                                              const int32_t *kv_last_page_len,
                                              uint32_t num_kv_indices, uint32_t num_pages,
                                              uint32_t page_size, uint32_t kv_row_elements,
                                              size_t *row, int64_t *position) {
    uint32_t lo_r = 0, hi_r = batch;
    while (hi_r - lo_r > 1) {
        const uint32_t mid = (lo_r + hi_r) / 2;
        if ((uint32_t)qo_indptr[mid] <= t)
            lo_r = mid;
        else
            hi_r = mid;
    }
    const uint32_t r = lo_r;
    const int64_t qo_len = qo_indptr[r + 1] - qo_indptr[r];
    const int64_t num_req_pages = kv_indptr[r + 1] - kv_indptr[r];
    const int64_t kv_len =
        num_req_pages > 0 ? (num_req_pages - 1) * page_size + kv_last_page_len[r] : 0;
    const int64_t pos = kv_len - qo_len + ((int64_t)t - qo_indptr[r]);
    if (pos < 0 || pos >= kv_len || t >= (uint32_t)qo_indptr[r + 1])
        return false;
    const int64_t entry = kv_indptr[r] + pos / page_size;
    if (entry < 0 || entry >= (int64_t)num_kv_indices)
        return false;
    const int32_t page = kv_indices[entry];
    if (page < 0 || (uint32_t)page >= num_pages)
        return false;
    *row = ((size_t)page * page_size + (size_t)(pos % page_size)) * kv_row_elements;
    *position = pos;
    return true;
}

// RoPE's cos and sin for frequency index i (< head_dim / 2) at `position`: Llama's
// rotate-half pairs (i, i + head_dim / 2) turn by position * f_i, f_i = inv_freq[i] when the
// caller gives a table (a scaled RoPE), else theta^(-2i / head_dim).
__device__ __forceinline__ void kv_rope_angle(float position, uint32_t i, uint32_t head_dim,
                                              float rope_theta, const float *inv_freq_table,
                                              float *c, float *s) {
    const float inv_freq =
        inv_freq_table ? inv_freq_table[i] : powf(rope_theta, -(float)(2 * i) / (float)head_dim);
    sincosf(position * inv_freq, s, c);
}
