// nvfp4_format.metal - the NVFP4 format tools (metrale/nvfp4.h): quantize, dequantize to BF16
// or FP32, nibble and byte transposes, and the Blackwell scale-factor swizzle and its inverse,
// with the names and argument lists of the CPU reference
// (src/ops/nvfp4_format/nvfp4_format_reference.c), which defines the rule. Every kernel is a
// grid-stride loop, so any grid computes the whole result. UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define NVFP4_BLOCK 16u
#define SF_TILE_ROWS 128u
#define SF_TILE_COLS 4u

static inline float e2m1_to_float(uint nibble) {
    const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float m = magnitude[nibble & 7u];
    return (nibble & 8u) ? -m : m;
}

static inline uchar block_scale_code(float amax, float global) {
    float s = (amax / 6.0f) / global;
    if (!(global > 0.0f) || !(s > 0.0f))
        return 0;
    return f32_to_e4m3(s);
}

static inline uchar e2m1_nibble(float x, float d) {
    float m = fabs(x) / d;
    uint code;
    if (!(m > 0.25f))
        return 0;
    if (m < 0.75f)
        code = 1;
    else if (m <= 1.25f)
        code = 2;
    else if (m < 1.75f)
        code = 3;
    else if (m <= 2.5f)
        code = 4;
    else if (m < 3.5f)
        code = 5;
    else if (m <= 5.0f)
        code = 6;
    else
        code = 7;
    return uchar(code | (signbit(x) ? 8u : 0u));
}

// One thread per 16-element block: its scale code and its 8 packed bytes.
kernel void nvfp4_quantize(device const ushort *in [[buffer(0)]],
                           device const float *global [[buffer(1)]],
                           device uchar *packed [[buffer(2)]], device uchar *scales [[buffer(3)]],
                           constant uint &n [[buffer(4)]], constant uint &k [[buffer(5)]],
                           constant uint &pitch [[buffer(6)]], uint tid [[thread_position_in_grid]],
                           uint threads [[threads_per_grid]]) {
    uint blocks = k / NVFP4_BLOCK;
    float g = global[0];
    for (ulong i = tid; i < ulong(n) * blocks; i += threads) {
        uint r = uint(i / blocks), b = uint(i % blocks);
        device const ushort *x = in + ulong(r) * pitch + ulong(b) * NVFP4_BLOCK;
        float amax = 0.0f;
        for (uint j = 0; j < NVFP4_BLOCK; j++) {
            float a = fabs(bf16_to_float(x[j]));
            if (isfinite(a) && a > amax)
                amax = a;
        }
        uchar scale = block_scale_code(amax, g);
        scales[i] = scale;
        float d = e4m3_to_float(scale) * g;
        device uchar *out = packed + ulong(r) * (k / 2) + ulong(b) * (NVFP4_BLOCK / 2);
        for (uint j = 0; j < NVFP4_BLOCK; j += 2) {
            uint lo = scale ? e2m1_nibble(bf16_to_float(x[j]), d) : 0;
            uint hi = scale ? e2m1_nibble(bf16_to_float(x[j + 1]), d) : 0;
            out[j / 2] = uchar(lo | hi << 4);
        }
    }
}

static inline float dequantize_at(device const uchar *packed, device const uchar *scales,
                                  float global, uint k, ulong i) {
    ulong r = i / k, c = i % k;
    uchar byte = packed[r * (k / 2) + c / 2];
    uint nibble = (c & 1) ? byte >> 4 : byte & 0xfu;
    float v =
        (e2m1_to_float(nibble) * e4m3_to_float(scales[r * (k / NVFP4_BLOCK) + c / NVFP4_BLOCK])) *
        global;
    return isnan(v) ? NAN : v;
}

kernel void nvfp4_dequantize_bf16(device const uchar *packed [[buffer(0)]],
                                  device const uchar *scales [[buffer(1)]],
                                  device const float *global [[buffer(2)]],
                                  device ushort *out [[buffer(3)]], constant uint &n [[buffer(4)]],
                                  constant uint &k [[buffer(5)]],
                                  uint tid [[thread_position_in_grid]],
                                  uint threads [[threads_per_grid]]) {
    for (ulong i = tid; i < ulong(n) * k; i += threads)
        out[i] = float_to_bf16(dequantize_at(packed, scales, global[0], k, i));
}

