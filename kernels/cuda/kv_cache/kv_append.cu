// kv_append.cu - mg_kv_append (metrale/ops_kv_cache.h): new tokens' keys and values into their
// pages of the paged KV cache, with optional Llama rotate-half RoPE on q (in place) and k.
//
// The work of a token is a list of items: an item is 8 consecutive elements of the first half
// of one head together with the 8 matching elements of its second half (two 16-byte loads and
// two 16-byte stores), so RoPE's pairs (i, i + D/2) meet in one thread. Items are numbered K
// heads first, then V heads, then q heads, head_dim / 16 items per head, so consecutive lanes
// of a warp move consecutive 16-byte pieces of a row. The grid is (token, item slice): block
// (x, y) takes tokens x, x + gridDim.x, ... and, of each, the items y * blockDim.x + threadIdx.x
// + k * blockDim.x * gridDim.y; the front sizes gridDim.y so that a thread holds up to
// kItemsPerThread items (up to 64 bytes in flight per load round) and small batches still fill
// the GPU.
//
// Bandwidth: a thread issues all its loads for a token before anything else (they depend only
// on the token's row), so the page-table walk (binary search of the request in qo_indptr, then
// kv_indptr, kv_last_page_len, kv_indices) overlaps them. RoPE's cos and sin depend only on
// (position, frequency), so the block computes them once per token into shared memory
// (head_dim / 2 pairs) and every K and q head reuses them: the same powf, sincosf and
// x0 cos - x1 sin, x1 cos + x0 sin as before, once per element.
//
// head_dim is a multiple of 16 up to 512 and every row start 16-byte aligned (the front checks).
// A token whose page entry is out of range (a bad table; the CPU backend refuses those before
// writing) is skipped: nothing is written outside the pool.
// FP8 E4M3 pools (kv_append_fp8: the same arguments, then the FP32 per-head scales k_scale and
// v_scale): K (rotated in FP32) and V are stored as e4m3(x / scale[h]), IEEE FP32 division then
// round to nearest even saturating to +-448 (cvt.rn.satfinite), 8 bytes per half item.
// Same argument lists as the CPU reference (src/ops/kv_cache/kv_append_reference.c).
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/fp8_e4m3.cuh"
#include "common/grid_dependency.cuh"
#include "common/kv_slot.cuh"

namespace {

constexpr uint32_t kMaxHalfDim = 256; // head_dim up to 512
constexpr uint32_t kItemsPerThread = 4;

__device__ __forceinline__ void unpack(const uint4 &raw, float out[8]) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = mg_num_bf16_low(words[i]);
        out[2 * i + 1] = mg_num_bf16_high(words[i]);
    }
}

__device__ __forceinline__ uint4 pack(const float in[8]) {
    return make_uint4(mg_num_bf16_pack(in[0], in[1]), mg_num_bf16_pack(in[2], in[3]),
                      mg_num_bf16_pack(in[4], in[5]), mg_num_bf16_pack(in[6], in[7]));
}

// Rotates elements [i0, i0 + 8) (lo) and [i0 + D/2, i0 + D/2 + 8) (hi) of one head with the
// block's table of cos and sin per frequency index.
__device__ __forceinline__ void rotate(float lo[8], float hi[8], uint32_t i0, const float *cos_t,
                                       const float *sin_t) {
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const float c = cos_t[i0 + u], s = sin_t[i0 + u];
        const float x0 = lo[u], x1 = hi[u];
        lo[u] = x0 * c - x1 * s;
        hi[u] = x1 * c + x0 * s;
    }
}

// 8 FP32 values as 8 E4M3 codes of value / scale.
__device__ __forceinline__ uint2 quantize(const float x[8], float scale) {
    uint2 raw;
    uint8_t *b = reinterpret_cast<uint8_t *>(&raw);
#pragma unroll
    for (int u = 0; u < 8; u++)
        b[u] = (uint8_t)mg_num_f32_to_fp8_e4m3(x[u] / scale);
    return raw;
}

