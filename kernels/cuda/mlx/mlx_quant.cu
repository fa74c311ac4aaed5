// mlx_quant.cu - MLX affine-quantized weights (metrale/mlx.h): dequant to BF16 and the GEMVs
// (plain, silu_gate, silu_gate_resid, gate_up) for bits 8 and 4, groups of 32/64/128, scales
// and biases in BF16 or FP16. Argument lists as in metrale/mlx.h; the CPU reference is
// src/ops/mlx/mlx_reference.c.
//
// Layout facts the kernels rely on (the front checks them): k % group_size == 0 and
// group_size >= 32, so a row of packed words is a whole number of 16-byte vectors and each
// vector (16 codes of 8 bits, or 32 of 4 bits) lies inside one group; weight rows are 16-byte
// aligned; x and u are 16-byte aligned.
//
// Dequant is bit-exact with the reference: scale * q is exact in FP32 (at most 11 + 8
// significant bits), rounded once to the scales' type; t + bias is an IEEE FP32 addition
// rounded to that type, then converted to BF16 (exact from BF16, round-to-nearest from FP16).
//
// GEMV: a block of 8 warps owns 16 output rows (2 per warp). The activation rows (M <= 8) are
// staged through shared memory in FP32, ChunkCols<M> columns at a time (32 KiB whatever M:
// 8192 columns at M = 1), together with each group's activation sum, so the bias is folded
// once per group: sum w*x = scale*sum(q*x) + bias*sum(x). Each lane issues LoadBatch<M> 16-byte
// weight loads before using any, to keep enough bytes in flight for the memory system.
// For silu_gate the staged activation is bf16(silu(g) * u), computed once per block. Weights
// are streamed with 16-byte non-allocating loads; each lane keeps its own partial sums and a
// warp-shuffle reduction ends each row. Codes become floats without conversion instructions:
// 8 bits through the 2^23 magic (prmt into 0x4b0000qq, minus 2^23); 4 bits through a BF16
// magic 128 + q whose offset 128 is folded into the bias (bias - 128 * scale).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp; // 16, as src/ops/mlx/mlx.c launches
constexpr int kStagedFloats = 8192;              // activation floats staged per pass (32 KiB)
constexpr int kStagedGroups = kStagedFloats / 32; // their group sums, at the smallest group
// Weight vectors a lane loads before using any: 4 while the per-row sums are few, 2 at M > 4
// (more would spill registers).
template <int M> constexpr int LoadBatch = M <= 4 ? 4 : 2;

// Staged columns per pass for M activation rows: as many as fit, a multiple of 128 so no group
// straddles two passes.
template <int M> constexpr int ChunkCols = kStagedFloats / M / 128 * 128;
static_assert(ChunkCols<8> == 1024, "M = 8 (MG_MLX_GEMV_MAX_M) stages 1024 columns per pass");

enum { kPlain = 0, kSiluGate = 1, kSiluGateResid = 2 };

__device__ __forceinline__ float scale_value(const uint16_t *p, size_t i, bool f16) {
    uint16_t bits = p[i];
    return f16 ? __half2float(__ushort_as_half(bits)) : __uint_as_float((uint32_t)bits << 16);
}

__device__ __forceinline__ float round_to(float x, bool f16) {
    return f16 ? __half2float(__float2half_rn(x)) : __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ uint16_t bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ uint4 load_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float bf16_to_float(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}

// ------------------------------------------------------------------ dequant

template <int Bits>
__device__ void dequant_body(const uint4 *weight, const uint16_t *scales, const uint16_t *biases,
                             uint16_t *out, uint32_t n, uint32_t k, uint32_t group_size, bool f16) {
    constexpr int kPerWord = 32 / Bits;
    constexpr int kPerVector = 4 * kPerWord;
    const uint32_t vectors_per_row = k / kPerVector;
    const uint64_t total = (uint64_t)n * vectors_per_row;
    const uint32_t groups = k / group_size;
    for (uint64_t v = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; v < total;
         v += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t row = (uint32_t)(v / vectors_per_row);
        uint32_t col = (uint32_t)(v % vectors_per_row) * kPerVector;
        size_t g = (size_t)row * groups + col / group_size;
        float scale = scale_value(scales, g, f16), bias = scale_value(biases, g, f16);
        uint4 words = load_stream(weight + v);
        uint32_t w[4] = {words.x, words.y, words.z, words.w};
        uint16_t *dst = out + (size_t)row * k + col;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t packed[kPerWord / 2];
#pragma unroll
            for (int j = 0; j < kPerWord; j += 2) {
                float q0 = (float)((w[i] >> (j * Bits)) & ((1u << Bits) - 1));
                float q1 = (float)((w[i] >> ((j + 1) * Bits)) & ((1u << Bits) - 1));
                float a = round_to(__fadd_rn(round_to(__fmul_rn(scale, q0), f16), bias), f16);
                float b = round_to(__fadd_rn(round_to(__fmul_rn(scale, q1), f16), bias), f16);
                packed[j / 2] = (uint32_t)bf16_bits(a) | (uint32_t)bf16_bits(b) << 16;
            }
            // kPerWord BF16 = 8 (8-bit: 4 codes -> 8 bytes) or 16 bytes (4-bit: 8 codes).
            if (kPerWord == 4)
                *reinterpret_cast<uint2 *>(dst + i * kPerWord) = make_uint2(packed[0], packed[1]);
            else
                *reinterpret_cast<uint4 *>(dst + i * kPerWord) =
                    make_uint4(packed[0], packed[1 % (kPerWord / 2)], packed[2 % (kPerWord / 2)],
                               packed[3 % (kPerWord / 2)]);
        }
    }
}

