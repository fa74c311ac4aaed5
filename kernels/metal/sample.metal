// sample.metal - sample_rows (mg_sample, metrale/ops_sample.h defines the result;
// src/ops/sample/sample_reference.c computes it on the CPU), with the reference's argument list
// and the CUDA kernel's method (kernels/cuda/sample/sample.cu): one threadgroup of
// SAMPLE_THREADS threads per row, the row's processed logits in the caller's FP32 workspace,
// the top-k and top-p thresholds found bit by bit over an order-preserving key of the values,
// every sum a fixed tree over the threadgroup (results identical run to run), the draw's
// uniform Philox4x32-10 as kernels/cuda/common/philox.h computes it. The sums run in another
// order than the reference's ascending ids, so a choice may differ only within rounding of a
// boundary (ops_sample.h). UNVERIFIED ON HARDWARE: in particular Metal compiles with fast math
// unless told otherwise, which may contract or reorder the penalties' arithmetic.
#include <metal_stdlib>
using namespace metal;

#define SAMPLE_THREADS 512            // MG_SAMPLE_THREADS
#define SAMPLE_MAX_ADDITIVE 1000.0f   // MG_SAMPLE_MAX_ADDITIVE_PENALTY
#define SAMPLE_BAD_LOGITS (-1)
#define SAMPLE_BAD_PARAMS (-2)
#define SAMPLE_NO_CANDIDATE (-3)
#define SAMPLE_NONE 0xffffffffu

// metrale/ops_sample.h's mg_sample_params, field for field (48 bytes).
struct sample_params {
    ulong seed, step;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    uint top_k, history_len;
};

// mg_sample_params_valid, written so that NaN fails every test.
static inline bool sample_params_valid(sample_params p, uint history_pitch) {
    return p.temperature >= 0.0f && p.temperature <= 3.4e38f && p.top_p > 0.0f &&
           p.top_p <= 1.0f && p.min_p >= 0.0f && p.min_p <= 1.0f &&
           p.repetition_penalty > 0.0f && p.repetition_penalty <= 3.4e38f &&
           p.presence_penalty >= -SAMPLE_MAX_ADDITIVE && p.presence_penalty <= SAMPLE_MAX_ADDITIVE &&
           p.frequency_penalty >= -SAMPLE_MAX_ADDITIVE &&
           p.frequency_penalty <= SAMPLE_MAX_ADDITIVE && p.history_len <= history_pitch;
}

