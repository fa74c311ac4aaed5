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
// GEMV: a block of 4 warps owns 16 output rows, 4 per warp (each warp 4 rows of each layer
// for gate_up). Lane L takes the row's 16-byte weight vectors L, L + 32, ...: for each it
// loads the vector of every row of the warp first (4 to 8 loads in flight per lane), then
// the matching activations straight from global memory (16 contiguous BF16 per load, L1 hits
// for the block's other warps), converts them once for all the warp's rows, and adds
// scale * sum(q * x) + bias * sum(x) per row, the bias folded through the vector's activation
// sum (a 16-byte vector lies inside one group). No shared memory, no barrier. For silu_gate
// the activation bf16(silu(g) * u) is made on the fly, as the reference makes it.
// Codes become floats without conversion instructions: 8 bits through the 2^23 magic (prmt
// into 0x4b0000qq, minus 2^23); 4 bits through a BF16 magic 128 + q whose offset 128 is folded
// into the bias (bias - 128 * scale).
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/f16.cuh"
#include "common/grid_dependency.cuh"
#include "common/silu.cuh"
#include "common/stream_load.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp; // 16, as src/ops/mlx/mlx.c launches

enum { kPlain = 0, kSiluGate = 1, kSiluGateResid = 2 };
// gate_up's epilogue (mlx_reference.h): both products stored, or y[0] = silu(gate) * up.
enum { kGateUpBoth = 0, kGateUpSiluMul = 1 };

__device__ __forceinline__ float scale_value(const uint16_t *p, size_t i, bool f16) {
    uint16_t bits = p[i];
    return f16 ? mg_num_f16_to_f32(bits) : mg_num_bf16_to_f32(bits);
}

// x rounded to the scale type (F16 or BF16) and back.
__device__ __forceinline__ float round_to(float x, bool f16) {
    return f16 ? mg_num_f16_to_f32(mg_num_f32_to_f16(x))
               : mg_num_bf16_to_f32(mg_num_f32_to_bf16(x));
}

// ------------------------------------------------------------------ dequant

template <int Bits>
__device__ void dequant_body(const uint4 *weight, const uint16_t *scales, const uint16_t *biases,
                             uint16_t *out, uint32_t n, uint32_t k, uint32_t group_size, bool f16) {
    constexpr int kPerWord = 32 / Bits;
    constexpr int kPerVector = 4 * kPerWord;
    const uint32_t vectors_per_row = k / kPerVector;
    const uint32_t groups = k / group_size;
    // Rows are strided over the grid and a row's vectors over the block: 32-bit index math
    // (a 64-bit division per vector cost more than the memory traffic).
    for (uint32_t row = blockIdx.x; row < n; row += gridDim.x)
        for (uint32_t vr = threadIdx.x; vr < vectors_per_row; vr += blockDim.x) {
            const size_t v = (size_t)row * vectors_per_row + vr;
            uint32_t col = vr * kPerVector;
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
                    packed[j / 2] = mg_num_bf16_pack(a, b);
                }
                // kPerWord BF16 = 8 (8-bit: 4 codes -> 8 bytes) or 16 bytes (4-bit: 8 codes).
                if (kPerWord == 4)
                    *reinterpret_cast<uint2 *>(dst + i * kPerWord) =
                        make_uint2(packed[0], packed[1]);
                else
                    *reinterpret_cast<uint4 *>(dst + i * kPerWord) =
                        make_uint4(packed[0], packed[1 % (kPerWord / 2)],
                                   packed[2 % (kPerWord / 2)], packed[3 % (kPerWord / 2)]);
            }
        }
}

// ------------------------------------------------------------------ GEMV

struct Layer {
    const uint4 *weight;
    const uint16_t *scales, *biases;
};

// Eight activations of row t at column c as floats (with silu_gate: bf16(silu(g) * u)).
__device__ __forceinline__ void load_act8(const uint16_t *x, const uint16_t *u, int mode, size_t at,
                                          float (&a)[8]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(x + at));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        a[2 * i] = mg_num_bf16_low(w[i]);
        a[2 * i + 1] = mg_num_bf16_high(w[i]);
    }
    if (mode != kPlain) {
        const uint4 uv = __ldg(reinterpret_cast<const uint4 *>(u + at));
        const uint32_t uw[4] = {uv.x, uv.y, uv.z, uv.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float ui = i % 2 ? mg_num_bf16_high(uw[i / 2]) : mg_num_bf16_low(uw[i / 2]);
            const float silu = a[i] / (1.0f + expf(-a[i]));
            a[i] = mg_num_bf16_to_f32(mg_num_f32_to_bf16(silu * ui));
        }
    }
}

