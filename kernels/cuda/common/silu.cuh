// silu.cuh - silu(g) * u in FP32, the arithmetic of the CPU reference of mg_silu_mul_bf16
// (src/ops/activation/), operation for operation: silu(g) = g / (1 + expf(-g)), each step
// rounded as IEEE single precision (the kernels are built without fast math, so `/` is the
// correctly rounded division and expf the accurate one). The one definition the kernels that
// end in SiLU-mul use; the caller rounds the product to BF16.
#ifndef METRALE_KERNELS_COMMON_SILU_CUH
#define METRALE_KERNELS_COMMON_SILU_CUH

__device__ __forceinline__ float mg_silu_mul_f32(float g, float u) {
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    return __fmul_rn(silu, u);
}

#endif
