// mma_bf16.cuh - the warp-level BF16 tensor-core product the decode kernels share:
// mma.sync m16n8k16, A row-major [16, 16], B column-major [16, 8], FP32 accumulators in place.
// Fragments (PTX ISA, "mma.m16n8k16" for .bf16), lane = 4 g + t:
//   a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
//   b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
//   c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1].
// The K order of one product is the caller's: any permutation applied to A and B alike.
#ifndef METRALE_KERNELS_COMMON_MMA_BF16_CUH
#define METRALE_KERNELS_COMMON_MMA_BF16_CUH

#include <stdint.h>

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    // Not volatile: registers only, so the compiler may schedule it among the loads.
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#endif
