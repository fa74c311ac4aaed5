// gemm.metal - gemm_bf16 (mg_gemm_bf16, metrale/ops_gemm.h): out[M, N] = act[M, K] · weight[N, K]ᵀ
// with BF16 inputs, FP32 accumulation and an FP32 or BF16 output of row pitch ldc, the argument
// list of the CPU reference gemm_bf16_ref (src/ops/gemm/gemm_reference.c), which defines the
// result. The front (src/ops/gemm/gemm_kernels.c) launches 16 x 16 threadgroups, one per 16 x 16
// block of out (x: columns, y: rows). The sum runs in a different order from the reference's,
// so the bits may differ within FP32 rounding. UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define GEMM_TILE 16
#define GEMM_OUT_F32 0u // MG_DTYPE_F32; anything else the front lets through is BF16

kernel void gemm_bf16(device const ushort *act [[buffer(0)]],
                      device const ushort *weight [[buffer(1)]], device uchar *out [[buffer(2)]],
                      constant uint &m [[buffer(3)]], constant uint &n [[buffer(4)]],
                      constant uint &k [[buffer(5)]], constant uint &ldc [[buffer(6)]],
                      constant uint &out_type [[buffer(7)]],
                      uint2 group [[threadgroup_position_in_grid]],
                      uint2 t [[thread_position_in_threadgroup]]) {
    threadgroup float a_tile[GEMM_TILE][GEMM_TILE];
    threadgroup float w_tile[GEMM_TILE][GEMM_TILE];
    uint row = group.y * GEMM_TILE + t.y, col = group.x * GEMM_TILE + t.x;
    // the weight row this thread stages: the block's column t.y
    uint w_row = group.x * GEMM_TILE + t.y;
    float acc = 0.0f;
    for (uint k0 = 0; k0 < k; k0 += GEMM_TILE) {
        uint kk = k0 + t.x;
        a_tile[t.y][t.x] = row < m && kk < k ? bf16_to_float(act[ulong(row) * k + kk]) : 0.0f;
        w_tile[t.y][t.x] = w_row < n && kk < k ? bf16_to_float(weight[ulong(w_row) * k + kk]) : 0.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint j = 0; j < GEMM_TILE; j++)
            acc = fma(a_tile[t.y][j], w_tile[t.x][j], acc);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (row >= m || col >= n)
        return;
    ulong at = ulong(row) * ldc + col;
    if (out_type == GEMM_OUT_F32)
        ((device float *)out)[at] = acc;
    else
        ((device ushort *)out)[at] = float_to_bf16(acc);
}
