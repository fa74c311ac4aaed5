// fp4_e2m1.cuh - FP4 E2M1 (the element type of NVFP4, metrale/nvfp4.h) for our kernels: a code
// is a nibble, sign in bit 3, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}. The decoder agrees with
// mg_nvfp4_e2m1_to_f32; the encoder rounds a magnitude to the nearest one, ties to the even
// code, NaN to 0 (the NVFP4 quantizer's rule, src/ops/nvfp4_format/nvfp4_format_reference.c).
// Host code in C and C++ as well (bf16.cuh says how), checked exhaustively on the CPU by
// tests/internal/test_kernel_numerics.c.
#ifndef METRALE_KERNELS_COMMON_FP4_E2M1_CUH
#define METRALE_KERNELS_COMMON_FP4_E2M1_CUH

#include <stdint.h>

#include "bf16.cuh"

// Exact. Bits above the low 4 are ignored.
MG_NUM_FN float mg_num_e2m1_to_f32(uint32_t nibble) {
    // 1.m * 2^(e-1) for e > 0, m * 0.5 for e = 0.
    uint32_t e = (nibble >> 1) & 3u, m = nibble & 1u;
    float magnitude = e ? mg_num_f32_from_bits(((e + 126u) << 23) | (m << 22)) : 0.5f * (float)m;
    return (nibble & 8u) ? -magnitude : magnitude;
}

// The magnitude code (0..7) of m >= 0; the midpoints go to the even code, anything not above
// 0.25 (NaN included) to 0, anything above 5 to 7 (6).
MG_NUM_FN uint32_t mg_num_e2m1_magnitude_code(float m) {
    if (!(m > 0.25f))
        return 0;
    return m < 0.75f    ? 1u
           : m <= 1.25f ? 2u
           : m < 1.75f  ? 3u
           : m <= 2.5f  ? 4u
           : m < 3.5f   ? 5u
           : m <= 5.0f  ? 6u
                        : 7u;
}

#endif
