// paged_decode.cu - split-KV decode attention over FP8 E4M3 pages (CUDA cores), launched by
// src/ops/attention/attention_paged_decode.c; the BF16 pools' kernels (tensor cores) are in
// paged_decode_mma.cu, and both share the schedule and the merge (paged_decode_merge.cuh).
//
// Layout of the work. A request's query rows are its qo_len new tokens times the G query heads
// of a KV head, flattened as row = token * G + head_in_group, and cut into blocks of ROWS rows
// (the template size: 1, 2, 4 or 8; decode with G <= ROWS is one block). A work item is one row
// block and one contiguous range of its keys (a chunk); blockIdx.y is the KV head.
//
// In a CTA, 8 warps split the chunk's tokens into contiguous ranges. In a warp, LANES = D / 8
// lanes share one token, each owning 8 consecutive dimensions (8 FP8 codes, widened exactly
// through FP16); 32 / LANES tokens are processed side by side, UNROLL of those groups per
// step, streamed through a per-warp ring of cp.async stages. Each lane group keeps its own
// running max and sum (no cross-lane reduction per token beyond the dot product's), and the
// groups, then the warps, are merged at the end.
//
// Scores are in base 2: q is pre-scaled by sm_scale * log2(e) (without soft-cap) or by
// sm_scale / cap (with it: x = cap * log2(e) * tanh(q.k sm_scale / cap)), times the key scale
// of the KV head; the value scale multiplies the output. The LSE written is base 2, as
// FlashInfer's and the CPU reference's.
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/fp8_e4m3.cuh"

#include "attention/paged_decode_merge.cuh"
#include "common/grid_dependency.cuh"

namespace {

using namespace mg_decode;

constexpr int kThreads = MG_DECODE_THREADS;
constexpr int kWarps = kThreads / 32;
// Eight FP8 E4M3 codes: 8 bytes, widened exactly (through FP16).
struct Fp8Codes {
    uint2 raw;
    __device__ __forceinline__ void read(const char *slot) {
        raw = *reinterpret_cast<const uint2 *>(slot);
    }
    __device__ __forceinline__ void widen(float (&out)[8]) const {
        mg_num_fp8x4_e4m3_to_f32(raw.x, out);
        mg_num_fp8x4_e4m3_to_f32(raw.y, out + 4);
    }
};

// The online-softmax state of one row: running max m (base 2), sum l, output o (8 dims).
struct RowState {
    float m, l, o[8];
};

// Merges state `other` into `s` (either may be empty: m = -inf, l = 0, o = 0).
__device__ __forceinline__ void merge_state(RowState &s, float m, float l, const float (&o)[8]) {
    const float m_new = fmaxf(s.m, m);
    const float a = m_new == kNegInf ? 0.0f : exp2f(s.m - m_new);
    const float b = m_new == kNegInf ? 0.0f : exp2f(m - m_new);
    s.l = s.l * a + l * b;
#pragma unroll
    for (int i = 0; i < 8; i++)
        s.o[i] = s.o[i] * a + o[i] * b;
    s.m = m_new;
}

template <int D, int ROWS>
__device__ __forceinline__ void decode_item(const Args &p, const Schedule &sched, int item_index,
                                            uint32_t kv_head, void *ring_smem) {
    constexpr int kStages = MG_DECODE_STAGES;
    constexpr int kLanes = D / 8;            // lanes sharing one token
    constexpr int kGroups = 32 / kLanes;     // tokens side by side in a warp
    constexpr int kUnroll = 8;               // token groups per step (4 KiB of K and V)
    constexpr int kStep = kGroups * kUnroll; // tokens per warp step
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / kLanes, part = lane % kLanes;

    const Item item = load_item(p, sched, item_index, kv_head);
    const int page_begin = item.page_begin;

    // The rows of this block: q (pre-scaled), and each row's visible key range [lo, hi].
    const float scale =
        (p.soft_cap > 0.0f ? p.sm_scale / p.soft_cap : p.sm_scale * kLog2e) * p.k_scale[kv_head];
    const float cap_log2 = p.soft_cap * kLog2e;
    float q[ROWS][8];
    int lo[ROWS], hi[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int row = item.row_begin + r;
        item.row_range(p, row, lo[r], hi[r]);
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (row < item.rows_total)
            raw = *reinterpret_cast<const uint4 *>(p.q + item.q_offset(p, row) * D + part * 8);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[r][2 * i] = mg_num_bf16_low(w[i]) * scale;
            q[r][2 * i + 1] = mg_num_bf16_high(w[i]) * scale;
        }
    }

