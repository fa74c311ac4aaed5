// nvfp4_gemm.metal - the NVFP4 weight-only GEMM (metrale/ops_nvfp4.h) by kernel name: the
// re-layout nvfp4_hopper_prepare and every GEMM variant the front (src/ops/nvfp4/nvfp4_gemm.c)
// launches, with the names and argument lists of the CPU reference
// (src/ops/nvfp4/nvfp4_gemm_reference.c), which defines the result. The weights are in the
// prepared layout of kernels/cuda/nvfp4/nvfp4_hopper_layout.h. Every GEMM variant is the same
// grid-stride loop of one thread per output element, so any grid and threadgroup the front
// picks computes the whole result; the threadgroup memory it asks for is not used. A row that
// no group holds, or whose token id is out of range, is left alone (the reference refuses such a
// routing). The sums are FP32 in K order where the reference's are FP64, so the bits may differ
// within FP32 rounding. UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define NV_SUPER_K 256u
#define NV_SUPER_BYTES 2048u
#define NV_SUPER_SCALE_BYTES 256u
#define NV_CHUNK_BYTES 512u

static inline uint nv_supers(uint k) {
    return (k + NV_SUPER_K - 1) / NV_SUPER_K;
}

static inline uint nv_row_blocks(uint n) {
    return (n + 15u) / 16u;
}

// mg_nvfp4_ue5m3_from_e4m3: the ue5m3 byte of an E4M3 scale code; 0 for zero and NaN.
static inline uint nv_ue5m3_from_e4m3(uint e4m3) {
    uint ex = (e4m3 >> 3) & 15u, man = e4m3 & 7u;
    if ((e4m3 & 0x7fu) == 0x7fu || (ex == 0 && man == 0))
        return 0;
    int e = int(ex) - 7;
    if (ex == 0) {
        e = -6;
        while (!(man & 8u)) {
            man <<= 1;
            e--;
        }
        man &= 7u;
    }
    return (uint(e + 15) << 3) | man;
}

// The value of a ue5m3 byte: (1 + m / 8) 2^(e - 15), no subnormals.
static inline float nv_ue5m3_value(uint u) {
    return as_type<float>((((u >> 3) + 112u) << 23) | ((u & 7u) << 20));
}

static inline float nv_e2m1_value(uint code) {
    const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float m = magnitude[code & 7u];
    return (code & 8u) ? -m : m;
}

// mg_nvfp4_value_offset: the byte of the code of (row, k) and its shift in that byte.
static inline ulong nv_value_offset(uint supers, uint row, uint k, thread uint &shift) {
    uint rb = row / 16, rr = row % 16, g = rr % 8, h = rr / 8;
    uint s = k / 256, c = (k % 256) / 64, kk = k % 64;
    uint t = kk / 16, kt = (kk % 16) / 4, e = kk % 4;
    uint lane = g * 4 + t;
    uint slot = ((e % 2) ? 7u : 3u) - (h + 2 * (e / 2));
    shift = (slot % 2) * 4;
    return ((ulong(rb) * supers + s) * 4 + c) * NV_CHUNK_BYTES + lane * 16u + kt * 4u + slot / 2;
}

// mg_nvfp4_scale_offset: the byte of the scale of (row, 16-element block q).
static inline ulong nv_scale_offset(uint supers, uint row, uint q) {
    uint rb = row / 16, rr = row % 16, g = rr % 8, h = rr / 8;
    uint s = q / 16, c = (q % 16) / 4, t = q % 4;
    uint lane = g * 4 + t;
    return (ulong(rb) * supers + s) * NV_SUPER_SCALE_BYTES + lane * 8u + c * 2u + h;
}

static inline ulong nv_linear(uint3 tid, uint3 grid) {
    return tid.x + ulong(grid.x) * (tid.y + ulong(grid.y) * tid.z);
}

static inline ulong nv_count(uint3 grid) {
    return ulong(grid.x) * grid.y * grid.z;
}

