// decode_gemv.cu - the decode GEMV of metrale/ops_gemm.h for M <= 16 token rows: BF16 weights
// (BF16 or F32 out) and FP8 E4M3 weights with per-tensor or row-wise scales (BF16 out), on the
// tensor cores. Launched by src/ops/gemm/gemm_decode_gemv_cuda.c, which checks what the kernels
// rely on: 1 <= m <= 16; rows of act and weight 16-byte aligned (K * element bytes % 16 == 0,
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
//
// Fusions (metrale/ops_gemm.h, "fusion"; BF16 weights only). The RMSNorm prologue makes the
// normed rows on the fly, with no pass of its own over act (common/rmsnorm_prologue.cuh): the
// first tile a block walks covers all of K, so at its end the block has each row's sum of
// squares (reduced in a fixed order), and every output is scaled by 1 / rms; within the
// tolerance of the composed ops, not bit-equal to the CPU composition. The SiLU-mul epilogue
// walks tiles of 4 gate rows and the 4 up rows of the same outputs (gate row j and up row N/2 + j
// in one mma), so a block finishes both halves of each output it writes; the residual epilogue
// adds in the same thread that stores, so out may be the residual itself.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/fp8_e4m3.cuh"
#include "common/grid_dependency.cuh"
#include "common/kv_slot.cuh"
#include "common/rmsnorm_prologue.cuh"
#include "common/silu.cuh"
#include "common/stream_load.cuh"

namespace {

constexpr int kWarps = 8;   // K-split inside a block
constexpr int kRows = 8;    // weight rows per block (mma N)
constexpr int kChunk = 128; // bytes of one row per lane quad per step group
constexpr int kUnroll = 2;  // chunks in flight per lane

enum { kBf16 = 0, kFp8Tensorwise = 1, kFp8Rowwise = 2 };
// The epilogues this kernel runs, numbered as mg_gemm_epilogue.
enum { kEpiNone = 0, kEpiResidual = 1, kEpiSiluMul = 2, kEpiKvAppend = 4 };

// The KV-append epilogue's operands: mg_kv_append's page table and BF16 pools, and the shape
// of out's rows, [q heads | k heads | v heads] of head_dim each.
struct KvAppend {
    const int32_t *qo_indptr, *kv_indptr, *kv_indices, *kv_last_page_len, *positions;
    uint16_t *k_pages, *v_pages;
    uint32_t batch, num_kv_indices, num_pages, page_size;
    uint32_t qo_heads, kv_heads, head_dim, rope;
    float rope_theta;
    const float *rope_inv_freq; // FP32 [head_dim / 2], or null: theta^(-2i / head_dim)
};

// The fusion's operands (unused ones null).
struct Fusion {
    const uint8_t *norm_weight; // RMSNorm: BF16 [k]
    const uint16_t *residual;   // residual add: BF16 [m, n], row pitch ldc
    float eps;
    KvAppend kv;
};

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

// Where a span is read from: the weight stream (past L1), an L1-cached global row, or the
// FP8 prologue's codes in shared memory.
enum { kFromStream = 0, kFromCache = 1, kFromShared = 2 };

template <int From> __device__ __forceinline__ uint4 load_vector(const uint8_t *p) {
    if (From == kFromStream)
        return load_stream(reinterpret_cast<const uint4 *>(p));
    if (From == kFromCache)
        return load_cached(p);
    return *reinterpret_cast<const uint4 *>(p);
}

template <int From>
__device__ __forceinline__ Span load_span(const uint8_t *row, uint32_t at, uint32_t row_bytes,
                                          bool live) {
    Span s = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    if (live && at < row_bytes)
        s.lo = load_vector<From>(row + at);
    if (live && at + 16 < row_bytes)
        s.hi = load_vector<From>(row + at + 16);
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
        w[u] =
            load_span<kFromStream>(p, chunk * kChunk + q * 32, row_bytes, live && chunk < chunks);
    }
}

