// elementwise.cu - gather_rows_bf16, rmsnorm_bf16, argmax_f32, argmax_bf16 and, at the end, the
// synthetic-data helpers fill_uniform_bf16 and amax_bf16
// (metrale/ops_elementwise.h defines the results; src/ops/elementwise/elementwise_reference.c
// computes them on the CPU). One block per row; BF16 rows move in 16-byte vectors (the front checks
// cols % 8 == 0 and 16-byte aligned pointers). Built without fast math: sqrtf and `/` are correctly
// rounded, and the per-element arithmetic is the reference's, operation for operation; only the
// order of RMSNorm's FP32 sum of squares differs (a tree of warp sums).
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/grid_dependency.cuh"

namespace {

__device__ __forceinline__ uint4 add_bf16x8(uint4 a, uint4 b) {
    uint4 r;
    r.x = mg_num_bf16_pack(__fadd_rn(mg_num_bf16_low(a.x), mg_num_bf16_low(b.x)),
                           __fadd_rn(mg_num_bf16_high(a.x), mg_num_bf16_high(b.x)));
    r.y = mg_num_bf16_pack(__fadd_rn(mg_num_bf16_low(a.y), mg_num_bf16_low(b.y)),
                           __fadd_rn(mg_num_bf16_high(a.y), mg_num_bf16_high(b.y)));
    r.z = mg_num_bf16_pack(__fadd_rn(mg_num_bf16_low(a.z), mg_num_bf16_low(b.z)),
                           __fadd_rn(mg_num_bf16_high(a.z), mg_num_bf16_high(b.z)));
    r.w = mg_num_bf16_pack(__fadd_rn(mg_num_bf16_low(a.w), mg_num_bf16_low(b.w)),
                           __fadd_rn(mg_num_bf16_high(a.w), mg_num_bf16_high(b.w)));
    return r;
}

__device__ __forceinline__ float sum_squares(uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++)
        s = __fadd_rn(s, __fadd_rn(__fmul_rn(mg_num_bf16_low(w[i]), mg_num_bf16_low(w[i])),
                                   __fmul_rn(mg_num_bf16_high(w[i]), mg_num_bf16_high(w[i]))));
    return s;
}

__device__ __forceinline__ uint32_t norm_pair(uint32_t x, uint32_t w, float inv) {
    return mg_num_bf16_pack(__fmul_rn(__fmul_rn(mg_num_bf16_low(x), inv), mg_num_bf16_low(w)),
                            __fmul_rn(__fmul_rn(mg_num_bf16_high(x), inv), mg_num_bf16_high(w)));
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The better of two (value, index) candidates: larger value, then lower index; NaN never wins
// (an index of UINT32_MAX marks "no candidate").
__device__ __forceinline__ void better(float &best, uint32_t &best_i, float v, uint32_t i) {
    if (v != v)
        return;
    if (best_i == 0xffffffffu || v > best || (v == best && i < best_i)) {
        best = v;
        best_i = i;
    }
}

} // namespace

extern "C" __global__ void gather_rows_bf16(const int32_t *__restrict__ ids,
                                            const uint16_t *__restrict__ src,
                                            const uint16_t *__restrict__ add,
                                            uint16_t *__restrict__ out, uint32_t rows,
                                            uint32_t cols, uint32_t src_rows) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t r = blockIdx.x;
    if (r >= rows)
        return;
    const int32_t id = ids[r];
    const uint32_t vectors = cols / 8;
    uint4 *o = reinterpret_cast<uint4 *>(out + static_cast<uint64_t>(r) * cols);
    if (id < 0 || static_cast<uint32_t>(id) >= src_rows) {
        for (uint32_t i = threadIdx.x; i < vectors; i += blockDim.x)
            o[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    const uint64_t base = static_cast<uint64_t>(id) * cols;
    const uint4 *a = reinterpret_cast<const uint4 *>(src + base);
    const uint4 *d = add ? reinterpret_cast<const uint4 *>(add + base) : nullptr;
    for (uint32_t i = threadIdx.x; i < vectors; i += blockDim.x)
        o[i] = d ? add_bf16x8(a[i], d[i]) : a[i];
}

extern "C" __global__ void rmsnorm_bf16(uint16_t *x, const uint16_t *__restrict__ add,
                                        const uint16_t *__restrict__ weight, uint16_t *out,
                                        uint32_t rows, uint32_t cols, float eps) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t r = blockIdx.x;
    if (r >= rows)
        return;
    const uint32_t vectors = cols / 8;
    uint4 *xr = reinterpret_cast<uint4 *>(x + static_cast<uint64_t>(r) * cols);
    const uint4 *ar =
        add ? reinterpret_cast<const uint4 *>(add + static_cast<uint64_t>(r) * cols) : nullptr;
    float s = 0.0f;
    for (uint32_t i = threadIdx.x; i < vectors; i += blockDim.x) {
        uint4 v = xr[i];
        if (ar) {
            v = add_bf16x8(v, ar[i]);
            xr[i] = v; // each thread re-reads only its own vectors below
        }
        s = __fadd_rn(s, sum_squares(v));
    }
    const float total = block_sum(s);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)cols), eps)));
    const uint4 *w = reinterpret_cast<const uint4 *>(weight);
    uint4 *o = reinterpret_cast<uint4 *>(out + static_cast<uint64_t>(r) * cols);
    for (uint32_t i = threadIdx.x; i < vectors; i += blockDim.x) {
        const uint4 v = xr[i], wv = w[i];
        o[i] = make_uint4(norm_pair(v.x, wv.x, inv), norm_pair(v.y, wv.y, inv),
                          norm_pair(v.z, wv.z, inv), norm_pair(v.w, wv.w, inv));
    }
}

