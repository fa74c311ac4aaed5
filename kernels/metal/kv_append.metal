// kv_append.metal - kv_append and kv_append_fp8 (mg_kv_append, metrale/ops_kv_cache.h), with
// the argument list of the CPU reference (src/ops/kv_cache/kv_append_reference.c): each new
// token's K and V heads go to their slot in the paged pools (RoPE, rotate-half, on K and on
// Q in place when asked), as BF16 or as FP8 E4M3 codes of value / per-head scale. Like the
// CUDA kernel, a token whose page entry is out of range is skipped. Threadgroups walk the
// tokens (x) and split a token's heads (y); one thread moves one whole head.
// UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define KV_MAX_HEAD_DIM 512u

// One head of d BF16 from src to dst (which may alias): rotated when rope, BF16 when scale is
// 0, else E4M3 codes of value / scale.
static inline void move_head(device const ushort *src, device uchar *dst, uint d, bool rope,
                             float position, float theta, device const float *inv_freq_table,
                             float scale) {
    float x[KV_MAX_HEAD_DIM];
    for (uint c = 0; c < d; c++)
        x[c] = bf16_to_float(src[c]);
    if (rope) {
        uint half_d = d / 2;
        for (uint i = 0; i < half_d; i++) {
            float inv_freq = inv_freq_table ? inv_freq_table[i] : pow(theta, -float(2 * i) / float(d));
            float angle = position * inv_freq, co = cos(angle), si = sin(angle);
            float x0 = x[i], x1 = x[i + half_d];
            x[i] = x0 * co - x1 * si;
            x[i + half_d] = x1 * co + x0 * si;
        }
    }
    for (uint c = 0; c < d; c++) {
        if (scale != 0.0f)
            dst[c] = f32_to_e4m3(x[c] / scale);
        else
            ((device ushort *)dst)[c] = float_to_bf16(x[c]);
    }
}

static inline void append(device const ushort *k_src, device const ushort *v_src, device ushort *q,
                          device const int *positions, device const int *qo_indptr,
                          device const int *kv_indptr, device const int *kv_indices,
                          device const int *last_page_len, device uchar *k_pages,
                          device uchar *v_pages, uint batch, uint tokens, uint num_indices,
                          uint kv_heads, uint qo_heads, uint d, uint page_size, uint num_pages,
                          uint k_stride, uint v_stride, uint q_stride, bool rope, float theta,
                          device const float *inv_freq, device const float *k_scale, device const float *v_scale, bool fp8,
                          uint2 group, uint2 groups, uint t, uint threads) {
    if (d > KV_MAX_HEAD_DIM || page_size == 0)
        return;
    uint slots = 2 * kv_heads + (q ? qo_heads : 0), elem_bytes = fp8 ? 1 : 2;
    for (uint tok = group.x; tok < tokens; tok += groups.x) {
        uint r = 0; // the request of the token: qo_indptr[r] <= tok < qo_indptr[r + 1]
        while (r < batch && uint(qo_indptr[r + 1]) <= tok)
            r++;
        if (r == batch)
            continue;
        long qo_len = qo_indptr[r + 1] - qo_indptr[r];
        long pages = kv_indptr[r + 1] - kv_indptr[r];
        long kv_len = pages ? (pages - 1) * page_size + last_page_len[r] : 0;
        long pos = kv_len - qo_len + (tok - qo_indptr[r]);
        long entry = kv_indptr[r] + pos / page_size;
        if (pos < 0 || entry < 0 || ulong(entry) >= num_indices)
            continue;
        int page = kv_indices[entry];
        if (page < 0 || uint(page) >= num_pages)
            continue;
        float position = positions ? float(positions[tok]) : float(pos);
        ulong dst = (ulong(page) * page_size + ulong(pos % page_size)) * kv_heads * d;
        for (uint slot = group.y * threads + t; slot < slots; slot += groups.y * threads) {
            if (slot < kv_heads) {
                uint h = slot;
                move_head(k_src + ulong(tok) * k_stride + ulong(h) * d,
                          k_pages + (dst + ulong(h) * d) * elem_bytes, d, rope, position, theta,
                          inv_freq, fp8 ? k_scale[h] : 0.0f);
            } else if (slot < 2 * kv_heads) {
                uint h = slot - kv_heads;
                move_head(v_src + ulong(tok) * v_stride + ulong(h) * d,
                          v_pages + (dst + ulong(h) * d) * elem_bytes, d, false, 0.0f, theta,
                          inv_freq, fp8 ? v_scale[h] : 0.0f);
            } else {
                device ushort *row = q + ulong(tok) * q_stride + ulong(slot - 2 * kv_heads) * d;
                move_head(row, (device uchar *)row, d, rope, position, theta, inv_freq, 0.0f);
            }
        }
    }
}