// The output columns a tile covers, and the weight row lane g streams in tile `tile` (false in
// *live past the matrix). SiLU-mul: 4 outputs j, gate rows j (g < 4) then up rows N/2 + j.
template <int Epi> __device__ __forceinline__ uint32_t tile_outputs() {
    return Epi == kEpiSiluMul ? kRows / 2 : kRows;
}

// KV append: the tiles of the q and k heads pair RoPE's rows, 4 rows j of a head's first half
// (g < 4) and the 4 rows j + head_dim / 2 (g >= 4); the v heads' tiles are 8 rows in order.
__device__ __forceinline__ bool kv_rope_tile(uint32_t tile, const KvAppend &kv) {
    return tile < (kv.qo_heads + kv.kv_heads) * (kv.head_dim / kRows);
}

template <int Epi>
__device__ __forceinline__ uint32_t tile_row(uint32_t tile, int g, uint32_t n, bool *live,
                                             const KvAppend &kv) {
    if (Epi == kEpiKvAppend && kv_rope_tile(tile, kv)) {
        const uint32_t per_head = kv.head_dim / kRows, head = tile / per_head;
        const uint32_t j = (tile % per_head) * (kRows / 2) + (g % (kRows / 2));
        *live = true;
        return head * kv.head_dim + (g < kRows / 2 ? j : kv.head_dim / 2 + j);
    }
    if (Epi == kEpiSiluMul) {
        const uint32_t half = n / 2, j = tile * (kRows / 2) + (g % (kRows / 2));
        *live = j < half;
        return g < kRows / 2 ? j : half + j;
    }
    const uint32_t row = tile * kRows + g;
    *live = row < n;
    return row;
}

__device__ __forceinline__ void norm_span(Span *a, const Span &w, bool count, float *sum_sq) {
    a->lo = make_uint4(rmsnorm_prologue_word(a->lo.x, w.lo.x, count, sum_sq),
                       rmsnorm_prologue_word(a->lo.y, w.lo.y, count, sum_sq),
                       rmsnorm_prologue_word(a->lo.z, w.lo.z, count, sum_sq),
                       rmsnorm_prologue_word(a->lo.w, w.lo.w, count, sum_sq));
    a->hi = make_uint4(rmsnorm_prologue_word(a->hi.x, w.hi.x, count, sum_sq),
                       rmsnorm_prologue_word(a->hi.y, w.hi.y, count, sum_sq),
                       rmsnorm_prologue_word(a->hi.z, w.hi.z, count, sum_sq),
                       rmsnorm_prologue_word(a->hi.w, w.hi.w, count, sum_sq));
}

// The FP8 RMSNorm prologue's row pitch in shared memory: K codes and 16 bytes, so that the 8
// rows a warp's lanes read at the same offset fall in different banks.
__device__ __forceinline__ uint32_t staged_pitch(uint32_t k) {
    return (k + 15) / 16 * 16 + 16;
}

