// fp8_quantize.metal - the FP8 E4M3 quantizer's stages (metrale/ops_quantize.h), with the
// names and argument lists of the CPU reference (src/ops/quantize/fp8_quantize_reference.c)
// and the rule of src/ops/common/fp8_quantize_host.h: amax over finite values, scale =
// amax / 448 (1 when amax is 0), code = E4M3 round-to-nearest-even of x / scale, saturating
// to +-448, NaN kept with its sign. UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define FP8_E4M3_MAX 448.0f
#define FP8_SCALE_BLOCK 128u
#define FP8_ROW_THREADS_MAX 128

static inline float amax_accumulate(float amax, float value) {
    float magnitude = fabs(value);
    return isfinite(magnitude) && magnitude > amax ? magnitude : amax;
}

static inline float scale_from_amax(float amax) {
    return amax > 0.0f ? amax / FP8_E4M3_MAX : 1.0f;
}

static inline uchar quantize_value(float value, float scale) {
    if (isnan(value))
        return signbit(value) ? 0xffu : 0x7fu;
    return f32_to_e4m3(value / scale);
}

kernel void fp8_quantize_tensor_reset(device float *slot [[buffer(0)]]) {
    slot[0] = 0.0f;
}

// The running amax lives in the scale slot as FP32 bits: for non-negative floats the bits
// order as the values do, so an integer max is the float max.
kernel void
fp8_quantize_tensor_amax(device const ushort *in [[buffer(0)]],
                         device atomic_uint *slot [[buffer(1)]], constant uint &rows [[buffer(2)]],
                         constant uint &cols [[buffer(3)]], constant uint &in_pitch [[buffer(4)]],
                         uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    float amax = 0.0f;
    ulong total = ulong(rows) * cols;
    for (ulong i = tid; i < total; i += threads)
        amax = amax_accumulate(amax, bf16_to_float(in[(i / cols) * in_pitch + i % cols]));
    atomic_fetch_max_explicit(slot, as_type<uint>(amax), memory_order_relaxed);
}

kernel void
fp8_quantize_tensor_codes(device const ushort *in [[buffer(0)]], device uchar *out [[buffer(1)]],
                          device const float *slot [[buffer(2)]], constant uint &rows [[buffer(3)]],
                          constant uint &cols [[buffer(4)]], constant uint &in_pitch [[buffer(5)]],
                          uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    float scale = scale_from_amax(slot[0]);
    ulong total = ulong(rows) * cols;
    for (ulong i = tid; i < total; i += threads)
        out[i] = quantize_value(bf16_to_float(in[(i / cols) * in_pitch + i % cols]), scale);
}

kernel void fp8_quantize_tensor_finish(device float *slot [[buffer(0)]]) {
    slot[0] = scale_from_amax(slot[0]);
}

// One scale per row; threadgroups grid-stride over rows, threads share a row's amax.
kernel void fp8_quantize_rows(device const ushort *in [[buffer(0)]],
                              device uchar *out [[buffer(1)]], device float *scales [[buffer(2)]],
                              constant uint &rows [[buffer(3)]], constant uint &cols [[buffer(4)]],
                              constant uint &in_pitch [[buffer(5)]],
                              uint group [[threadgroup_position_in_grid]],
                              uint groups [[threadgroups_per_grid]],
                              uint t [[thread_position_in_threadgroup]],
                              uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[FP8_ROW_THREADS_MAX];
    if (threads > FP8_ROW_THREADS_MAX)
        return;
    for (uint r = group; r < rows; r += groups) {
        device const ushort *row = in + ulong(r) * in_pitch;
        float amax = 0.0f;
        for (uint c = t; c < cols; c += threads)
            amax = amax_accumulate(amax, bf16_to_float(row[c]));
        partial[t] = amax;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float row_amax = 0.0f;
        for (uint i = 0; i < threads; i++)
            row_amax = max(row_amax, partial[i]);
        float scale = scale_from_amax(row_amax);
        for (uint c = t; c < cols; c += threads)
            out[ulong(r) * cols + c] = quantize_value(bf16_to_float(row[c]), scale);
        if (t == 0)
            scales[r] = scale;
        threadgroup_barrier(mem_flags::mem_threadgroup); // partial is reused by the next row
    }
}

// One scale per 1x128 block, at scales[r * row_stride + g * block_stride]; rows in
// [rows, rows_out) are the GEMM layout's padding (zero codes, zero scales). Each thread owns
// whole blocks of a row.
kernel void
fp8_quantize_1x128(device const ushort *in [[buffer(0)]], device uchar *out [[buffer(1)]],
                   device float *scales [[buffer(2)]], constant uint &rows [[buffer(3)]],
                   constant uint &rows_out [[buffer(4)]], constant uint &cols [[buffer(5)]],
                   constant uint &in_pitch [[buffer(6)]], constant uint &row_stride [[buffer(7)]],
                   constant uint &block_stride [[buffer(8)]],
                   uint group [[threadgroup_position_in_grid]],
                   uint groups [[threadgroups_per_grid]], uint t [[thread_position_in_threadgroup]],
                   uint threads [[threads_per_threadgroup]]) {
    uint blocks = (cols + FP8_SCALE_BLOCK - 1) / FP8_SCALE_BLOCK;
    for (uint r = group; r < rows_out; r += groups) {
        for (uint g = t; g < blocks; g += threads) {
            uint c0 = g * FP8_SCALE_BLOCK, c1 = min(c0 + FP8_SCALE_BLOCK, cols);
            ulong s = ulong(r) * row_stride + ulong(g) * block_stride;
            if (r >= rows) {
                for (uint c = c0; c < c1; c++)
                    out[ulong(r) * cols + c] = 0;
                scales[s] = 0.0f;
                continue;
            }
            device const ushort *row = in + ulong(r) * in_pitch;
            float amax = 0.0f;
            for (uint c = c0; c < c1; c++)
                amax = amax_accumulate(amax, bf16_to_float(row[c]));
            float scale = scale_from_amax(amax);
            for (uint c = c0; c < c1; c++)
                out[ulong(r) * cols + c] = quantize_value(bf16_to_float(row[c]), scale);
            scales[s] = scale;
        }
    }
}
