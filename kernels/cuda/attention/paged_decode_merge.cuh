// paged_decode_merge.cuh - what the split-KV decode kernels share (paged_decode_mma.cu for BF16
// pools, paged_decode.cu for FP8 pools): the parameter block with typed pointers, the schedule
// and its items, and the end of an item: merging the CTA's warps, then writing
// the output, or a partial result that the last CTA of the item's merge group combines.
//
// Merging split chunks in the launch: each chunk of a group of more than one writes its
// unnormalized output and (max, sum) per row to its partial slot, fences, and counts itself in
// the group's counter; the CTA that brings the count to the group's size reads every chunk's
// partials (through L2: __ldcg), writes the output and resets the counter to zero for the next
// launch. No CTA waits for another, so any grid size and order is safe.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/copy_async.cuh"
#include "common/paged_decode_abi.h"

namespace mg_decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ float fast_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// n / d for n < 2^31 with the host's magic numbers for d (attention_paged_decode.c).
__device__ __forceinline__ uint32_t fast_div(uint32_t n, uint32_t mul, uint32_t shift) {
    return (__umulhi(n, mul) + n) >> shift;
}

// The parameter block with typed pointers.
struct Args {
    const __nv_bfloat16 *q;
    __nv_bfloat16 *o;
    float *lse;
    const void *k_pages, *v_pages;
    const int32_t *kv_indices;
    const float *k_scale, *v_scale;
    float *partial_o;
    float2 *partial_ml;
    uint32_t *counters;
    uint32_t num_qo_heads, num_kv_heads, page_size, page_div_mul, page_div_shift;
    int32_t window_left;
    float sm_scale, soft_cap;

    __device__ explicit Args(const mg_decode_params &p)
        : q(reinterpret_cast<const __nv_bfloat16 *>(p.q)),
          o(reinterpret_cast<__nv_bfloat16 *>(p.o)), lse(reinterpret_cast<float *>(p.lse)),
          k_pages(reinterpret_cast<const void *>(p.k_pages)),
          v_pages(reinterpret_cast<const void *>(p.v_pages)),
          kv_indices(reinterpret_cast<const int32_t *>(p.kv_indices)),
          k_scale(reinterpret_cast<const float *>(p.k_scale)),
          v_scale(reinterpret_cast<const float *>(p.v_scale)),
          partial_o(reinterpret_cast<float *>(p.partial_o)),
          partial_ml(reinterpret_cast<float2 *>(p.partial_ml)),
          counters(reinterpret_cast<uint32_t *>(p.counters)), num_qo_heads(p.num_qo_heads),
          num_kv_heads(p.num_kv_heads), page_size(p.page_size), page_div_mul(p.page_div_mul),
          page_div_shift(p.page_div_shift), window_left(p.window_left), sm_scale(p.sm_scale),
          soft_cap(p.soft_cap) {}
};

// The schedule in device memory (layout: paged_decode_abi.h).
struct Schedule {
    int num_items;
    const mg_decode_item *items;
};

__device__ __forceinline__ Schedule schedule_of(const mg_decode_params &params) {
    const int32_t *s = reinterpret_cast<const int32_t *>(params.schedule);
    Schedule sched;
    sched.num_items = s[0];
    sched.items = reinterpret_cast<const mg_decode_item *>(s + MG_DECODE_ITEMS_OFFSET);
    return sched;
}

// One work item with its request's numbers.
struct Item {
    int row_begin, token_begin, token_end, chunk, num_chunks, partial_slot;
    int qo_begin, qo_len, kv_len, page_begin, group_size, rows_total;
    int rows; // rows of the block that exist (the last block of a request may be partial)
    uint32_t kv_head;

    // Row index (token * Hq + head) of the request's row `row` in q and o.
    __device__ __forceinline__ size_t q_offset(const Args &p, int row) const {
        const int token = row / group_size;
        return (size_t)(qo_begin + token) * p.num_qo_heads + kv_head * group_size +
               row % group_size;
    }
    // The keys row `row` sees: [lo, hi] (hi = -1: none, for rows past the request's).
    __device__ __forceinline__ void row_range(const Args &p, int row, int &lo, int &hi) const {
        if (row >= rows_total) {
            lo = 0, hi = -1;
            return;
        }
        hi = kv_len - qo_len + row / group_size;
        lo = p.window_left >= 0 ? max(0, hi - p.window_left) : 0;
    }
};

__device__ __forceinline__ Item load_item(const Args &p, const Schedule &sched, int index,
                                          uint32_t kv_head) {
    // Three independent 16-byte loads (mg_decode_item's words, in order).
    static_assert(sizeof(mg_decode_item) == 3 * sizeof(int4), "an item is three int4");
    const int4 *raw = reinterpret_cast<const int4 *>(sched.items + index);
    const int4 w0 = raw[0], w1 = raw[1], w2 = raw[2];
    Item it;
    it.row_begin = w0.x;
    it.token_begin = w0.y;
    it.token_end = w0.z;
    it.chunk = w0.w;
    it.num_chunks = w1.x;
    it.partial_slot = w1.y;
    it.qo_begin = w1.z;
    it.qo_len = w1.w;
    it.kv_len = w2.x;
    it.page_begin = w2.y;
    it.group_size = (int)(p.num_qo_heads / p.num_kv_heads);
    it.rows_total = it.qo_len * it.group_size;
    it.rows = it.rows_total - it.row_begin;
    it.kv_head = kv_head;
    return it;
}

