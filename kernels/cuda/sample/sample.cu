// sample.cu - sample_rows (metrale/ops_sample.h defines the result; src/ops/sample/
// sample_reference.c computes it on the CPU). One block per row; the row's processed logits
// live in the caller's FP32 workspace (the first half of the row's region).
//
// Where the reference sorts, this kernel searches: the top-k and top-p thresholds are found bit
// by bit over an order-preserving 32-bit key of the values (32 block-wide counts or sums each),
// which yields the same element the reference's sorted walk ends on. The penalties, the
// thresholds' comparisons and the draw's uniform (common/philox.h) are exact and equal to the
// reference's; the FP32 sums (top-p's mass, the draw's running sum) are taken in this kernel's
// fixed order, so a choice may differ from the reference only within rounding of a boundary.
// Every sum is in a fixed order: results are identical run to run.
//
// Built without fast math; the arithmetic of steps 2 and 5 uses the _rn intrinsics so no
// multiply-add is contracted (the reference's order of operations, rounding for rounding).
#include <stdint.h>

#include "common/grid_dependency.cuh"
#include "common/philox.h"

namespace {

constexpr unsigned kThreads = 512; // MG_SAMPLE_THREADS
constexpr unsigned kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kMaxAdditive = 1000.0f; // MG_SAMPLE_MAX_ADDITIVE_PENALTY
constexpr int32_t kBadLogits = -1, kBadParams = -2, kNoCandidate = -3;

// metrale/ops_sample.h's mg_sample_params, field for field.
struct Params {
    uint64_t seed, step;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    uint32_t top_k, history_len;
};
static_assert(sizeof(Params) == 48, "mg_sample_params is 48 bytes");

__device__ __forceinline__ float neg_inf() {
    return -__int_as_float(0x7f800000);
}
__device__ __forceinline__ float pos_inf() {
    return __int_as_float(0x7f800000);
}

// mg_sample_params_valid (sample_reference.c), written so that NaN fails every test.
__device__ __forceinline__ bool params_valid(const Params &p, uint32_t history_pitch) {
    return p.temperature >= 0.0f && p.temperature <= 3.4e38f && p.top_p > 0.0f && p.top_p <= 1.0f &&
           p.min_p >= 0.0f && p.min_p <= 1.0f && p.repetition_penalty > 0.0f &&
           p.repetition_penalty <= 3.4e38f && p.presence_penalty >= -kMaxAdditive &&
           p.presence_penalty <= kMaxAdditive && p.frequency_penalty >= -kMaxAdditive &&
           p.frequency_penalty <= kMaxAdditive && p.history_len <= history_pitch;
}

// Order-preserving key of a float that is never NaN (larger float, larger key; -0 < +0, and
// only +0 occurs among the values compared here).
__device__ __forceinline__ uint32_t key_of(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float float_of(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Block-wide sums; every thread gets the result. `scratch` holds kWarps values; the trailing
// barrier lets the caller reuse it at once.
__device__ float block_sum(float v, float *scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = __fadd_rn(v, __shfl_xor_sync(kFull, v, o));
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (unsigned w = 0; w < kWarps; w++)
        total = __fadd_rn(total, scratch[w]);
    __syncthreads();
    return total;
}

__device__ uint32_t block_sum_u32(uint32_t v, uint32_t *scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    uint32_t total = 0;
    for (unsigned w = 0; w < kWarps; w++)
        total += scratch[w];
    __syncthreads();
    return total;
}

// The greatest value and, among equal ones, the lowest index.
__device__ __forceinline__ bool better(float v, uint32_t i, float bv, uint32_t bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ void block_argmax(float &v, uint32_t &i, float *sv, uint32_t *si) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(kFull, v, o);
        const uint32_t oi = __shfl_xor_sync(kFull, i, o);
        if (better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    for (unsigned w = 1; w < kWarps; w++)
        if (better(sv[w], si[w], v, i)) {
            v = sv[w];
            i = si[w];
        }
    __syncthreads();
}

} // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
    sample_rows(const void *__restrict__ logits, const Params *__restrict__ params,
                const int32_t *__restrict__ history, float *__restrict__ workspace,
                int32_t *__restrict__ ids, uint32_t rows, uint32_t vocab, uint32_t pitch,
                uint32_t logits_bf16, uint32_t history_pitch) {
    grid_dependency_wait();
    launch_dependents();
    __shared__ float scratch_f[kWarps];
    __shared__ uint32_t scratch_u[kWarps];
    __shared__ float chunk_sum[kThreads];
    __shared__ uint32_t chunk_last[kThreads];
    const uint32_t r = blockIdx.x, tid = threadIdx.x;
    if (r >= rows)
        return;
    const Params p = params[r];
    float *y = workspace + (uint64_t)r * 2 * (((uint64_t)vocab + 3) & ~3ull);
    const int32_t *hist = history ? history + (uint64_t)r * history_pitch : nullptr;

    // 1: parameters and the history's ids, then the logits (the decision is block-uniform)
    if (!params_valid(p, history_pitch)) {
        if (tid == 0)
            ids[r] = kBadParams;
        return;
    }
    uint32_t bad = 0;
    for (uint32_t j = tid; j < p.history_len; j += kThreads)
        bad |= hist[j] < 0 || (uint32_t)hist[j] >= vocab;
    if (block_sum_u32(bad, scratch_u)) {
        if (tid == 0)
            ids[r] = kBadParams;
        return;
    }
    for (uint32_t i = tid; i < vocab; i += kThreads) {
        const uint64_t at = (uint64_t)r * pitch + i;
        const float x =
            logits_bf16
                ? __uint_as_float((uint32_t) static_cast<const uint16_t *>(logits)[at] << 16)
                : static_cast<const float *>(logits)[at];
        bad |= x != x || x == pos_inf();
        y[i] = x;
    }
    if (block_sum_u32(bad, scratch_u)) {
        if (tid == 0)
            ids[r] = kBadLogits;
        return;
    }

    // 2: penalties, applied by the thread holding an id's first occurrence in the history
    if (p.history_len && (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
                          p.frequency_penalty != 0.0f)) {
        for (uint32_t j = tid; j < p.history_len; j += kThreads) {
            const int32_t t = hist[j];
            bool first = true;
            for (uint32_t k = 0; k < j && first; k++)
                first = hist[k] != t;
            if (!first)
                continue;
            uint32_t c = 0;
            for (uint32_t k = j; k < p.history_len; k++)
                c += hist[k] == t;
            const float x = y[t];
            const float q =
                x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
            y[t] = __fsub_rn(
                q, __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, (float)c)));
        }
        __syncthreads();
    }

    // 3 and 4
    float m = neg_inf();
    uint32_t best = 0xffffffffu;
    for (uint32_t i = tid; i < vocab; i += kThreads)
        if (better(y[i], i, m, best)) {
            m = y[i];
            best = i;
        }
    block_argmax(m, best, scratch_f, scratch_u);
    if (m == neg_inf()) {
        if (tid == 0)
            ids[r] = kNoCandidate;
        return;
    }
    if (p.temperature == 0.0f) {
        if (tid == 0)
            ids[r] = (int32_t)best;
        return;
    }

    // 5
    for (uint32_t i = tid; i < vocab; i += kThreads)
        y[i] = __fdiv_rn(__fsub_rn(y[i], m), p.temperature);
    __syncthreads();

    // 6: the largest key K with at least top_k values at or above it is the top_k-th value's
    if (p.top_k && p.top_k < vocab) {
        uint32_t K = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = K | (1u << bit);
            uint32_t count = 0;
            for (uint32_t i = tid; i < vocab; i += kThreads)
                count += key_of(y[i]) >= cand;
            if (block_sum_u32(count, scratch_u) >= p.top_k)
                K = cand;
        }
        const float t = float_of(K);
        for (uint32_t i = tid; i < vocab; i += kThreads)
            if (y[i] < t)
                y[i] = neg_inf();
        __syncthreads();
    }

