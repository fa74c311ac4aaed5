// moe_routing.cu - MoE routing helpers (metrale/ops_moe.h): top-k over router logits, the
// stable deterministic sort of (token, slot) pairs into expert order, and the weighted combine.
// The CPU reference is src/ops/moe/moe_routing_reference.c; the ids, offsets, sorted tokens,
// positions and the combine agree with it bit for bit, the top-k weights to a few ulp (expf
// and the order of the full softmax sum differ).
//
// Nothing here depends on the order of atomic operations: the sort counts with shared-memory
// atomic increments (a count is the same in any order) and places each pair by a rank computed
// from warp match masks and per-warp counts, so results are identical run to run.
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/grid_dependency.cuh"

namespace {

constexpr int kTopkThreads = 128; // one warp per token
constexpr int kSortThreads = 256; // one thread per expert / per pair of a 256-pair tile
constexpr int kSortWarps = kSortThreads / 32;
constexpr int kCombineThreads = 128;
constexpr uint32_t kMaxExperts = 256;
constexpr uint32_t kMaxTopk = 8;
constexpr uint32_t kPerLane = kMaxExperts / 32;
constexpr uint32_t kSortChunk = 4096; // MG_MOE_SORT_CHUNK
constexpr unsigned kFullMask = 0xffffffffu;

// (value, index) ordering of the top-k: larger value first, then lower index.
__device__ __forceinline__ bool ranks_before(float va, uint32_t ia, float vb, uint32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

__device__ __forceinline__ bool valid_id(int32_t id, uint32_t experts) {
    return id >= 0 && (uint32_t)id < experts;
}

} // namespace

// One warp per token (grid-stride over tokens). Lane l holds experts l, l + 32, ... (at most 8).
extern "C" __global__ void __launch_bounds__(kTopkThreads)
    moe_topk(const void *__restrict__ logits, int32_t *__restrict__ topk_ids,
             float *__restrict__ topk_weights, uint32_t tokens, uint32_t experts, uint32_t k,
             uint32_t logits_pitch, uint32_t logits_bf16, uint32_t renormalize) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t warps_per_block = blockDim.x / 32;
    for (uint64_t t = (uint64_t)blockIdx.x * warps_per_block + threadIdx.x / 32; t < tokens;
         t += (uint64_t)gridDim.x * warps_per_block) {
        float v[kPerLane];
        uint32_t present = 0; // bit i: expert lane + 32 i exists and is not chosen yet
#pragma unroll
        for (uint32_t i = 0; i < kPerLane; i++) {
            uint32_t e = lane + 32 * i;
            v[i] = -__int_as_float(0x7f800000);
            if (e < experts) {
                uint64_t at = t * logits_pitch + e;
                float x = logits_bf16
                              ? mg_num_bf16_to_f32(static_cast<const uint16_t *>(logits)[at])
                              : static_cast<const float *>(logits)[at];
                v[i] = x != x ? -__int_as_float(0x7f800000) : x;
                present |= 1u << i;
            }
        }
        float chosen_value[kMaxTopk];
        uint32_t chosen_id[kMaxTopk];
#pragma unroll
        for (uint32_t j = 0; j < kMaxTopk; j++) {
            if (j >= k)
                break;
            // This lane's best remaining candidate, then the warp's.
            float best_v = -__int_as_float(0x7f800000);
            uint32_t best_e = 0xffffffffu;
#pragma unroll
            for (uint32_t i = 0; i < kPerLane; i++)
                if ((present >> i & 1u) && ranks_before(v[i], lane + 32 * i, best_v, best_e)) {
                    best_v = v[i];
                    best_e = lane + 32 * i;
                }
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2) {
                float other_v = __shfl_xor_sync(kFullMask, best_v, offset);
                uint32_t other_e = __shfl_xor_sync(kFullMask, best_e, offset);
                if (ranks_before(other_v, other_e, best_v, best_e)) {
                    best_v = other_v;
                    best_e = other_e;
                }
            }
            chosen_value[j] = best_v;
            chosen_id[j] = best_e;
            if (best_e % 32 == lane)
                present &= ~(1u << (best_e / 32));
        }
        const float max = chosen_value[0];
        float sum = 0.0f;
        if (renormalize) {
            for (uint32_t j = 0; j < k; j++)
                sum += expf(chosen_value[j] - max);
        } else {
#pragma unroll
            for (uint32_t i = 0; i < kPerLane; i++)
                if (lane + 32 * i < experts)
                    sum += expf(v[i] - max);
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2)
                sum += __shfl_xor_sync(kFullMask, sum, offset);
        }
        for (uint32_t j = 0; j < k; j++)
            if (lane == j) {
                topk_ids[t * k + j] = (int32_t)chosen_id[j];
                topk_weights[t * k + j] = __fdiv_rn(expf(chosen_value[j] - max), sum);
            }
    }
}

