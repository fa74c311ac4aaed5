// builtin.metal - the built-in kernels of module "metrale" (the CPU backend's
// src/backends/cpu/cpu_kernels.c has the same two): the conformance suite's launches.
// UNVERIFIED ON HARDWARE: checked here only by clang -fsyntax-only against a stand-in
// header (tests/metal/msl_stub.h) and through the test double.
#include <metal_stdlib>
using namespace metal;

// out[i] = a[i] + b[i] for i < n; any grid covers n (a grid-stride loop, as on CUDA).
kernel void vector_add(device const float *a [[buffer(0)]], device const float *b [[buffer(1)]],
                       device float *out [[buffer(2)]], constant uint &n [[buffer(3)]],
                       uint tid [[thread_position_in_grid]], uint threads [[threads_per_grid]]) {
    for (uint i = tid; i < n; i += threads)
        out[i] = a[i] + b[i];
}

// Does nothing: launch-latency benchmarks time the launch path.
kernel void empty_kernel() {}
