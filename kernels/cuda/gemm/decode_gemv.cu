// decode_gemv.cu - the decode GEMV of metrale/ops_gemm.h for M <= 16 token rows: BF16 weights
// (BF16 or F32 out) and FP8 E4M3 weights with per-tensor or row-wise scales (BF16 out), on the
// tensor cores. Launched by src/ops/gemm/gemm_decode_gemv.c, which checks what the kernels rely
// on: 1 <= m <= 16; rows of act and weight 16-byte aligned (K * element bytes % 16 == 0,
// pointers 16-byte aligned); FP8 only on the sm_90a image.
//
// Shape of the work. A block of 8 warps owns 8 weight rows (the n8 of one mma tile) and
// splits K between its warps; each warp streams its share of the 8 rows once, so the weights
// are read exactly once and every activation row rides along in the mma's 16 rows (rows
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
// drains; it lets its dependents launch once its last loads are issued.
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 8;    // K-split inside a block
constexpr int kRows = 8;     // weight rows per block (mma N)
constexpr int kChunk = 128;  // bytes of one row per lane quad per step group
constexpr int kUnroll = 2;   // chunks in flight per lane

enum { kBf16 = 0, kFp8Tensorwise = 1, kFp8Rowwise = 2 };

__device__ __forceinline__ uint4 load_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 load_cached(const void *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
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
        s.lo = Stream ? load_stream(row + at) : load_cached(row + at);
    if (live && at + 16 < row_bytes)
        s.hi = Stream ? load_stream(row + at + 16) : load_cached(row + at + 16);
    return s;
}

__device__ __forceinline__ uint32_t word(const Span &s, int i) {
    const uint4 &v = i < 4 ? s.lo : s.hi;
    switch (i & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
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

template <int Mode>
__device__ void decode_gemv(const uint8_t *act, const uint8_t *weight, const float *act_scale,
                            const float *weight_scale, void *out, uint32_t m, uint32_t n,
                            uint32_t k, uint32_t ldc, bool out_f32) {
    constexpr bool kFp8 = Mode != kBf16;
    constexpr uint32_t kElem = kFp8 ? 1 : 2;
    __shared__ float partial[kWarps][16][kRows];

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, q = lane % 4;
    const uint32_t n0 = blockIdx.x * kRows;
    const uint32_t row_bytes = k * kElem;
    const uint32_t chunks = (row_bytes + kChunk - 1) / kChunk;
    const bool w_live = n0 + g < n, a_live_lo = (uint32_t)g < m, a_live_hi = (uint32_t)g + 8 < m;
    const uint8_t *w_row = weight + (size_t)(w_live ? n0 + g : 0) * row_bytes;
    const uint8_t *a_row_lo = act + (size_t)(a_live_lo ? g : 0) * row_bytes;
    const uint8_t *a_row_hi = act + (size_t)(a_live_hi ? g + 8 : 0) * row_bytes;

    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t chunk = warp;
    // The first group's weights do not depend on the previous kernel: load them before waiting.
    Span w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
        w[u] = load_span<true>(w_row, (chunk + u * kWarps) * kChunk + q * 32, row_bytes,
                               w_live && chunk + u * kWarps < chunks);
    grid_dependency_wait();
    for (;;) {
        Span a_lo[kUnroll], a_hi[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const uint32_t at = (chunk + u * kWarps) * kChunk + q * 32;
            const bool live = chunk + u * kWarps < chunks;
            a_lo[u] = load_span<false>(a_row_lo, at, row_bytes, live && a_live_lo);
            a_hi[u] = load_span<false>(a_row_hi, at, row_bytes, live && a_live_hi);
        }
        const uint32_t next = chunk + kUnroll * kWarps;
        Span w_next[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            w_next[u] = load_span<true>(w_row, (next + u * kWarps) * kChunk + q * 32, row_bytes,
                                        w_live && next + u * kWarps < chunks);
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            mma_chunk<kFp8>(c, w[u], a_lo[u], a_hi[u]);
        if (next >= chunks)
            break;
        chunk = next;
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            w[u] = w_next[u];
    }
    launch_dependents();

    partial[warp][g][2 * q] = c[0];
    partial[warp][g][2 * q + 1] = c[1];
    partial[warp][g + 8][2 * q] = c[2];
    partial[warp][g + 8][2 * q + 1] = c[3];
    __syncthreads();
    if (threadIdx.x >= 16 * kRows)
        return;
    const uint32_t t = threadIdx.x / kRows, col = threadIdx.x % kRows, j = n0 + col;
    if (t >= m || j >= n)
        return;
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
        static_cast<__nv_bfloat16 *>(out)[(size_t)t * ldc + j] = __float2bfloat16_rn(sum);
}

} // namespace

// out[t, j] = act[t] . weight[j] for t < m <= 16, j < n; grid ceil(n / 8) blocks of 256.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
mg_decode_gemv_bf16(const uint8_t *act, const uint8_t *weight, void *out, uint32_t m, uint32_t n,
                    uint32_t k, uint32_t ldc, uint32_t out_f32) {
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
        decode_gemv<kFp8Tensorwise>(act, weight, act_scale, weight_scale, out, m, n, k, ldc,
                                    false);
}
