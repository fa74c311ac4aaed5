// nvfp4_gemm_tile.cu - the NVFP4 GEMMs of Hopper from 17 tokens (metrale/ops_nvfp4.h), dense
// and grouped, plain and fused gate_up: each weight is decoded once per tile of 32 or 64 tokens
// instead of once per 16 (nvfp4_gemm.cu, whose arithmetic and argument list they share:
// nvfp4_mma.cuh).
//
// A CTA owns WARPS warps of rows and one tile of TT tokens; every warp computes all TT tokens
// of its rows, over the whole K, in a fixed order (no split of K: results do not depend on
// timing or on the grid). A warp holds two row-block slots: two consecutive row blocks (32
// output rows) in the plain form, the gate and up row blocks of the same 16 rows in the fused
// form. It streams its slots' 512-byte chunks straight into registers, one super-chunk ahead,
// and decodes each chunk's A fragments once for the TT / 8 MMA column tiles.
//
// The activations go through shared memory: the CTA copies the tile's TT rows chunk by chunk
// (64 K, 128 bytes per row) with cp.async into a ring of STAGES stages, rows STAGE_PITCH = 72
// BF16 (144 bytes) apart, so that each 8-lane phase of a lane's 16-byte shared load (token
// g's 32-byte run at t * 32) hits eight distinct 16-byte bank groups. Runs at or past k are
// zero-filled by the copy (the weight's K padding has zero codes, and 0 * 0 keeps the sums
// finite); a tile row past the group's rows, or a token id outside [0, act_rows), reads
// activation row 0 and its output is not stored (past the rows) or stored as 0 (bad ids).
//
// Programmatic dependent launch: a dense call loads its first super-chunk of weights before
// it waits for the previous kernel; a grouped call waits first (the routing decides which
// expert's weights it reads).
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/copy_async.cuh"
#include "common/grid_dependency.cuh"
#include "common/silu.cuh"
#include "common/stream_load.cuh"
#include "nvfp4/nvfp4_hopper_layout.h"
#include "nvfp4/nvfp4_mma.cuh"

using namespace mg_nvfp4;

namespace {

constexpr int STAGES = 4;
constexpr uint32_t STAGE_PITCH = MG_NVFP4_CHUNK_K + 8; // BF16 per token row of a stage

// One warp's two slots: the codes and scales of one super-chunk.
struct slot_words {
    uint4 w[2][4];
    uint2 sc[2];
};

__device__ __forceinline__ void load_super(const uint8_t *const (&values)[2],
                                           const uint8_t *const (&scales)[2], uint32_t s,
                                           slot_words &out) {
    const uint32_t lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint4 *wv = reinterpret_cast<const uint4 *>(values[j] + s * MG_NVFP4_SUPER_BYTES);
        const uint2 *ws =
            reinterpret_cast<const uint2 *>(scales[j] + s * MG_NVFP4_SUPER_SCALE_BYTES);
        out.sc[j] = load_stream2(ws + lane);
#pragma unroll
        for (int c = 0; c < 4; c++)
            out.w[j][c] = load_stream(wv + c * 32 + lane);
    }
}

// The stage of step i: for each K group kw, the tile's activations of chunk c of its super-chunk
// s_begin(kw) + i (TT rows, their addresses in `row`, of eight 16-byte pieces), TT * 8 / (32 *
// WR) pieces per thread. Pieces at or past k, of a row past the tile, or of a group whose
// super-chunks have run out are zeros.
template <int TT, int WR, int KW>
__device__ __forceinline__ void load_stage(__nv_bfloat16 *stage, const __nv_bfloat16 *const *row,
                                           const __nv_bfloat16 *any, uint32_t supers, uint32_t i,
                                           int c, uint32_t k) {
    constexpr int THREADS = 32 * WR * KW, PIECES = TT * 8 * KW / THREADS;
    const uint32_t col = threadIdx.x % 8;
#pragma unroll
    for (int p = 0; p < PIECES; p++) {
        const uint32_t piece_row = threadIdx.x / 8 + p * (THREADS / 8); // (kw, r) = (/ TT, % TT)
        const uint32_t kw = piece_row / TT, r = piece_row % TT;
        const uint32_t s = kw * supers / KW + i;
        const uint32_t k0 = (s * 4 + c) * MG_NVFP4_CHUNK_K + col * 8;
        const bool valid = s < (kw + 1) * supers / KW && k0 < k && row[r] != nullptr;
        copy_async<16>(reinterpret_cast<char *>(stage + piece_row * STAGE_PITCH + col * 8),
                       reinterpret_cast<const char *>(valid ? row[r] + k0 : any), valid);
    }
}

