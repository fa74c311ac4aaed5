// activation.metal - silu_mul_bf16 (mg_silu_mul_bf16, metrale/ops_activation.h): for each of
// `rows` rows, out[c] = silu(in[c]) * in[cols + c] in BF16, with pitches in elements. The
// reference is src/ops/activation/silu_mul_reference.c. UNVERIFIED ON HARDWARE.
#include <metal_stdlib>
using namespace metal;

kernel void silu_mul_bf16(device const ushort *in [[buffer(0)]], device ushort *out [[buffer(1)]],
                          constant uint &rows [[buffer(2)]], constant uint &cols [[buffer(3)]],
                          constant uint &in_pitch [[buffer(4)]],
                          constant uint &out_pitch [[buffer(5)]],
                          uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    ulong total = ulong(rows) * cols;
    for (ulong i = tid; i < total; i += threads) {
        uint r = uint(i / cols), c = uint(i % cols);
        float g = bf16_to_float(in[ulong(r) * in_pitch + c]);
        float u = bf16_to_float(in[ulong(r) * in_pitch + cols + c]);
        out[ulong(r) * out_pitch + c] = float_to_bf16(g / (1.0f + exp(-g)) * u);
    }
}