    RowState st[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        st[r].m = kNegInf;
        st[r].l = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            st[r].o[i] = 0.0f;
    }

    // This warp's contiguous share of the chunk.
    const int chunk_len = item.token_end - item.token_begin;
    const int share = (chunk_len + kWarps - 1) / kWarps;
    const int warp_begin = item.token_begin + min(chunk_len, warp * share);
    const int warp_end = item.token_begin + min(chunk_len, (warp + 1) * share);
    const size_t head_offset = (size_t)kv_head * D + part * 8;
    const size_t token_stride = (size_t)p.num_kv_heads * D;

    // Element offsets of this lane's tokens of the step at `base` (-1: past the range).
    // Streaming: each lane copies its own tokens' 8-element vectors of K and V with cp.async
    // into its own slots of the warp's ring of kStages steps in shared memory, and reads back
    // only what it copied itself (so a lane's wait on its own copies is all the synchronization
    // needed). Copies run kStages - 1 steps ahead of the math; page ids are loaded one step
    // before the copies that need them.
    constexpr int kVecBytes = 8;
    char *ring =
        reinterpret_cast<char *>(ring_smem) + (size_t)warp * kStages * kUnroll * 2 * 32 * kVecBytes;
    auto slot_of = [&](int stage, int u, int kv) {
        return ring + (((stage * kUnroll + u) * 2 + kv) * 32 + lane) * kVecBytes;
    };
    int32_t page_id[kUnroll], page_slot[kUnroll];
    auto lookup = [&](int base) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int t = base + u * kGroups + group;
            if (t < warp_end) {
                const uint32_t page = fast_div((uint32_t)t, p.page_div_mul, p.page_div_shift);
                page_slot[u] = (int32_t)((uint32_t)t - page * p.page_size);
                page_id[u] = __ldg(p.kv_indices + page_begin + page);
            } else {
                page_id[u] = -1;
            }
        }
    };
    auto issue = [&](int stage) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const bool valid = page_id[u] >= 0;
            const size_t element =
                valid
                    ? ((size_t)page_id[u] * p.page_size + page_slot[u]) * token_stride + head_offset
                    : 0;
            const char *k_src = static_cast<const char *>(p.k_pages) + element;
            const char *v_src = static_cast<const char *>(p.v_pages) + element;
            copy_async<kVecBytes>(slot_of(stage, u, 0), k_src, valid);
            copy_async<kVecBytes>(slot_of(stage, u, 1), v_src, valid);
        }
        copy_commit();
    };

    const int steps = warp_end > warp_begin ? (warp_end - warp_begin + kStep - 1) / kStep : 0;
    lookup(warp_begin);
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) {
        if (i < steps) {
            issue(i);
            lookup(warp_begin + (i + 1) * kStep);
        } else {
            copy_commit(); // empty groups keep the wait counts uniform
        }
    }
    for (int i = 0; i < steps; i++) {
        copy_wait<kStages - 2>(); // step i has landed
        const int ahead = i + kStages - 1;
        if (ahead < steps) {
            issue(ahead % kStages);
            lookup(warp_begin + (ahead + 1) * kStep);
        } else {
            copy_commit();
        }
        const int base = warp_begin + i * kStep;
        const int stage = i % kStages;

        float s[ROWS][kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            Fp8Codes k;
            k.read(slot_of(stage, u, 0));
            float kf[8];
            k.widen(kf);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    dot = fmaf(q[r][e], kf[e], dot);
#pragma unroll
                for (int offset = kLanes / 2; offset > 0; offset /= 2)
                    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
                s[r][u] = dot;
            }
        }
        bool any[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float m_step = kNegInf;
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const int t = base + u * kGroups + group;
                float x = p.soft_cap > 0.0f ? cap_log2 * fast_tanh(s[r][u]) : s[r][u];
                if (t >= warp_end || t < lo[r] || t > hi[r])
                    x = kNegInf;
                s[r][u] = x;
                m_step = fmaxf(m_step, x);
            }
            const float m_new = fmaxf(st[r].m, m_step);
            any[r] = m_new != kNegInf;
            if (!any[r])
                continue; // nothing visible yet
            const float a = exp2f(st[r].m - m_new);
            st[r].l *= a;
