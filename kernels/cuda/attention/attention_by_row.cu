// attention_by_row.cu - attention_ragged_prefill (mg_attention_run, metrale/ops_attention.h) and
// attention_paged_prefill (mg_paged_attention_run, metrale/ops_kv_cache.h) for every head_dim the
// fronts accept (a multiple of 8 up to 512), with the argument lists of the CPU reference kernels
// of the same names (src/ops/attention/attention_reference.c), which define the results. The
// "kernels" provider launches them; it comes after FlashInfer and split_kv_decode in the op's
// order, so on CUDA they serve the head_dims those are not built for (16, 48, 80, 96, ...), and
// any shape when forced by name.
//
// Layout of the work: one CTA of kThreads threads per query row and head (grid x: rows, y:
// heads), the launch shape the provider uses on every backend. The row's visible keys are cut
// into kWarps contiguous ranges, one per warp; in a warp each lane owns pairs of dimensions
// (2 * lane + 64 * p), so a key's K and V rows are read coalesced, and kUnroll keys are
// in flight per step. Each warp keeps an online softmax (base 2); the warps are merged at the
// end through shared memory. BF16 q, keys and values (or FP8 E4M3 codes, scaled per KV head:
// k_scale folds into the score scale, v_scale multiplies the output), FP32 sums, the output
// rounded to BF16 once, the LSE in base 2; the sums run in another order than the
// reference's. Rows outside every request are left alone, as the reference leaves them.
//
// Built for correctness on any shape, not for speed: a decode step gives only qo_heads CTAs.
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/fp8_e4m3.cuh"
#include "common/grid_dependency.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kMaxHeadDim = 512;           // MG_KV_MAX_HEAD_DIM
constexpr int kPairsPerLane = kMaxHeadDim / 64; // dimension pairs a lane may own
constexpr int kUnroll = 4;                      // keys in flight per warp step
constexpr uint32_t kKvFp8 = 1;                  // MG_KV_FP8_E4M3
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// Where the keys of one request and KV head live: ragged rows k0 + j of k and v, or slot
// j % page_size of page pages[j / page_size]; both laid out [row][kv_heads][d].
struct Keys {
    const uint8_t *k, *v;
    const int32_t *pages; // NULL: ragged
    uint32_t page_size, k0, kv_heads, kv_head, d;
    bool fp8;

    // The element offset of key j's vector.
    __device__ __forceinline__ size_t at(int j) const {
        const size_t row =
            pages ? (size_t)pages[j / (int)page_size] * page_size + (size_t)(j % (int)page_size)
                  : (size_t)k0 + (size_t)j;
        return (row * kv_heads + kv_head) * d;
    }
    // Elements `e` and `e + 1` of a pool (e even), widened exactly.
    __device__ __forceinline__ float2 pair(const uint8_t *pool, size_t e) const {
        if (fp8) {
            const uint32_t codes = *reinterpret_cast<const uint16_t *>(pool + e);
            return make_float2(mg_num_fp8_e4m3_to_f32(codes & 0xffu),
                               mg_num_fp8_e4m3_to_f32(codes >> 8));
        }
        const uint32_t w = *reinterpret_cast<const uint32_t *>(pool + 2 * e);
        return make_float2(mg_num_bf16_low(w), mg_num_bf16_high(w));
    }
};

struct Row {
    const uint16_t *q;
    uint16_t *o;
    float *lse; // NULL: not written
    const int32_t *qo_indptr, *kv_indptr;
    uint32_t batch, qo_heads;
    bool causal;
    int32_t window_left;
    float scale;     // sm_scale, times k_scale for FP8 pools
    float soft_cap;  // 0: none
    float out_scale; // v_scale for FP8 pools, else 1
};