// One chunk: the two slots' A fragments decoded once, then TT / 8 column tiles of 4 MMA steps.
template <int NT>
__device__ __forceinline__ void mma_chunk(const __nv_bfloat16 *stage, const slot_words &w, int c,
                                          float (&acc)[2][NT][4]) {
    const uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t a[2][4][4];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t sword = c < 2 ? w.sc[j].x : w.sc[j].y;
        const uint32_t s_lo = scale_pair(sword, (c & 1) * 2),
                       s_hi = scale_pair(sword, (c & 1) * 2 + 1);
        const uint32_t words[4] = {w.w[j][c].x, w.w[j][c].y, w.w[j][c].z, w.w[j][c].w};
#pragma unroll
        for (int kt = 0; kt < 4; kt++) {
            a[j][kt][0] = mul_bf16x2(decode_pair(words[kt], 0), s_lo);
            a[j][kt][1] = mul_bf16x2(decode_pair(words[kt], 1), s_hi);
            a[j][kt][2] = mul_bf16x2(decode_pair(words[kt], 2), s_lo);
            a[j][kt][3] = mul_bf16x2(decode_pair(words[kt], 3), s_hi);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const uint4 *p =
            reinterpret_cast<const uint4 *>(stage + (nt * 8 + g) * STAGE_PITCH + t * 16);
        const uint4 x0 = p[0], x1 = p[1];
        const uint32_t x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int kt = 0; kt < 4; kt++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                mma_bf16(acc[j][nt], a[j][kt][0], a[j][kt][1], a[j][kt][2], a[j][kt][3], x[kt * 2],
                         x[kt * 2 + 1]);
    }
}

// WR warps of rows times KW warps splitting K (each K group a contiguous range of whole
// super-chunks, summed through shared memory in group order at the end).
template <int TT, int WR, int KW, bool FUSED>
__device__ __forceinline__ void tile_body(const gemm_args &a) {
    constexpr int NT = TT / 8, THREADS = 32 * WR * KW;
    constexpr uint32_t STAGE = KW * TT * STAGE_PITCH; // BF16 per stage
    static_assert(TT * 8 * KW % THREADS == 0, "whole pieces per thread");
    extern __shared__ __align__(16) __nv_bfloat16 smem[]; // STAGES * STAGE
    __shared__ const __nv_bfloat16 *row[TT];

    const bool grouped = a.expert_offsets != nullptr;
    token_tile tile = {0, blockIdx.x * TT, a.rows};
    if (grouped) {
        grid_dependency_wait();
        tile = find_tile(a, blockIdx.x, TT);
        if (tile.expert < 0)
            return; // the whole CTA: every warp found the same tile
    }
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t wr = warp % WR, kw = warp / WR;
    const uint32_t supers = mg_nvfp4_supers(a.k), row_blocks = mg_nvfp4_row_blocks(a.n);
    const uint32_t rb0 = (blockIdx.y * WR + wr) * (FUSED ? 1 : 2);
    const uint32_t s_begin = kw * supers / KW, s_count = (kw + 1) * supers / KW - s_begin;
    const uint32_t steps = (supers + KW - 1) / KW; // the longest group's super-chunks

    // The slots' weights; a row block past the last is read as the last one (its outputs are
    // past n and never stored), so every load is inside the weight.
    const uint8_t *values[2], *scales[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t rb = min(FUSED ? rb0 : rb0 + j, row_blocks - 1);
        const bool up = FUSED && j == 1;
        values[j] = (up ? a.up_values : a.values) + (uint64_t)tile.expert * a.expert_value_bytes +
                    ((uint64_t)rb * supers + s_begin) * MG_NVFP4_SUPER_BYTES;
        scales[j] = (up ? a.up_scales : a.scales) + (uint64_t)tile.expert * a.expert_scale_bytes +
                    ((uint64_t)rb * supers + s_begin) * MG_NVFP4_SUPER_SCALE_BYTES;
    }
    slot_words cur;
    if (s_count)
        load_super(values, scales, 0, cur);
    if (!grouped)
        grid_dependency_wait();

    for (uint32_t i = threadIdx.x; i < TT; i += THREADS) {
        const uint32_t r = tile.row0 + i;
        int32_t src = r < tile.row_end ? (a.token_ids ? a.token_ids[r] : (int32_t)r) : -1;
        if (r < tile.row_end && (src < 0 || (uint32_t)src >= a.act_rows))
            src = 0; // a bad id reads row 0; its output is stored as 0
        row[i] = src < 0 ? nullptr : a.act + (uint64_t)src * a.act_pitch;
    }
    __syncthreads();
    const uint32_t total = steps * 4; // stages of the whole loop
#pragma unroll
    for (int p = 0; p < STAGES - 1; p++) {
        if ((uint32_t)p < total)
            load_stage<TT, WR, KW>(smem + p * STAGE, row, a.act, supers, p / 4, p % 4, a.k);
        copy_commit(); // empty groups keep the wait counts uniform
    }

    float acc[2][NT][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            acc[j][nt][0] = acc[j][nt][1] = acc[j][nt][2] = acc[j][nt][3] = 0.0f;

    for (uint32_t i = 0; i < steps; i++) {
        slot_words next;
        const bool active = i < s_count, more = i + 1 < s_count;
        if (more)
            load_super(values, scales, i + 1, next);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const uint32_t step = i * 4 + c, ahead = step + STAGES - 1;
            copy_wait<STAGES - 2>(); // the step's group has landed (for this thread)
            __syncthreads();         // for every thread; and the stage refilled below is free
            if (ahead < total)
                load_stage<TT, WR, KW>(smem + (ahead % STAGES) * STAGE, row, a.act, supers,
                                       ahead / 4, ahead % 4, a.k);
            copy_commit();
            if (active)
                mma_chunk<NT>(smem + (step % STAGES) * STAGE + kw * TT * STAGE_PITCH, cur, c, acc);
        }
        if (more)
            cur = next;
    }

    if (KW > 1) { // the K groups' partial sums, added in group order by group 0
        copy_wait<0>();
        __syncthreads(); // every stage has been read
        // [KW - 1][WR][2][NT][4][32]: group w's (>= 1) accumulators, lane-minor
        float *partial = reinterpret_cast<float *>(smem);
        auto at = [&](uint32_t w, int j, int nt, int e) {
            return partial + ((((w - 1) * WR + wr) * 2 + j) * NT + nt) * 128 + e * 32 + lane;
        };
        if (kw > 0)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        *at(kw, j, nt, e) = acc[j][nt][e];
        __syncthreads();
        if (kw > 0)
            return;
        for (uint32_t w = 1; w < KW; w++)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[j][nt][e] += *at(w, j, nt, e);
    }

    const float scale0 = a.global_scales[tile.expert] * MG_NVFP4_ACC_FACTOR;
    const float scale1 = FUSED ? a.up_global_scales[tile.expert] * MG_NVFP4_ACC_FACTOR : scale0;
#pragma unroll
    for (int j = 0; j < (FUSED ? 1 : 2); j++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                // c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8.
                const uint32_t n = (rb0 + j) * 16 + g + (e >= 2 ? 8 : 0);
                const uint32_t r = tile.row0 + nt * 8 + 2 * t + (e & 1);
                if (n >= a.n || r >= tile.row_end)
                    continue;
                float value = acc[j][nt][e] * scale0;
                if (FUSED)
                    value = mg_silu_mul_f32(value, acc[1][nt][e] * scale1);
                store_output(a, r, n, value);
            }
}

} // namespace

