// nvfp4_gemm.cu - NVFP4 weights x BF16 activations on Hopper (metrale/ops_nvfp4.h): the
// weight re-layout done once at load, and the dense and grouped (per-expert) GEMMs.
//
// out[r, n] = sum_k act[token(r), k] * w[n, k] * global, w = e2m1 * e4m3 scale, FP32
// accumulation, BF16 out. The weights are in the layout of nvfp4_hopper_layout.h; each warp
// streams its 512-byte chunks with 16-byte no-L1-allocate loads, decodes E2M1 into BF16 with
// bit operations, applies the block scale with one bf16x2 multiply (exact), and feeds
// mma.sync m16n8k16 with the weights as A (16 rows) and up to 16 tokens as B. The MMA's K
// order is the layout's permutation of the real K, the same for weights and activations.
//
// A CTA owns one row block (two in the fused gate_up form: gate and up rows) and one tile of
// 8 * NT tokens; its KW warps per row block split K in whole super-chunks and add their
// partial sums through shared memory in a fixed order, so results do not depend on timing.
// The grid is (token tiles, row blocks): CTAs next to each other read the same weights.
//
// Programmatic dependent launch: in a dense call (plain or gate_up) each warp issues the loads
// of its first super-chunk's codes and block scales (what the main loop expects in registers on
// entry; load_super) before it waits for the previous kernel; token ids, activations and global
// scales are read, and anything is stored, only after the wait. A grouped call waits first: the
// routing decides its tile and which expert's weights it reads. A CTA releases the next kernel
// once all its warps have accumulated (that kernel starts once every CTA has, and waits for this
// grid to complete before it reads the output), so the next kernel's own early loads overlap
// this one's reduction and stores.
//
// Grouped form: rows of the problem are in expert order, expert e owning rows
// [expert_offsets[e], expert_offsets[e+1]); token tile i of the grid is found on the device by
// counting each expert's tiles, so a graph captured once replays with any routing, and an
// expert without rows has no tile. Offsets are clamped to [0, rows] and a decreasing pair is
// an empty expert; a token id outside [0, act_rows) reads zeros: no access is out of bounds
// whatever the routing holds (the CPU backend rejects such routings with an error instead).
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/stream_load.cuh"

#include "common/grid_dependency.cuh"
#include "common/rmsnorm_prologue.cuh"
#include "common/silu.cuh"
#include "nvfp4/nvfp4_hopper_layout.h"
#include "nvfp4/nvfp4_mma.cuh"

using namespace mg_nvfp4;

namespace {

// The activations lane t needs for one chunk: 16 BF16 of each of its NT tokens at kbase.
// CHECKED zero-fills the runs at or past k (the last, partial super-chunk of a row block);
// elsewhere every run is inside the row. STAGED: the rows are the normed rows in shared memory
// (stage_normed), zero past k.
template <int NT, bool CHECKED, bool STAGED>
__device__ __forceinline__ void load_act(const __nv_bfloat16 *const (&act_row)[NT], uint32_t kbase,
                                         uint32_t k, uint32_t (&x)[NT][8]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
        const uint4 *p = reinterpret_cast<const uint4 *>(act_row[nt] + kbase);
        if (STAGED) {
            v0 = p[0];
            v1 = p[1];
        } else if (!CHECKED || kbase < k) {
            v0 = __ldg(p);
            v1 = __ldg(p + 1);
        }
        x[nt][0] = v0.x, x[nt][1] = v0.y, x[nt][2] = v0.z, x[nt][3] = v0.w;
        x[nt][4] = v1.x, x[nt][5] = v1.y, x[nt][6] = v1.z, x[nt][7] = v1.w;
    }
}