struct SharedState {
    float q[kMaxHeadDim];
    float m[kWarps], l[kWarps];
    float o[kWarps][kMaxHeadDim];
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Query row `row` of head `h`, whose request is found in qo_indptr. `keys` is the batch's: paged
// keys have pages = all of kv_indices, which becomes the request's own (from page_indptr, NULL
// for ragged keys), and k0 is filled here.
__device__ void attend(const Row &r, Keys keys, const int32_t *page_indptr, uint32_t row,
                       uint32_t h, SharedState &sh) {
    if (row >= (uint32_t)r.qo_indptr[r.batch])
        return;
    uint32_t lo = 0, hi = r.batch; // the request: qo_indptr[i] <= row < qo_indptr[i + 1]
    while (lo < hi) {
        const uint32_t mid = (lo + hi) / 2;
        if ((uint32_t)r.qo_indptr[mid + 1] <= row)
            lo = mid + 1;
        else
            hi = mid;
    }
    const uint32_t i = lo, d = keys.d;
    const int q0 = r.qo_indptr[i], lq = r.qo_indptr[i + 1] - q0;
    const int lk = r.kv_indptr[i + 1] - r.kv_indptr[i];
    keys.k0 = (uint32_t)r.kv_indptr[i];
    if (keys.pages)
        keys.pages += page_indptr[i];
    const int pos = lk - lq + ((int)row - q0); // bottom-right aligned
    int end = r.causal ? pos + 1 : lk, begin = r.window_left >= 0 ? pos - r.window_left : 0;
    begin = begin < 0 ? 0 : begin;
    end = end > lk ? lk : end;

    const size_t q_at = ((size_t)row * r.qo_heads + h) * d;
    for (uint32_t c = threadIdx.x; c < d; c += kThreads)
        sh.q[c] = mg_num_bf16_to_f32(r.q[q_at + c]);
    __syncthreads();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int pairs = (int)d / 2;
    float2 q[kPairsPerLane], acc[kPairsPerLane];
#pragma unroll
    for (int p = 0; p < kPairsPerLane; p++) {
        const int pi = lane + 32 * p;
        q[p] = pi < pairs ? make_float2(sh.q[2 * pi], sh.q[2 * pi + 1]) : make_float2(0.f, 0.f);
        acc[p] = make_float2(0.f, 0.f);
    }
    const int visible = end > begin ? end - begin : 0;
    const int share = (visible + kWarps - 1) / kWarps;
    const int warp_begin = begin + min(visible, warp * share);
    const int warp_end = begin + min(visible, (warp + 1) * share);
    const float cap_log2 = r.soft_cap * kLog2e;
    float m = kNegInf, l = 0.0f;
    for (int j = warp_begin; j < warp_end; j += kUnroll) {
        size_t at[kUnroll];
        float score[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            at[u] = j + u < warp_end ? keys.at(j + u) : keys.at(j);
            float dot = 0.0f;
#pragma unroll
            for (int p = 0; p < kPairsPerLane; p++) {
                const int pi = lane + 32 * p;
                if (pi < pairs) {
                    const float2 k = keys.pair(keys.k, at[u] + 2 * pi);
                    dot = fmaf(q[p].x, k.x, fmaf(q[p].y, k.y, dot));
                }
            }
            score[u] = dot;
        }
        float step_max = kNegInf;
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const float s = warp_sum(score[u]) * r.scale;
            // c * tanh(s / c) with soft-cap, in base 2 either way
            score[u] = j + u >= warp_end   ? kNegInf
                       : r.soft_cap > 0.0f ? cap_log2 * tanhf(s / r.soft_cap)
                                           : s * kLog2e;
            step_max = fmaxf(step_max, score[u]);
        }
        const float m_new = fmaxf(m, step_max); // finite: key j is always visible
        const float rescale = m == kNegInf ? 0.0f : exp2f(m - m_new);
        l *= rescale;
#pragma unroll
        for (int p = 0; p < kPairsPerLane; p++)
            acc[p] = make_float2(acc[p].x * rescale, acc[p].y * rescale);
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            if (j + u >= warp_end)
                break;
            const float w = exp2f(score[u] - m_new);
            l += w;
#pragma unroll
            for (int p = 0; p < kPairsPerLane; p++) {
                const int pi = lane + 32 * p;
                if (pi < pairs) {
                    const float2 v = keys.pair(keys.v, at[u] + 2 * pi);
                    acc[p] = make_float2(fmaf(w, v.x, acc[p].x), fmaf(w, v.y, acc[p].y));
                }
            }
        }
        m = m_new;
    }

    // Merge the warps: each publishes its state, then every thread combines its dimensions.
    if (lane == 0) {
        sh.m[warp] = m;
        sh.l[warp] = l;
    }
#pragma unroll
    for (int p = 0; p < kPairsPerLane; p++) {
        const int pi = lane + 32 * p;
        if (pi < pairs) {
            sh.o[warp][2 * pi] = acc[p].x;
            sh.o[warp][2 * pi + 1] = acc[p].y;
        }
    }
    __syncthreads();
    float m_all = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; w++)
        m_all = fmaxf(m_all, sh.m[w]);
    float weight[kWarps], l_all = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
        weight[w] = sh.m[w] == kNegInf ? 0.0f : exp2f(sh.m[w] - m_all);
        l_all += sh.l[w] * weight[w];
    }
    for (uint32_t c = threadIdx.x; c < d; c += kThreads) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; w++)
            sum = fmaf(sh.o[w][c], weight[w], sum);
        r.o[q_at + c] =
            (uint16_t)mg_num_f32_to_bf16(l_all > 0.0f ? sum / l_all * r.out_scale : 0.0f);
    }
    if (r.lse && threadIdx.x == 0)
        r.lse[(size_t)row * r.qo_heads + h] = l_all > 0.0f ? m_all + log2f(l_all) : kNegInf;
}