// The FP8 RMSNorm prologue, once per block before its first MMA: each of the m rows of act
// (BF16, un-normed) normed as mg_rmsnorm_bf16 does, then quantized as mg_fp8_quantize_rowwise
// does (amax of the normed row, scale = amax / 448, codes rounded to nearest even), into
// `codes` (shared, m rows at staged_pitch) and row_scale[t]. Given the row's 1 / rms, every
// value, the scale and the codes are bit-identical to the CPU composition; the sum of squares
// runs in another order (a fixed one: per thread, then lanes, then warps 0..7). `sum_part` and
// `amax_part` are shared scratch of [kWarps][16].
__device__ void stage_fp8_rows(const uint8_t *act, const uint8_t *norm_weight, uint32_t m,
                               uint32_t k, float eps, uint8_t *codes, float *row_scale,
                               float (*sum_part)[16], float (*amax_part)[16]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t vectors = k / 8, pitch = staged_pitch(k);
    const uint4 *w = reinterpret_cast<const uint4 *>(norm_weight);
    auto row_of = [&](uint32_t t) { return reinterpret_cast<const uint4 *>(act) + t * vectors; };
    for (uint32_t t = 0; t < m; t++) {
        float sum = 0.0f;
        for (uint32_t v = threadIdx.x; v < vectors; v += kWarps * 32)
            sum = sum_squares(load_cached(row_of(t) + v), sum);
        sum = warp_sum(sum);
        if (lane == 0)
            sum_part[warp][t] = sum;
    }
    __syncthreads();
    auto inv_of = [&](uint32_t t) {
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < kWarps; v++)
            sum += sum_part[v][t];
        return rmsnorm_prologue_inv(sum, k, eps);
    };
    for (uint32_t t = 0; t < m; t++) {
        const float inv = inv_of(t);
        float amax = 0.0f;
        for (uint32_t v = threadIdx.x; v < vectors; v += kWarps * 32)
            amax = mg_fp8::vector_amax(
                norm_vector(load_cached(row_of(t) + v), load_cached(w + v), inv), amax);
        amax = mg_fp8::lanes_max(amax, 32);
        if (lane == 0)
            amax_part[warp][t] = amax;
    }
    __syncthreads();
    for (uint32_t t = 0; t < m; t++) {
        const float inv = inv_of(t);
        float amax = 0.0f;
#pragma unroll
        for (int v = 0; v < kWarps; v++)
            amax = fmaxf(amax, amax_part[v][t]);
        const float scale = mg_fp8::scale_from_amax(amax);
        if (threadIdx.x == 0)
            row_scale[t] = scale;
        for (uint32_t v = threadIdx.x; v < vectors; v += kWarps * 32)
            *reinterpret_cast<uint2 *>(codes + t * pitch + v * 8) = mg_fp8::quantize_vector(
                norm_vector(load_cached(row_of(t) + v), load_cached(w + v), inv), scale);
    }
    __syncthreads();
}

// The KV-append epilogue's stores of output row t, column `col` of a finished tile (its sums
// over the warps in `partial`, times scale_lo for column col and scale_hi for col + 4, the
// RMSNorm's 1 / rms or the FP8 scales): out receives y with the q heads rotated, the pools
// the rotated k heads and the v heads at the token's page row (when kv_ok), as mg_kv_append
// does after the plain GEMM (y rounded to BF16 first, RoPE in FP32, rounded again).
__device__ __forceinline__ void kv_append_store(const KvAppend &kv, uint32_t tile, uint32_t col,
                                                const float (*partial)[16][kRows], uint32_t t,
                                                float scale_lo, float scale_hi, uint32_t ldc,
                                                uint32_t n, uint16_t *out, bool kv_ok,
                                                size_t kv_row, float position) {
    auto y_of = [&](uint32_t c, float scale) {
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < kWarps; v++)
            sum += partial[v][t][c];
        return mg_num_bf16_to_f32(mg_num_f32_to_bf16(sum * scale));
    };
    uint16_t *out_row = out + (size_t)t * ldc;
    const uint32_t D = kv.head_dim;
    if (!kv_rope_tile(tile, kv)) { // a v head's 8 rows
        const uint32_t row = tile * kRows + col;
        if (row >= n)
            return;
        const uint16_t y = (uint16_t)mg_num_f32_to_bf16(y_of(col, scale_lo));
        out_row[row] = y;
        if (kv_ok)
            kv.v_pages[kv_row + (row - (kv.qo_heads + kv.kv_heads) * D)] = y;
        return;
    }
    if (col >= kRows / 2) // the second half's rows: stored by the thread of their pair
        return;
    const uint32_t per_head = D / kRows, head = tile / per_head;
    const uint32_t i = (tile % per_head) * (kRows / 2) + col; // frequency index, < D / 2
    const uint32_t row0 = head * D + i, row1 = row0 + D / 2;
    const float x0 = y_of(col, scale_lo), x1 = y_of(col + kRows / 2, scale_hi);
    float r0 = x0, r1 = x1;
    if (kv.rope && kv_ok) {
        float c, s;
        kv_rope_angle(position, i, D, kv.rope_theta, kv.rope_inv_freq, &c, &s);
        r0 = x0 * c - x1 * s;
        r1 = x1 * c + x0 * s;
    }
    const bool is_q = head < kv.qo_heads;
    // q is rotated in out; k stays in out as computed and goes rotated into the pool
    out_row[row0] = (uint16_t)mg_num_f32_to_bf16(is_q ? r0 : x0);
    out_row[row1] = (uint16_t)mg_num_f32_to_bf16(is_q ? r1 : x1);
    if (!is_q && kv_ok) {
        const size_t at = kv_row + (size_t)(head - kv.qo_heads) * D + i;
        kv.k_pages[at] = (uint16_t)mg_num_f32_to_bf16(r0);
        kv.k_pages[at + D / 2] = (uint16_t)mg_num_f32_to_bf16(r1);
    }
}

