// decode_gemv.cu - the decode GEMV of metrale/ops_gemm.h for M <= 16 token rows: BF16 weights
// (BF16 or F32 out) and FP8 E4M3 weights with per-tensor or row-wise scales (BF16 out), on the
// tensor cores. Launched by src/ops/gemm/gemm_decode_gemv.c, which checks what the kernels rely
// on: 1 <= m <= 16; rows of act and weight 16-byte aligned (K * element bytes % 16 == 0,
// pointers 16-byte aligned); FP8 only on the sm_90a image.
//
// Shape of the work. A block of 8 warps owns a tile of 8 weight rows at a time (the n8 of one
// mma) and splits K between its warps, walking tiles grid-stride (the grid is sized to the
// resident blocks, so the weight stream does not drain between waves); each warp streams its share
// of the 8 rows once, so the weights are read exactly once and every activation row rides along in
// the mma's 16 rows (rows
// >= m are zero registers, never loaded). The 8 partial tiles are summed in shared memory in
// a fixed order (warp 0, 1, ..., 7), so a captured call equals an eager one bit for bit and a
// row's result does not depend on the other rows of the batch.
//
// Fragment trick. Lane (g, q) = (lane / 4, lane % 4) loads 32 contiguous bytes of weight row
// g (and of activation rows g and g + 8) from each 128-byte chunk of K: two 16-byte loads, no
// shuffles. An mma's K positions need not be the matrix's K positions, only the same ones for
// A and B; so mma step s (4 per chunk) takes the lane's bytes 8s..8s+3 as the fragment's low K
// half and 8s+4..8s+7 as its high half (k16 BF16 or k32 E4M3 per step). Over the 4 steps every
// byte of the chunk enters exactly once on both sides.
//
// Weights are streamed past L1 (ld.global.nc.L1::no_allocate); activations, read by every
// block, go through L1. The kernel waits on its grid dependency only after the first chunk's
// weight loads are issued (griddepcontrol.wait: a no-op unless launched with programmatic
// stream serialization), so under PDL the weight stream starts while the previous kernel
// drains (the provider launches it with MG_LAUNCH_PROGRAMMATIC); it lets its dependents launch
// once its last loads are issued.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/grid_dependency.cuh"
#include "common/stream_load.cuh"

