// kv_append.cu - mg_kv_append (metrale/ops_kv_cache.h): new tokens' keys and values into their
// pages of the paged KV cache, with optional Llama rotate-half RoPE on q (in place) and k.
//
// One block per token (grid-stride over tokens). A thread moves 8 consecutive elements of the
// first half of a head together with the 8 matching elements of its second half (two 16-byte
// loads and stores), so RoPE's pairs (i, i + D/2) meet in one thread; head_dim is a multiple of
// 16 and every row start 16-byte aligned (the front checks). The request of a token is found by
// binary search in qo_indptr. A token whose page entry is out of range (a bad table; the CPU
// backend refuses those before writing) is skipped: nothing is written outside the pool.
// Same argument list as the CPU reference (src/ops/kv_cache/kv_append_reference.c).
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ void unpack(const uint4 &raw, float out[8]) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ uint4 pack(const float in[8]) {
    uint4 raw;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    return raw;
}

// Moves elements [i0, i0 + 8) and [i0 + D/2, i0 + D/2 + 8) of one head from src to dst (which
// may alias), rotating them at `position` when `rope`.
__device__ __forceinline__ void move_pair(const __nv_bfloat16 *src, __nv_bfloat16 *dst,
                                          uint32_t d, uint32_t i0, bool rope, float position,
                                          float theta) {
    const uint32_t half = d / 2;
    uint4 lo_raw = *reinterpret_cast<const uint4 *>(src + i0);
    uint4 hi_raw = *reinterpret_cast<const uint4 *>(src + i0 + half);
    if (rope) {
        float lo[8], hi[8];
        unpack(lo_raw, lo);
        unpack(hi_raw, hi);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const float inv_freq = powf(theta, -(float)(2 * (i0 + u)) / (float)d);
            float s, c;
            sincosf(position * inv_freq, &s, &c);
            const float x0 = lo[u], x1 = hi[u];
            lo[u] = x0 * c - x1 * s;
            hi[u] = x1 * c + x0 * s;
        }
        lo_raw = pack(lo);
        hi_raw = pack(hi);
    }
    *reinterpret_cast<uint4 *>(dst + i0) = lo_raw;
    *reinterpret_cast<uint4 *>(dst + i0 + half) = hi_raw;
}

} // namespace

extern "C" __global__ void __launch_bounds__(128)
    kv_append(const __nv_bfloat16 *k_src, const __nv_bfloat16 *v_src, __nv_bfloat16 *q,
              const int32_t *positions, const int32_t *qo_indptr, const int32_t *kv_indptr,
              const int32_t *kv_indices, const int32_t *kv_last_page_len, __nv_bfloat16 *k_pages,
              __nv_bfloat16 *v_pages, uint32_t batch, uint32_t num_tokens, uint32_t num_kv_indices,
              uint32_t num_kv_heads, uint32_t num_qo_heads, uint32_t head_dim, uint32_t page_size,
              uint32_t num_pages, uint32_t k_stride, uint32_t v_stride, uint32_t q_stride,
              uint32_t rope, float rope_theta) {
    const uint32_t pairs = head_dim / 16; // 8-element groups per half head
    // num_tokens is the rows' capacity; the batch's own count is read here, so a captured
    // launch serves every later batch within the capacity.
    const int32_t planned = qo_indptr[batch];
    const uint32_t tokens = planned < 0 ? 0u : min(num_tokens, (uint32_t)planned);
    for (uint32_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        // The request r with qo_indptr[r] <= t < qo_indptr[r + 1] (skipping empty requests).
        uint32_t lo = 0, hi = batch;
        while (hi - lo > 1) {
            const uint32_t mid = (lo + hi) / 2;
            if ((uint32_t)qo_indptr[mid] <= t)
                lo = mid;
            else
                hi = mid;
        }
        const uint32_t r = lo;
        const int64_t qo_len = qo_indptr[r + 1] - qo_indptr[r];
        const int64_t pages = kv_indptr[r + 1] - kv_indptr[r];
        const int64_t kv_len = pages > 0 ? (pages - 1) * page_size + kv_last_page_len[r] : 0;
        const int64_t pos = kv_len - qo_len + ((int64_t)t - qo_indptr[r]);
        if (pos < 0 || pos >= kv_len || (uint32_t)t >= (uint32_t)qo_indptr[r + 1])
            continue;
        const int64_t entry = kv_indptr[r] + pos / page_size;
        if (entry < 0 || entry >= (int64_t)num_kv_indices)
            continue;
        const int32_t page = kv_indices[entry];
        if (page < 0 || (uint32_t)page >= num_pages)
            continue;
        const size_t dst =
            ((size_t)page * page_size + (size_t)(pos % page_size)) * num_kv_heads * head_dim;
        const float position = positions ? (float)positions[t] : (float)pos;
        const uint32_t kv_items = num_kv_heads * pairs;
        const uint32_t items = 2 * kv_items + num_qo_heads * pairs;
        for (uint32_t i = threadIdx.x; i < items; i += blockDim.x) {
            if (i < kv_items) {
                const uint32_t h = i / pairs, i0 = (i % pairs) * 8;
                move_pair(k_src + (size_t)t * k_stride + (size_t)h * head_dim,
                          k_pages + dst + (size_t)h * head_dim, head_dim, i0, rope != 0, position,
                          rope_theta);
            } else if (i < 2 * kv_items) {
                const uint32_t j = i - kv_items, h = j / pairs, i0 = (j % pairs) * 8;
                move_pair(v_src + (size_t)t * v_stride + (size_t)h * head_dim,
                          v_pages + dst + (size_t)h * head_dim, head_dim, i0, false, 0.0f,
                          rope_theta);
            } else {
                const uint32_t j = i - 2 * kv_items, h = j / pairs, i0 = (j % pairs) * 8;
                __nv_bfloat16 *row = q + (size_t)t * q_stride + (size_t)h * head_dim;
                move_pair(row, row, head_dim, i0, rope != 0, position, rope_theta);
            }
        }
    }
}