// Hi: rows 8..15 of the mma may be live (m > 8); without them a lane holds no second
// activation row, which leaves the RMSNorm kernels room for 4 blocks per SM.
template <int Mode, bool Norm = false, int Epi = kEpiNone, bool Hi = true>
__device__ void decode_gemv(const uint8_t *act, const uint8_t *weight, const float *act_scale,
                            const float *weight_scale, void *out, uint32_t m, uint32_t n,
                            uint32_t k, uint32_t ldc, bool out_f32, Fusion fusion) {
    constexpr bool kFp8 = Mode != kBf16;
    constexpr uint32_t kElem = kFp8 ? 1 : 2;
    // The FP8 RMSNorm prologue's codes come from shared memory, made once per block.
    constexpr bool kStaged = kFp8 && Norm;
    static_assert(!Norm || Mode != kFp8Tensorwise, "the FP8 prologue quantizes by rows");
    __shared__ float partial[kWarps][16][kRows];
    __shared__ float sum_sq_part[kWarps][16];         // RMSNorm: each warp's share of each row
    __shared__ float staged_scale[16];                // FP8 RMSNorm: each row's quantization scale
    extern __shared__ __align__(16) uint8_t staged[]; // FP8 RMSNorm: m x staged_pitch(k) codes

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, q = lane % 4;
    const uint32_t row_bytes = k * kElem;
    const uint32_t chunks = (row_bytes + kChunk - 1) / kChunk;
    const uint32_t groups = (chunks + kWarps * kUnroll - 1) / (kWarps * kUnroll); // per tile
    const uint32_t outputs = Epi == kEpiSiluMul ? n / 2 : n;                      // columns of out
    const uint32_t tiles = (outputs + tile_outputs<Epi>() - 1) / tile_outputs<Epi>();
    const bool a_live_lo = (uint32_t)g < m, a_live_hi = Hi && (uint32_t)g + 8 < m;
    const uint8_t *a_rows = kStaged ? staged : act;
    const uint32_t a_pitch = kStaged ? staged_pitch(k) : row_bytes;
    const uint8_t *a_row_lo = a_rows + (size_t)(a_live_lo ? g : 0) * a_pitch;
    const uint8_t *a_row_hi = a_rows + (size_t)(a_live_hi ? g + 8 : 0) * a_pitch;

    // The block walks tiles blockIdx.x, + gridDim.x, ... and each warp its chunk groups of a
    // tile; the weights of the next (tile, group) are in flight while the current one is
    // multiplied and while a finished tile is reduced, so the stream never drains between tiles.
    uint32_t tile = blockIdx.x, group = 0;
    if (tile >= tiles)
        return;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float sum_sq_lo = 0.0f, sum_sq_hi = 0.0f; // RMSNorm: rows g and g + 8, the first tile
    float inv = 1.0f; // RMSNorm: 1 / rms of this thread's output row, once the first tile ends
    bool first_tile = true;
    Span w[kUnroll];
    bool live;
    uint32_t row = tile_row<Epi>(tile, g, n, &live, fusion.kv);
    // The first weights do not depend on the previous kernel: load them before waiting.
    load_weights(w, weight, row, live, row_bytes, chunks, 0, warp, q);
    grid_dependency_wait();
    if (kStaged) // the rows are the previous work's output: after the wait
        stage_fp8_rows(act, fusion.norm_weight, m, k, fusion.eps, staged, staged_scale, sum_sq_part,
                       reinterpret_cast<float(*)[16]>(&partial[0][0][0]));
    // KV append: the page row and position of this thread's output row t (threadIdx.x / 8),
    // looked up once (the table is the previous work's output, so after the wait).
    size_t kv_row = 0;
    int64_t kv_pos = 0;
    bool kv_ok = false;
    if (Epi == kEpiKvAppend && threadIdx.x < 16 * kRows && threadIdx.x / kRows < m) {
        const KvAppend &kv = fusion.kv;
        const uint32_t t = threadIdx.x / kRows;
        const int32_t planned = kv.qo_indptr[kv.batch];
        if (planned > 0 && t < (uint32_t)planned)
            kv_ok = kv_token_slot(t, kv.batch, kv.qo_indptr, kv.kv_indptr, kv.kv_indices,
                                  kv.kv_last_page_len, kv.num_kv_indices, kv.num_pages,
                                  kv.page_size, kv.kv_heads * kv.head_dim, &kv_row, &kv_pos);
        if (kv_ok && kv.positions)
            kv_pos = kv.positions[t];
    }
    for (;;) {
        Span a_lo[kUnroll], a_hi[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const uint32_t chunk = warp + (group * kUnroll + u) * kWarps;
            const uint32_t at = chunk * kChunk + q * 32;
            constexpr int kFrom = kStaged ? kFromShared : kFromCache;
            a_lo[u] = load_span<kFrom>(a_row_lo, at, row_bytes, chunk < chunks && a_live_lo);
            a_hi[u] = load_span<kFrom>(a_row_hi, at, row_bytes, chunk < chunks && a_live_hi);
            if (Norm && !kStaged) {
                const Span nw = load_span<kFromCache>(fusion.norm_weight, at, row_bytes,
                                                      chunk < chunks && (a_live_lo || a_live_hi));
                if (a_live_lo)
                    norm_span(&a_lo[u], nw, first_tile, &sum_sq_lo);
                if (a_live_hi)
                    norm_span(&a_hi[u], nw, first_tile, &sum_sq_hi);
            }
        }
        const bool tile_done = group + 1 == groups;
        const uint32_t next_tile = tile_done ? tile + gridDim.x : tile;
        const uint32_t next_group = tile_done ? 0 : group + 1;
        const bool more = next_tile < tiles;
        Span w_next[kUnroll];
        bool next_live;
        const uint32_t next_row = tile_row<Epi>(next_tile, g, n, &next_live, fusion.kv);
        load_weights(w_next, weight, next_row, more && next_live, row_bytes, chunks, next_group,
                     warp, q);
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
            if (Norm && !kStaged && first_tile) { // all of K has passed: each row's sum of squares
                const float lo = quad_sum(sum_sq_lo), hi = quad_sum(sum_sq_hi);
                if (q == 0) {
                    sum_sq_part[warp][g] = lo;
                    sum_sq_part[warp][g + 8] = hi;
                }
            }
            __syncthreads();
            const uint32_t t = threadIdx.x / kRows, col = threadIdx.x % kRows;
            if (Norm && !kStaged && first_tile && t < 16) {
                float sum_sq = 0.0f;
#pragma unroll
                for (int v = 0; v < kWarps; v++)
                    sum_sq += sum_sq_part[v][t];
                inv = rmsnorm_prologue_inv(sum_sq, k, fusion.eps);
            }
            first_tile = false;
            const uint32_t j = tile * tile_outputs<Epi>() + col;
            // What column c of the tile's sums is multiplied by: 1 / rms (BF16 RMSNorm), the
            // FP8 scales of the row's activation and of the column's weight row.
            auto scale_of = [&](uint32_t c) {
                if (Mode == kFp8Tensorwise)
                    return act_scale[0] * weight_scale[0];
                if (Mode == kFp8Rowwise) {
                    bool row_live;
                    const uint32_t r = tile_row<Epi>(tile, (int)c, n, &row_live, fusion.kv);
                    const float a = kStaged ? staged_scale[t] : act_scale[t];
                    return row_live ? a * weight_scale[r] : 0.0f;
                }
                return Norm ? inv : 1.0f;
            };
            if (Epi == kEpiKvAppend) {
                if (threadIdx.x < 16 * kRows && t < m)
                    kv_append_store(fusion.kv, tile, col, partial, t, scale_of(col),
                                    col < kRows / 2 ? scale_of(col + kRows / 2) : 0.0f, ldc, n,
                                    static_cast<uint16_t *>(out), kv_ok, kv_row, (float)kv_pos);
            } else if (threadIdx.x < 16 * kRows && t < m && col < tile_outputs<Epi>() &&
                       j < outputs) {
                float sum = 0.0f;
#pragma unroll
                for (int v = 0; v < kWarps; v++)
                    sum += partial[v][t][col];
                sum *= scale_of(col);
                uint16_t *out_bf16 = static_cast<uint16_t *>(out) + (size_t)t * ldc + j;
                if (Epi == kEpiSiluMul) {
                    float up = 0.0f;
#pragma unroll
                    for (int v = 0; v < kWarps; v++)
                        up += partial[v][t][col + kRows / 2];
                    up *= scale_of(col + kRows / 2);
                    *out_bf16 = (uint16_t)mg_num_f32_to_bf16(
                        mg_silu_mul_f32(mg_num_bf16_to_f32(mg_num_f32_to_bf16(sum)),
                                        mg_num_bf16_to_f32(mg_num_f32_to_bf16(up))));
                } else if (Epi == kEpiResidual) {
                    // read before the store: out may be the residual itself
                    const float r = mg_num_bf16_to_f32(fusion.residual[(size_t)t * ldc + j]);
                    *out_bf16 = (uint16_t)mg_num_f32_to_bf16(
                        mg_num_bf16_to_f32(mg_num_f32_to_bf16(sum)) + r);
                } else if (out_f32) {
                    static_cast<float *>(out)[(size_t)t * ldc + j] = sum;
                } else {
                    *out_bf16 = (uint16_t)mg_num_f32_to_bf16(sum);
                }
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
    decode_gemv<kBf16>(act, weight, nullptr, nullptr, out, m, n, k, ldc, out_f32 != 0, Fusion());
}

// The BF16 GEMV with a fusion (see the top of the file), one kernel per fusion, named
// mg_decode_gemv_bf16_<prologue>_<epilogue> after mg_gemm_prologue_name / _epilogue_name
// (each its own registers: 3 blocks per SM for the RMSNorm ones, at most 80 registers with no
// spill, and 4 for the others, as the provider sizes their grids). The RMSNorm ones also come
// as <name>_m8, for m <= 8, at 4 blocks per SM (64 registers). Prologue rmsnorm: act is the
// un-normed rows, norm_weight BF16 [k], eps. Epilogue residual_add: out = bf16(y + residual),
// residual BF16 [m, n] at pitch ldc (out itself allowed); silu_mul: out BF16 [m, n / 2], n
// even. out_f32 only without an epilogue.
extern "C" __global__ void __launch_bounds__(kWarps * 32, 3)
    mg_decode_gemv_bf16_rmsnorm_none(const uint8_t *act, const uint8_t *weight, void *out,
                                     const uint8_t *norm_weight, const uint16_t *residual,
                                     uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                     uint32_t out_f32, float eps) {
    decode_gemv<kBf16, true, kEpiNone>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                       out_f32 != 0, Fusion{norm_weight, residual, eps});
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_rmsnorm_none_m8(const uint8_t *act, const uint8_t *weight, void *out,
                                        const uint8_t *norm_weight, const uint16_t *residual,
                                        uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                        uint32_t out_f32, float eps) {
    decode_gemv<kBf16, true, kEpiNone, false>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                              out_f32 != 0, Fusion{norm_weight, residual, eps});
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 3)
    mg_decode_gemv_bf16_rmsnorm_residual_add(const uint8_t *act, const uint8_t *weight, void *out,
                                             const uint8_t *norm_weight, const uint16_t *residual,
                                             uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                             uint32_t out_f32, float eps) {
    decode_gemv<kBf16, true, kEpiResidual>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                           out_f32 != 0, Fusion{norm_weight, residual, eps});
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_rmsnorm_residual_add_m8(const uint8_t *act, const uint8_t *weight,
                                                void *out, const uint8_t *norm_weight,
                                                const uint16_t *residual, uint32_t m, uint32_t n,
                                                uint32_t k, uint32_t ldc, uint32_t out_f32,
                                                float eps) {
    decode_gemv<kBf16, true, kEpiResidual, false>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                                  out_f32 != 0, Fusion{norm_weight, residual, eps});
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 3)
    mg_decode_gemv_bf16_rmsnorm_silu_mul(const uint8_t *act, const uint8_t *weight, void *out,
                                         const uint8_t *norm_weight, const uint16_t *residual,
                                         uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                         uint32_t out_f32, float eps) {
    decode_gemv<kBf16, true, kEpiSiluMul>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                          out_f32 != 0, Fusion{norm_weight, residual, eps});
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_rmsnorm_silu_mul_m8(const uint8_t *act, const uint8_t *weight, void *out,
                                            const uint8_t *norm_weight, const uint16_t *residual,
                                            uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                            uint32_t out_f32, float eps) {
    decode_gemv<kBf16, true, kEpiSiluMul, false>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                                 out_f32 != 0, Fusion{norm_weight, residual, eps});
}