// Codes 8 * part .. 8 * part + 7 of a 16-byte vector as floats (4 bits: 128 + q).
template <int Bits> __device__ __forceinline__ void codes8(uint4 words, int part, float (&q)[8]) {
    const uint32_t w[4] = {words.x, words.y, words.z, words.w};
    if (Bits == 8) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t word = w[part * 2 + h];
#pragma unroll
            for (int j = 0; j < 4; j++)
                q[h * 4 + j] =
                    __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7640u + j)) - 8388608.0f;
        }
    } else {
        const uint32_t word = w[part];
#pragma unroll
        for (int s = 0; s < 4; s++) {
            // Nibbles s and s + 4 as BF16 128 + q in the low and high halves.
            const uint32_t pair = ((word >> (4 * s)) & 0x000f000fu) | 0x43004300u;
            q[s] = mg_num_bf16_low(pair);
            q[s + 4] = mg_num_bf16_high(pair);
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Rows of each layer a warp handles in one pass over K: NW * R * M running sums stay at 8 or
// fewer, so every M of the one kernel fits its registers (the kernel's register count is that
// of its largest variant).
template <int M, int NW>
constexpr int RowsPerPass = (M <= 2 ? 4
                             : M <= 4
                                 ? 2
                                 : 1) / NW
                                    > 0
                                ? (M <= 2   ? 4
                                   : M <= 4 ? 2
                                            : 1) /
                                      NW
                                : 1;

// R = RowsPerPass rows of each of the NW layers (NW = 2 for gate_up, one activation), from
// row0 on.
template <int Bits, int M, int NW>
__device__ void gemv_rows(const Layer *layers, const uint16_t *x, const uint16_t *u,
                          const uint16_t *resid, uint16_t *const *y, uint32_t n, uint32_t k,
                          uint32_t group_size, bool f16, int mode, uint32_t row0) {
    constexpr int R = RowsPerPass<M, NW>;
    constexpr int kPerVector = 128 / Bits; // codes per 16-byte vector: 16 or 32
    // One layer: `mode` says how the activations are formed (and whether resid is added);
    // gate_up (NW = 2): it is the epilogue, and the activations are x.
    const int act_mode = NW == 1 ? mode : kPlain;
    constexpr int kParts = kPerVector / 8;
    const float offset = Bits == 4 ? 128.0f : 0.0f;
    const int lane = threadIdx.x % 32;
    const uint32_t groups = k / group_size, vectors_per_row = k / kPerVector;
    float sum[NW][R][M];
#pragma unroll
    for (int l = 0; l < NW; l++)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < M; t++)
                sum[l][r][t] = 0.0f;

    for (uint32_t v = lane; v < vectors_per_row; v += 32) {
        uint4 w[NW][R];
        float scale[NW][R], bias[NW][R];
        const uint32_t c = v * kPerVector;
#pragma unroll
        for (int l = 0; l < NW; l++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t row = min(row0 + r, n - 1); // rows past n compute, never store
                w[l][r] = load_stream(layers[l].weight + (size_t)row * vectors_per_row + v);
            }
#pragma unroll
        for (int l = 0; l < NW; l++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t row = min(row0 + r, n - 1);
                const size_t g = (size_t)row * groups + c / group_size;
                scale[l][r] = scale_value(layers[l].scales, g, f16);
                bias[l][r] = scale_value(layers[l].biases, g, f16) - offset * scale[l][r];
            }
#pragma unroll
        for (int t = 0; t < M; t++) {
            float xsum = 0.0f;
            float dot[NW][R];
#pragma unroll
            for (int l = 0; l < NW; l++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    dot[l][r] = 0.0f;
#pragma unroll
            for (int part = 0; part < kParts; part++) {
                float a[8];
                load_act8(x, u, act_mode, (size_t)t * k + c + part * 8, a);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    xsum += a[i];
#pragma unroll
                for (int l = 0; l < NW; l++)
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float q[8];
                        codes8<Bits>(w[l][r], part, q);
#pragma unroll
                        for (int i = 0; i < 8; i++)
                            dot[l][r] = fmaf(q[i], a[i], dot[l][r]);
                    }
            }
#pragma unroll
            for (int l = 0; l < NW; l++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    sum[l][r][t] += scale[l][r] * dot[l][r] + bias[l][r] * xsum;
        }
    }
    if (NW == 2 && mode == kGateUpSiluMul) {
        // gate_up with the SiLU-mul: the lane holds both products of its row and token, each
        // rounded to BF16 as gate_up stores it, then silu(gate) * up rounded once.
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t row = row0 + r;
#pragma unroll
            for (int t = 0; t < M; t++) {
                const float gate = mg_num_bf16_to_f32(mg_num_f32_to_bf16(warp_sum(sum[0][r][t])));
                const float up =
                    mg_num_bf16_to_f32(mg_num_f32_to_bf16(warp_sum(sum[NW - 1][r][t])));
                if (lane == t && row < n)
                    y[0][(size_t)t * n + row] =
                        (uint16_t)mg_num_f32_to_bf16(mg_silu_mul_f32(gate, up));
            }
        }
        return;
    }
#pragma unroll
    for (int l = 0; l < NW; l++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t row = row0 + r;
#pragma unroll
            for (int t = 0; t < M; t++) {
                float v = warp_sum(sum[l][r][t]);
                if (lane == t && row < n) {
                    size_t o = (size_t)t * n + row;
                    if (act_mode == kSiluGateResid)
                        v += mg_num_bf16_to_f32(resid[o]);
                    y[l][o] = (uint16_t)mg_num_f32_to_bf16(v);
                }
            }
        }
}

// The warp's kRowsPerWarp rows, RowsPerPass at a time (the activations of a later pass are L1
// hits).
template <int Bits, int M, int NW>
__device__ void gemv_body(const Layer *layers, const uint16_t *x, const uint16_t *u,
                          const uint16_t *resid, uint16_t *const *y, uint32_t n, uint32_t k,
                          uint32_t group_size, bool f16, int mode) {
    const uint32_t warp_row0 = blockIdx.x * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
    for (uint32_t r = 0; r < kRowsPerWarp && warp_row0 + r < n; r += RowsPerPass<M, NW>)
        gemv_rows<Bits, M, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode, warp_row0 + r);
}

