// mlx.metal - the MLX affine-quantized kernels (metrale/mlx.h): mlx_dequant, mlx_gemv (plain,
// SiLU-gated, gated with a residual), mlx_gemv_gate_up and mlx_add_bias, with the argument
// lists of the CPU reference (src/ops/mlx/mlx_reference.c), which defines the results: a
// weight row is k codes of `bits` bits packed little-end first into 32-bit words, with one
// scale and one bias (BF16 or FP16) per group of group_size codes; w = scale * code + bias.
// The GEMVs sum in FP32 where the reference sums in double. UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

#define MLX_SCALE_F16 1u
#define MLX_BIAS_F16 1u
#define MLX_BIAS_F32 2u
#define MLX_GEMV_PLAIN 0u
#define MLX_GEMV_SILU_GATE_RESID 2u
#define MLX_GATE_UP_SILU_MUL 1u
#define MLX_GEMV_MAX_M 8
#define MLX_GEMV_ROWS 16 // output rows per threadgroup (the front's GEMV_ROWS_PER_BLOCK)
#define MLX_GEMV_THREADS_MAX 128

static inline float scale_value(ushort v, uint scale_type) {
    return scale_type == MLX_SCALE_F16 ? float(as_type<half>(v)) : bf16_to_float(v);
}

// x rounded to the scales' type and back (round to nearest even either way).
static inline float round_to_scale(float x, uint scale_type) {
    return scale_type == MLX_SCALE_F16 ? float(half(x)) : bf16_to_float(float_to_bf16(x));
}

static inline uint code_at(device const uint *row_words, uint j, uint bits) {
    uint per_word = 32 / bits;
    return (row_words[j / per_word] >> ((j % per_word) * bits)) & ((1u << bits) - 1u);
}

// out[n, k] = BF16 of round(round(scale * code) + bias), rows grid-strided over threadgroups.
kernel void
mlx_dequant(device const uint *weight [[buffer(0)]], device const ushort *scales [[buffer(1)]],
            device const ushort *biases [[buffer(2)]], device ushort *out [[buffer(3)]],
            constant uint &n [[buffer(4)]], constant uint &k [[buffer(5)]],
            constant uint &bits [[buffer(6)]], constant uint &group_size [[buffer(7)]],
            constant uint &scale_type [[buffer(8)]], uint group [[threadgroup_position_in_grid]],
            uint groups [[threadgroups_per_grid]], uint t [[thread_position_in_threadgroup]],
            uint threads [[threads_per_threadgroup]]) {
    uint words_per_row = k / (32 / bits), groups_per_row = k / group_size;
    for (uint r = group; r < n; r += groups) {
        device const uint *row = weight + ulong(r) * words_per_row;
        for (uint j = t; j < k; j += threads) {
            ulong g = ulong(r) * groups_per_row + j / group_size;
            float scale = scale_value(scales[g], scale_type);
            float bias = scale_value(biases[g], scale_type);
            float v = round_to_scale(scale * float(code_at(row, j, bits)), scale_type);
            out[ulong(r) * k + j] = float_to_bf16(round_to_scale(v + bias, scale_type));
        }
    }
}

// The activation the GEMV multiplies: x, or BF16(silu(x) * u) when gated.
static inline float activation(device const ushort *x, device const ushort *u, ulong i,
                               bool gated) {
    float g = bf16_to_float(x[i]);
    if (!gated)
        return g;
    return bf16_to_float(float_to_bf16(g / (1.0f + exp(-g)) * bf16_to_float(u[i])));
}

// Partial sums of output row `r` for every token: lanes split the row's groups.
static inline void gemv_partials(device const uint *weight, device const ushort *scales,
                                 device const ushort *biases, device const ushort *x,
                                 device const ushort *u, bool gated, uint m, uint r, uint k,
                                 uint bits, uint group_size, uint scale_type, uint lane, uint lanes,
                                 thread float *acc) {
    uint words_per_row = k / (32 / bits), groups_per_row = k / group_size;
    device const uint *row = weight + ulong(r) * words_per_row;
    for (uint grp = lane; grp < groups_per_row; grp += lanes) {
        ulong g = ulong(r) * groups_per_row + grp;
        float scale = scale_value(scales[g], scale_type);
        float bias = scale_value(biases[g], scale_type);
        for (uint tok = 0; tok < m; tok++) {
            float qx = 0.0f, xs = 0.0f;
            for (uint j = grp * group_size; j < (grp + 1) * group_size; j++) {
                float a = activation(x, u, ulong(tok) * k + j, gated);
                qx += float(code_at(row, j, bits)) * a;
                xs += a;
            }
            acc[tok] += scale * qx + bias * xs;
        }
    }
}

// Sums the lanes' partials of each row in threadgroup memory; lane 0 of a row gets totals.
static inline void gemv_reduce(threadgroup float *partial, thread float *acc, uint m, uint t,
                               uint lane, uint lanes) {
    for (uint tok = 0; tok < m; tok++)
        partial[t * MLX_GEMV_MAX_M + tok] = acc[tok];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0)
        for (uint tok = 0; tok < m; tok++) {
            float s = 0.0f;
            for (uint l = 0; l < lanes; l++)
                s += partial[(t + l) * MLX_GEMV_MAX_M + tok];
            acc[tok] = s;
        }
}