// KV append (metrale/ops_gemm.h): out's rows are [q | k | v] heads; the page table and
// pools as mg_kv_append's, BF16 pools only.
#define MG_DECODE_GEMV_KV_APPEND_PARAMS                                                            \
    const uint8_t *act, const uint8_t *weight, void *out, const uint8_t *norm_weight, uint32_t m,  \
        uint32_t n, uint32_t k, uint32_t ldc, float eps, const int32_t *qo_indptr,                 \
        const int32_t *kv_indptr, const int32_t *kv_indices, const int32_t *kv_last_page_len,      \
        const int32_t *positions, uint16_t *k_pages, uint16_t *v_pages, uint32_t batch,            \
        uint32_t num_kv_indices, uint32_t num_pages, uint32_t page_size, uint32_t qo_heads,        \
        uint32_t kv_heads, uint32_t head_dim, uint32_t rope, float rope_theta,                     \
        const float *rope_inv_freq
#define MG_DECODE_GEMV_KV_APPEND_FUSION                                                            \
    Fusion {                                                                                       \
        norm_weight, nullptr, eps, KvAppend {                                                      \
            qo_indptr, kv_indptr, kv_indices, kv_last_page_len, positions, k_pages, v_pages,       \
                batch, num_kv_indices, num_pages, page_size, qo_heads, kv_heads, head_dim, rope,   \
                rope_theta, rope_inv_freq                                                          \
        }                                                                                          \
    }