// The launch shape and the shape arguments every kernel here needs; the fronts validated them.
__device__ __forceinline__ bool shape_ok(uint32_t qo_rows, uint32_t qo_heads, uint32_t kv_heads,
                                         uint32_t d) {
    return blockDim.x == kThreads && d && d % 8 == 0 && d <= kMaxHeadDim && kv_heads &&
           qo_heads % kv_heads == 0 && blockIdx.x < qo_rows && blockIdx.y < qo_heads;
}

} // namespace

// indptrs: qo_indptr then kv_indptr, batch + 1 entries each (the plan's); k and v are
// [kv_rows][kv_heads][head_dim] BF16.
extern "C" __global__ void __launch_bounds__(kThreads)
    attention_ragged_prefill(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                             const uint16_t *__restrict__ v, uint16_t *__restrict__ o,
                             float *__restrict__ lse, const int32_t *__restrict__ indptrs,
                             uint32_t batch, uint32_t qo_heads, uint32_t kv_heads,
                             uint32_t head_dim, uint32_t causal, int32_t window_left,
                             float sm_scale, uint32_t qo_rows, uint32_t kv_rows, uint32_t has_lse) {
    __shared__ SharedState sh;
    grid_dependency_wait();
    launch_dependents();
    if (!shape_ok(qo_rows, qo_heads, kv_heads, head_dim) ||
        (uint32_t)indptrs[2 * batch + 1] > kv_rows)
        return;
    const Row r = {q,
                   o,
                   has_lse ? lse : nullptr,
                   indptrs,
                   indptrs + batch + 1,
                   batch,
                   qo_heads,
                   causal != 0,
                   window_left,
                   sm_scale,
                   0.0f,
                   1.0f};
    const uint32_t h = blockIdx.y;
    const Keys keys = {reinterpret_cast<const uint8_t *>(k),
                       reinterpret_cast<const uint8_t *>(v),
                       nullptr,
                       0,
                       0,
                       kv_heads,
                       h / (qo_heads / kv_heads),
                       head_dim,
                       false};
    attend(r, keys, nullptr, blockIdx.x, h, sh);
}

// indptrs: qo_indptr, kv_indptr (tokens), page_indptr, last_page_len, batch + 1 entries apart
// (the plan's); attention over pages is causal. The front checked the page table against
// num_pages and num_indices when it planned.
extern "C" __global__ void __launch_bounds__(kThreads)
    attention_paged_prefill(const uint16_t *__restrict__ q, const uint8_t *__restrict__ k_pages,
                            const uint8_t *__restrict__ v_pages, uint16_t *__restrict__ o,
                            float *__restrict__ lse, const int32_t *__restrict__ indptrs,
                            const int32_t *__restrict__ kv_indices, uint32_t batch,
                            uint32_t qo_heads, uint32_t kv_heads, uint32_t head_dim,
                            uint32_t page_size, uint32_t num_pages, uint32_t num_indices,
                            int32_t window_left, float sm_scale, float soft_cap, uint32_t qo_rows,
                            uint32_t has_lse, uint32_t kv_dtype, const float *__restrict__ k_scale,
                            const float *__restrict__ v_scale) {
    __shared__ SharedState sh;
    grid_dependency_wait();
    launch_dependents();
    if (!shape_ok(qo_rows, qo_heads, kv_heads, head_dim) || !page_size || !num_pages ||
        !num_indices)
        return;
    const bool fp8 = kv_dtype == kKvFp8;
    const uint32_t h = blockIdx.y, kv_head = h / (qo_heads / kv_heads);
    const int32_t *kv_indptr = indptrs + batch + 1;
    const Row r = {q,
                   o,
                   has_lse ? lse : nullptr,
                   indptrs,
                   kv_indptr,
                   batch,
                   qo_heads,
                   true,
                   window_left,
                   fp8 ? sm_scale * k_scale[kv_head] : sm_scale,
                   soft_cap,
                   fp8 ? v_scale[kv_head] : 1.0f};
    const Keys keys = {k_pages,  v_pages, kv_indices, page_size, 0,
                       kv_heads, kv_head, head_dim,   fp8};
    attend(r, keys, kv_indptr + batch + 1, blockIdx.x, h, sh);
}