    // 7: the largest key with a mass at or above it of at least top_p * S is the boundary's
    if (p.top_p < 1.0f) {
        float s = 0.0f;
        for (uint32_t i = tid; i < vocab; i += kThreads)
            s = __fadd_rn(s, expf(y[i]));
        const float target = __fmul_rn(p.top_p, block_sum(s, scratch_f));
        uint32_t K = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = K | (1u << bit);
            float mass = 0.0f;
            for (uint32_t i = tid; i < vocab; i += kThreads)
                if (key_of(y[i]) >= cand)
                    mass = __fadd_rn(mass, expf(y[i]));
            if (block_sum(mass, scratch_f) >= target)
                K = cand;
        }
        const float t = float_of(K);
        for (uint32_t i = tid; i < vocab; i += kThreads)
            if (y[i] < t)
                y[i] = neg_inf();
        __syncthreads();
    }

    // 8
    if (p.min_p > 0.0f) {
        for (uint32_t i = tid; i < vocab; i += kThreads)
            if (y[i] != neg_inf() && expf(y[i]) < p.min_p)
                y[i] = neg_inf();
        __syncthreads();
    }

    // 9: contiguous chunks per thread, so that running sums follow ascending ids
    const uint32_t chunk = (vocab + kThreads - 1) / kThreads;
    const uint32_t begin = tid * chunk, end = min(vocab, begin + chunk);
    float s = 0.0f;
    uint32_t last = 0xffffffffu;
    for (uint32_t i = begin; i < end; i++) {
        const float w = expf(y[i]);
        s = __fadd_rn(s, w);
        if (w > 0.0f)
            last = i;
    }
    chunk_sum[tid] = s;
    chunk_last[tid] = last;
    __syncthreads();
    if (tid == 0) {
        float W = 0.0f;
        uint32_t highest = best;
        for (unsigned t = 0; t < kThreads; t++) {
            W = __fadd_rn(W, chunk_sum[t]);
            if (chunk_last[t] != 0xffffffffu)
                highest = chunk_last[t];
        }
        const float target = __fmul_rn(mg_sample_uniform_of(p.seed, p.step), W);
        float run = 0.0f;
        int32_t chosen = -1;
        for (unsigned t = 0; t < kThreads && chosen < 0; t++) {
            if (__fadd_rn(run, chunk_sum[t]) <= target) {
                run = __fadd_rn(run, chunk_sum[t]);
                continue;
            }
            const uint32_t b = t * chunk, e = min(vocab, b + chunk);
            for (uint32_t i = b; i < e; i++) {
                run = __fadd_rn(run, expf(y[i]));
                if (run > target) {
                    chosen = (int32_t)i;
                    break;
                }
            }
        }
        ids[r] = chosen >= 0 ? chosen : (int32_t)highest;
    }
}
