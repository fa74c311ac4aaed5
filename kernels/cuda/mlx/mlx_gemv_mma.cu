// mlx_gemv_mma.cu - the MLX affine GEMVs on tensor cores, for BF16 scales and biases: the
// kernels of provider "cuda_mma" (src/ops/mlx/mlx.c), with the argument lists of mlx_gemv and
// mlx_gemv_gate_up (metrale/mlx.h), M = 1..8 tokens, bits 4 and 8, groups of 32/64/128.
//
// Each weight is decoded once per launch into the dequant's BF16 value, bit for bit the one
// mlx_dequant writes (t = bf16(scale * q), w = bf16(t + bias)), and the products run on
// mma.sync m16n8k16 (common/mma_bf16.cuh) with the weights as A (16 rows) and the tokens as B
// (8 columns), FP32 accumulation: the cost of a launch no longer grows with M, as it does in
// the SIMT kernels of mlx_quant.cu, which decode every weight once per token. So the product
// is sum_k x[t, k] * dequant(w)[r, k], the weights of the GEMM path (mg_mlx_gemm), where the
// SIMT kernels fold the bias (scale * sum q x + bias * sum x, unrounded): the two differ by the
// BF16 rounding of the weights, inside the GEMVs' stated tolerance.
//
// Decoding without conversion instructions:
//  - 4 bits: a word holds codes 0..7 (code i at bits 4i). (word >> 4s) & 0x000f000f | 0x43004300
//    is the BF16 pair (128 + q[s], 128 + q[s + 4]); fma.bf16x2 with (scale, -128 scale) gives
//    scale * q exactly rounded once to BF16, and add.bf16x2 the bias: the dequant's two
//    roundings. The MMA's K order pairs codes (s, s + 4), so the activations are permuted the
//    same way (prmt of two activation words).
//  - 8 bits: prmt puts code i into 0x4b0000qq, the FP32 2^23 + q; fma(., scale, -2^23 scale)
//    is scale * q exactly; cvt.rn.bf16x2 rounds two of them to BF16, add.bf16x2 adds the bias.
//    Adjacent codes form the pairs, so the activations need no permutation.
//
// Work split: a CTA owns 16 weight rows of each layer (gate_up: gate and up); KW warps per
// layer split the row's K in chunks of 64 bytes per row (128 codes at 4 bits, 64 at 8). In a
// chunk, lane 4 g + t reads the 16-byte vector t of rows g and g + 8 (one vector lies inside
// one group: a single scale and bias per row) and the matching activations of token g (zeros
// for g >= m and past the row's end). The next two chunks' weights are in flight while one is
// computed, the first two loaded before the grid-dependency wait (weights and scales are
// written by no kernel). The KW partial sums meet in shared memory in a fixed order: results do not
// depend on timing. Rows past n are computed from row n - 1 and never stored.
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/grid_dependency.cuh"
#include "common/mma_bf16.cuh"
#include "common/silu.cuh"
#include "common/stream_load.cuh"

namespace {

constexpr int kRowsPerCta = 16; // as src/ops/mlx/mlx.c launches the provider
constexpr int kVectorsPerChunk = 4;

// A lane's activations of one vector, in BF16 pairs: 16 words (32 BF16) at 4 bits, 8 at 8.
__host__ __device__ constexpr int kActWords(int bits) {
    return 128 / bits / 2;
}
// A token's activations of one chunk, in BF16 pairs: 64 words at 4 bits, 32 at 8.
__host__ __device__ constexpr int kChunkWords(int bits) {
    return kVectorsPerChunk * kActWords(bits);
}

enum { kPlain = 0, kSiluGate = 1, kSiluGateResid = 2 };
// gate_up's epilogue (mlx_reference.h): both products stored, or y[0] = silu(gate) * up.
enum { kGateUpBoth = 0, kGateUpSiluMul = 1 };

struct Layer {
    const uint4 *weight;
    const uint16_t *scales, *biases;
};

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint32_t add_bf16x2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// (low, high) rounded to nearest even; both are finite here.
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(high), "f"(low));
    return d;
}

// One row's vector of a chunk as loaded: its 16 bytes of codes and its group's scale (low 16
// bits) and bias (high), both BF16; zeros for a vector past the row's end.
struct RowVector {
    uint4 words;
    uint32_t scale_bias;
};

