// nvfp4_format.cu - the NVFP4 format tools (metrale/nvfp4.h): quantize BF16 weights to packed
// E2M1 nibbles with E4M3 block scales, dequantize them to BF16 or FP32, transpose packed
// weights and scales, and move block scales into the Blackwell scale-factor layout and back.
//
// Bit-identical to the CPU reference (src/ops/nvfp4_format/nvfp4_format_reference.c) because
// every step is the same exact or correctly rounded IEEE single operation: __fdiv_rn and
// __fmul_rn whatever the compile flags (no contraction into FMA, no approximate division), the
// E4M3 conversion round-to-nearest-even with saturation (cvt.rn.satfinite on sm_89+,
// cuda_fp8.hpp's exact software conversion on older targets), and E4M3/E2M1 decoding by bits.
// A NaN result of dequantization is written as the canonical quiet NaN, as on the host.
//
// Every kernel is grid-stride over 64-bit item indices, with blocks of kThreads threads.
#include <cuda_fp8.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/fp4_e2m1.cuh"
#include "common/fp8_e4m3.cuh"
#include "common/grid_dependency.cuh"

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kBlock = 16; // K elements per block scale

__device__ __forceinline__ uint64_t first_item() {
    return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ uint64_t item_stride() {
    return (uint64_t)gridDim.x * blockDim.x;
}

// The block scale code of a block whose finite amax is `amax`.
__device__ __forceinline__ uint32_t block_scale_code(float amax, float global) {
    float s = __fdiv_rn(__fdiv_rn(amax, 6.0f), global);
    if (!(global > 0.0f) || !(s > 0.0f)) // +0 would give s = inf: a global not > 0 zeroes all
        return 0;
    return mg_num_f32_to_fp8_e4m3(s);
}

// The nibble of x for the block divisor d (block scale code not 0).
__device__ __forceinline__ uint32_t e2m1_nibble(float x, float d) {
    uint32_t code = mg_num_e2m1_magnitude_code(__fdiv_rn(fabsf(x), d));
    return code ? code | ((mg_num_f32_bits(x) >> 28) & 8u) : 0u;
}

__device__ __forceinline__ float dequantize_value(uint32_t nibble, float scale, float global) {
    float v = __fmul_rn(__fmul_rn(mg_num_e2m1_to_f32(nibble), scale), global);
    return v != v ? __uint_as_float(0x7fc00000u) : v;
}

} // namespace

// One thread per 16-element block: 32 bytes of BF16 in, 8 bytes of nibbles and 1 scale out.
extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_quantize(const uint16_t *__restrict__ in, const float *__restrict__ global_scale,
                   uint8_t *__restrict__ packed, uint8_t *__restrict__ scales, uint32_t n,
                   uint32_t k, uint32_t in_pitch) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t blocks = k / kBlock;
    const uint64_t total = (uint64_t)n * blocks;
    const float global = *global_scale;
    for (uint64_t item = first_item(); item < total; item += item_stride()) {
        uint64_t row = item / blocks;
        uint32_t block = (uint32_t)(item % blocks);
        const uint4 *src =
            reinterpret_cast<const uint4 *>(in + row * in_pitch + (uint64_t)block * kBlock);
        uint4 v0 = src[0], v1 = src[1];
        uint32_t pairs[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            amax = fmaxf(amax, fmaxf(mg_num_finite_magnitude(mg_num_bf16_low(pairs[i])),
                                     mg_num_finite_magnitude(mg_num_bf16_high(pairs[i]))));
        uint32_t scale = block_scale_code(amax, global);
        float d = __fmul_rn(mg_num_fp8_e4m3_to_f32(scale), global);
        uint32_t words[2] = {0, 0};
        if (scale) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t byte = e2m1_nibble(mg_num_bf16_low(pairs[i]), d) |
                                e2m1_nibble(mg_num_bf16_high(pairs[i]), d) << 4;
                words[i / 4] |= byte << (8 * (i % 4));
            }
        }
        *reinterpret_cast<uint2 *>(packed + row * (k / 2) + (uint64_t)block * (kBlock / 2)) =
            make_uint2(words[0], words[1]);
        scales[item] = (uint8_t)scale;
    }
}