// mg_sample_uniform_of (kernels/cuda/common/philox.h): Philox4x32-10, key = seed, counter =
// (step low, step high, 0, 0), the first word's top 24 bits times 2^-24.
static inline float sample_uniform(ulong seed, ulong step) {
    uint c0 = uint(step), c1 = uint(step >> 32), c2 = 0, c3 = 0;
    uint k0 = uint(seed), k1 = uint(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint hi0 = mulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint hi1 = mulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return float(c0 >> 8) * (1.0f / 16777216.0f);
}

// Order-preserving key of a float that is never NaN, and back.
static inline uint sample_key(float f) {
    uint u = as_type<uint>(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static inline float sample_value(uint k) {
    return as_type<float>((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Threadgroup-wide sums in a fixed tree; every thread gets the result, and the scratch may be
// reused at once.
static inline float sample_sum(threadgroup float *scratch, float v, uint t) {
    scratch[t] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint w = SAMPLE_THREADS / 2; w > 0; w /= 2) {
        if (t < w)
            scratch[t] = scratch[t] + scratch[t + w];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    float total = scratch[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return total;
}
static inline uint sample_sum_u(threadgroup uint *scratch, uint v, uint t) {
    scratch[t] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint w = SAMPLE_THREADS / 2; w > 0; w /= 2) {
        if (t < w)
            scratch[t] = scratch[t] + scratch[t + w];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    uint total = scratch[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return total;
}

// The greatest value and, among equal ones, the lowest index.
static inline bool sample_better(float v, uint i, float bv, uint bi) {
    return v > bv || (v == bv && i < bi);
}
static inline void sample_argmax(threadgroup float *sv, threadgroup uint *si, thread float &v,
                                 thread uint &i, uint t) {
    sv[t] = v;
    si[t] = i;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint w = SAMPLE_THREADS / 2; w > 0; w /= 2) {
        if (t < w && sample_better(sv[t + w], si[t + w], sv[t], si[t])) {
            sv[t] = sv[t + w];
            si[t] = si[t + w];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    v = sv[0];
    i = si[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

kernel void sample_rows(device const uchar *logits [[buffer(0)]],
                        device const sample_params *params [[buffer(1)]],
                        device const int *history [[buffer(2)]],
                        device float *workspace [[buffer(3)]], device int *ids [[buffer(4)]],
                        constant uint &rows [[buffer(5)]], constant uint &vocab [[buffer(6)]],
                        constant uint &pitch [[buffer(7)]],
                        constant uint &logits_bf16 [[buffer(8)]],
                        constant uint &history_pitch [[buffer(9)]],
                        uint r [[threadgroup_position_in_grid]],
                        uint t [[thread_position_in_threadgroup]],
                        uint threads [[threads_per_threadgroup]]) {
    threadgroup float scratch_f[SAMPLE_THREADS];
    threadgroup uint scratch_u[SAMPLE_THREADS];
    threadgroup float chunk_sum[SAMPLE_THREADS];
    threadgroup uint chunk_last[SAMPLE_THREADS];
    if (r >= rows || threads != SAMPLE_THREADS)
        return;
    sample_params p = params[r];
    device float *y = workspace + ulong(r) * 2 * ((ulong(vocab) + 3) & ~3ul);
    device const int *hist = history_pitch ? history + ulong(r) * history_pitch : history;

    // 1: parameters and the history's ids, then the logits (the decision is uniform)
    if (!sample_params_valid(p, history_pitch)) {
        if (t == 0)
            ids[r] = SAMPLE_BAD_PARAMS;
        return;
    }
    uint bad = 0;
    for (uint j = t; j < p.history_len; j += SAMPLE_THREADS)
        bad |= hist[j] < 0 || uint(hist[j]) >= vocab;
    if (sample_sum_u(scratch_u, bad, t)) {
        if (t == 0)
            ids[r] = SAMPLE_BAD_PARAMS;
        return;
    }
    for (uint i = t; i < vocab; i += SAMPLE_THREADS) {
        ulong at = ulong(r) * pitch + i;
        float x = logits_bf16 ? bf16_to_float(((device const ushort *)logits)[at])
                              : ((device const float *)logits)[at];
        bad |= isnan(x) || x == INFINITY;
        y[i] = x;
    }
    if (sample_sum_u(scratch_u, bad, t)) {
        if (t == 0)
            ids[r] = SAMPLE_BAD_LOGITS;
        return;
    }

    // 2: penalties, applied by the thread holding an id's first occurrence in the history
    if (p.history_len && (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
                          p.frequency_penalty != 0.0f)) {
        for (uint j = t; j < p.history_len; j += SAMPLE_THREADS) {
            int id = hist[j];
            bool first = true;
            for (uint k = 0; k < j && first; k++)
                first = hist[k] != id;
            if (!first)
                continue;
            uint c = 0;
            for (uint k = j; k < p.history_len; k++)
                c += hist[k] == id;
            float x = y[id];
            float q = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
            y[id] = q - (p.presence_penalty + p.frequency_penalty * float(c));
        }
        threadgroup_barrier(mem_flags::mem_device);
    }

    // 3 and 4
    float m = -INFINITY;
    uint best = SAMPLE_NONE;
    for (uint i = t; i < vocab; i += SAMPLE_THREADS)
        if (sample_better(y[i], i, m, best)) {
            m = y[i];
            best = i;
        }
    sample_argmax(scratch_f, scratch_u, m, best, t);
    if (m == -INFINITY) {
        if (t == 0)
            ids[r] = SAMPLE_NO_CANDIDATE;
        return;
    }
    if (p.temperature == 0.0f) {
        if (t == 0)
            ids[r] = int(best);
        return;
    }

    // 5
    for (uint i = t; i < vocab; i += SAMPLE_THREADS)
        y[i] = (y[i] - m) / p.temperature;
    threadgroup_barrier(mem_flags::mem_device);

    // 6: the largest key K with at least top_k values at or above it is the top_k-th value's
    if (p.top_k && p.top_k < vocab) {
        uint K = 0;
        for (int bit = 31; bit >= 0; bit--) {
            uint cand = K | (1u << uint(bit)), count = 0;
            for (uint i = t; i < vocab; i += SAMPLE_THREADS)
                count += sample_key(y[i]) >= cand;
            if (sample_sum_u(scratch_u, count, t) >= p.top_k)
                K = cand;
        }
        float threshold = sample_value(K);
        for (uint i = t; i < vocab; i += SAMPLE_THREADS)
            if (y[i] < threshold)
                y[i] = -INFINITY;
        threadgroup_barrier(mem_flags::mem_device);
    }

    // 7: the largest key with a mass at or above it of at least top_p * S is the boundary's
    if (p.top_p < 1.0f) {
        float s = 0.0f;
        for (uint i = t; i < vocab; i += SAMPLE_THREADS)
            s += exp(y[i]);
        float target = p.top_p * sample_sum(scratch_f, s, t);
        uint K = 0;
        for (int bit = 31; bit >= 0; bit--) {
            uint cand = K | (1u << uint(bit));
            float mass = 0.0f;
            for (uint i = t; i < vocab; i += SAMPLE_THREADS)
                if (sample_key(y[i]) >= cand)
                    mass += exp(y[i]);
            if (sample_sum(scratch_f, mass, t) >= target)
                K = cand;
        }
        float threshold = sample_value(K);
        for (uint i = t; i < vocab; i += SAMPLE_THREADS)
            if (y[i] < threshold)
                y[i] = -INFINITY;
        threadgroup_barrier(mem_flags::mem_device);
    }

    // 8
    if (p.min_p > 0.0f) {
        for (uint i = t; i < vocab; i += SAMPLE_THREADS)
            if (y[i] != -INFINITY && exp(y[i]) < p.min_p)
                y[i] = -INFINITY;
        threadgroup_barrier(mem_flags::mem_device);
    }

    // 9: contiguous chunks per thread, so that running sums follow ascending ids
    uint chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    uint begin = t * chunk, end = min(vocab, begin + chunk);
    float s = 0.0f;
    uint last = SAMPLE_NONE;
    for (uint i = begin; i < end; i++) {
        float w = exp(y[i]);
        s += w;
        if (w > 0.0f)
            last = i;
    }
    chunk_sum[t] = s;
    chunk_last[t] = last;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t != 0)
        return;
    float W = 0.0f;
    uint highest = best;
    for (uint c = 0; c < SAMPLE_THREADS; c++) {
        W += chunk_sum[c];
        if (chunk_last[c] != SAMPLE_NONE)
            highest = chunk_last[c];
    }
    float target = sample_uniform(p.seed, p.step) * W;
    float run = 0.0f;
    int chosen = -1;
    for (uint c = 0; c < SAMPLE_THREADS && chosen < 0; c++) {
        if (run + chunk_sum[c] <= target) {
            run += chunk_sum[c];
            continue;
        }
        uint b = c * chunk, e = min(vocab, b + chunk);
        for (uint i = b; i < e; i++) {
            run += exp(y[i]);
            if (run > target) {
                chosen = int(i);
                break;
            }
        }
    }
    ids[r] = chosen >= 0 ? chosen : int(highest);
}
