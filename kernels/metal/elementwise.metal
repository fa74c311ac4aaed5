// elementwise.metal - gather_rows_bf16, rmsnorm_bf16, argmax_f32, argmax_bf16, and (at the end)
// fill_uniform_bf16 and amax_bf16
// (metrale/ops_elementwise.h defines their results; the references are
// src/ops/elementwise/elementwise_reference.c). The front launches one threadgroup per row
// (grid = rows) of up to 256 threads, 1024 for the argmax kernels. UNVERIFIED ON HARDWARE; in particular that an optional
// buffer bound as nil reads as a null pointer here is Apple silicon's documented behaviour for
// Metal 3 argument tables, not something checked on a GPU.
#include <metal_stdlib>
using namespace metal;

#define ROW_THREADS_MAX 256
#define ARGMAX_THREADS_MAX 1024

// out[r] = src[ids[r]] (+ add[ids[r]] when add is bound), zero for an id outside [0, src_rows).
kernel void
gather_rows_bf16(device const int *ids [[buffer(0)]], device const ushort *src [[buffer(1)]],
                 device const ushort *add [[buffer(2)]], device ushort *out [[buffer(3)]],
                 constant uint &rows [[buffer(4)]], constant uint &cols [[buffer(5)]],
                 constant uint &src_rows [[buffer(6)]], uint r [[threadgroup_position_in_grid]],
                 uint t [[thread_position_in_threadgroup]],
                 uint threads [[threads_per_threadgroup]]) {
    if (r >= rows)
        return;
    int id = ids[r];
    device ushort *o = out + ulong(r) * cols;
    for (uint c = t; c < cols; c += threads) {
        if (id < 0 || uint(id) >= src_rows) {
            o[c] = 0;
            continue;
        }
        ushort a = src[ulong(id) * cols + c];
        o[c] = add ? float_to_bf16(bf16_to_float(a) + bf16_to_float(add[ulong(id) * cols + c])) : a;
    }
}

// x += add (in place, BF16) when add is bound; out = (x * rsqrt(mean(x^2) + eps)) * w.
kernel void rmsnorm_bf16(device ushort *x [[buffer(0)]], device const ushort *add [[buffer(1)]],
                         device const ushort *w [[buffer(2)]], device ushort *out [[buffer(3)]],
                         constant uint &rows [[buffer(4)]], constant uint &cols [[buffer(5)]],
                         constant float &eps [[buffer(6)]], uint r [[threadgroup_position_in_grid]],
                         uint t [[thread_position_in_threadgroup]],
                         uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[ROW_THREADS_MAX];
    threadgroup float inv_shared[1];
    if (r >= rows || threads > ROW_THREADS_MAX)
        return;
    device ushort *xr = x + ulong(r) * cols;
    float sum = 0.0f;
    for (uint c = t; c < cols; c += threads) {
        if (add)
            xr[c] = float_to_bf16(bf16_to_float(xr[c]) + bf16_to_float(add[ulong(r) * cols + c]));
        float v = bf16_to_float(xr[c]);
        sum += v * v;
    }
    partial[t] = sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0) {
        float total = 0.0f;
        for (uint i = 0; i < threads; i++)
            total += partial[i];
        inv_shared[0] = 1.0f / sqrt(total / float(cols) + eps);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float inv = inv_shared[0];
    device ushort *o = out + ulong(r) * cols;
    for (uint c = t; c < cols; c += threads)
        o[c] = float_to_bf16((bf16_to_float(xr[c]) * inv) * bf16_to_float(w[c]));
}

// The first index of the largest non-NaN value of each row (0 when every value is NaN).
static inline void argmax_finish(threadgroup float *best_value, threadgroup uint *best_index,
                                 threadgroup bool *found, uint t, uint threads, device int *ids,
                                 uint r) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t != 0)
        return;
    bool any = false;
    float value = 0.0f;
    uint index = 0;
    for (uint i = 0; i < threads; i++) {
        if (!found[i])
            continue;
        if (!any || best_value[i] > value || (best_value[i] == value && best_index[i] < index)) {
            value = best_value[i];
            index = best_index[i];
            any = true;
        }
    }
    ids[r] = int(index);
}

