// moe_routing.metal - the MoE routing helpers (metrale/ops_moe.h): moe_topk, the three stages
// of moe_sort and moe_combine, with the names and argument lists of the CPU reference
// (src/ops/moe/moe_routing_reference.c). As on every device backend, ids outside [0, E) are
// dropped (position -1) rather than refused. The sort's count and scatter give each 4096-pair
// chunk one threadgroup and walk it in order on one thread, which keeps the sort stable.
// UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define MOE_MAX_EXPERTS 256u
#define MOE_MAX_TOPK 8u
#define MOE_SORT_CHUNK 4096u

// Per token: the k largest logits (NaN as -inf; ties keep the lower expert), and their softmax
// weights over the chosen k (renormalize) or over all experts. One thread per token.
kernel void moe_topk(device const void *logits [[buffer(0)]], device int *ids [[buffer(1)]],
                     device float *weights [[buffer(2)]], constant uint &tokens [[buffer(3)]],
                     constant uint &experts [[buffer(4)]], constant uint &k [[buffer(5)]],
                     constant uint &pitch [[buffer(6)]], constant uint &is_bf16 [[buffer(7)]],
                     constant uint &renormalize [[buffer(8)]], uint tid [[thread_position_in_grid]],
                     uint threads [[threads_per_grid]]) {
    if (experts > MOE_MAX_EXPERTS || k > MOE_MAX_TOPK || k > experts)
        return;
    for (uint t = tid; t < tokens; t += threads) {
        float v[MOE_MAX_EXPERTS];
        bool taken[MOE_MAX_EXPERTS];
        for (uint e = 0; e < experts; e++) {
            ulong i = ulong(t) * pitch + e;
            float x = is_bf16 ? bf16_to_float(((device const ushort *)logits)[i])
                              : ((device const float *)logits)[i];
            v[e] = isnan(x) ? -INFINITY : x;
            taken[e] = false;
        }
        uint chosen[MOE_MAX_TOPK];
        for (uint j = 0; j < k; j++) {
            uint best = 0xffffffffu;
            for (uint e = 0; e < experts; e++)
                if (!taken[e] && (best == 0xffffffffu || v[e] > v[best]))
                    best = e;
            taken[best] = true;
            chosen[j] = best;
        }
        float top = v[chosen[0]], sum = 0.0f;
        if (renormalize)
            for (uint j = 0; j < k; j++)
                sum += exp(v[chosen[j]] - top);
        else
            for (uint e = 0; e < experts; e++)
                sum += exp(v[e] - top);
        for (uint j = 0; j < k; j++) {
            ids[ulong(t) * k + j] = int(chosen[j]);
            weights[ulong(t) * k + j] = exp(v[chosen[j]] - top) / sum;
        }
    }
}

static inline bool valid_id(int id, uint experts) {
    return id >= 0 && uint(id) < experts;
}

// workspace[c * E + e] = valid pairs of chunk c (this threadgroup) with expert e.
kernel void moe_sort_count(device const int *ids [[buffer(0)]], device int *workspace [[buffer(1)]],
                           constant uint &pairs [[buffer(2)]], constant uint &experts [[buffer(3)]],
                           uint c [[threadgroup_position_in_grid]],
                           uint t [[thread_position_in_threadgroup]]) {
    device int *counts = workspace + ulong(c) * experts;
    if (t != 0)
        return;
    for (uint e = 0; e < experts; e++)
        counts[e] = 0;
    uint end = min(pairs, (c + 1) * MOE_SORT_CHUNK);
    for (uint p = c * MOE_SORT_CHUNK; p < end; p++)
        if (valid_id(ids[p], experts))
            counts[ids[p]]++;
}

// Counts -> each chunk's first row per expert and the expert offsets; rows past the valid
// pairs get token -1. One threadgroup.
kernel void moe_sort_scan(device int *workspace [[buffer(0)]], device int *offsets [[buffer(1)]],
                          device int *sorted_tokens [[buffer(2)]],
                          constant uint &pairs [[buffer(3)]], constant uint &experts [[buffer(4)]],
                          uint t [[thread_position_in_threadgroup]],
                          uint threads [[threads_per_threadgroup]]) {
    threadgroup int total[1];
    uint chunks = pairs ? (pairs + MOE_SORT_CHUNK - 1) / MOE_SORT_CHUNK : 1;
    if (t == 0) {
        int base = 0;
        for (uint e = 0; e < experts; e++) {
            offsets[e] = base;
            for (uint c = 0; c < chunks; c++) {
                int count = workspace[ulong(c) * experts + e];
                workspace[ulong(c) * experts + e] = base;
                base += count;
            }
        }
        offsets[experts] = base;
        total[0] = base;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint row = uint(total[0]) + t; row < pairs; row += threads)
        sorted_tokens[row] = -1;
}

// Each valid pair to its row, in pair order within the chunk (stable); dropped pairs get -1.
kernel void
moe_sort_scatter(device const int *ids [[buffer(0)]], device int *workspace [[buffer(1)]],
                 device int *sorted_tokens [[buffer(2)]], device int *positions [[buffer(3)]],
                 constant uint &pairs [[buffer(4)]], constant uint &experts [[buffer(5)]],
                 constant uint &k [[buffer(6)]], uint c [[threadgroup_position_in_grid]],
                 uint t [[thread_position_in_threadgroup]]) {
    if (t != 0 || k == 0)
        return;
    device int *next = workspace + ulong(c) * experts;
    uint end = min(pairs, (c + 1) * MOE_SORT_CHUNK);
    for (uint p = c * MOE_SORT_CHUNK; p < end; p++) {
        int id = ids[p];
        if (!valid_id(id, experts)) {
            positions[p] = -1;
            continue;
        }
        int row = next[id]++;
        sorted_tokens[row] = int(p / k);
        positions[p] = row;
    }
}

// out[t] = residual[t] (when has_residual) + sum over j of weight * rows[position], in FP32
// with fused multiply-adds in j order, then BF16. A thread per 8 elements of a token.
kernel void
moe_combine(device const ushort *rows [[buffer(0)]], device const int *positions [[buffer(1)]],
            device const float *weights [[buffer(2)]], device const ushort *residual [[buffer(3)]],
            device ushort *out [[buffer(4)]], constant uint &tokens [[buffer(5)]],
            constant uint &k [[buffer(6)]], constant uint &hidden [[buffer(7)]],
            constant uint &has_residual [[buffer(8)]], uint2 group [[threadgroup_position_in_grid]],
            uint2 groups [[threadgroups_per_grid]], uint t [[thread_position_in_threadgroup]],
            uint threads [[threads_per_threadgroup]]) {
    uint vector = group.x * threads + t;
    if (vector * 8 >= hidden)
        return;
    long row_count = long(tokens) * k;
    for (uint tok = group.y; tok < tokens; tok += groups.y) {
        for (uint h = vector * 8; h < vector * 8 + 8; h++) {
            ulong i = ulong(tok) * hidden + h;
            float acc = has_residual ? bf16_to_float(residual[i]) : 0.0f;
            for (uint j = 0; j < k; j++) {
                int row = positions[ulong(tok) * k + j];
                if (row < 0 || long(row) >= row_count)
                    continue;
                acc = fma(weights[ulong(tok) * k + j], bf16_to_float(rows[ulong(row) * hidden + h]),
                          acc);
            }
            out[i] = float_to_bf16(acc);
        }
    }
}