__device__ __forceinline__ RowVector load_row_vector(const Layer &l, uint32_t row, uint32_t v,
                                                     bool live, uint32_t vectors_per_row,
                                                     uint32_t groups, uint32_t codes_per_group,
                                                     int bits) {
    RowVector r = {make_uint4(0, 0, 0, 0), 0};
    if (!live)
        return r; // past the row's end: weights 0 (scale and bias 0), activations 0
    r.words = load_stream(l.weight + (size_t)row * vectors_per_row + v);
    const uint32_t codes_per_vector = 128 / bits;
    const size_t g = (size_t)row * groups + v * codes_per_vector / codes_per_group;
    r.scale_bias = (uint32_t)__ldg(l.scales + g) | (uint32_t)__ldg(l.biases + g) << 16;
    return r;
}

// What decodes one row's vector: the BF16 pairs (s, s), (b, b) and, at 4 bits,
// (-128 s, -128 s); at 8 bits s and -2^23 s in FP32 (all exact).
struct RowDecoder {
    uint32_t scale2, bias2, offset2;
    float scale, offset;
};

template <int Bits> __device__ __forceinline__ RowDecoder row_decoder(uint32_t scale_bias) {
    RowDecoder d;
    d.scale2 = __byte_perm(scale_bias, 0, 0x1010u);
    d.bias2 = __byte_perm(scale_bias, 0, 0x3232u);
    d.scale = mg_num_bf16_low(scale_bias);
    d.offset = (Bits == 4 ? -128.0f : -8388608.0f) * d.scale; // exact: a power of two
    d.offset2 = Bits == 4 ? pack_bf16x2(d.offset, d.offset) : 0;
    return d;
}

// The A fragments of step j of a chunk for rows g (lo) and g + 8 (hi): {a0, a1, a2, a3}.
template <int Bits>
__device__ __forceinline__ void decode_step(const RowVector &lo, const RowVector &hi,
                                            const RowDecoder &dlo, const RowDecoder &dhi, int j,
                                            uint32_t (&a)[4]) {
    const RowVector *rows[2] = {&lo, &hi};
    const RowDecoder *decoders[2] = {&dlo, &dhi};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const RowVector &r = *rows[h];
        const RowDecoder &d = *decoders[h];
        const uint32_t w[4] = {r.words.x, r.words.y, r.words.z, r.words.w};
        if (Bits == 4) {
            // Step j: word j / 2, code pairs s = 2 (j % 2) and s + 1.
            const uint32_t word = w[j / 2];
            const int s = 2 * (j % 2);
            const uint32_t p0 = ((word >> (4 * s)) & 0x000f000fu) | 0x43004300u;
            const uint32_t p1 = ((word >> (4 * s + 4)) & 0x000f000fu) | 0x43004300u;
            a[h] = add_bf16x2(fma_bf16x2(p0, d.scale2, d.offset2), d.bias2);
            a[h + 2] = add_bf16x2(fma_bf16x2(p1, d.scale2, d.offset2), d.bias2);
        } else {
            // Step j: word j, codes (0, 1) and (2, 3).
            const uint32_t word = w[j];
            float t[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                t[i] = fmaf(__uint_as_float(__byte_perm(word, 0x4b000000u, 0x7640u + i)), d.scale,
                            d.offset);
            a[h] = add_bf16x2(pack_bf16x2(t[0], t[1]), d.bias2);
            a[h + 2] = add_bf16x2(pack_bf16x2(t[2], t[3]), d.bias2);
        }
    }
}

// A lane's activations of one vector (kActWords(Bits) BF16 pairs from `src`: global memory,
// read through the non-coherent cache, or the warp's silu stage); zeros where !live.
template <int Bits, bool Global>
__device__ __forceinline__ void load_acts(const uint4 *src, bool live,
                                          uint32_t (&act)[kActWords(Bits)]) {
    constexpr int kWords = kActWords(Bits);
#pragma unroll
    for (int i = 0; i < kWords; i++)
        act[i] = 0;
    if (!live)
        return;
#pragma unroll
    for (int i = 0; i < kWords / 4; i++) {
        const uint4 v = Global ? __ldg(src + i) : src[i];
        act[4 * i] = v.x, act[4 * i + 1] = v.y, act[4 * i + 2] = v.z, act[4 * i + 3] = v.w;
    }
}