kernel void argmax_f32(device const float *in [[buffer(0)]], device int *ids [[buffer(1)]],
                       constant uint &rows [[buffer(2)]], constant uint &cols [[buffer(3)]],
                       constant uint &pitch [[buffer(4)]], uint r [[threadgroup_position_in_grid]],
                       uint t [[thread_position_in_threadgroup]],
                       uint threads [[threads_per_threadgroup]]) {
    threadgroup float best_value[ARGMAX_THREADS_MAX];
    threadgroup uint best_index[ARGMAX_THREADS_MAX];
    threadgroup bool found[ARGMAX_THREADS_MAX];
    if (r >= rows || threads > ARGMAX_THREADS_MAX)
        return;
    found[t] = false;
    for (uint c = t; c < cols; c += threads) {
        float v = in[ulong(r) * pitch + c];
        if (!isnan(v) && (!found[t] || v > best_value[t])) {
            best_value[t] = v;
            best_index[t] = c;
            found[t] = true;
        }
    }
    argmax_finish(best_value, best_index, found, t, threads, ids, r);
}

kernel void argmax_bf16(device const ushort *in [[buffer(0)]], device int *ids [[buffer(1)]],
                        constant uint &rows [[buffer(2)]], constant uint &cols [[buffer(3)]],
                        constant uint &pitch [[buffer(4)]], uint r [[threadgroup_position_in_grid]],
                        uint t [[thread_position_in_threadgroup]],
                        uint threads [[threads_per_threadgroup]]) {
    threadgroup float best_value[ARGMAX_THREADS_MAX];
    threadgroup uint best_index[ARGMAX_THREADS_MAX];
    threadgroup bool found[ARGMAX_THREADS_MAX];
    if (r >= rows || threads > ARGMAX_THREADS_MAX)
        return;
    found[t] = false;
    for (uint c = t; c < cols; c += threads) {
        float v = bf16_to_float(in[ulong(r) * pitch + c]);
        if (!isnan(v) && (!found[t] || v > best_value[t])) {
            best_value[t] = v;
            best_index[t] = c;
            found[t] = true;
        }
    }
    argmax_finish(best_value, best_index, found, t, threads, ids, r);
}

// ------------------------------------------------------------------ synthetic data
// fill_uniform_bf16 and amax_bf16 (metrale/ops_elementwise.h), one element per thread,
// grid-stride (the front's grid: blocks of 256 threads). The fill is the host's
// (mg_uniform_bf16_host) operation for operation, but the library is compiled with Metal's
// default options, which allow a * b + c to become one FMA: where it does, a value rounds once
// instead of twice and may differ from the host's by one BF16 step (rarely). UNVERIFIED ON
// HARDWARE, like the rest of this file.

static inline ulong splitmix64(ulong x) {
    x += 0x9E3779B97F4A7C15ul;
    ulong z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ul;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBul;
    return z ^ (z >> 31);
}

kernel void fill_uniform_bf16(device ushort *out [[buffer(0)]], constant ulong &count [[buffer(1)]],
                              constant ulong &counter [[buffer(2)]],
                              constant float &offset [[buffer(3)]],
                              constant float &scale [[buffer(4)]],
                              uint group [[threadgroup_position_in_grid]],
                              uint groups [[threadgroups_per_grid]],
                              uint t [[thread_position_in_threadgroup]],
                              uint threads [[threads_per_threadgroup]]) {
    const ulong stride = ulong(groups) * threads;
    for (ulong i = ulong(group) * threads + t; i < count; i += stride) {
        const float u = float(splitmix64(counter + i) >> 40) * 0x1p-23f - 1.0f;
        const float product = scale * u;
        out[i] = float_to_bf16(offset + product);
    }
}

// out[0] = max(out[0], the largest finite |x|) (the front zeroes out first): each threadgroup's
// maximum meets the others' through an atomic max on the bits (non-negative floats order as
// their bits do).
kernel void amax_bf16(device const ushort *x [[buffer(0)]], device atomic_uint *out [[buffer(1)]],
                      constant ulong &count [[buffer(2)]],
                      uint group [[threadgroup_position_in_grid]],
                      uint groups [[threadgroups_per_grid]],
                      uint t [[thread_position_in_threadgroup]],
                      uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[ROW_THREADS_MAX];
    const ulong stride = ulong(groups) * threads;
    float m = 0.0f;
    for (ulong i = ulong(group) * threads + t; i < count; i += stride) {
        const float a = fabs(bf16_to_float(x[i]));
        if (isfinite(a))
            m = max(m, a);
    }
    partial[t] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t != 0)
        return;
    for (uint i = 1; i < threads && i < ROW_THREADS_MAX; i++)
        m = max(m, partial[i]);
    atomic_fetch_max_explicit(out, as_type<uint>(m), memory_order_relaxed);
}