// The re-layout (nvfp4_hopper_layout.h), gathered: each thread writes whole bytes of the
// prepared values and scales. Padding (rows past n, K past k) and blocks whose E4M3 scale is
// zero or NaN get zero codes; padding gets zero scale bytes.
kernel void nvfp4_hopper_prepare(device const uchar *codes [[buffer(0)]],
                                 device const uchar *e4m3 [[buffer(1)]],
                                 device uchar *values [[buffer(2)]],
                                 device uchar *scales [[buffer(3)]], constant uint &n [[buffer(4)]],
                                 constant uint &k [[buffer(5)]],
                                 constant uint &experts [[buffer(6)]],
                                 uint3 tid [[thread_position_in_grid]],
                                 uint3 grid [[threads_per_grid]]) {
    uint supers = nv_supers(k), kb = k / 16;
    ulong value_bytes = ulong(nv_row_blocks(n)) * supers * NV_SUPER_BYTES;
    ulong scale_bytes = ulong(nv_row_blocks(n)) * supers * NV_SUPER_SCALE_BYTES;
    ulong total = (value_bytes + scale_bytes) * experts;
    for (ulong i = nv_linear(tid, grid); i < total; i += nv_count(grid)) {
        if (i < value_bytes * experts) {
            uint e = uint(i / value_bytes);
            ulong at = i % value_bytes;
            ulong chunk = at / NV_CHUNK_BYTES;
            uint in_chunk = uint(at % NV_CHUNK_BYTES);
            uint c = uint(chunk % 4), s = uint((chunk / 4) % supers), rb = uint(chunk / 4 / supers);
            uint lane = in_chunk / 16, kt = (in_chunk % 16) / 4, byte = in_chunk % 4;
            uint g = lane / 4, t = lane % 4, out = 0;
            for (uint half_ = 0; half_ < 2; half_++) {
                uint slot = byte * 2 + half_, odd = slot >= 4 ? 1u : 0u;
                uint pair = (odd ? 7u : 3u) - slot, h = pair % 2, el = 2 * (pair / 2) + odd;
                uint row = rb * 16 + h * 8 + g;
                uint kk = s * 256 + c * 64 + t * 16 + kt * 4 + el;
                if (row >= n || kk >= k)
                    continue;
                ulong grow = ulong(e) * n + row;
                if (nv_ue5m3_from_e4m3(e4m3[grow * kb + kk / 16]) == 0)
                    continue;
                uint code = (codes[grow * (k / 2) + kk / 2] >> (4 * (kk % 2))) & 15u;
                out |= code << (half_ * 4);
            }
            values[i] = uchar(out);
        } else {
            ulong j = i - value_bytes * experts;
            uint e = uint(j / scale_bytes);
            ulong at = j % scale_bytes;
            ulong super_ = at / NV_SUPER_SCALE_BYTES;
            uint in_super = uint(at % NV_SUPER_SCALE_BYTES);
            uint s = uint(super_ % supers), rb = uint(super_ / supers);
            uint lane = in_super / 8, c = (in_super % 8) / 2, h = in_super % 2;
            uint row = rb * 16 + h * 8 + lane / 4, q = s * 16 + c * 4 + lane % 4;
            uint out = 0;
            if (row < n && q < kb)
                out = nv_ue5m3_from_e4m3(e4m3[(ulong(e) * n + row) * kb + q]);
            scales[j] = uchar(out);
        }
    }
}

// Row j of one prepared weight (of expert `e`'s bytes) dotted with the activation row x.
static inline float nv_dot(device const ushort *x, device const uchar *values,
                           device const uchar *scales, uint supers, uint j, uint k) {
    float acc = 0.0f;
    for (uint q = 0; q < k / 16; q++) {
        float block = 0.0f;
        for (uint i = 0; i < 16; i++) {
            uint kk = q * 16 + i, shift;
            ulong at = nv_value_offset(supers, j, kk, shift);
            block = fma(bf16_to_float(x[kk]), nv_e2m1_value((values[at] >> shift) & 15u), block);
        }
        acc = fma(block, nv_ue5m3_value(scales[nv_scale_offset(supers, j, q)]), acc);
    }
    return acc;
}

