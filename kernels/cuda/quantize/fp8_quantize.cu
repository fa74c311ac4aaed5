// fp8_quantize.cu - FP8 E4M3 activation quantizers (metrale/ops_quantize.h): BF16 rows in,
// E4M3 codes and FP32 scales out, per tensor, per row or per 1x128 block.
//
// Bit-identical to the CPU reference (src/ops/common/fp8_quantize_host.h), because every step is
// the same exact or correctly rounded IEEE operation:
//  - BF16 -> FP32 moves the bits (exact);
//  - amax is the max of the finite |x| (fmaxf of non-negative finite floats is exact and
//    independent of order, so any reduction tree, and atomicMax on the bits, which order
//    like the values for non-negative floats, gives the host's bits);
//  - scale = __fdiv_rn(amax, 448), or 1 when amax is 0; code = E4M3 of __fdiv_rn(x, scale),
//    round to nearest even, saturating (cvt.rn.satfinite in hardware on sm_89+, cuda_fp8.hpp's
//    exact software conversion on older targets). __fdiv_rn is IEEE division whatever the
//    flags, and the build keeps subnormals (no fast math), as the host does. Infinities
//    divide to infinities, which saturate to +-448 as on the host.
//  - A NaN input gets the NaN code with its own sign, set explicitly: the division and the
//    conversion would give a canonical NaN whose sign the host does not produce.
//
// Rows are moved in 16-byte vectors: 8 BF16 loaded, 8 codes stored, which the front
// guarantees is aligned (cols and in_pitch multiples of 8, 16-byte aligned buffers). Blocks
// have at most kMaxThreads threads, a multiple of 32; every kernel is grid-stride.
#include <cuda_fp8.h>
#include <stdint.h>

#include "../common/fp8_e4m3.cuh"
#include "../common/grid_dependency.cuh"

namespace {

using namespace mg_fp8;

constexpr uint32_t kBf16PerVector = 8;
constexpr uint32_t kBlockColumns = 128;                               // one 1x128 scale block
constexpr uint32_t kVectorsPerBlock = kBlockColumns / kBf16PerVector; // 16: half a warp
constexpr int kMaxThreads = 128;
constexpr int kVectorsPerThread = 4; // 16-byte loads a thread keeps in flight
// Per-row mode: vectors a thread keeps in registers between the amax and the codes, so rows up
// to kMaxThreads * kRowVectorsKept * 8 = 8192 columns are read from memory once.
constexpr int kRowVectorsKept = 8;

// Max over the block; every thread gets it. All threads must call it.
__device__ __forceinline__ float block_max(float v) {
    __shared__ float warp_max[kMaxThreads / 32];
    v = lanes_max(v, 32);
    if (threadIdx.x % 32 == 0)
        warp_max[threadIdx.x / 32] = v;
    __syncthreads();
    float m = 0.0f;
    for (uint32_t w = 0; w < blockDim.x / 32; w++)
        m = fmaxf(m, warp_max[w]);
    __syncthreads(); // warp_max is written again by the next call
    return m;
}

__device__ __forceinline__ const uint4 *input_row(const uint16_t *in, uint64_t row,
                                                  uint32_t in_pitch) {
    return reinterpret_cast<const uint4 *>(in + row * in_pitch);
}

__device__ __forceinline__ uint2 *output_row(uint8_t *out, uint64_t row, uint32_t cols) {
    return reinterpret_cast<uint2 *>(out + row * cols);
}

__device__ __forceinline__ uint4 load_or_zero(const uint4 *row, uint32_t v, uint32_t vectors) {
    return v < vectors ? row[v] : make_uint4(0, 0, 0, 0);
}

// The per-tensor kernels walk units of one row by kVectorsPerThread * blockDim.x vectors.
struct TensorUnits {
    uint32_t vectors; // per row
    uint32_t chunk;   // vectors per unit
    uint64_t per_row; // units per row
    uint64_t count;

    __device__ TensorUnits(uint32_t rows, uint32_t cols)
        : vectors(cols / kBf16PerVector), chunk(blockDim.x * kVectorsPerThread),
          per_row((vectors + chunk - 1) / chunk), count((uint64_t)rows * per_row) {}
};

} // namespace

// ---------------------------------------------------------------- per tensor

// The scale slot holds the running amax, as FP32 bits, from reset to finish.
extern "C" __global__ void fp8_quantize_tensor_reset(float *scale) {
    grid_dependency_wait();
    launch_dependents();
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *reinterpret_cast<uint32_t *>(scale) = 0u;
}

extern "C" __global__ void __launch_bounds__(kMaxThreads)
    fp8_quantize_tensor_amax(const uint16_t *__restrict__ in, float *scale, uint32_t rows,
                             uint32_t cols, uint32_t in_pitch) {
    grid_dependency_wait();
    launch_dependents();
    TensorUnits units(rows, cols);
    float amax = 0.0f;
    for (uint64_t u = blockIdx.x; u < units.count; u += gridDim.x) {
        uint64_t row = u / units.per_row;
        uint32_t first = (uint32_t)(u - row * units.per_row) * units.chunk + threadIdx.x;
        const uint4 *src = input_row(in, row, in_pitch);
        uint4 x[kVectorsPerThread];
#pragma unroll
        for (int k = 0; k < kVectorsPerThread; k++)
            x[k] = load_or_zero(src, first + k * blockDim.x, units.vectors);
#pragma unroll
        for (int k = 0; k < kVectorsPerThread; k++)
            amax = vector_amax(x[k], amax);
    }
    amax = block_max(amax);
    if (threadIdx.x == 0 && amax > 0.0f)
        atomicMax(reinterpret_cast<unsigned int *>(scale), __float_as_uint(amax));
}