// The block's argmax of row r from each thread's candidate: warp shuffles, then thread 0 over
// the warps' winners writes ids[r] (0 when the row has no candidate: all NaN).
__device__ __forceinline__ void argmax_finish(float best, uint32_t best_i, int32_t *ids,
                                              uint32_t r) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, offset);
        const uint32_t i = __shfl_xor_sync(0xffffffffu, best_i, offset);
        if (i != 0xffffffffu)
            better(best, best_i, v, i);
    }
    __shared__ float warp_best[32];
    __shared__ uint32_t warp_index[32];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        warp_best[warp] = best;
        warp_index[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < blockDim.x / 32; w++)
            if (warp_index[w] != 0xffffffffu)
                better(best, best_i, warp_best[w], warp_index[w]);
        ids[r] = best_i == 0xffffffffu ? 0 : static_cast<int32_t>(best_i);
    }
}

// The argmax kernels run one block of up to 1024 threads per row (the front launches
// 1024) and keep kLoads 16-byte loads of each thread in flight: a row of logits
// (128256 FP32 values, 501 KiB) is then read in a few round trips by one SM, where one load
// per thread at a time left a 256-thread block bound by latency (65 us per row on the H200).
constexpr uint32_t kLoads = 8;

extern "C" __global__ void __launch_bounds__(1024)
    argmax_f32(const float *__restrict__ in, int32_t *__restrict__ ids, uint32_t rows,
               uint32_t cols, uint32_t pitch) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t r = blockIdx.x;
    if (r >= rows)
        return;
    const float *row = in + static_cast<uint64_t>(r) * pitch;
    float best = 0.0f;
    uint32_t best_i = 0xffffffffu;
    const uint32_t vectors = cols / 4, step = blockDim.x;
    const float4 *v4 = reinterpret_cast<const float4 *>(row);
    uint32_t i = threadIdx.x;
    for (; i + (kLoads - 1) * step < vectors; i += kLoads * step) {
        float4 v[kLoads];
#pragma unroll
        for (uint32_t u = 0; u < kLoads; u++)
            v[u] = __ldg(v4 + i + u * step);
#pragma unroll
        for (uint32_t u = 0; u < kLoads; u++) {
            const uint32_t at = 4 * (i + u * step);
            better(best, best_i, v[u].x, at);
            better(best, best_i, v[u].y, at + 1);
            better(best, best_i, v[u].z, at + 2);
            better(best, best_i, v[u].w, at + 3);
        }
    }
    for (; i < vectors; i += step) {
        const float4 v = __ldg(v4 + i);
        better(best, best_i, v.x, 4 * i);
        better(best, best_i, v.y, 4 * i + 1);
        better(best, best_i, v.z, 4 * i + 2);
        better(best, best_i, v.w, 4 * i + 3);
    }
    for (uint32_t c = 4 * vectors + threadIdx.x; c < cols; c += step)
        better(best, best_i, row[c], c);
    argmax_finish(best, best_i, ids, r);
}