extern "C" __global__ void __launch_bounds__(kWarps * 32, 3)
    mg_decode_gemv_bf16_rmsnorm_kv_append(MG_DECODE_GEMV_KV_APPEND_PARAMS) {
    decode_gemv<kBf16, true, kEpiKvAppend>(act, weight, nullptr, nullptr, out, m, n, k, ldc, false,
                                           MG_DECODE_GEMV_KV_APPEND_FUSION);
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_rmsnorm_kv_append_m8(MG_DECODE_GEMV_KV_APPEND_PARAMS) {
    decode_gemv<kBf16, true, kEpiKvAppend, false>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                                  false, MG_DECODE_GEMV_KV_APPEND_FUSION);
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_none_kv_append(MG_DECODE_GEMV_KV_APPEND_PARAMS) {
    decode_gemv<kBf16, false, kEpiKvAppend>(act, weight, nullptr, nullptr, out, m, n, k, ldc, false,
                                            MG_DECODE_GEMV_KV_APPEND_FUSION);
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_none_residual_add(const uint8_t *act, const uint8_t *weight, void *out,
                                          const uint8_t *norm_weight, const uint16_t *residual,
                                          uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                          uint32_t out_f32, float eps) {
    decode_gemv<kBf16, false, kEpiResidual>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                            out_f32 != 0, Fusion{norm_weight, residual, eps});
}

extern "C" __global__ void __launch_bounds__(kWarps * 32, 4)
    mg_decode_gemv_bf16_none_silu_mul(const uint8_t *act, const uint8_t *weight, void *out,
                                      const uint8_t *norm_weight, const uint16_t *residual,
                                      uint32_t m, uint32_t n, uint32_t k, uint32_t ldc,
                                      uint32_t out_f32, float eps) {
    decode_gemv<kBf16, false, kEpiSiluMul>(act, weight, nullptr, nullptr, out, m, n, k, ldc,
                                           out_f32 != 0, Fusion{norm_weight, residual, eps});
}

// As above with E4M3 codes, times act_scale[0] * weight_scale[0] (rowwise == 0) or
// act_scale[t] * weight_scale[j] (rowwise != 0); BF16 out.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
    mg_decode_gemv_fp8(const uint8_t *act, const float *act_scale, const uint8_t *weight,
                       const float *weight_scale, void *out, uint32_t m, uint32_t n, uint32_t k,
                       uint32_t ldc, uint32_t rowwise) {
    if (rowwise)
        decode_gemv<kFp8Rowwise>(act, weight, act_scale, weight_scale, out, m, n, k, ldc, false,
                                 Fusion());
    else
        decode_gemv<kFp8Tensorwise>(act, weight, act_scale, weight_scale, out, m, n, k, ldc, false,
                                    Fusion());
}

// The row-wise FP8 GEMV with a fusion, mg_decode_gemv_fp8_row_<prologue>_<epilogue>: the fused
// BF16 kernels' operands after act_scale and weight_scale (the KV-append one: after them, its
// operands above). Prologue rmsnorm: act is the BF16 un-normed rows and act_scale is not read
// (the kernel makes the codes and the row scales in shared memory: the launch gives m *
// staged_pitch(k) bytes of dynamic shared memory); prologue none: act is E4M3 codes with
// act_scale[t]. Out BF16; 4 blocks per SM (64 registers).
#define MG_DECODE_GEMV_FP8_FUSED(NAME, NORM, EPI)                                                  \
    extern "C" __global__ void __launch_bounds__(kWarps * 32, 4) mg_decode_gemv_fp8_row_##NAME(    \
        const float *act_scale, const float *weight_scale, const uint8_t *act,                     \
        const uint8_t *weight, void *out, const uint8_t *norm_weight, const uint16_t *residual,    \
        uint32_t m, uint32_t n, uint32_t k, uint32_t ldc, uint32_t out_f32, float eps) {           \
        (void)out_f32;                                                                             \
        decode_gemv<kFp8Rowwise, NORM, EPI>(act, weight, act_scale, weight_scale, out, m, n, k,    \
                                            ldc, false, Fusion{norm_weight, residual, eps});       \
    }