namespace {

constexpr int kWarps = 8;   // K-split inside a block
constexpr int kRows = 8;    // weight rows per block (mma N)
constexpr int kChunk = 128; // bytes of one row per lane quad per step group
constexpr int kUnroll = 2;  // chunks in flight per lane

enum { kBf16 = 0, kFp8Tensorwise = 1, kFp8Rowwise = 2 };

__device__ __forceinline__ uint4 load_cached(const void *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

// c += A(16 x k) * B(k x 8), A = {a0 row g lo, a1 row g+8 lo, a2 row g hi, a3 row g+8 hi}.
template <bool Fp8>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
    if (Fp8) {
#if __CUDA_ARCH__ >= 890
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
        __trap(); // the front runs FP8 on the sm_90a image only
#endif
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// 32 bytes of a row at byte offset `at` (16-byte halves past the row's end read as zero).
struct Span {
    uint4 lo, hi;
};

template <bool Stream>
__device__ __forceinline__ Span load_span(const uint8_t *row, uint32_t at, uint32_t row_bytes,
                                          bool live) {
    Span s = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    if (live && at < row_bytes)
        s.lo =
            Stream ? load_stream(reinterpret_cast<const uint4 *>(row + at)) : load_cached(row + at);
    if (live && at + 16 < row_bytes)
        s.hi = Stream ? load_stream(reinterpret_cast<const uint4 *>(row + at + 16))
                      : load_cached(row + at + 16);
    return s;
}

__device__ __forceinline__ uint32_t word(const Span &s, int i) {
    const uint4 &v = i < 4 ? s.lo : s.hi;
    switch (i & 3) {
    case 0:
        return v.x;
    case 1:
        return v.y;
    case 2:
        return v.z;
    default:
        return v.w;
    }
}

template <bool Fp8>
__device__ __forceinline__ void mma_chunk(float (&c)[4], const Span &w, const Span &a_lo,
                                          const Span &a_hi) {
#pragma unroll
    for (int s = 0; s < 4; s++)
        mma<Fp8>(c, word(a_lo, 2 * s), word(a_hi, 2 * s), word(a_lo, 2 * s + 1),
                 word(a_hi, 2 * s + 1), word(w, 2 * s), word(w, 2 * s + 1));
}

// The weights of chunk group `group` (kUnroll chunks of the warp) of weight row `row`.
__device__ __forceinline__ void load_weights(Span (&w)[kUnroll], const uint8_t *weight,
                                             uint32_t row, bool live, uint32_t row_bytes,
                                             uint32_t chunks, uint32_t group, int warp, int q) {
    const uint8_t *p = weight + (size_t)(live ? row : 0) * row_bytes;
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const uint32_t chunk = warp + (group * kUnroll + u) * kWarps;
        w[u] = load_span<true>(p, chunk * kChunk + q * 32, row_bytes, live && chunk < chunks);
    }
}

template <int Mode>
__device__ void decode_gemv(const uint8_t *act, const uint8_t *weight, const float *act_scale,
                            const float *weight_scale, void *out, uint32_t m, uint32_t n,
                            uint32_t k, uint32_t ldc, bool out_f32) {
    constexpr bool kFp8 = Mode != kBf16;
    constexpr uint32_t kElem = kFp8 ? 1 : 2;
    __shared__ float partial[kWarps][16][kRows];

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, q = lane % 4;
    const uint32_t row_bytes = k * kElem;
    const uint32_t chunks = (row_bytes + kChunk - 1) / kChunk;
    const uint32_t groups = (chunks + kWarps * kUnroll - 1) / (kWarps * kUnroll); // per tile
    const uint32_t tiles = (n + kRows - 1) / kRows;
    const bool a_live_lo = (uint32_t)g < m, a_live_hi = (uint32_t)g + 8 < m;
    const uint8_t *a_row_lo = act + (size_t)(a_live_lo ? g : 0) * row_bytes;
    const uint8_t *a_row_hi = act + (size_t)(a_live_hi ? g + 8 : 0) * row_bytes;

    // The block walks tiles blockIdx.x, + gridDim.x, ... and each warp its chunk groups of a
    // tile; the weights of the next (tile, group) are in flight while the current one is
    // multiplied and while a finished tile is reduced, so the stream never drains between tiles.
    uint32_t tile = blockIdx.x, group = 0;
    if (tile >= tiles)
        return;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    Span w[kUnroll];
    // The first weights do not depend on the previous kernel: load them before waiting.
    load_weights(w, weight, tile * kRows + g, tile * kRows + g < n, row_bytes, chunks, 0, warp, q);
    grid_dependency_wait();
    for (;;) {
        Span a_lo[kUnroll], a_hi[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const uint32_t chunk = warp + (group * kUnroll + u) * kWarps;
            const uint32_t at = chunk * kChunk + q * 32;
            a_lo[u] = load_span<false>(a_row_lo, at, row_bytes, chunk < chunks && a_live_lo);
            a_hi[u] = load_span<false>(a_row_hi, at, row_bytes, chunk < chunks && a_live_hi);
        }
        const bool tile_done = group + 1 == groups;
        const uint32_t next_tile = tile_done ? tile + gridDim.x : tile;
        const uint32_t next_group = tile_done ? 0 : group + 1;
        const bool more = next_tile < tiles;
        Span w_next[kUnroll];
        load_weights(w_next, weight, next_tile * kRows + g, more && next_tile * kRows + g < n,
                     row_bytes, chunks, next_group, warp, q);
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            mma_chunk<kFp8>(c, w[u], a_lo[u], a_hi[u]);
        if (tile_done) {
            if (!more)
                launch_dependents();
            // The 8 warps' partial tiles, summed in a fixed order.
            partial[warp][g][2 * q] = c[0];
            partial[warp][g][2 * q + 1] = c[1];
            partial[warp][g + 8][2 * q] = c[2];
            partial[warp][g + 8][2 * q + 1] = c[3];
            c[0] = c[1] = c[2] = c[3] = 0.0f;
            __syncthreads();
            const uint32_t t = threadIdx.x / kRows, col = threadIdx.x % kRows;
            const uint32_t j = tile * kRows + col;
            if (threadIdx.x < 16 * kRows && t < m && j < n) {
                float sum = 0.0f;
#pragma unroll
                for (int v = 0; v < kWarps; v++)
                    sum += partial[v][t][col];
                if (Mode == kFp8Tensorwise)
                    sum = sum * act_scale[0] * weight_scale[0];
                else if (Mode == kFp8Rowwise)
                    sum = sum * act_scale[t] * weight_scale[j];
                if (out_f32)
                    static_cast<float *>(out)[(size_t)t * ldc + j] = sum;
                else
                    static_cast<__nv_bfloat16 *>(out)[(size_t)t * ldc + j] =
                        __float2bfloat16_rn(sum);
            }
            __syncthreads(); // the partials are read before the next tile writes them
        }
        if (!more)
            break;
        tile = next_tile;
        group = next_group;
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            w[u] = w_next[u];
    }
}

} // namespace

// out[t, j] = act[t] . weight[j] for t < m <= 16, j < n; blocks of 256 threads, each walking
// the 8-row tiles blockIdx.x, blockIdx.x + gridDim.x, ... (any grid of at most ceil(n / 8)).
extern "C" __global__ void __launch_bounds__(kWarps * 32)
    mg_decode_gemv_bf16(const uint8_t *act, const uint8_t *weight, void *out, uint32_t m,
                        uint32_t n, uint32_t k, uint32_t ldc, uint32_t out_f32) {
    decode_gemv<kBf16>(act, weight, nullptr, nullptr, out, m, n, k, ldc, out_f32 != 0);
}

// As above with E4M3 codes, times act_scale[0] * weight_scale[0] (rowwise == 0) or
// act_scale[t] * weight_scale[j] (rowwise != 0); BF16 out.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
    mg_decode_gemv_fp8(const uint8_t *act, const float *act_scale, const uint8_t *weight,
                       const float *weight_scale, void *out, uint32_t m, uint32_t n, uint32_t k,
                       uint32_t ldc, uint32_t rowwise) {
    if (rowwise)
        decode_gemv<kFp8Rowwise>(act, weight, act_scale, weight_scale, out, m, n, k, ldc, false);
    else
        decode_gemv<kFp8Tensorwise>(act, weight, act_scale, weight_scale, out, m, n, k, ldc, false);
}