extern "C" __global__ void __launch_bounds__(kMaxThreads)
    fp8_quantize_tensor_codes(const uint16_t *__restrict__ in, uint8_t *__restrict__ out,
                              const float *scale, uint32_t rows, uint32_t cols, uint32_t in_pitch) {
    grid_dependency_wait();
    launch_dependents();
    const float s = scale_from_amax(*scale); // the amax fp8_quantize_tensor_amax reduced
    TensorUnits units(rows, cols);
    for (uint64_t u = blockIdx.x; u < units.count; u += gridDim.x) {
        uint64_t row = u / units.per_row;
        uint32_t first = (uint32_t)(u - row * units.per_row) * units.chunk + threadIdx.x;
        const uint4 *src = input_row(in, row, in_pitch);
        uint2 *dst = output_row(out, row, cols);
        uint4 x[kVectorsPerThread];
#pragma unroll
        for (int k = 0; k < kVectorsPerThread; k++)
            x[k] = load_or_zero(src, first + k * blockDim.x, units.vectors);
#pragma unroll
        for (int k = 0; k < kVectorsPerThread; k++) {
            uint32_t v = first + k * blockDim.x;
            if (v < units.vectors)
                dst[v] = quantize_vector(x[k], s);
        }
    }
}

extern "C" __global__ void fp8_quantize_tensor_finish(float *scale) {
    grid_dependency_wait();
    launch_dependents();
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *scale = scale_from_amax(*scale);
}

// ---------------------------------------------------------------- per row

// One block per row: the row's amax over the block, then its codes from the registers
// (rows longer than the registers hold read their tail again, from L2).
extern "C" __global__ void __launch_bounds__(kMaxThreads)
    fp8_quantize_rows(const uint16_t *__restrict__ in, uint8_t *__restrict__ out,
                      float *__restrict__ scales, uint32_t rows, uint32_t cols, uint32_t in_pitch) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t vectors = cols / kBf16PerVector;
    const uint32_t kept_end = kRowVectorsKept * blockDim.x;
    for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const uint4 *src = input_row(in, row, in_pitch);
        uint2 *dst = output_row(out, row, cols);
        uint4 kept[kRowVectorsKept];
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < kRowVectorsKept; k++)
            kept[k] = load_or_zero(src, threadIdx.x + k * blockDim.x, vectors);
#pragma unroll
        for (int k = 0; k < kRowVectorsKept; k++)
            amax = vector_amax(kept[k], amax);
        for (uint32_t v = kept_end + threadIdx.x; v < vectors; v += blockDim.x)
            amax = vector_amax(src[v], amax);
        const float scale = scale_from_amax(block_max(amax));
        if (threadIdx.x == 0)
            scales[row] = scale;
#pragma unroll
        for (int k = 0; k < kRowVectorsKept; k++) {
            uint32_t v = threadIdx.x + k * blockDim.x;
            if (v < vectors)
                dst[v] = quantize_vector(kept[k], scale);
        }
        for (uint32_t v = kept_end + threadIdx.x; v < vectors; v += blockDim.x)
            dst[v] = quantize_vector(src[v], scale);
    }
}

// ---------------------------------------------------------------- per 1x128 block

// One block per row; each 128-column block of the row is 16 consecutive vectors, held by one
// half-warp, which reduces its amax with shuffles. Row r's scale of K-block g goes to
// scales[r * scale_row_stride + g * scale_block_stride]: the natural [rows, L] layout or the
// GEMM's [L, rows_pad]. Rows rows <= r < rows_out are the GEMM layout's padding: zero codes
// and zero scales.
extern "C" __global__ void __launch_bounds__(kMaxThreads)
    fp8_quantize_1x128(const uint16_t *__restrict__ in, uint8_t *__restrict__ out,
                       float *__restrict__ scales, uint32_t rows, uint32_t rows_out, uint32_t cols,
                       uint32_t in_pitch, uint32_t scale_row_stride, uint32_t scale_block_stride) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t vectors = cols / kBf16PerVector;
    const uint32_t blocks = (cols - 1) / kBlockColumns + 1; // L = ceil(cols / 128), cols >= 1
    const uint32_t pass = kVectorsPerThread * blockDim.x;
    const bool leads_block = threadIdx.x % kVectorsPerBlock == 0;
    for (uint64_t row = blockIdx.x; row < rows_out; row += gridDim.x) {
        uint2 *dst = output_row(out, row, cols);
        float *row_scales = scales + row * scale_row_stride;
        if (row >= rows) {
            for (uint32_t v = threadIdx.x; v < vectors; v += blockDim.x)
                dst[v] = make_uint2(0u, 0u);
            for (uint32_t g = threadIdx.x; g < blocks; g += blockDim.x)
                row_scales[(uint64_t)g * scale_block_stride] = 0.0f;
            continue;
        }
        const uint4 *src = input_row(in, row, in_pitch);
        for (uint32_t base = 0; base < vectors; base += pass) {
            uint4 x[kVectorsPerThread];
#pragma unroll
            for (int k = 0; k < kVectorsPerThread; k++)
                x[k] = load_or_zero(src, base + k * blockDim.x + threadIdx.x, vectors);
#pragma unroll
            for (int k = 0; k < kVectorsPerThread; k++) {
                uint32_t v = base + k * blockDim.x + threadIdx.x;
                // Lanes past the row end hold zeros, which leave a partial block's amax as is.
                const float scale =
                    scale_from_amax(lanes_max(vector_amax(x[k], 0.0f), kVectorsPerBlock));
                if (v < vectors) {
                    dst[v] = quantize_vector(x[k], scale);
                    if (leads_block)
                        row_scales[(uint64_t)(v / kVectorsPerBlock) * scale_block_stride] = scale;
                }
            }
        }
    }
}