// One chunk: 4 MMA steps of 16 rows x 16 K x 8 * NT tokens.
template <int NT>
__device__ __forceinline__ void mma_chunk(uint4 w, uint32_t s_lo, uint32_t s_hi,
                                          const uint32_t (&x)[NT][8], float (&acc)[NT][4]) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int kt = 0; kt < 4; kt++) {
        const uint32_t word = words[kt];
        const uint32_t a0 = mul_bf16x2(decode_pair(word, 0), s_lo);
        const uint32_t a1 = mul_bf16x2(decode_pair(word, 1), s_hi);
        const uint32_t a2 = mul_bf16x2(decode_pair(word, 2), s_lo);
        const uint32_t a3 = mul_bf16x2(decode_pair(word, 3), s_hi);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma_bf16(acc[nt], a0, a1, a2, a3, x[nt][kt * 2], x[nt][kt * 2 + 1]);
    }
}

// One super-chunk (4 chunks) whose codes and scales are in registers.
template <int NT, bool CHECKED, bool STAGED>
__device__ __forceinline__ void mma_super(const uint4 (&w)[4], uint2 sc,
                                          const __nv_bfloat16 *const (&act_row)[NT], uint32_t s,
                                          uint32_t k, float (&acc)[NT][4]) {
    const uint32_t t = threadIdx.x % 4;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        uint32_t x[NT][8];
        load_act<NT, CHECKED, STAGED>(act_row, s * MG_NVFP4_SUPER_K + c * MG_NVFP4_CHUNK_K + t * 16,
                                      k, x);
        const uint32_t sword = c < 2 ? sc.x : sc.y;
        mma_chunk<NT>(w[c], scale_pair(sword, (c & 1) * 2), scale_pair(sword, (c & 1) * 2 + 1), x,
                      acc);
    }
}

// The lane's codes and scales of super-chunk s of a row block (values, scales: its first), as
// the loop of accumulate loads the next one: the same bytes, so the same sums. Ordered loads
// (stream_load.cuh), so that a dense call's issue before the grid wait stays there.
__device__ __forceinline__ void load_super(const uint8_t *values, const uint8_t *scales, uint32_t s,
                                           uint4 (&w)[4], uint2 &sc) {
    const uint32_t lane = threadIdx.x % 32;
    const uint4 *wv = reinterpret_cast<const uint4 *>(values) + lane;
    const uint2 *ws = reinterpret_cast<const uint2 *>(scales) + lane;
    sc = load_stream_ordered2(ws + s * 32);
#pragma unroll
    for (int c = 0; c < 4; c++)
        w[c] = load_stream_ordered(wv + (s * 4 + c) * 32);
}

// One warp's partial sums for one row block over super-chunks [s_begin, s_end): each
// super-chunk's codes and scales are loaded while the one before is computed. w and sc hold
// super-chunk s_begin's on entry (load_super, issued by the caller so that it may come before
// the grid wait); unread when the range is empty.
template <int NT, bool STAGED>
__device__ __forceinline__ void accumulate(const uint8_t *values, const uint8_t *scales,
                                           const __nv_bfloat16 *const (&act_row)[NT], uint32_t k,
                                           uint32_t s_begin, uint32_t s_end, uint4 (&w)[4],
                                           uint2 &sc, float (&acc)[NT][4]) {
    const uint32_t lane = threadIdx.x % 32;
    const uint4 *wv = reinterpret_cast<const uint4 *>(values) + lane;
    const uint2 *ws = reinterpret_cast<const uint2 *>(scales) + lane;
    if (s_begin >= s_end)
        return;
    // Super-chunks at or past full_supers hold K padding: their activation loads are checked.
    const uint32_t full_supers = k / MG_NVFP4_SUPER_K;
    for (uint32_t s = s_begin; s < s_end; s++) {
        uint4 wn[4];
        uint2 scn = sc;
        const bool more = s + 1 < s_end;
        if (more) {
            scn = load_stream2(ws + (s + 1) * 32);
#pragma unroll
            for (int c = 0; c < 4; c++)
                wn[c] = load_stream(wv + ((s + 1) * 4 + c) * 32);
        }
        if (s < full_supers)
            mma_super<NT, false, STAGED>(w, sc, act_row, s, k, acc);
        else
            mma_super<NT, true, STAGED>(w, sc, act_row, s, k, acc);
        if (more) {
            sc = scn;
#pragma unroll
            for (int c = 0; c < 4; c++)
                w[c] = wn[c];
        }
    }
}