#pragma unroll
            for (int e = 0; e < 8; e++)
                st[r].o[e] *= a;
            st[r].m = m_new;
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                s[r][u] = exp2f(s[r][u] - m_new);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            Fp8Codes v;
            v.read(slot_of(stage, u, 1));
            float vf[8];
            v.widen(vf);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (!any[r])
                    continue;
                st[r].l += s[r][u];
#pragma unroll
                for (int e = 0; e < 8; e++)
                    st[r].o[e] = fmaf(s[r][u], vf[e], st[r].o[e]);
            }
        }
    }
    copy_wait<0>();
    __syncthreads(); // the ring becomes the merge scratch below

    // Merge the token groups of the warp (lanes with equal `part`).
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int offset = kLanes; offset < 32; offset *= 2) {
            const float m = __shfl_xor_sync(0xffffffffu, st[r].m, offset);
            const float l = __shfl_xor_sync(0xffffffffu, st[r].l, offset);
            float o[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                o[i] = __shfl_xor_sync(0xffffffffu, st[r].o[i], offset);
            merge_state(st[r], m, l, o);
        }
    }
    // Then the warps, through shared memory in two rounds (half the warps store, the other
    // half merge): [kWarps / 2][ROWS][D] outputs and [kWarps / 2][ROWS] (max, sum) pairs.
    constexpr int kHalf = kWarps / 2;
    float *smem_o = static_cast<float *>(ring_smem);
    float *smem_ml = smem_o + kHalf * ROWS * D;
    static_assert(kHalf * ROWS * (D + 2) * sizeof(float) <= MG_DECODE_SHARED_BYTES,
                  "the merge scratch must fit in the ring");
    auto store = [&](int slot) {
        if (group != 0)
            return;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                smem_o[(slot * ROWS + r) * D + part * 8 + i] = st[r].o[i];
            if (part == 0) {
                smem_ml[(slot * ROWS + r) * 2] = st[r].m;
                smem_ml[(slot * ROWS + r) * 2 + 1] = st[r].l;
            }
        }
    };
    if (warp >= kHalf)
        store(warp - kHalf);
    __syncthreads();
    if (warp < kHalf) {
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float o[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                o[i] = smem_o[(warp * ROWS + r) * D + part * 8 + i];
            merge_state(st[r], smem_ml[(warp * ROWS + r) * 2], smem_ml[(warp * ROWS + r) * 2 + 1],
                        o);
        }
    }
    __syncthreads();
    if (warp < kHalf)
        store(warp);
    __syncthreads();

    finish_item<D, ROWS, kHalf>(p, item, item_index, kv_head, smem_o, smem_ml, smem_o,
                                p.v_scale[kv_head]);
}

// The grid: x walks the items (a fixed-grid plan's grid may be smaller than the item count of
// a later batch: each CTA then takes items x, x + gridDim.x, ...), y is the KV head.
template <int D, int ROWS> __device__ void decode_kernel(const mg_decode_params &params) {
    extern __shared__ __align__(16) uint4 ring_smem[]; // MG_DECODE_SHARED_BYTES
    const Args p(params);
    const Schedule sched = schedule_of(params);
    for (int item = blockIdx.x; item < sched.num_items; item += gridDim.x)
        decode_item<D, ROWS>(p, sched, item, blockIdx.y, ring_smem);
}

} // namespace

#define MG_PAGED_DECODE_KERNEL(D, ROWS)                                                            \
    extern "C" __global__ void __launch_bounds__(kThreads, 1)                                      \
        paged_decode_fp8_d##D##_r##ROWS(const mg_decode_params p) {                                \
        grid_dependency_wait();                                                                    \
        decode_kernel<D, ROWS>(p);                                                                 \
    }

#define MG_PAGED_DECODE_ROWS(D)                                                                    \
    MG_PAGED_DECODE_KERNEL(D, 1)                                                                   \
    MG_PAGED_DECODE_KERNEL(D, 2)                                                                   \
    MG_PAGED_DECODE_KERNEL(D, 4)                                                                   \
    MG_PAGED_DECODE_KERNEL(D, 8)

MG_PAGED_DECODE_ROWS(64)
MG_PAGED_DECODE_ROWS(128)
MG_PAGED_DECODE_ROWS(256)