template <int Bits, int NW>
__device__ void gemv_dispatch_m(const Layer *layers, const uint16_t *x, const uint16_t *u,
                                const uint16_t *resid, uint16_t *const *y, uint32_t m, uint32_t n,
                                uint32_t k, uint32_t group_size, bool f16, int mode) {
    switch (m) {
    case 1:
        gemv_body<Bits, 1, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    case 2:
        gemv_body<Bits, 2, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    case 3:
        gemv_body<Bits, 3, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    case 4:
        gemv_body<Bits, 4, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    case 5:
        gemv_body<Bits, 5, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    case 6:
        gemv_body<Bits, 6, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    case 7:
        gemv_body<Bits, 7, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    default:
        gemv_body<Bits, 8, NW>(layers, x, u, resid, y, n, k, group_size, f16, mode);
        break;
    }
}

} // namespace

extern "C" __global__ void __launch_bounds__(256)
    mlx_dequant(const uint4 *weight, const uint16_t *scales, const uint16_t *biases, uint16_t *out,
                uint32_t n, uint32_t k, uint32_t bits, uint32_t group_size, uint32_t scale_type) {
    grid_dependency_wait();
    if (bits == 8)
        dequant_body<8>(weight, scales, biases, out, n, k, group_size, scale_type == 1);
    else
        dequant_body<4>(weight, scales, biases, out, n, k, group_size, scale_type == 1);
}

extern "C" __global__ void __launch_bounds__(kThreads)
    mlx_gemv(const uint4 *weight, const uint16_t *scales, const uint16_t *biases, const uint16_t *x,
             const uint16_t *u, const uint16_t *resid, uint16_t *y, uint32_t m, uint32_t n,
             uint32_t k, uint32_t bits, uint32_t group_size, uint32_t scale_type, uint32_t mode) {
    grid_dependency_wait();
    const Layer layer = {weight, scales, biases};
    uint16_t *const outs[1] = {y};
    if (bits == 8)
        gemv_dispatch_m<8, 1>(&layer, x, u, resid, outs, m, n, k, group_size, scale_type == 1,
                              (int)mode);
    else
        gemv_dispatch_m<4, 1>(&layer, x, u, resid, outs, m, n, k, group_size, scale_type == 1,
                              (int)mode);
}