// Every GEMM variant: out[r, j] for each row r of each group (token_ids[r] or r the activation
// row), silu(gate) * up where up_values is bound.
static inline void nv_gemm(device const ushort *act, uint act_pitch, uint act_rows,
                           device const int *token_ids, device const int *offsets, uint experts,
                           uint rows, device const uchar *values, device const uchar *scales,
                           ulong expert_value_bytes, ulong expert_scale_bytes,
                           device const float *global, device const uchar *up_values,
                           device const uchar *up_scales, device const float *up_global,
                           device ushort *out, uint ldc, uint n, uint k, uint3 tid, uint3 grid) {
    uint supers = nv_supers(k);
    for (ulong i = nv_linear(tid, grid); i < ulong(rows) * n; i += nv_count(grid)) {
        uint r = uint(i / n), j = uint(i % n), e = 0;
        if (offsets != nullptr) {
            while (e < experts && !(uint(offsets[e]) <= r && r < uint(offsets[e + 1])))
                e++;
            if (e == experts)
                continue;
        }
        uint src = token_ids != nullptr ? uint(token_ids[r]) : r;
        if (src >= act_rows)
            continue;
        device const ushort *x = act + ulong(src) * act_pitch;
        float v = nv_dot(x, values + e * expert_value_bytes, scales + e * expert_scale_bytes,
                         supers, j, k) *
                  global[e];
        if (up_values != nullptr) {
            float u = nv_dot(x, up_values + e * expert_value_bytes,
                             up_scales + e * expert_scale_bytes, supers, j, k) *
                      up_global[e];
            v = v / (1.0f + exp(-v)) * u;
        }
        out[ulong(r) * ldc + j] = float_to_bf16(v);
    }
}

// The variants (nvfp4_gemm_reference.h): the small-tile family nvfp4_gemm_[gate_up_]t{8,16}_k*
// and the tile family nvfp4_gemm_[gate_up_]t{32,64}_r*_k*, one argument list.
kernel void nvfp4_gemm_t8_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t8_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t8_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t8_k8(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t16_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t16_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t16_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t16_k8(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t8_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t8_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t8_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t8_k8(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t16_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t16_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t16_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t16_k8(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r32_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r32_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r32_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r64_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r64_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r64_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r128_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t32_r128_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t64_r32_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t64_r32_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t64_r64_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t64_r64_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t64_r128_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_t64_r128_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r16_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r16_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r16_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r32_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r32_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r32_k4(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r64_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t32_r64_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t64_r16_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t64_r16_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t64_r32_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t64_r32_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t64_r64_k1(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}

kernel void nvfp4_gemm_gate_up_t64_r64_k2(
    device const ushort *act [[buffer(0)]], constant uint &act_pitch [[buffer(1)]],
    constant uint &act_rows [[buffer(2)]], device const int *token_ids [[buffer(3)]],
    device const int *offsets [[buffer(4)]], constant uint &experts [[buffer(5)]],
    constant uint &rows [[buffer(6)]], device const uchar *values [[buffer(7)]],
    device const uchar *scales [[buffer(8)]], constant ulong &expert_value_bytes [[buffer(9)]],
    constant ulong &expert_scale_bytes [[buffer(10)]], device const float *global [[buffer(11)]],
    device const uchar *up_values [[buffer(12)]], device const uchar *up_scales [[buffer(13)]],
    device const float *up_global [[buffer(14)]], device ushort *out [[buffer(15)]],
    constant uint &ldc [[buffer(16)]], constant uint &n [[buffer(17)]],
    constant uint &k [[buffer(18)]], uint3 tid [[thread_position_in_grid]],
    uint3 grid [[threads_per_grid]]) {
    nv_gemm(act, act_pitch, act_rows, token_ids, offsets, experts, rows, values, scales,
            expert_value_bytes, expert_scale_bytes, global, up_values, up_scales, up_global, out,
            ldc, n, k, tid, grid);
}