// The same over BF16 rows (pitch a multiple of 8 elements: 16-byte vectors of 8 values).
extern "C" __global__ void __launch_bounds__(1024)
    argmax_bf16(const uint16_t *__restrict__ in, int32_t *__restrict__ ids, uint32_t rows,
                uint32_t cols, uint32_t pitch) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t r = blockIdx.x;
    if (r >= rows)
        return;
    const uint16_t *row = in + static_cast<uint64_t>(r) * pitch;
    float best = 0.0f;
    uint32_t best_i = 0xffffffffu;
    const uint32_t vectors = cols / 8, step = blockDim.x;
    const uint4 *v8 = reinterpret_cast<const uint4 *>(row);
    auto take = [&](const uint4 &v, uint32_t at) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            better(best, best_i, mg_num_bf16_low(w[j]), at + 2 * j);
            better(best, best_i, mg_num_bf16_high(w[j]), at + 2 * j + 1);
        }
    };
    uint32_t i = threadIdx.x;
    for (; i + (kLoads / 2 - 1) * step < vectors; i += kLoads / 2 * step) {
        uint4 v[kLoads / 2];
#pragma unroll
        for (uint32_t u = 0; u < kLoads / 2; u++)
            v[u] = __ldg(v8 + i + u * step);
#pragma unroll
        for (uint32_t u = 0; u < kLoads / 2; u++)
            take(v[u], 8 * (i + u * step));
    }
    for (; i < vectors; i += step)
        take(__ldg(v8 + i), 8 * i);
    for (uint32_t c = 8 * vectors + threadIdx.x; c < cols; c += step)
        better(best, best_i, mg_num_bf16_to_f32(row[c]), c);
    argmax_finish(best, best_i, ids, r);
}

// ------------------------------------------------------------------ synthetic data
// fill_uniform_bf16 and amax_bf16 (metrale/ops_elementwise.h): grid-stride, each thread 8
// elements (one 16-byte vector) per pass, then the tail one by one. Every step of the fill is
// the host's (mg_uniform_bf16_host) operation for operation, with the product and the sum
// rounded apart (__fmul_rn, __fadd_rn: never contracted into an FMA).

namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform_value(uint64_t c, float offset, float scale) {
    // 24 random bits, exact in FP32, times 2^-23, minus 1: both exact
    const float u = __fsub_rn(__fmul_rn(__ull2float_rn(splitmix64(c) >> 40), 0x1p-23f), 1.0f);
    return __fadd_rn(offset, __fmul_rn(scale, u));
}

} // namespace

extern "C" __global__ void __launch_bounds__(256)
    fill_uniform_bf16(uint16_t *__restrict__ out, uint64_t count, uint64_t counter, float offset,
                      float scale) {
    grid_dependency_wait(); // earlier kernels may still read what is overwritten
    launch_dependents();
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t vectors = count / 8;
    for (uint64_t v = first; v < vectors; v += stride) {
        const uint64_t c = counter + 8 * v;
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = mg_num_bf16_pack(uniform_value(c + 2 * i, offset, scale),
                                    uniform_value(c + 2 * i + 1, offset, scale));
        reinterpret_cast<uint4 *>(out)[v] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    for (uint64_t i = 8 * vectors + first; i < count; i += stride)
        out[i] = (uint16_t)mg_num_f32_to_bf16(uniform_value(counter + i, offset, scale));
}

// out[0] = max(out[0], the largest finite |x|): the front zeroes out first. Non-negative
// floats order as their bits do, so the blocks meet through an unsigned atomic max (exact and
// independent of the order).
extern "C" __global__ void __launch_bounds__(256)
    amax_bf16(const uint16_t *__restrict__ x, float *out, uint64_t count) {
    grid_dependency_wait();
    launch_dependents();
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t vectors = count / 8;
    float m = 0.0f;
    auto take = [&m](float v) {
        const float a = fabsf(v);
        if (isfinite(a))
            m = fmaxf(m, a);
    };
    for (uint64_t v = first; v < vectors; v += stride) {
        const uint4 q = __ldg(reinterpret_cast<const uint4 *>(x) + v);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            take(mg_num_bf16_low(w[i]));
            take(mg_num_bf16_high(w[i]));
        }
    }
    for (uint64_t i = 8 * vectors + first; i < count; i += stride)
        take(mg_num_bf16_to_f32(x[i]));
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    __shared__ float warp_max[32];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        warp_max[warp] = m;
    __syncthreads();
    if (warp != 0)
        return;
    m = lane < blockDim.x / 32 ? warp_max[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (lane == 0 && m > 0.0f)
        atomicMax(reinterpret_cast<unsigned int *>(out), __float_as_uint(m));
}