// The RMSNorm prologue (dense calls): the tile's `live` token rows of act normed as
// mg_rmsnorm_bf16 rounds them, bf16((x * (1 / rms)) * norm_weight), into `staged` (row pitch
// mg_nvfp4_normed_pitch(k) uint4, zero from k to the padded K), once per CTA, so the main loop
// reads them with no work of its own. Each thread sums its share of a row's squares in a fixed
// order, the warps' shares are added in warp order: a row's 1 / rms is the same in every CTA.
template <uint32_t THREADS, uint32_t TILE>
__device__ __forceinline__ void stage_normed(const gemm_args &a, uint32_t row0, uint32_t live,
                                             uint4 *staged) {
    __shared__ float sum_part[THREADS / 32][TILE];
    const uint32_t vecs = a.k / 8, padded = mg_nvfp4_normed_pitch(a.k) - 1;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint4 *w = reinterpret_cast<const uint4 *>(a.norm_weight);
    for (uint32_t r = 0; r < live; r++) {
        const uint4 *x =
            reinterpret_cast<const uint4 *>(a.act + (uint64_t)(row0 + r) * a.act_pitch);
        float sum = 0.0f;
        for (uint32_t v = threadIdx.x; v < vecs; v += THREADS)
            sum = sum_squares(__ldg(x + v), sum);
        sum = warp_sum(sum);
        if (lane == 0)
            sum_part[warp][r] = sum;
    }
    __syncthreads();
    for (uint32_t r = 0; r < live; r++) {
        float sum = 0.0f;
#pragma unroll
        for (uint32_t i = 0; i < THREADS / 32; i++)
            sum += sum_part[i][r];
        const float inv = rmsnorm_prologue_inv(sum, a.k, a.eps);
        const uint4 *x =
            reinterpret_cast<const uint4 *>(a.act + (uint64_t)(row0 + r) * a.act_pitch);
        for (uint32_t v = threadIdx.x; v < padded; v += THREADS)
            staged[r * (padded + 1) + v] =
                v < vecs ? norm_vector(__ldg(x + v), __ldg(w + v), inv) : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
}

// NT: n8 token tiles per CTA (8 * NT tokens); KW: warps splitting K per row block; FUSED:
// gate and up row blocks, out = silu(gate) * up; NORM: the RMSNorm prologue (a.norm_weight,
// a.eps; dense; the normed rows staged in the dynamic shared memory, stage_normed). a.residual,
// when set, is added to every output as it is stored.
template <int NT, int KW, bool FUSED, bool NORM>
__device__ __forceinline__ void gemm_body(const gemm_args &a) {
    constexpr int RB = FUSED ? 2 : 1;
    constexpr uint32_t TILE = 8 * NT;
    __shared__ float partial[RB][KW][NT][4][32];
    extern __shared__ uint4 normed_rows[]; // NORM: [live rows][mg_nvfp4_normed_pitch(k)]

    // A dense call's tile and weights are known from its arguments alone; a grouped call's come
    // from the routing, which an earlier kernel writes.
    const bool grouped = a.expert_offsets != nullptr;
    if (grouped)
        grid_dependency_wait();
    const token_tile tile = find_tile(a, blockIdx.x, TILE);
    if (tile.expert < 0)
        return; // the whole CTA: every warp found the same tile
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t kw = warp % KW, which = warp / KW; // which: 0 gate (or plain), 1 up
    const uint32_t rb = blockIdx.y, supers = mg_nvfp4_supers(a.k);

    const uint8_t *values = which ? a.up_values : a.values;
    const uint8_t *scales = which ? a.up_scales : a.scales;
    values +=
        (uint64_t)tile.expert * a.expert_value_bytes + (uint64_t)rb * supers * MG_NVFP4_SUPER_BYTES;
    scales += (uint64_t)tile.expert * a.expert_scale_bytes +
              (uint64_t)rb * supers * MG_NVFP4_SUPER_SCALE_BYTES;
    const uint32_t s_begin = (uint32_t)((uint64_t)kw * supers / KW);
    const uint32_t s_end = (uint32_t)((uint64_t)(kw + 1) * supers / KW);

    // The first super-chunk the loop computes: no earlier kernel writes weights or block
    // scales, so a dense call streams them while the kernel before it drains.
    uint4 w0[4];
    uint2 sc0;
    if (s_begin < s_end)
        load_super(values, scales, s_begin, w0, sc0);
    if (!grouped)
        grid_dependency_wait(); // before the token ids, the activations and any store

    // Each lane's tokens, so that no activation load needs a predicate: a slot past the
    // tile's rows reads the tile's first row instead, and a token id outside the activation
    // reads row 0; an MMA column reaches only its own outputs, and those are not stored (past
    // the rows) or stored as 0 (bad ids), as if the row were zeros.
    // NORM (dense, no token ids): the rows staged normed, read from shared memory.
    const __nv_bfloat16 *act_row[NT];
    if (NORM) {
        const uint32_t live = min(tile.row_end - tile.row0, TILE);
        stage_normed<32 * KW * RB, TILE>(a, tile.row0, live, normed_rows);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint32_t slot = nt * 8 + g < live ? nt * 8 + g : 0;
            act_row[nt] = reinterpret_cast<const __nv_bfloat16 *>(normed_rows) +
                          (uint64_t)slot * mg_nvfp4_normed_pitch(a.k) * 8;
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint32_t r = tile.row0 + nt * 8 + g;
            if (r >= tile.row_end)
                r = tile.row0;
            int32_t src = a.token_ids ? a.token_ids[r] : (int32_t)r;
            if (src < 0 || (uint32_t)src >= a.act_rows)
                src = 0;
            act_row[nt] = a.act + (uint64_t)src * a.act_pitch;
        }
    }

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    accumulate<NT, NORM>(values, scales, act_row, a.k, s_begin, s_end, w0, sc0, acc);

#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            partial[which][kw][nt][i][lane] = acc[nt][i];
    __syncthreads();
    // Every warp's weights are loaded and used: the next kernel may start its own independent
    // loads. Released here rather than at the first warp's end (measured on an H100,
    // bench/results/2026-12-07-h100-nvfp4-fused.md: 4-10% faster on the long-K and 4096-row
    // shapes at 1 and 8 tokens, whose grids are one wave).
    launch_dependents();
    if (warp != 0)
        return;

    const float gate_scale = a.global_scales[tile.expert] * MG_NVFP4_ACC_FACTOR;
    const float up_scale = FUSED ? a.up_global_scales[tile.expert] * MG_NVFP4_ACC_FACTOR : 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            // c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8.
            const uint32_t n = rb * 16 + g + (i >= 2 ? 8 : 0);
            const uint32_t r = tile.row0 + nt * 8 + 2 * t + (i & 1);
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < KW; w++)
                sum += partial[0][w][nt][i][lane];
            float value = sum * gate_scale;
            if (FUSED) {
                float up = 0.0f;
#pragma unroll
                for (int w = 0; w < KW; w++)
                    up += partial[RB - 1][w][nt][i][lane];
                value = mg_silu_mul_f32(value, up * up_scale);
            }
            if (n < a.n && r < tile.row_end)
                store_output(a, r, n, value);
        }
    }
}

} // namespace