// ------------------------------------------------------------------ GEMV

struct Layer {
    const uint4 *weight;
    const uint16_t *scales, *biases;
};

// Sum over one 16-byte vector (16 or 32 codes starting at staged column c) of code * act for
// each activation row, added to acc[t]. For 4 bits the codes are 128 + q (see the file comment).
template <int Bits, int M>
__device__ __forceinline__ void vector_dot(uint4 words, const float *act, uint32_t c,
                                           float acc[M]) {
    constexpr int kChunk = ChunkCols<M>;
    const uint32_t w[4] = {words.x, words.y, words.z, words.w};
    if (Bits == 8) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                // 0x4b0000qq: 2^23 + q.
                float q = __uint_as_float(__byte_perm(w[i], 0x4b000000u, 0x7640u + j)) -
                          8388608.0f;
#pragma unroll
                for (int t = 0; t < M; t++)
                    acc[t] = fmaf(q, act[t * kChunk + c + i * 4 + j], acc[t]);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int s = 0; s < 4; s++) {
                // Nibbles s and s + 4 of the word as BF16 128 + q in the low and high halves.
                uint32_t pair = ((w[i] >> (4 * s)) & 0x000f000fu) | 0x43004300u;
                float q_lo = __uint_as_float(pair << 16), q_hi = __uint_as_float(pair & 0xffff0000u);
#pragma unroll
                for (int t = 0; t < M; t++) {
                    acc[t] = fmaf(q_lo, act[t * kChunk + c + i * 8 + s], acc[t]);
                    acc[t] = fmaf(q_hi, act[t * kChunk + c + i * 8 + s + 4], acc[t]);
                }
            }
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One block: kRowsPerBlock rows of each of the NW layers (NW = 2 for gate_up, one activation).
template <int Bits, int M, int NW>
__device__ void gemv_body(const Layer *layers, const uint16_t *x, const uint16_t *u,
                          const uint16_t *resid, uint16_t *const *y, uint32_t n, uint32_t k,
                          uint32_t group_size, bool f16, int mode, float *act,
                          float *group_sums) {
    constexpr int kPerVector = 128 / Bits;
    const float offset = Bits == 4 ? 128.0f : 0.0f;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t row0 = blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp;
    const uint32_t groups = k / group_size, vectors_per_row = k / kPerVector;
    float sum[NW][kRowsPerWarp][M];
#pragma unroll
    for (int l = 0; l < NW; l++)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
            for (int t = 0; t < M; t++)
                sum[l][r][t] = 0.0f;

    constexpr int kChunk = ChunkCols<M>;
    constexpr int kChunkGroups = kChunk / 32; // group sums per activation row, at most
    constexpr int kLoadBatch = LoadBatch<M>;
    for (uint32_t c0 = 0; c0 < k; c0 += kChunk) {
        const uint32_t width = min((uint32_t)kChunk, k - c0);
        __syncthreads(); // the previous chunk is consumed
        for (uint32_t i = threadIdx.x; i < M * width; i += kThreads) {
            uint32_t t = i / width, c = i % width;
            size_t src = (size_t)t * k + c0 + c;
            float a = bf16_to_float(x[src]);
            if (mode != kPlain) {
                float silu = a / (1.0f + expf(-a));
                a = __bfloat162float(__float2bfloat16_rn(silu * bf16_to_float(u[src])));
            }
            act[t * kChunk + c] = a;
        }
        __syncthreads();
        // Group sums of the staged activations: one warp per (row, group), lanes over columns.
        const uint32_t chunk_groups = width / group_size;
        for (uint32_t i = warp; i < M * chunk_groups; i += kWarps) {
            uint32_t t = i / chunk_groups, g = i % chunk_groups;
            float s = 0.0f;
            for (uint32_t c = lane; c < group_size; c += 32)
                s += act[t * kChunk + g * group_size + c];
            s = warp_sum(s);
            if (lane == 0)
                group_sums[t * kChunkGroups + g] = s;
        }
        __syncthreads();
        const uint32_t chunk_vectors = width / kPerVector;
#pragma unroll
        for (int l = 0; l < NW; l++)
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; r++) {
                const uint32_t row = row0 + r;
                if (row >= n)
                    continue;
                const uint4 *wrow = layers[l].weight + (size_t)row * vectors_per_row + c0 / kPerVector;
                for (uint32_t v0 = lane; v0 < chunk_vectors; v0 += 32 * kLoadBatch) {
                    uint4 words[kLoadBatch];
#pragma unroll
                    for (int b = 0; b < kLoadBatch; b++)
                        if (v0 + b * 32 < chunk_vectors)
                            words[b] = load_stream(wrow + v0 + b * 32);
#pragma unroll
                    for (int b = 0; b < kLoadBatch; b++) {
                        const uint32_t v = v0 + b * 32;
                        if (v >= chunk_vectors)
                            continue;
                        const uint32_t c = v * kPerVector;
                        float acc[M];
#pragma unroll
                        for (int t = 0; t < M; t++)
                            acc[t] = 0.0f;
                        vector_dot<Bits, M>(words[b], act, c, acc);
                        const size_t g = (size_t)row * groups + (c0 + c) / group_size;
                        const float scale = scale_value(layers[l].scales, g, f16);
                        // The group's bias term once, by the lane holding its first vector.
                        const bool first = (c0 + c) % group_size == 0;
                        const float bias =
                            first ? scale_value(layers[l].biases, g, f16) - offset * scale : 0.0f;
                        const uint32_t cg = c / group_size;
#pragma unroll
                        for (int t = 0; t < M; t++)
                            sum[l][r][t] += scale * acc[t] + bias * group_sums[t * kChunkGroups + cg];
                    }
                }
            }
    }