// Block c counts the valid pairs of chunk c per expert: workspace[c * E + e].
extern "C" __global__ void __launch_bounds__(kSortThreads)
    moe_sort_count(const int32_t *__restrict__ topk_ids, int32_t *__restrict__ workspace,
                   uint32_t pairs, uint32_t experts) {
    grid_dependency_wait();
    launch_dependents();
    __shared__ int32_t counts[kMaxExperts];
    for (uint32_t e = threadIdx.x; e < experts; e += blockDim.x)
        counts[e] = 0;
    __syncthreads();
    const uint64_t begin = (uint64_t)blockIdx.x * kSortChunk;
    const uint64_t end = begin + kSortChunk < pairs ? begin + kSortChunk : pairs;
    for (uint64_t p = begin + threadIdx.x; p < end; p += blockDim.x) {
        int32_t id = topk_ids[p];
        if (valid_id(id, experts))
            atomicAdd(&counts[id], 1);
    }
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < experts; e += blockDim.x)
        workspace[(uint64_t)blockIdx.x * experts + e] = counts[e];
}

// One block: thread e turns expert e's per-chunk counts into the first row of each chunk's
// pairs, after the block's exclusive scan of the experts' totals gives expert_offsets. Rows past
// the valid pairs get token -1.
extern "C" __global__ void __launch_bounds__(kSortThreads)
    moe_sort_scan(int32_t *__restrict__ workspace, int32_t *__restrict__ expert_offsets,
                  int32_t *__restrict__ sorted_token_ids, uint32_t pairs, uint32_t experts) {
    grid_dependency_wait();
    launch_dependents();
    __shared__ int32_t totals[kMaxExperts];
    __shared__ int32_t scan[kMaxExperts];
    const uint32_t chunks = (pairs + kSortChunk - 1) / kSortChunk;
    const uint32_t e = threadIdx.x;
    int32_t running = 0;
    if (e < experts)
        for (uint32_t c = 0; c < chunks; c++) {
            int32_t count = workspace[(uint64_t)c * experts + e];
            workspace[(uint64_t)c * experts + e] = running;
            running += count;
        }
    totals[e] = e < experts ? running : 0;
    scan[e] = totals[e];
    __syncthreads();
    // Inclusive Hillis-Steele scan over kSortThreads (>= experts) entries.
    for (uint32_t offset = 1; offset < kSortThreads; offset *= 2) {
        int32_t add = e >= offset ? scan[e - offset] : 0;
        __syncthreads();
        scan[e] += add;
        __syncthreads();
    }
    const int32_t base = scan[e] - totals[e];
    if (e < experts) {
        expert_offsets[e] = base;
        for (uint32_t c = 0; c < chunks; c++)
            workspace[(uint64_t)c * experts + e] += base;
    }
    const int32_t valid = scan[kSortThreads - 1];
    if (e == 0)
        expert_offsets[experts] = valid;
    for (uint32_t row = (uint32_t)valid + e; row < pairs; row += blockDim.x)
        sorted_token_ids[row] = -1;
}