#define MG_NVFP4_GEMM_KERNEL(NAME, NT, KW, FUSED)                                                  \
    extern "C" __global__ void __launch_bounds__(32 * KW * (FUSED ? 2 : 1))                        \
        NAME(MG_NVFP4_GEMM_PARAMS) {                                                               \
        gemm_body<NT, KW, FUSED, false>(MG_NVFP4_GEMM_ARGS);                                       \
    }
// The fused kernels (metrale/ops_nvfp4.h, mg_nvfp4_gemm_fused): three more arguments, the norm
// weight (NORM kernels), the residual (or null) and eps.
#define MG_NVFP4_GEMM_FUSED_KERNEL(NAME, NT, KW, FUSED, NORM)                                      \
    extern "C" __global__ void __launch_bounds__(32 * KW * (FUSED ? 2 : 1))                        \
        NAME(MG_NVFP4_GEMM_PARAMS, const __nv_bfloat16 *norm_weight,                               \
             const __nv_bfloat16 *residual, float eps) {                                           \
        mg_nvfp4::gemm_args a = MG_NVFP4_GEMM_ARGS;                                                \
        a.norm_weight = norm_weight;                                                               \
        a.residual = residual;                                                                     \
        a.eps = eps;                                                                               \
        gemm_body<NT, KW, FUSED, NORM>(a);                                                         \
    }

MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t8_k1, 1, 1, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t8_k2, 1, 2, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t8_k4, 1, 4, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t8_k8, 1, 8, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t16_k1, 2, 1, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t16_k2, 2, 2, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t16_k4, 2, 4, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_t16_k8, 2, 8, false)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_gate_up_t8_k1, 1, 1, true)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_gate_up_t8_k2, 1, 2, true)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_gate_up_t8_k4, 1, 4, true)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_gate_up_t16_k1, 2, 1, true)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_gate_up_t16_k2, 2, 2, true)
MG_NVFP4_GEMM_KERNEL(nvfp4_gemm_gate_up_t16_k4, 2, 4, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t8_k1, 1, 1, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t8_k2, 1, 2, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t8_k4, 1, 4, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t8_k8, 1, 8, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t16_k1, 2, 1, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t16_k2, 2, 2, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t16_k4, 2, 4, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_add_t16_k8, 2, 8, false, false)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t8_k1, 1, 1, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t8_k2, 1, 2, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t8_k4, 1, 4, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t8_k8, 1, 8, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t16_k1, 2, 1, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t16_k2, 2, 2, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t16_k4, 2, 4, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_norm_t16_k8, 2, 8, false, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_gate_up_norm_t8_k1, 1, 1, true, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_gate_up_norm_t8_k2, 1, 2, true, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_gate_up_norm_t8_k4, 1, 4, true, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_gate_up_norm_t16_k1, 2, 1, true, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_gate_up_norm_t16_k2, 2, 2, true, true)
MG_NVFP4_GEMM_FUSED_KERNEL(nvfp4_gemm_gate_up_norm_t16_k4, 2, 4, true, true)

// The re-layout (once at load): canonical packed codes [experts * n, k / 2] (low nibble = even
// k) and E4M3 scales [experts * n, k / 16] -> the layout of nvfp4_hopper_layout.h, each expert
// in its own padded region. One thread per 32-bit output word; threads with kt < 2 also write
// one scale byte (row g + 8 * kt of their lane's block).
extern "C" __global__ void __launch_bounds__(256)
    nvfp4_hopper_prepare(const uint8_t *packed, const uint8_t *e4m3_scales, uint8_t *values,
                         uint8_t *scales, uint32_t n, uint32_t k, uint32_t experts) {
    grid_dependency_wait();
    const uint32_t row_blocks = mg_nvfp4_row_blocks(n), supers = mg_nvfp4_supers(k);
    const uint64_t words_per_expert = (uint64_t)row_blocks * supers * (MG_NVFP4_SUPER_BYTES / 4);
    const uint64_t total = words_per_expert * experts;
    const uint32_t kb = k / 16; // scale blocks per row
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t expert = (uint32_t)(i / words_per_expert);
        uint64_t w = i % words_per_expert; // word within the expert: ((rb, s, c), lane, kt)
        const uint32_t kt = (uint32_t)(w % 4), lane = (uint32_t)(w / 4 % 32);
        const uint64_t chunk = w / 128; // (rb * supers + s) * 4 + c
        const uint32_t c = (uint32_t)(chunk % 4), s = (uint32_t)(chunk / 4 % supers);
        const uint32_t rb = (uint32_t)(chunk / 4 / supers);
        const uint32_t g = lane / 4, t = lane % 4;
        const uint32_t q = s * 16 + c * 4 + t; // the lane's scale block
        const uint32_t k0 = q * 16 + kt * 4;   // real k of element e = 0
        uint32_t word = 0;
        for (uint32_t h = 0; h < 2; h++) {
            const uint32_t row = rb * 16 + g + 8 * h;
            uint32_t codes = 0; // 4 codes, element e at bits 4e
            uint32_t scale = 0;
            if (row < n && q < kb) {
                const uint64_t grow = (uint64_t)expert * n + row;
                scale = e4m3_scales[grow * kb + q];
                const uint8_t *src = packed + grow * (k / 2) + k0 / 2;
                if (!mg_nvfp4_scale_clears_block(scale))
                    codes = (uint32_t)src[0] | ((uint32_t)src[1] << 8);
            }
            for (uint32_t e = 0; e < 4; e++) {
                word |= ((codes >> (4 * e)) & 15u) << (4 * mg_nvfp4_slot(h + 2 * (e / 2), e % 2));
            }
            if (kt == h) {
                const uint64_t at =
                    (uint64_t)expert * row_blocks * supers * MG_NVFP4_SUPER_SCALE_BYTES +
                    mg_nvfp4_scale_offset(supers, rb * 16 + g + 8 * h, q);
                scales[at] = (uint8_t)mg_nvfp4_ue5m3_from_e4m3(scale);
            }
        }
        reinterpret_cast<uint32_t *>(values)[(uint64_t)expert * words_per_expert + w] = word;
    }
}