// The pool element type: BF16 (Pool = __nv_bfloat16) or FP8 E4M3 codes (Pool = uint8_t).
template <typename Pool>
__device__ __forceinline__ void
append_rows(const __nv_bfloat16 *k_src, const __nv_bfloat16 *v_src, __nv_bfloat16 *q,
            const int32_t *positions, const int32_t *qo_indptr, const int32_t *kv_indptr,
            const int32_t *kv_indices, const int32_t *kv_last_page_len, Pool *k_pages,
            Pool *v_pages, uint32_t batch, uint32_t num_tokens, uint32_t num_kv_indices,
            uint32_t num_kv_heads, uint32_t num_qo_heads, uint32_t head_dim, uint32_t page_size,
            uint32_t num_pages, uint32_t k_stride, uint32_t v_stride, uint32_t q_stride,
            uint32_t rope, float rope_theta, const float *rope_inv_freq, const float *k_scale,
            const float *v_scale) {
    constexpr bool kFp8 = sizeof(Pool) == 1;
    __shared__ __align__(16) float cos_t[kMaxHalfDim];
    __shared__ __align__(16) float sin_t[kMaxHalfDim];
    const uint32_t half = head_dim / 2;
    const uint32_t pairs = head_dim / 16; // items per head
    const uint32_t kv_items = num_kv_heads * pairs;
    const uint32_t items = 2 * kv_items + num_qo_heads * pairs;
    const uint32_t item_stride = blockDim.x * gridDim.y;
    const uint32_t first_item = blockIdx.y * blockDim.x + threadIdx.x;
    if (blockIdx.y * blockDim.x >= items || half > kMaxHalfDim)
        return; // the whole block: no item of any token (uniform, before any barrier)
    // num_tokens is the rows' capacity; the batch's own count is read here, so a captured
    // launch serves every later batch within the capacity.
    const int32_t planned = qo_indptr[batch];
    const uint32_t tokens = planned < 0 ? 0u : min(num_tokens, (uint32_t)planned);
    for (uint32_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        for (uint32_t base = first_item; base - threadIdx.x < items;
             base += kItemsPerThread * item_stride) {
            // 1. The loads: they depend only on the token's rows.
            uint4 lo[kItemsPerThread], hi[kItemsPerThread];
#pragma unroll
            for (uint32_t u = 0; u < kItemsPerThread; u++) {
                const uint32_t i = base + u * item_stride;
                if (i >= items)
                    continue;
                const __nv_bfloat16 *src;
                uint32_t j;
                if (i < kv_items) {
                    j = i;
                    src = k_src + (size_t)t * k_stride;
                } else if (i < 2 * kv_items) {
                    j = i - kv_items;
                    src = v_src + (size_t)t * v_stride;
                } else {
                    j = i - 2 * kv_items;
                    src = q + (size_t)t * q_stride;
                }
                src += (size_t)(j / pairs) * head_dim + (j % pairs) * 8;
                lo[u] = *reinterpret_cast<const uint4 *>(src);
                hi[u] = *reinterpret_cast<const uint4 *>(src + half);
            }
            // 2. The token's request, position and page (the same for the whole block).
            size_t dst;
            int64_t pos;
            if (!kv_token_slot(t, batch, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                               num_kv_indices, num_pages, page_size, num_kv_heads * head_dim, &dst,
                               &pos))
                break; // uniform: every thread of the block skips this token
            // 3. RoPE's table for this token's position, once per block. The first barrier
            // keeps it from overwriting the table while a previous round still reads it.
            if (rope) {
                const float position = positions ? (float)positions[t] : (float)pos;
                __syncthreads();
                for (uint32_t i = threadIdx.x; i < half; i += blockDim.x)
                    kv_rope_angle(position, i, head_dim, rope_theta, rope_inv_freq, &cos_t[i],
                                  &sin_t[i]);
                __syncthreads();
            }
            // 4. Rotate (K and q heads) and store.
#pragma unroll
            for (uint32_t u = 0; u < kItemsPerThread; u++) {
                const uint32_t i = base + u * item_stride;
                if (i >= items)
                    continue;
                const bool is_k = i < kv_items, is_q = i >= 2 * kv_items, is_v = !is_k && !is_q;
                const uint32_t j = is_k ? i : is_q ? i - 2 * kv_items : i - kv_items;
                const uint32_t h = j / pairs, i0 = (j % pairs) * 8;
                const size_t offset = (size_t)h * head_dim + i0;
                const bool rotated = rope != 0 && !is_v;
                if constexpr (kFp8) {
                    if (!is_q) {
                        // A K or V head of the FP8 pool: quantized with its head's scale.
                        float x_lo[8], x_hi[8];
                        unpack(lo[u], x_lo);
                        unpack(hi[u], x_hi);
                        if (rotated)
                            rotate(x_lo, x_hi, i0, cos_t, sin_t);
                        const float scale = is_k ? k_scale[h] : v_scale[h];
                        Pool *pool = (is_k ? k_pages : v_pages) + dst + offset;
                        *reinterpret_cast<uint2 *>(pool) = quantize(x_lo, scale);
                        *reinterpret_cast<uint2 *>(pool + half) = quantize(x_hi, scale);
                        continue;
                    }
                }
                if (rotated) {
                    float x_lo[8], x_hi[8];
                    unpack(lo[u], x_lo);
                    unpack(hi[u], x_hi);
                    rotate(x_lo, x_hi, i0, cos_t, sin_t);
                    lo[u] = pack(x_lo);
                    hi[u] = pack(x_hi);
                }
                __nv_bfloat16 *out =
                    is_q ? q + (size_t)t * q_stride + offset
                         : reinterpret_cast<__nv_bfloat16 *>(is_k ? k_pages : v_pages) + dst +
                               offset;
                *reinterpret_cast<uint4 *>(out) = lo[u];
                *reinterpret_cast<uint4 *>(out + half) = hi[u];
            }
        }
    }
}

} // namespace

