/*
 * philox.h - Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
 * 1, 2, 3", SC11) and the one uniform draw of the sampler (metrale/ops_sample.h), shared by the
 * CUDA kernel (kernels/cuda/sample/sample.cu) and the CPU reference (src/ops/sample/), so both
 * draw the same number from the same (seed, step). Plain C (C11 or CUDA C++), no state: the
 * output is a pure function of the counter and the key, which is what makes a request's draw at
 * a step independent of the batch it runs in and of the order rows are processed.
 *
 * The constants and the round are the paper's and Random123's; tests/test_sample.c checks this
 * code against Random123's published known-answer vectors.
 */
#ifndef METRALE_PHILOX_H
#define METRALE_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define MG_PHILOX_FN static __host__ __device__ __forceinline__
#else
#define MG_PHILOX_FN static inline
#endif

#define MG_PHILOX_M0 0xD2511F53u
#define MG_PHILOX_M1 0xCD9E8D57u
#define MG_PHILOX_W0 0x9E3779B9u
#define MG_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(counter ctr, key key); out may alias ctr. */
MG_PHILOX_FN void mg_philox4x32_10_block(const uint32_t ctr[4], const uint32_t key[2],
                                         uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)MG_PHILOX_M0 * c0, p1 = (uint64_t)MG_PHILOX_M1 * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += MG_PHILOX_W0;
        k1 += MG_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The sampler's draw for (seed, step): key = (seed low 32 bits, seed high 32 bits), counter =
 * (step low, step high, 0, 0); the first output word's top 24 bits, u = word >> 8 times 2^-24,
 * a float in [0, 1) that FP32 represents exactly. */
MG_PHILOX_FN float mg_sample_uniform_of(uint64_t seed, uint64_t step) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)step, (uint32_t)(step >> 32), 0u, 0u};
    uint32_t out[4];
    mg_philox4x32_10_block(ctr, key, out);
    return (float)(out[0] >> 8) * (1.0f / 16777216.0f);
}

#endif