// Prepared weight -> BF16 [n, k] row-major, global scale folded in: out = bf16(e2m1 * scale *
// global) (e2m1 * scale is exact in FP32; one rounding of the product with the global scale
// in FP32, then one to BF16). The large-M path of the dense GEMM (a BF16 GEMM on the copy).
// A block per row (grid-stride over rows), a thread per 16-element block of the row: it reads
// its lane's 16 bytes of the chunk and writes 32 contiguous bytes.
extern "C" __global__ void __launch_bounds__(256)
    nvfp4_hopper_dequant_bf16(const uint8_t *values, const uint8_t *scales,
                              const float *global_scale, __nv_bfloat16 *out, uint32_t n,
                              uint32_t k) {
    grid_dependency_wait();
    const uint32_t supers = mg_nvfp4_supers(k), kb = k / 16;
    const float global = *global_scale * MG_NVFP4_ACC_FACTOR;
    for (uint32_t row = blockIdx.x; row < n; row += gridDim.x)
        for (uint32_t q = threadIdx.x; q < kb; q += blockDim.x) {
            const uint32_t rb = row / 16, g = row % 8, h = row % 16 / 8;
            const uint32_t s = q / 16, c = q % 16 / 4, t = q % 4;
            const uint4 w = *reinterpret_cast<const uint4 *>(
                values + ((uint64_t)rb * supers * 4 + s * 4 + c) * MG_NVFP4_CHUNK_BYTES +
                (g * 4 + t) * 16);
            const uint32_t sword = scales[mg_nvfp4_scale_offset(supers, row, q)];
            const uint32_t scale = scale_pair(sword, 0);
            const uint32_t words[4] = {w.x, w.y, w.z, w.w};
            uint32_t pairs[8]; // element kt * 4 + e, two per register
#pragma unroll
            for (int kt = 0; kt < 4; kt++) {
                const uint32_t lo = mul_bf16x2(decode_pair(words[kt], h), scale);     // e 0, 1
                const uint32_t hi = mul_bf16x2(decode_pair(words[kt], h + 2), scale); // e 2, 3
                const float v[4] = {mg_num_bf16_low(lo), mg_num_bf16_high(lo), mg_num_bf16_low(hi),
                                    mg_num_bf16_high(hi)};
                pairs[kt * 2] = mg_num_bf16_pack(v[0] * global, v[1] * global);
                pairs[kt * 2 + 1] = mg_num_bf16_pack(v[2] * global, v[3] * global);
            }
            uint4 *dst = reinterpret_cast<uint4 *>(out + (uint64_t)row * k + q * 16);
            dst[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
            dst[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
        }
}