extern "C" __global__ void __launch_bounds__(128)
    kv_append(const __nv_bfloat16 *k_src, const __nv_bfloat16 *v_src, __nv_bfloat16 *q,
              const int32_t *positions, const int32_t *qo_indptr, const int32_t *kv_indptr,
              const int32_t *kv_indices, const int32_t *kv_last_page_len, __nv_bfloat16 *k_pages,
              __nv_bfloat16 *v_pages, uint32_t batch, uint32_t num_tokens, uint32_t num_kv_indices,
              uint32_t num_kv_heads, uint32_t num_qo_heads, uint32_t head_dim, uint32_t page_size,
              uint32_t num_pages, uint32_t k_stride, uint32_t v_stride, uint32_t q_stride,
              uint32_t rope, float rope_theta, const float *rope_inv_freq) {
    grid_dependency_wait();
    launch_dependents();
    append_rows(k_src, v_src, q, positions, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                k_pages, v_pages, batch, num_tokens, num_kv_indices, num_kv_heads, num_qo_heads,
                head_dim, page_size, num_pages, k_stride, v_stride, q_stride, rope, rope_theta,
                rope_inv_freq, nullptr, nullptr);
}

extern "C" __global__ void __launch_bounds__(128)
    kv_append_fp8(const __nv_bfloat16 *k_src, const __nv_bfloat16 *v_src, __nv_bfloat16 *q,
                  const int32_t *positions, const int32_t *qo_indptr, const int32_t *kv_indptr,
                  const int32_t *kv_indices, const int32_t *kv_last_page_len, uint8_t *k_pages,
                  uint8_t *v_pages, uint32_t batch, uint32_t num_tokens, uint32_t num_kv_indices,
                  uint32_t num_kv_heads, uint32_t num_qo_heads, uint32_t head_dim,
                  uint32_t page_size, uint32_t num_pages, uint32_t k_stride, uint32_t v_stride,
                  uint32_t q_stride, uint32_t rope, float rope_theta, const float *rope_inv_freq,
                  const float *k_scale, const float *v_scale) {
    grid_dependency_wait();
    launch_dependents();
    append_rows(k_src, v_src, q, positions, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                k_pages, v_pages, batch, num_tokens, num_kv_indices, num_kv_heads, num_qo_heads,
                head_dim, page_size, num_pages, k_stride, v_stride, q_stride, rope, rope_theta,
                rope_inv_freq, k_scale, v_scale);
}