// Block c places the pairs of chunk c, 256 at a time in increasing p: a pair's row is its
// expert's running row in this chunk + the same-expert pairs of earlier warps in the tile + the
// same-expert pairs of lower lanes in its warp.
extern "C" __global__ void __launch_bounds__(kSortThreads)
    moe_sort_scatter(const int32_t *__restrict__ topk_ids, const int32_t *__restrict__ workspace,
                     int32_t *__restrict__ sorted_token_ids, int32_t *__restrict__ pair_positions,
                     uint32_t pairs, uint32_t experts, uint32_t k) {
    grid_dependency_wait();
    launch_dependents();
    __shared__ int32_t running[kMaxExperts];
    __shared__ int32_t warp_counts[kSortWarps][kMaxExperts];
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (tid < experts)
        running[tid] = workspace[(uint64_t)blockIdx.x * experts + tid];
    const uint64_t begin = (uint64_t)blockIdx.x * kSortChunk;
    const uint64_t end = begin + kSortChunk < pairs ? begin + kSortChunk : pairs;
    for (uint64_t tile = begin; tile < end; tile += kSortThreads) {
#pragma unroll
        for (int w = 0; w < kSortWarps; w++)
            warp_counts[w][tid] = 0;
        __syncthreads();
        const uint64_t p = tile + tid;
        const int32_t id = p < end ? topk_ids[p] : -1;
        const bool valid = p < end && valid_id(id, experts);
        const unsigned peers = __match_any_sync(kFullMask, valid ? id : -1);
        const unsigned lower = peers & ((1u << lane) - 1u);
        if (valid && lower == 0)
            warp_counts[warp][id] = __popc(peers);
        __syncthreads();
        if (valid) {
            int32_t row = running[id] + __popc(lower);
            for (uint32_t w = 0; w < warp; w++)
                row += warp_counts[w][id];
            sorted_token_ids[row] = (int32_t)(p / k);
            pair_positions[p] = row;
        } else if (p < end) {
            pair_positions[p] = -1;
        }
        __syncthreads();
        if (tid < experts) {
            int32_t add = 0;
#pragma unroll
            for (int w = 0; w < kSortWarps; w++)
                add += warp_counts[w][tid];
            running[tid] += add;
        }
        // The next tile's zeroing of warp_counts waits for these reads at its first barrier:
        // it writes only after this thread's own reads (same thread, same entries).
    }
}

// Thread (x, token): 8 columns of one token. acc = residual (or 0), then fmaf over the slots
// in order j = 0..k-1, skipping positions outside [0, tokens * k).
extern "C" __global__ void __launch_bounds__(kCombineThreads)
    moe_combine(const uint16_t *__restrict__ rows, const int32_t *__restrict__ pair_positions,
                const float *__restrict__ topk_weights, const uint16_t *residual, uint16_t *out,
                uint32_t tokens, uint32_t k, uint32_t hidden, uint32_t has_residual) {
    grid_dependency_wait();
    launch_dependents();
    const uint32_t vector = blockIdx.x * blockDim.x + threadIdx.x;
    if (vector >= hidden / 8)
        return;
    const int64_t row_count = (int64_t)tokens * k;
    for (uint64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
        float acc[8];
        if (has_residual) {
            uint4 r = reinterpret_cast<const uint4 *>(residual + t * hidden)[vector];
            uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[2 * i] = mg_num_bf16_low(w[i]);
                acc[2 * i + 1] = mg_num_bf16_high(w[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] = 0.0f;
        }
        for (uint32_t j = 0; j < k; j++) {
            int32_t row = pair_positions[t * k + j];
            if (row < 0 || row >= row_count)
                continue;
            float weight = topk_weights[t * k + j];
            uint4 x = reinterpret_cast<const uint4 *>(rows + (uint64_t)row * hidden)[vector];
            uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[2 * i] = fmaf(weight, mg_num_bf16_low(w[i]), acc[2 * i]);
                acc[2 * i + 1] = fmaf(weight, mg_num_bf16_high(w[i]), acc[2 * i + 1]);
            }
        }
        uint32_t packed[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            packed[i] = mg_num_bf16_pack(acc[2 * i], acc[2 * i + 1]);
        reinterpret_cast<uint4 *>(out + t * hidden)[vector] =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}