#pragma unroll
    for (int l = 0; l < NW; l++)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; r++) {
            const uint32_t row = row0 + r;
#pragma unroll
            for (int t = 0; t < M; t++) {
                float v = warp_sum(sum[l][r][t]);
                if (lane == t && row < n) {
                    size_t o = (size_t)t * n + row;
                    if (mode == kSiluGateResid)
                        v += bf16_to_float(resid[o]);
                    y[l][o] = bf16_bits(v);
                }
            }
        }
}

template <int Bits, int NW>
__device__ void gemv_dispatch_m(const Layer *layers, const uint16_t *x, const uint16_t *u,
                                const uint16_t *resid, uint16_t *const *y, uint32_t m, uint32_t n,
                                uint32_t k, uint32_t group_size, bool f16, int mode,
                                float *act, float *group_sums) {
    switch (m) {
    case 1: gemv_body<Bits, 1, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    case 2: gemv_body<Bits, 2, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    case 3: gemv_body<Bits, 3, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    case 4: gemv_body<Bits, 4, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    case 5: gemv_body<Bits, 5, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    case 6: gemv_body<Bits, 6, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    case 7: gemv_body<Bits, 7, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    default: gemv_body<Bits, 8, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, act, group_sums); break;
    }
}

} // namespace

extern "C" __global__ void __launch_bounds__(256)
mlx_dequant(const uint4 *weight, const uint16_t *scales, const uint16_t *biases, uint16_t *out,
            uint32_t n, uint32_t k, uint32_t bits, uint32_t group_size, uint32_t scale_type) {
    if (bits == 8)
        dequant_body<8>(weight, scales, biases, out, n, k, group_size, scale_type == 1);
    else
        dequant_body<4>(weight, scales, biases, out, n, k, group_size, scale_type == 1);
}

extern "C" __global__ void __launch_bounds__(kThreads)
mlx_gemv(const uint4 *weight, const uint16_t *scales, const uint16_t *biases, const uint16_t *x,
         const uint16_t *u, const uint16_t *resid, uint16_t *y, uint32_t m, uint32_t n, uint32_t k,
         uint32_t bits, uint32_t group_size, uint32_t scale_type, uint32_t mode) {
    // Declared here, once: declared in the templates, each instantiation would get its own.
    __shared__ __align__(16) float act[kStagedFloats];
    __shared__ float group_sums[kStagedGroups];
    const Layer layer = {weight, scales, biases};
    uint16_t *const outs[1] = {y};
    if (bits == 8)
        gemv_dispatch_m<8, 1>(&layer, x, u, resid, outs, m, n, k, group_size, scale_type == 1, (int)mode, act, group_sums);
    else
        gemv_dispatch_m<4, 1>(&layer, x, u, resid, outs, m, n, k, group_size, scale_type == 1, (int)mode, act, group_sums);
}

extern "C" __global__ void __launch_bounds__(kThreads)
mlx_gemv_gate_up(const uint4 *w1, const uint16_t *s1, const uint16_t *b1, const uint4 *w2,
                 const uint16_t *s2, const uint16_t *b2, const uint16_t *x, uint16_t *y1,
                 uint16_t *y2, uint32_t m, uint32_t n, uint32_t k, uint32_t bits,
                 uint32_t group_size, uint32_t scale_type) {
    __shared__ __align__(16) float act[kStagedFloats];
    __shared__ float group_sums[kStagedGroups];
    const Layer layers[2] = {{w1, s1, b1}, {w2, s2, b2}};
    uint16_t *const outs[2] = {y1, y2};
    if (bits == 8)
        gemv_dispatch_m<8, 2>(layers, x, nullptr, nullptr, outs, m, n, k, group_size, scale_type == 1, kPlain, act, group_sums);
    else
        gemv_dispatch_m<4, 2>(layers, x, nullptr, nullptr, outs, m, n, k, group_size, scale_type == 1, kPlain, act, group_sums);
}