// Writes the finished row `r` of item `it`: output o / l (times the value scale) and the LSE.
__device__ __forceinline__ void write_row(const Args &p, const Item &it, int r, int d, int D,
                                          float m, float l, float o, float v_scale) {
    const size_t out_row = it.q_offset(p, it.row_begin + r);
    p.o[out_row * D + d] = mg_num_to_nv_bf16(l > 0.0f ? o / l * v_scale : 0.0f);
    if (p.lse && d == 0)
        p.lse[out_row] = l > 0.0f ? m + __log2f(l) : kNegInf;
}

// The last CTA of a merge group combines the group's partials. Three passes, each spread over
// the CTA so that its loads are independent and in flight together: every chunk's (max, sum)
// per row into shared memory; per row (a warp each) the overall max M and sum L and each
// chunk's weight exp2(m - M) / L; then each output element as the weighted sum of the chunks'
// outputs. `scratch` holds 2 * MG_DECODE_MAX_SPLITS * ROWS floats.
template <int D, int ROWS>
__device__ __forceinline__ void merge_group(const Args &p, const Item &it, int first_slot,
                                            uint32_t kv_head, float *scratch, float v_scale) {
    const int chunks = it.num_chunks;
    float *weight = scratch, *sum = scratch + MG_DECODE_MAX_SPLITS * ROWS;
    auto slot_of = [&](int c, int r) {
        return ((size_t)(first_slot + c) * p.num_kv_heads + kv_head) * ROWS + r;
    };
    const int rows = it.rows < ROWS ? it.rows : ROWS;
    for (int e = threadIdx.x; e < chunks * ROWS; e += blockDim.x) {
        if (e % ROWS >= rows)
            continue; // never written
        const float2 ml = __ldcg(&p.partial_ml[slot_of(e / ROWS, e % ROWS)]);
        weight[e] = ml.x;
        sum[e] = ml.y;
    }
    __syncthreads();
    __shared__ float row_max[ROWS], row_sum[ROWS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < rows; r += blockDim.x / 32) {
        float m = kNegInf;
        for (int c = lane; c < chunks; c += 32)
            m = fmaxf(m, weight[c * ROWS + r]);
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
        float l = 0.0f;
        for (int c = lane; c < chunks; c += 32) {
            const float mc = weight[c * ROWS + r];
            l += mc == kNegInf ? 0.0f : sum[c * ROWS + r] * exp2f(mc - m);
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2)
            l += __shfl_xor_sync(0xffffffffu, l, offset);
        __syncwarp();
        for (int c = lane; c < chunks; c += 32) {
            const float mc = weight[c * ROWS + r];
            weight[c * ROWS + r] = mc == kNegInf || !(l > 0.0f) ? 0.0f : exp2f(mc - m) / l;
        }
        if (lane == 0)
            row_max[r] = m, row_sum[r] = l;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        float o = 0.0f;
#pragma unroll 8
        for (int c = 0; c < chunks; c++)
            o += weight[c * ROWS + r] * __ldcg(&p.partial_o[slot_of(c, r) * D + d]);
        const size_t out_row = it.q_offset(p, it.row_begin + r);
        p.o[out_row * D + d] = mg_num_to_nv_bf16(o * v_scale);
        if (p.lse && d == 0)
            p.lse[out_row] = row_sum[r] > 0.0f ? row_max[r] + __log2f(row_sum[r]) : kNegInf;
    }
}

// The end of an item, after the CTA's WARPS warps left their unnormalized outputs
// scratch_o [WARPS][ROWS][D] and (max, sum) pairs scratch_ml [WARPS][ROWS][2] in shared memory
// (and synchronized); `scratch` (where they may live) is free after the first pass and must hold
// 2 * MG_DECODE_MAX_SPLITS * ROWS floats. Every thread of the CTA calls it; it ends with the
// CTA synchronized.
template <int D, int ROWS, int WARPS>
__device__ __forceinline__ void
finish_item(const Args &p, const Item &it, int item_index, uint32_t kv_head, const float *scratch_o,
            const float *scratch_ml, float *scratch, float v_scale) {
    const bool split = it.num_chunks > 1;
    const size_t partial_base = ((size_t)it.partial_slot * p.num_kv_heads + kv_head) * ROWS;
    const int rows = it.rows < ROWS ? it.rows : ROWS;
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        float m = kNegInf;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            m = fmaxf(m, scratch_ml[(w * ROWS + r) * 2]);
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            const float mw = scratch_ml[(w * ROWS + r) * 2];
            const float f = mw == kNegInf ? 0.0f : exp2f(mw - m);
            l += scratch_ml[(w * ROWS + r) * 2 + 1] * f;
            o += scratch_o[(w * ROWS + r) * D + d] * f;
        }
        if (!split) {
            write_row(p, it, r, d, D, m, l, o, v_scale);
        } else {
            p.partial_o[(partial_base + r) * D + d] = o;
            if (d == 0)
                p.partial_ml[partial_base + r] = make_float2(m, l);
        }
    }
    if (!split) {
        __syncthreads(); // the scratch is the next item's ring
        return;
    }
    __shared__ uint32_t last_arrival;
    __threadfence();
    __syncthreads();
    const int first_item = item_index - it.chunk, first_slot = it.partial_slot - it.chunk;
    uint32_t *counter = p.counters + (size_t)first_item * p.num_kv_heads + kv_head;
    if (threadIdx.x == 0)
        last_arrival = atomicAdd(counter, 1u) == (uint32_t)it.num_chunks - 1;
    __syncthreads();
    if (!last_arrival)
        return;
    __threadfence();
    merge_group<D, ROWS>(p, it, first_slot, kv_head, scratch, v_scale);
    if (threadIdx.x == 0)
        *counter = 0; // ready for the next launch
    __syncthreads();
}

} // namespace mg_decode