// silu_gate's activations bf16(silu(g) * u) (as the reference rounds them) of chunk `chunk`
// for tokens 0..m-1, into the warp's stage [8][kChunkWords] (zeros past k): the whole warp
// computes them, each once, where the lanes of one token alone would leave 7 of 8 idle at one
// token.
template <int Bits>
__device__ __forceinline__ void stage_silu(uint32_t (*stage)[kChunkWords(Bits)], const uint16_t *g,
                                           const uint16_t *u, uint32_t m, uint32_t k,
                                           uint32_t chunk, uint32_t lane) {
    constexpr uint32_t kWords = kChunkWords(Bits);
    const uint32_t col0 = chunk * kChunkWords(Bits) * 2;
    __syncwarp(); // the lanes have read the previous chunk's
    for (uint32_t i = lane; i < m * kWords; i += 32) {
        const uint32_t token = i / kWords, w = i % kWords, col = col0 + 2 * w;
        uint32_t v = 0;
        if (col < k) {
            const size_t at = (size_t)token * k + col;
            const uint32_t gw = __ldg(reinterpret_cast<const uint32_t *>(g + at));
            const uint32_t uw = __ldg(reinterpret_cast<const uint32_t *>(u + at));
            v = mg_num_bf16_pack(mg_silu_mul_f32(mg_num_bf16_low(gw), mg_num_bf16_low(uw)),
                                 mg_silu_mul_f32(mg_num_bf16_high(gw), mg_num_bf16_high(uw)));
        }
        stage[token][w] = v;
    }
    __syncwarp();
}

// The B fragment {b0, b1} of step j from the lane's activation words.
template <int Bits>
__device__ __forceinline__ void act_step(const uint32_t (&act)[kActWords(Bits)], int j,
                                         uint32_t &b0, uint32_t &b1) {
    if (Bits == 4) {
        // Word j / 2 of the weights holds codes of activations 8 (j / 2) .. + 7: pairs
        // (x[2h], x[2h + 4]) and (x[2h + 1], x[2h + 5]) with h = j % 2.
        const uint32_t *X = act + 4 * (j / 2);
        const int h = j % 2;
        b0 = __byte_perm(X[h], X[h + 2], 0x5410u);
        b1 = __byte_perm(X[h], X[h + 2], 0x7632u);
    } else {
        b0 = act[2 * j];
        b1 = act[2 * j + 1];
    }
}

template <int Bits, int NW, int KW>
__device__ __forceinline__ void gemv_mma_body(const Layer (&layers)[NW], const uint16_t *x,
                                              const uint16_t *u, const uint16_t *resid,
                                              uint16_t *const (&y)[NW], uint32_t m, uint32_t n,
                                              uint32_t k, uint32_t group_size, int mode) {
    constexpr int kSteps = Bits == 4 ? 8 : 4; // MMA steps (16 K each) per 16-byte vector
    constexpr uint32_t kCodesPerVector = 128 / Bits;
    __shared__ float partial[NW][KW][4][32];
    // silu_gate's activations, a stage per warp (only the one-layer kernel has the mode).
    __shared__ __align__(16) uint32_t silu_stage[NW == 1 ? KW : 1][8][kChunkWords(Bits)];

    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t kw = warp % KW, which = warp / KW;
    const Layer layer = which == 0 ? layers[0] : layers[NW - 1]; // selects, no local memory
    const uint32_t row0 = blockIdx.x * kRowsPerCta;
    const uint32_t row_lo = min(row0 + g, n - 1), row_hi = min(row0 + g + 8, n - 1);
    const uint32_t vectors_per_row = k / kCodesPerVector, groups = k / group_size;
    const uint32_t chunks = (vectors_per_row + kVectorsPerChunk - 1) / kVectorsPerChunk;
    const bool token_live = g < m;

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // Chunks c (computed), c + KW and c + 2 KW (in flight): two chunks a warp ahead keep
    // enough bytes in flight for the memory's latency at two CTAs an SM.
    auto load = [&](uint32_t chunk, RowVector &lo, RowVector &hi) {
        const uint32_t vc = chunk * kVectorsPerChunk + t;
        const bool live = chunk < chunks && vc < vectors_per_row;
        lo = load_row_vector(layer, row_lo, vc, live, vectors_per_row, groups, group_size, Bits);
        hi = load_row_vector(layer, row_hi, vc, live, vectors_per_row, groups, group_size, Bits);
    };
    uint32_t c = kw;
    RowVector lo0, hi0, lo1, hi1;
    load(c, lo0, hi0);
    load(c + KW, lo1, hi1);
    grid_dependency_wait(); // the activations (and the residual) come from earlier kernels
    for (; c < chunks; c += KW) {
        RowVector lo2, hi2;
        load(c + 2 * KW, lo2, hi2);
        const uint32_t v = c * kVectorsPerChunk + t;
        uint32_t act[kActWords(Bits)];
        const bool act_live = token_live && v < vectors_per_row;
        if (NW == 1 && mode != kPlain) {
            stage_silu<Bits>(silu_stage[NW == 1 ? kw : 0], x, u, m, k, c, lane);
            load_acts<Bits, false>(reinterpret_cast<const uint4 *>(
                                       &silu_stage[NW == 1 ? kw : 0][g][t * kActWords(Bits)]),
                                   act_live, act);
        } else {
            load_acts<Bits, true>(
                reinterpret_cast<const uint4 *>(x + (size_t)g * k + (size_t)v * kCodesPerVector),
                act_live, act);
        }
        const RowDecoder dlo = row_decoder<Bits>(lo0.scale_bias);
        const RowDecoder dhi = row_decoder<Bits>(hi0.scale_bias);
#pragma unroll
        for (int j = 0; j < kSteps; j++) {
            uint32_t a[4], b0, b1;
            decode_step<Bits>(lo0, hi0, dlo, dhi, j, a);
            act_step<Bits>(act, j, b0, b1);
            mma_bf16(acc, a[0], a[1], a[2], a[3], b0, b1);
        }
        lo0 = lo1, hi0 = hi1;
        lo1 = lo2, hi1 = hi2;
    }
    launch_dependents();

#pragma unroll
    for (int i = 0; i < 4; i++)
        partial[which][kw][i][lane] = acc[i];
    __syncthreads();
    // gate_up with the SiLU-mul (mode kGateUpSiluMul, NW = 2): warp 0 alone stores, from both
    // layers' sums.
    const bool silu_mul = NW == 2 && mode == kGateUpSiluMul;
    if (warp >= (silu_mul ? 1u : (uint32_t)NW))
        return;
        // Warp l stores layer l: c0, c1 are rows g, tokens 2t, 2t + 1; c2, c3 rows g + 8.
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t row = row0 + g + (i >= 2 ? 8 : 0), token = 2 * t + (i & 1);
        float sum = 0.0f, up = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; w++) {
            sum += partial[warp][w][i][lane];
            if (silu_mul)
                up += partial[NW - 1][w][i][lane];
        }
        if (row < n && token < m) {
            const size_t o = (size_t)token * n + row;
            if (NW == 1 && mode == kSiluGateResid)
                sum += mg_num_bf16_to_f32(resid[o]);
            if (silu_mul) // each product rounded to BF16 as gate_up stores it
                sum = mg_silu_mul_f32(mg_num_bf16_to_f32(mg_num_f32_to_bf16(sum)),
                                      mg_num_bf16_to_f32(mg_num_f32_to_bf16(up)));
            uint16_t *const out = warp == 0 ? y[0] : y[NW - 1];
            out[o] = (uint16_t)mg_num_f32_to_bf16(sum);
        }
    }
}

} // namespace