#define MG_NVFP4_TILE_KERNEL(NAME, TT, WR, KW, FUSED)                                              \
    extern "C" __global__ void __launch_bounds__(32 * WR * KW) NAME(MG_NVFP4_GEMM_PARAMS) {        \
        tile_body<TT, WR, KW, FUSED>(MG_NVFP4_GEMM_ARGS);                                          \
    }

// Names: tokens per tile (t32, t64), output rows per CTA (r: 32 per row warp, 16 gate_up) and
// warps splitting K (k). Dynamic shared memory: STAGES * KW * TT * 144 bytes.
#define MG_NVFP4_TILE_KERNELS(T, TT, R1, R2, R4, FUSED)                                            \
    MG_NVFP4_TILE_KERNEL(nvfp4_gemm_##T##_r##R1##_k1, TT, 1, 1, FUSED)                             \
    MG_NVFP4_TILE_KERNEL(nvfp4_gemm_##T##_r##R1##_k2, TT, 1, 2, FUSED)                             \
    MG_NVFP4_TILE_KERNEL(nvfp4_gemm_##T##_r##R2##_k1, TT, 2, 1, FUSED)                             \
    MG_NVFP4_TILE_KERNEL(nvfp4_gemm_##T##_r##R2##_k2, TT, 2, 2, FUSED)                             \
    MG_NVFP4_TILE_KERNEL(nvfp4_gemm_##T##_r##R4##_k1, TT, 4, 1, FUSED)                             \
    MG_NVFP4_TILE_KERNEL(nvfp4_gemm_##T##_r##R4##_k2, TT, 4, 2, FUSED)

MG_NVFP4_TILE_KERNELS(t32, 32, 32, 64, 128, false)
MG_NVFP4_TILE_KERNELS(t64, 64, 32, 64, 128, false)
MG_NVFP4_TILE_KERNELS(gate_up_t32, 32, 16, 32, 64, true)
MG_NVFP4_TILE_KERNELS(gate_up_t64, 64, 16, 32, 64, true)
// 32 tokens: also four K groups (at most 8 warps)
MG_NVFP4_TILE_KERNEL(nvfp4_gemm_t32_r32_k4, 32, 1, 4, false)
MG_NVFP4_TILE_KERNEL(nvfp4_gemm_t32_r64_k4, 32, 2, 4, false)
MG_NVFP4_TILE_KERNEL(nvfp4_gemm_gate_up_t32_r16_k4, 32, 1, 4, true)
MG_NVFP4_TILE_KERNEL(nvfp4_gemm_gate_up_t32_r32_k4, 32, 2, 4, true)