extern "C" __global__ void __launch_bounds__(kThreads)
    mlx_gemv_gate_up(const uint4 *w1, const uint16_t *s1, const uint16_t *b1, const uint4 *w2,
                     const uint16_t *s2, const uint16_t *b2, const uint16_t *x, uint16_t *y1,
                     uint16_t *y2, uint32_t m, uint32_t n, uint32_t k, uint32_t bits,
                     uint32_t group_size, uint32_t scale_type, uint32_t epilogue) {
    grid_dependency_wait();
    const Layer layers[2] = {{w1, s1, b1}, {w2, s2, b2}};
    uint16_t *const outs[2] = {y1, y2};
    if (bits == 8)
        gemv_dispatch_m<8, 2>(layers, x, nullptr, nullptr, outs, m, n, k, group_size,
                              scale_type == 1, (int)epilogue);
    else
        gemv_dispatch_m<4, 2>(layers, x, nullptr, nullptr, outs, m, n, k, group_size,
                              scale_type == 1, (int)epilogue);
}

// The plain GEMV and gate_up compiled for one activation row alone (provider "cuda_m1" of
// src/ops/mlx/mlx.c, which launches them only with m = 1, the GEMV only in its plain mode):
// the kernels above take the registers of their M = 8 variant (mlx_gemv 124 a thread, four
// blocks an SM; gate_up 195, two), these at most 64 without spilling, so two to four times as
// many warps keep loads in flight. Same arguments, same arithmetic, the same bits.
constexpr int kM1BlocksPerSm = 8;     // gate_up: 64 registers
constexpr int kM1GemvBlocksPerSm = 7; // the GEMV's four rows a warp: 72 (64 would spill)

extern "C" __global__ void __launch_bounds__(kThreads, kM1GemvBlocksPerSm)
    mlx_gemv_m1(const uint4 *weight, const uint16_t *scales, const uint16_t *biases,
                const uint16_t *x, const uint16_t *u, const uint16_t *resid, uint16_t *y,
                uint32_t m, uint32_t n, uint32_t k, uint32_t bits, uint32_t group_size,
                uint32_t scale_type, uint32_t mode) {
    // m = 1 and mode plain: the provider's supports hook refuses the rest (the silu forms'
    // activations need more registers than 64 without spilling)
    (void)m, (void)u, (void)resid, (void)mode;
    grid_dependency_wait();
    const Layer layer = {weight, scales, biases};
    uint16_t *const outs[1] = {y};
    if (bits == 8)
        gemv_body<8, 1, 1>(&layer, x, nullptr, nullptr, outs, n, k, group_size, scale_type == 1,
                           kPlain);
    else
        gemv_body<4, 1, 1>(&layer, x, nullptr, nullptr, outs, n, k, group_size, scale_type == 1,
                           kPlain);
}

extern "C" __global__ void __launch_bounds__(kThreads, kM1BlocksPerSm)
    mlx_gemv_gate_up_m1(const uint4 *w1, const uint16_t *s1, const uint16_t *b1, const uint4 *w2,
                        const uint16_t *s2, const uint16_t *b2, const uint16_t *x, uint16_t *y1,
                        uint16_t *y2, uint32_t m, uint32_t n, uint32_t k, uint32_t bits,
                        uint32_t group_size, uint32_t scale_type, uint32_t epilogue) {
    (void)m;
    grid_dependency_wait();
    const Layer layers[2] = {{w1, s1, b1}, {w2, s2, b2}};
    uint16_t *const outs[2] = {y1, y2};
    if (bits == 8)
        gemv_body<8, 1, 2>(layers, x, nullptr, nullptr, outs, n, k, group_size, scale_type == 1,
                           (int)epilogue);
    else
        gemv_body<4, 1, 2>(layers, x, nullptr, nullptr, outs, n, k, group_size, scale_type == 1,
                           (int)epilogue);
}

// A layer's own bias after its product (metrale/mlx.h): y[t, r] = bf16(y[t, r] + bias[r]), the
// sum an IEEE FP32 addition of the BF16 product and the bias converted exactly to FP32
// (bias_type 0 BF16, 1 FP16, 2 FP32). A thread per element, grid-stride.
extern "C" __global__ void __launch_bounds__(256)
    mlx_add_bias(uint16_t *y, const void *bias, uint32_t m, uint32_t n, uint32_t bias_type) {
    grid_dependency_wait();
    size_t total = (size_t)m * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t r = (uint32_t)(i % n);
        float b = bias_type == 2   ? static_cast<const float *>(bias)[r]
                  : bias_type == 1 ? scale_value(static_cast<const uint16_t *>(bias), r, true)
                                   : scale_value(static_cast<const uint16_t *>(bias), r, false);
        y[i] = (uint16_t)mg_num_f32_to_bf16(__fadd_rn(mg_num_bf16_to_f32(y[i]), b));
    }
}