// y[m, n] = act · Wᵀ (+ resid in mode 2), MLX_GEMV_ROWS output rows per threadgroup.
kernel void
mlx_gemv(device const uint *weight [[buffer(0)]], device const ushort *scales [[buffer(1)]],
         device const ushort *biases [[buffer(2)]], device const ushort *x [[buffer(3)]],
         device const ushort *u [[buffer(4)]], device const ushort *resid [[buffer(5)]],
         device ushort *y [[buffer(6)]], constant uint &m [[buffer(7)]],
         constant uint &n [[buffer(8)]], constant uint &k [[buffer(9)]],
         constant uint &bits [[buffer(10)]], constant uint &group_size [[buffer(11)]],
         constant uint &scale_type [[buffer(12)]], constant uint &mode [[buffer(13)]],
         uint group [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]],
         uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[MLX_GEMV_THREADS_MAX * MLX_GEMV_MAX_M];
    if (threads > MLX_GEMV_THREADS_MAX || threads % MLX_GEMV_ROWS || m > MLX_GEMV_MAX_M)
        return;
    uint lanes = threads / MLX_GEMV_ROWS, lane = t % lanes;
    uint r = group * MLX_GEMV_ROWS + t / lanes;
    float acc[MLX_GEMV_MAX_M] = {0};
    if (r < n)
        gemv_partials(weight, scales, biases, x, u, mode != MLX_GEMV_PLAIN, m, r, k, bits,
                      group_size, scale_type, lane, lanes, acc);
    gemv_reduce(partial, acc, m, t, lane, lanes);
    if (lane != 0 || r >= n)
        return;
    for (uint tok = 0; tok < m; tok++) {
        ulong o = ulong(tok) * n + r;
        float v = acc[tok];
        if (mode == MLX_GEMV_SILU_GATE_RESID)
            v += bf16_to_float(resid[o]);
        y[o] = float_to_bf16(v);
    }
}

// y1 = x · W1ᵀ and y2 = x · W2ᵀ for two layers of one shape (a gate and an up projection); with
// epilogue 1 (SiLU-mul) y1 = BF16(silu(g) * u) of the two BF16 products and y2 is not written.
kernel void mlx_gemv_gate_up(
    device const uint *w1 [[buffer(0)]], device const ushort *s1 [[buffer(1)]],
    device const ushort *b1 [[buffer(2)]], device const uint *w2 [[buffer(3)]],
    device const ushort *s2 [[buffer(4)]], device const ushort *b2 [[buffer(5)]],
    device const ushort *x [[buffer(6)]], device ushort *y1 [[buffer(7)]],
    device ushort *y2 [[buffer(8)]], constant uint &m [[buffer(9)]],
    constant uint &n [[buffer(10)]], constant uint &k [[buffer(11)]],
    constant uint &bits [[buffer(12)]], constant uint &group_size [[buffer(13)]],
    constant uint &scale_type [[buffer(14)]], constant uint &epilogue [[buffer(15)]],
    uint group [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]],
    uint threads [[threads_per_threadgroup]]) {
    threadgroup float partial[MLX_GEMV_THREADS_MAX * MLX_GEMV_MAX_M];
    if (threads > MLX_GEMV_THREADS_MAX || threads % MLX_GEMV_ROWS || m > MLX_GEMV_MAX_M)
        return;
    uint lanes = threads / MLX_GEMV_ROWS, lane = t % lanes;
    uint r = group * MLX_GEMV_ROWS + t / lanes;
    float gate[MLX_GEMV_MAX_M] = {0};
    for (uint which = 0; which < 2; which++) {
        float acc[MLX_GEMV_MAX_M] = {0};
        if (r < n)
            gemv_partials(which ? w2 : w1, which ? s2 : s1, which ? b2 : b1, x, x, false, m, r, k,
                          bits, group_size, scale_type, lane, lanes, acc);
        gemv_reduce(partial, acc, m, t, lane, lanes);
        if (lane == 0 && r < n)
            for (uint tok = 0; tok < m; tok++) {
                ulong o = ulong(tok) * n + r;
                float v = bf16_to_float(float_to_bf16(acc[tok]));
                if (epilogue != MLX_GATE_UP_SILU_MUL)
                    (which ? y2 : y1)[o] = float_to_bf16(acc[tok]);
                else if (which == 0)
                    gate[tok] = v;
                else
                    y1[o] = float_to_bf16(gate[tok] / (1.0f + exp(-gate[tok])) * v);
            }
        threadgroup_barrier(mem_flags::mem_threadgroup); // partial is reused
    }
}

// y[t, r] = BF16(y[t, r] + bias[r]) in FP32; bias BF16, FP16 or FP32.
kernel void mlx_add_bias(device ushort *y [[buffer(0)]], device const void *bias [[buffer(1)]],
                         constant uint &m [[buffer(2)]], constant uint &n [[buffer(3)]],
                         constant uint &bias_type [[buffer(4)]],
                         uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    ulong total = ulong(m) * n;
    for (ulong i = tid; i < total; i += threads) {
        uint r = uint(i % n);
        float b = bias_type == MLX_BIAS_F32   ? ((device const float *)bias)[r]
                  : bias_type == MLX_BIAS_F16 ? float(((device const half *)bias)[r])
                                              : bf16_to_float(((device const ushort *)bias)[r]);
        y[i] = float_to_bf16(bf16_to_float(y[i]) + b);
    }
}