// KW = 8 warps split K for one layer, 4 per layer for gate_up: 256 threads either way.
extern "C" __global__ void __launch_bounds__(256)
    mlx_gemv_mma(const uint4 *weight, const uint16_t *scales, const uint16_t *biases,
                 const uint16_t *x, const uint16_t *u, const uint16_t *resid, uint16_t *y,
                 uint32_t m, uint32_t n, uint32_t k, uint32_t bits, uint32_t group_size,
                 uint32_t scale_type, uint32_t mode) {
    (void)scale_type; // BF16: the provider takes no other
    const Layer layers[1] = {{weight, scales, biases}};
    uint16_t *const outs[1] = {y};
    if (bits == 8)
        gemv_mma_body<8, 1, 8>(layers, x, u, resid, outs, m, n, k, group_size, (int)mode);
    else
        gemv_mma_body<4, 1, 8>(layers, x, u, resid, outs, m, n, k, group_size, (int)mode);
}

extern "C" __global__ void __launch_bounds__(256)
    mlx_gemv_gate_up_mma(const uint4 *w1, const uint16_t *s1, const uint16_t *b1, const uint4 *w2,
                         const uint16_t *s2, const uint16_t *b2, const uint16_t *x, uint16_t *y1,
                         uint16_t *y2, uint32_t m, uint32_t n, uint32_t k, uint32_t bits,
                         uint32_t group_size, uint32_t scale_type, uint32_t epilogue) {
    (void)scale_type;
    const Layer layers[2] = {{w1, s1, b1}, {w2, s2, b2}};
    uint16_t *const outs[2] = {y1, y2};
    if (bits == 8)
        gemv_mma_body<8, 2, 4>(layers, x, nullptr, nullptr, outs, m, n, k, group_size,
                               (int)epilogue);
    else
        gemv_mma_body<4, 2, 4>(layers, x, nullptr, nullptr, outs, m, n, k, group_size,
                               (int)epilogue);
}