kernel void nvfp4_dequantize_f32(device const uchar *packed [[buffer(0)]],
                                 device const uchar *scales [[buffer(1)]],
                                 device const float *global [[buffer(2)]],
                                 device float *out [[buffer(3)]], constant uint &n [[buffer(4)]],
                                 constant uint &k [[buffer(5)]],
                                 uint tid [[thread_position_in_grid]],
                                 uint threads [[threads_per_grid]]) {
    for (ulong i = tid; i < ulong(n) * k; i += threads)
        out[i] = dequantize_at(packed, scales, global[0], k, i);
}

// [rows, cols] nibbles -> [cols, rows] nibbles; one thread per output byte (two rows).
kernel void
nvfp4_transpose_nibbles(device const uchar *in [[buffer(0)]], device uchar *out [[buffer(1)]],
                        constant uint &rows [[buffer(2)]], constant uint &cols [[buffer(3)]],
                        uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    ulong per_col = rows / 2;
    for (ulong i = tid; i < ulong(cols) * per_col; i += threads) {
        ulong c = i / per_col, r = (i % per_col) * 2;
        device const uchar *a = in + r * (cols / 2) + c / 2;
        uint shift = uint(c & 1) * 4;
        out[i] = uchar(((a[0] >> shift) & 0xfu) | ((a[cols / 2] >> shift) & 0xfu) << 4);
    }
}

kernel void
nvfp4_transpose_bytes(device const uchar *in [[buffer(0)]], device uchar *out [[buffer(1)]],
                      constant uint &rows [[buffer(2)]], constant uint &cols [[buffer(3)]],
                      uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    for (ulong i = tid; i < ulong(rows) * cols; i += threads) {
        ulong c = i / rows, r = i % rows;
        out[i] = in[r * cols + c];
    }
}

// mg_nvfp4_swizzled_offset: 128x4 tiles, row r at (r % 32) * 16 + ((r % 128) / 32) * 4.
static inline ulong swizzled_offset(uint row, uint col, uint cols) {
    ulong col_tiles = (cols + SF_TILE_COLS - 1) / SF_TILE_COLS;
    ulong tile = ulong(row / SF_TILE_ROWS) * col_tiles + col / SF_TILE_COLS;
    return tile * SF_TILE_ROWS * SF_TILE_COLS + (row % 32u) * 16u +
           ((row % SF_TILE_ROWS) / 32u) * 4u + col % SF_TILE_COLS;
}

// Every byte of the padded layout is written: the scale it holds, or 0 for padding.
kernel void nvfp4_scales_swizzle(device const uchar *in [[buffer(0)]],
                                 device uchar *out [[buffer(1)]], constant uint &rows [[buffer(2)]],
                                 constant uint &cols [[buffer(3)]],
                                 uint tid [[thread_position_in_grid]],
                                 uint threads [[threads_per_grid]]) {
    uint rows_padded = (rows + SF_TILE_ROWS - 1) / SF_TILE_ROWS * SF_TILE_ROWS;
    uint cols_padded = (cols + SF_TILE_COLS - 1) / SF_TILE_COLS * SF_TILE_COLS;
    for (ulong i = tid; i < ulong(rows_padded) * cols_padded; i += threads) {
        uint r = uint(i / cols_padded), c = uint(i % cols_padded);
        out[swizzled_offset(r, c, cols)] = r < rows && c < cols ? in[ulong(r) * cols + c] : 0;
    }
}

kernel void
nvfp4_scales_unswizzle(device const uchar *in [[buffer(0)]], device uchar *out [[buffer(1)]],
                       constant uint &rows [[buffer(2)]], constant uint &cols [[buffer(3)]],
                       uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    for (ulong i = tid; i < ulong(rows) * cols; i += threads)
        out[i] = in[swizzled_offset(uint(i / cols), uint(i % cols), cols)];
}