kernel void
kv_append(device const ushort *k_src [[buffer(0)]], device const ushort *v_src [[buffer(1)]],
          device ushort *q [[buffer(2)]], device const int *positions [[buffer(3)]],
          device const int *qo_indptr [[buffer(4)]], device const int *kv_indptr [[buffer(5)]],
          device const int *kv_indices [[buffer(6)]], device const int *last_page_len [[buffer(7)]],
          device uchar *k_pages [[buffer(8)]], device uchar *v_pages [[buffer(9)]],
          constant uint &batch [[buffer(10)]], constant uint &tokens [[buffer(11)]],
          constant uint &num_indices [[buffer(12)]], constant uint &kv_heads [[buffer(13)]],
          constant uint &qo_heads [[buffer(14)]], constant uint &head_dim [[buffer(15)]],
          constant uint &page_size [[buffer(16)]], constant uint &num_pages [[buffer(17)]],
          constant uint &k_stride [[buffer(18)]], constant uint &v_stride [[buffer(19)]],
          constant uint &q_stride [[buffer(20)]], constant uint &rope [[buffer(21)]],
          constant float &theta [[buffer(22)]], device const float *inv_freq [[buffer(23)]],
          uint2 group [[threadgroup_position_in_grid]],
          uint2 groups [[threadgroups_per_grid]], uint t [[thread_position_in_threadgroup]],
          uint threads [[threads_per_threadgroup]]) {
    append(k_src, v_src, q, positions, qo_indptr, kv_indptr, kv_indices, last_page_len, k_pages,
           v_pages, batch, tokens, num_indices, kv_heads, qo_heads, head_dim, page_size, num_pages,
           k_stride, v_stride, q_stride, rope != 0, theta, inv_freq, nullptr, nullptr, false, group,
           groups, t, threads);
}

kernel void
kv_append_fp8(device const ushort *k_src [[buffer(0)]], device const ushort *v_src [[buffer(1)]],
              device ushort *q [[buffer(2)]], device const int *positions [[buffer(3)]],
              device const int *qo_indptr [[buffer(4)]], device const int *kv_indptr [[buffer(5)]],
              device const int *kv_indices [[buffer(6)]],
              device const int *last_page_len [[buffer(7)]], device uchar *k_pages [[buffer(8)]],
              device uchar *v_pages [[buffer(9)]], constant uint &batch [[buffer(10)]],
              constant uint &tokens [[buffer(11)]], constant uint &num_indices [[buffer(12)]],
              constant uint &kv_heads [[buffer(13)]], constant uint &qo_heads [[buffer(14)]],
              constant uint &head_dim [[buffer(15)]], constant uint &page_size [[buffer(16)]],
              constant uint &num_pages [[buffer(17)]], constant uint &k_stride [[buffer(18)]],
              constant uint &v_stride [[buffer(19)]], constant uint &q_stride [[buffer(20)]],
              constant uint &rope [[buffer(21)]], constant float &theta [[buffer(22)]],
              device const float *inv_freq [[buffer(23)]],
              device const float *k_scale [[buffer(24)]],
              device const float *v_scale [[buffer(25)]],
              uint2 group [[threadgroup_position_in_grid]], uint2 groups [[threadgroups_per_grid]],
              uint t [[thread_position_in_threadgroup]], uint threads [[threads_per_threadgroup]]) {
    append(k_src, v_src, q, positions, qo_indptr, kv_indptr, kv_indices, last_page_len, k_pages,
           v_pages, batch, tokens, num_indices, kv_heads, qo_heads, head_dim, page_size, num_pages,
           k_stride, v_stride, q_stride, rope != 0, theta, inv_freq, k_scale, v_scale, true, group,
           groups, t, threads);
}
