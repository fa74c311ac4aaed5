// attention.metal - attention_ragged_prefill (mg_attention_run, metrale/ops_attention.h) and
// attention_paged_prefill (mg_paged_attention_run, metrale/ops_kv_cache.h: decode and prefill
// over the paged KV cache), with the argument lists of the CPU reference kernels of the same
// names (src/ops/attention/attention_reference.c), which define the results: BF16 q, keys and
// values (or FP8 E4M3 pools scaled per KV head), FP32 scores and softmax, the output rounded to
// BF16 once, the log-sum-exp in base 2. The front launches one threadgroup of ATTN_THREADS
// threads per query row and head (grid x: rows, y: heads); keys go by in tiles of ATTN_THREADS,
// one per thread, with an online softmax, so the sums run in another order than the
// reference's. Rows outside every request are left alone, as the reference leaves them.
// UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define ATTN_THREADS 128
#define ATTN_MAX_HEAD_DIM 512
#define ATTN_DIMS_PER_THREAD (ATTN_MAX_HEAD_DIM / ATTN_THREADS)
#define ATTN_KV_FP8 1u // MG_KV_FP8_E4M3
#define ATTN_LOG2E 1.4426950408889634f

// The sum (or the maximum) of x over the threadgroup's ATTN_THREADS threads, seen by all.
static inline float attn_reduce(threadgroup float *scratch, float x, uint t, bool take_max) {
    scratch[t] = x;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint half_width = ATTN_THREADS / 2; half_width > 0; half_width /= 2) {
        if (t < half_width)
            scratch[t] = take_max ? max(scratch[t], scratch[t + half_width])
                                  : scratch[t] + scratch[t + half_width];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    float result = scratch[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return result;
}

static inline float attn_kv(device const uchar *pool, ulong i, bool fp8) {
    return fp8 ? e4m3_to_float(pool[i]) : bf16_to_float(((device const ushort *)pool)[i]);
}

// One query row `row` of head `h`: the keys of its request, ragged (page_size 0: rows k0 + j of
// k and v) or paged (slot j % page_size of page kv_indices[page_indptr[i] + j / page_size]),
// both [row][kv_heads][d].
static inline void attend(device const ushort *q, device const uchar *k, device const uchar *v,
                          device ushort *o, device float *lse, device const int *qo_indptr,
                          device const int *kv_indptr, device const int *page_indptr,
                          device const int *kv_indices, uint batch, uint qo_heads, uint kv_heads,
                          uint d, uint page_size, bool causal, int window_left, float sm_scale,
                          float soft_cap, bool has_lse, bool fp8, float k_scale, float v_scale,
                          uint row, uint h, uint t, threadgroup float *q_row,
                          threadgroup float *p_tile, threadgroup float *scratch) {
    if (row >= uint(qo_indptr[batch]))
        return;
    uint lo = 0, hi = batch; // the request: qo_indptr[i] <= row < qo_indptr[i + 1]
    while (lo < hi) {
        uint mid = (lo + hi) / 2;
        if (uint(qo_indptr[mid + 1]) <= row)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint i = lo, kvh = h / (qo_heads / kv_heads);
    int q0 = qo_indptr[i], lq = qo_indptr[i + 1] - q0, k0 = kv_indptr[i];
    int lk = kv_indptr[i + 1] - k0;
    int pos = lk - lq + (int(row) - q0); // bottom-right aligned
    int end = causal ? pos + 1 : lk, begin = window_left >= 0 ? pos - window_left : 0;
    begin = begin < 0 ? 0 : begin;
    end = end > lk ? lk : end;
    ulong q_at = (ulong(row) * qo_heads + h) * d;
    for (uint c = t; c < d; c += ATTN_THREADS)
        q_row[c] = bf16_to_float(q[q_at + c]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float scale = fp8 ? sm_scale * k_scale : sm_scale;
    float run_max = -INFINITY, run_sum = 0.0f, acc[ATTN_DIMS_PER_THREAD] = {0.0f};
    for (int j0 = begin; j0 < end; j0 += ATTN_THREADS) {
        int j = j0 + int(t);
        float score = -INFINITY;
        if (j < end) {
            ulong key_row = page_size ? ulong(kv_indices[page_indptr[i] + j / int(page_size)]) *
                                                page_size +
                                            ulong(j % int(page_size))
                                      : ulong(k0 + j);
            ulong at = (key_row * kv_heads + kvh) * d;
            float dot = 0.0f;
            for (uint c = 0; c < d; c++)
                dot = fma(q_row[c], attn_kv(k, at + c, fp8), dot);
            score = dot * scale;
            if (soft_cap > 0.0f)
                score = soft_cap * tanh(score / soft_cap);
        }
        float tile_max = attn_reduce(scratch, score, t, true);
        float new_max = max(run_max, tile_max);
        float rescale = run_max == -INFINITY ? 0.0f : exp(run_max - new_max);
        float p = j < end ? exp(score - new_max) : 0.0f;
        p_tile[t] = p;
        run_sum = run_sum * rescale + attn_reduce(scratch, p, t, false);
        run_max = new_max;
        int count = end - j0 < ATTN_THREADS ? end - j0 : ATTN_THREADS;
        for (uint slot = 0; slot < ATTN_DIMS_PER_THREAD; slot++) {
            uint c = t + slot * ATTN_THREADS;
            if (c >= d)
                break;
            float sum = acc[slot] * rescale;
            for (int jj = 0; jj < count; jj++) {
                int key = j0 + jj;
                ulong key_row = page_size
                                    ? ulong(kv_indices[page_indptr[i] + key / int(page_size)]) *
                                              page_size +
                                          ulong(key % int(page_size))
                                    : ulong(k0 + key);
                sum = fma(p_tile[jj], attn_kv(v, (key_row * kv_heads + kvh) * d + c, fp8), sum);
            }
            acc[slot] = sum;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint slot = 0; slot < ATTN_DIMS_PER_THREAD; slot++) {
        uint c = t + slot * ATTN_THREADS;
        if (c < d)
            o[q_at + c] = float_to_bf16(run_sum > 0.0f ? acc[slot] / run_sum * v_scale : 0.0f);
    }
    if (has_lse && t == 0)
        lse[ulong(row) * qo_heads + h] =
            run_sum > 0.0f ? (run_max + log(run_sum)) * ATTN_LOG2E : -INFINITY;
}

// indptrs: qo_indptr then kv_indptr, batch + 1 entries each (the plan's).
kernel void attention_ragged_prefill(
    device const ushort *q [[buffer(0)]], device const uchar *k [[buffer(1)]],
    device const uchar *v [[buffer(2)]], device ushort *o [[buffer(3)]],
    device float *lse [[buffer(4)]], device const int *indptrs [[buffer(5)]],
    constant uint &batch [[buffer(6)]], constant uint &qo_heads [[buffer(7)]],
    constant uint &kv_heads [[buffer(8)]], constant uint &head_dim [[buffer(9)]],
    constant uint &causal [[buffer(10)]], constant int &window_left [[buffer(11)]],
    constant float &sm_scale [[buffer(12)]], constant uint &qo_rows [[buffer(13)]],
    constant uint &kv_rows [[buffer(14)]], constant uint &has_lse [[buffer(15)]],
    uint2 group [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]],
    uint threads [[threads_per_threadgroup]]) {
    threadgroup float q_row[ATTN_MAX_HEAD_DIM];
    threadgroup float p_tile[ATTN_THREADS];
    threadgroup float scratch[ATTN_THREADS];
    if (threads != ATTN_THREADS || head_dim > ATTN_MAX_HEAD_DIM || group.x >= qo_rows ||
        group.y >= qo_heads || uint(indptrs[2 * batch + 1]) > kv_rows)
        return;
    attend(q, k, v, o, lse, indptrs, indptrs + batch + 1, indptrs, indptrs, batch, qo_heads,
           kv_heads, head_dim, 0, causal != 0, window_left, sm_scale, 0.0f, has_lse != 0, false,
           1.0f, 1.0f, group.x, group.y, t, q_row, p_tile, scratch);
}

// indptrs: qo_indptr, kv_indptr (tokens), page_indptr, last_page_len, batch + 1 entries apart;
// attention over pages is causal.
kernel void attention_paged_prefill(
    device const ushort *q [[buffer(0)]], device const uchar *k_pages [[buffer(1)]],
    device const uchar *v_pages [[buffer(2)]], device ushort *o [[buffer(3)]],
    device float *lse [[buffer(4)]], device const int *indptrs [[buffer(5)]],
    device const int *kv_indices [[buffer(6)]], constant uint &batch [[buffer(7)]],
    constant uint &qo_heads [[buffer(8)]], constant uint &kv_heads [[buffer(9)]],
    constant uint &head_dim [[buffer(10)]], constant uint &page_size [[buffer(11)]],
    constant uint &num_pages [[buffer(12)]], constant uint &num_indices [[buffer(13)]],
    constant int &window_left [[buffer(14)]], constant float &sm_scale [[buffer(15)]],
    constant float &soft_cap [[buffer(16)]], constant uint &qo_rows [[buffer(17)]],
    constant uint &has_lse [[buffer(18)]], constant uint &kv_dtype [[buffer(19)]],
    device const float *k_scale [[buffer(20)]], device const float *v_scale [[buffer(21)]],
    uint2 group [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]],
    uint threads [[threads_per_threadgroup]]) {
    threadgroup float q_row[ATTN_MAX_HEAD_DIM];
    threadgroup float p_tile[ATTN_THREADS];
    threadgroup float scratch[ATTN_THREADS];
    // the front checked the page table against num_pages and num_indices when it planned
    if (threads != ATTN_THREADS || head_dim > ATTN_MAX_HEAD_DIM || !page_size || !num_pages ||
        !num_indices || group.x >= qo_rows || group.y >= qo_heads)
        return;
    bool fp8 = kv_dtype == ATTN_KV_FP8;
    uint kvh = group.y / (qo_heads / kv_heads);
    device const int *stride = indptrs + batch + 1;
    attend(q, k_pages, v_pages, o, lse, indptrs, stride, stride + batch + 1, kv_indices, batch,
           qo_heads, kv_heads, head_dim, page_size, true, window_left, sm_scale, soft_cap,
           has_lse != 0, fp8, fp8 ? k_scale[kvh] : 1.0f, fp8 ? v_scale[kvh] : 1.0f, group.x,
           group.y, t, q_row, p_tile, scratch);
}