MG_DECODE_GEMV_FP8_FUSED(rmsnorm_none, true, kEpiNone)
MG_DECODE_GEMV_FP8_FUSED(rmsnorm_residual_add, true, kEpiResidual)
MG_DECODE_GEMV_FP8_FUSED(rmsnorm_silu_mul, true, kEpiSiluMul)
MG_DECODE_GEMV_FP8_FUSED(none_residual_add, false, kEpiResidual)
MG_DECODE_GEMV_FP8_FUSED(none_silu_mul, false, kEpiSiluMul)

// The KV-append ones run 3 blocks per SM (80 registers): at 64 the page lookup spills.
#define MG_DECODE_GEMV_FP8_KV_APPEND(NAME, NORM)                                                   \
    extern "C" __global__ void __launch_bounds__(kWarps * 32, 3) mg_decode_gemv_fp8_row_##NAME(    \
        const float *act_scale, const float *weight_scale, MG_DECODE_GEMV_KV_APPEND_PARAMS) {      \
        decode_gemv<kFp8Rowwise, NORM, kEpiKvAppend>(act, weight, act_scale, weight_scale, out, m, \
                                                     n, k, ldc, false,                             \
                                                     MG_DECODE_GEMV_KV_APPEND_FUSION);             \
    }
MG_DECODE_GEMV_FP8_KV_APPEND(rmsnorm_kv_append, true)
MG_DECODE_GEMV_FP8_KV_APPEND(none_kv_append, false)