// One thread per 16-element block: 8 bytes of nibbles and 1 scale in, 16 values out.
template <bool kF32>
__device__ __forceinline__ void
dequantize(const uint8_t *__restrict__ packed, const uint8_t *__restrict__ scales,
           const float *__restrict__ global_scale, void *out, uint32_t n, uint32_t k) {
    const uint32_t blocks = k / kBlock;
    const uint64_t total = (uint64_t)n * blocks;
    const float global = *global_scale;
    for (uint64_t item = first_item(); item < total; item += item_stride()) {
        uint2 q = *reinterpret_cast<const uint2 *>(packed + item * (kBlock / 2));
        float scale = mg_num_fp8_e4m3_to_f32(scales[item]);
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; i++)
            v[i] = dequantize_value(((i < 8 ? q.x : q.y) >> (4 * (i % 8))) & 0xfu, scale, global);
        // Blocks are contiguous in a contiguous [n, k] output: item * 16 is the first value.
        if (kF32) {
            uint4 *dst = reinterpret_cast<uint4 *>(static_cast<float *>(out) + item * kBlock);
#pragma unroll
            for (int i = 0; i < 4; i++)
                dst[i] = make_uint4(__float_as_uint(v[4 * i]), __float_as_uint(v[4 * i + 1]),
                                    __float_as_uint(v[4 * i + 2]), __float_as_uint(v[4 * i + 3]));
        } else {
            uint32_t w[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = mg_num_bf16_pack(v[2 * i], v[2 * i + 1]);
            uint4 *dst = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(out) + item * kBlock);
            dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
            dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_bf16(const uint8_t *__restrict__ packed, const uint8_t *__restrict__ scales,
                          const float *__restrict__ global_scale, uint16_t *__restrict__ out,
                          uint32_t n, uint32_t k) {
    grid_dependency_wait();
    launch_dependents();
    dequantize<false>(packed, scales, global_scale, out, n, k);
}

extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_f32(const uint8_t *__restrict__ packed, const uint8_t *__restrict__ scales,
                         const float *__restrict__ global_scale, float *__restrict__ out,
                         uint32_t n, uint32_t k) {
    grid_dependency_wait();
    launch_dependents();
    dequantize<true>(packed, scales, global_scale, out, n, k);
}

// Nibble matrix [rows, cols] packed along cols -> [cols, rows] packed along rows; one thread
// per output byte (an offline layout tool: simple rather than fast).
extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_transpose_nibbles(const uint8_t *__restrict__ in, uint8_t *__restrict__ out,
                            uint32_t rows, uint32_t cols) {
    grid_dependency_wait();
    launch_dependents();
    const uint64_t out_row_bytes = rows / 2, total = (uint64_t)cols * out_row_bytes;
    for (uint64_t item = first_item(); item < total; item += item_stride()) {
        uint64_t c = item / out_row_bytes, r = 2 * (item % out_row_bytes);
        const uint8_t *a = in + r * (cols / 2) + c / 2;
        uint32_t shift = (uint32_t)(c & 1) * 4;
        out[item] = (uint8_t)(((a[0] >> shift) & 0xfu) | ((a[cols / 2] >> shift) & 0xfu) << 4);
    }
}

// Byte matrix [rows, cols] -> [cols, rows]; one thread per output byte.
extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_transpose_bytes(const uint8_t *__restrict__ in, uint8_t *__restrict__ out, uint32_t rows,
                          uint32_t cols) {
    grid_dependency_wait();
    launch_dependents();
    const uint64_t total = (uint64_t)rows * cols;
    for (uint64_t item = first_item(); item < total; item += item_stride())
        out[item] = in[(item % rows) * cols + item / rows];
}

// Scales [rows, cols] -> Blackwell layout; one thread per output byte, padding written as 0.
extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_scales_swizzle(const uint8_t *__restrict__ in, uint8_t *__restrict__ out, uint32_t rows,
                         uint32_t cols) {
    grid_dependency_wait();
    launch_dependents();
    const uint64_t col_tiles = ((uint64_t)cols + 3) / 4;
    const uint64_t total = ((uint64_t)rows + 127) / 128 * 128 * col_tiles * 4;
    for (uint64_t item = first_item(); item < total; item += item_stride()) {
        uint64_t tile = item / 512;
        uint32_t within = (uint32_t)(item % 512);
        uint64_t row = (tile / col_tiles) * 128 + ((within % 16) / 4) * 32 + within / 16;
        uint64_t col = (tile % col_tiles) * 4 + within % 4;
        out[item] = row < rows && col < cols ? in[row * cols + col] : (uint8_t)0;
    }
}

// Blackwell layout -> scales [rows, cols]; one thread per output byte.
extern "C" __global__ void __launch_bounds__(kThreads)
    nvfp4_scales_unswizzle(const uint8_t *__restrict__ in, uint8_t *__restrict__ out, uint32_t rows,
                           uint32_t cols) {
    grid_dependency_wait();
    launch_dependents();
    const uint64_t col_tiles = ((uint64_t)cols + 3) / 4, total = (uint64_t)rows * cols;
    for (uint64_t item = first_item(); item < total; item += item_stride()) {
        uint64_t row = item / cols, col = item % cols;
        uint64_t tile = (row / 128) * col_tiles + col / 4;
        out[item] = in[tile * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4];
    }
}
