/*
 * nvfp4_hopper_layout.h - the NVFP4 weight layout the Hopper GEMM kernels read, shared by the
 * CUDA kernels (nvfp4_gemm.cu) and the host code (src/ops/nvfp4/), C and CUDA alike.
 *
 * Hopper has no FP4 tensor-core instruction, so the kernels decode E2M1 codes into BF16 in
 * registers and multiply with BF16 mma.sync (m16n8k16). The layout puts every value where one
 * lane of one warp needs it for its A fragment, so a warp reads one contiguous 512-byte chunk
 * (16 bytes per lane) per 16 rows x 64 K, and the matching activations in 32-byte runs.
 *
 * Rows are grouped in row blocks of 16 (N padded to 16 with zero codes), K in super-chunks of
 * 256 (K padded to 256 with zero codes), each super-chunk in 4 chunks of 64 K.
 *
 * Values. The chunk (row block rb, super-chunk s, chunk c) is 512 bytes at
 *     ((rb * supers + s) * 4 + c) * 512.
 * Lane L (g = L / 4, t = L % 4) owns 16 bytes at L * 16: four 32-bit words, word kt = 0..3 for
 * the chunk's MMA step kt. The MMA's K order is a permutation of the real K (a dot product does
 * not care, as long as weights and activations agree): step kt, fragment element e = 0..3 of
 * lane t is real k = s * 256 + c * 64 + t * 16 + kt * 4 + e. So lane t's activations for the
 * chunk are the 16 contiguous elements at t * 16 (two 16-byte loads), and all of its weights in
 * the chunk lie in one 16-element scale block.
 * Word kt holds 8 codes as 4 BF16 pairs j (the mma's A registers): pair 0 = row g, e 0..1;
 * pair 1 = row g + 8, e 0..1; pair 2 = row g, e 2..3; pair 3 = row g + 8, e 2..3. The low
 * element (even e) of pair j is the nibble at bits 12 - 4j, the high one at bits 28 - 4j, so
 * after a left shift by 4j both sit at the top of their 16-bit halves, sign bit first, and one
 * mask and one shift make the BF16 pair. A nibble is the canonical code: sign in bit 3, E2M1
 * magnitude in bits 0..2.
 *
 * Scales. One byte per (row, 16-element block), re-encoded as "ue5m3": an unsigned 8-bit
 * float with 5 exponent bits (bias 15) and 3 mantissa bits, no subnormals, so every E4M3 scale
 * (subnormals included) is exact and the kernel turns a byte into a BF16 with one shift and
 * one add. A block whose E4M3 scale is zero (or the NaN code) has its codes cleared to 0 and
 * its scale byte set to 0. Super-chunk (rb, s) has 256 scale bytes at (rb * supers + s) * 256;
 * lane L owns 8 at L * 8: byte c * 2 + h is row g + 8h's scale of block (s * 16 + c * 4 + t).
 *
 * Decoding (the kernels' arithmetic, exact in BF16):
 *   code c -> BF16 bits (c & 8) << 12 | (c & 7) << 6     = e2m1(c) * 2^-126
 *   (for a pair: q = word << 4j; (q & 0x80008000) | ((q >> 6) & 0x01c001c0))
 *   ue5m3 byte u -> BF16 bits (u << 4) + (230 << 7)       = scale(u) * 2^118
 *   their product (at most 6 significant bits)             = e2m1 * scale * 2^-8
 * and the FP32 accumulator is multiplied by global_scale * 2^8 at the end.
 */
#ifndef METRALE_NVFP4_HOPPER_LAYOUT_H
#define METRALE_NVFP4_HOPPER_LAYOUT_H

#ifdef __CUDACC__
#define MG_NVFP4_INLINE __host__ __device__ static inline
#else
#include <stddef.h>
#include <stdint.h>
#define MG_NVFP4_INLINE static inline
#endif

#define MG_NVFP4_BLOCK_ROWS 16u          /* rows of a row block (the MMA's M) */
#define MG_NVFP4_SUPER_K 256u            /* K of a super-chunk */
#define MG_NVFP4_CHUNK_K 64u             /* K of a chunk */
#define MG_NVFP4_CHUNK_BYTES 512u        /* value bytes of a chunk: 16 rows x 64 codes / 2 */
#define MG_NVFP4_SUPER_BYTES 2048u       /* value bytes of a super-chunk */
#define MG_NVFP4_SUPER_SCALE_BYTES 256u  /* scale bytes of a super-chunk: 16 rows x 16 blocks */
#define MG_NVFP4_SCALE_BF16_BIAS 0x7300u /* 230 << 7: the exponent added to a ue5m3 byte */
#define MG_NVFP4_ACC_FACTOR 256.0f       /* 2^8, undone on the accumulator */

MG_NVFP4_INLINE uint32_t mg_nvfp4_row_blocks(uint32_t n) {
    return (n + MG_NVFP4_BLOCK_ROWS - 1) / MG_NVFP4_BLOCK_ROWS;
}

MG_NVFP4_INLINE uint32_t mg_nvfp4_supers(uint32_t k) {
    return (k + MG_NVFP4_SUPER_K - 1) / MG_NVFP4_SUPER_K;
}

/* The small-tile kernels' RMSNorm prologue (nvfp4_gemm.cu) stages a tile's normed activation
 * rows in shared memory: each row K padded to whole super-chunks plus 16 bytes (so that
 * neighbouring rows fall in other banks), in 16-byte units; and the bytes of `rows` such rows. */
MG_NVFP4_INLINE uint32_t mg_nvfp4_normed_pitch(uint32_t k) {
    return mg_nvfp4_supers(k) * MG_NVFP4_SUPER_K / 8 + 1;
}

MG_NVFP4_INLINE uint64_t mg_nvfp4_normed_bytes(uint32_t rows, uint32_t k) {
    return (uint64_t)rows * mg_nvfp4_normed_pitch(k) * 16;
}

/* The nibble slot (bits 4 * slot of the word) of the low (odd = 0) or high element of pair j. */
MG_NVFP4_INLINE uint32_t mg_nvfp4_slot(uint32_t pair, uint32_t odd) {
    return (odd ? 7u : 3u) - pair;
}

/* Byte offset of the code of (row, k) in the values, and its bit shift in that byte. */
MG_NVFP4_INLINE uint64_t mg_nvfp4_value_offset(uint32_t supers, uint32_t row, uint32_t k,
                                               uint32_t *shift) {
    uint32_t rb = row / 16, rr = row % 16, g = rr % 8, h = rr / 8;
    uint32_t s = k / 256, c = (k % 256) / 64, kk = k % 64;
    uint32_t t = kk / 16, kt = (kk % 16) / 4, e = kk % 4;
    uint32_t lane = g * 4 + t;
    uint32_t slot = mg_nvfp4_slot(h + 2 * (e / 2), e % 2); /* nibble slot in the word */
    *shift = (slot % 2) * 4;
    return (((uint64_t)rb * supers + s) * 4 + c) * MG_NVFP4_CHUNK_BYTES + lane * 16u + kt * 4u +
           slot / 2;
}

/* Byte offset of the scale of (row, 16-element block q). */
MG_NVFP4_INLINE uint64_t mg_nvfp4_scale_offset(uint32_t supers, uint32_t row, uint32_t q) {
    uint32_t rb = row / 16, rr = row % 16, g = rr % 8, h = rr / 8;
    uint32_t s = q / 16, c = (q % 16) / 4, t = q % 4;
    uint32_t lane = g * 4 + t;
    return ((uint64_t)rb * supers + s) * MG_NVFP4_SUPER_SCALE_BYTES + lane * 8u + c * 2u + h;
}

/* The ue5m3 byte of an E4M3 scale code (sign ignored); 0 for zero and NaN (their block's codes
 * are cleared). */
MG_NVFP4_INLINE uint32_t mg_nvfp4_ue5m3_from_e4m3(uint32_t e4m3) {
    uint32_t exp = (e4m3 >> 3) & 15u, man = e4m3 & 7u;
    if ((e4m3 & 0x7fu) == 0x7fu || (exp == 0 && man == 0))
        return 0;
    int e = (int)exp - 7;
    if (exp == 0) { /* subnormal: man * 2^-9, normalised (each shift lowers e by one) */
        e = -6;
        while (!(man & 8u)) {
            man <<= 1;
            e--;
        }
        man &= 7u;
    }
    return ((uint32_t)(e + 15) << 3) | man;
}

/* Whether an E4M3 scale code makes its block zero in this layout. */
MG_NVFP4_INLINE int mg_nvfp4_scale_clears_block(uint32_t e4m3) {
    return mg_nvfp4_ue5m3_from_e4m3(e4m3) == 0;
}

#endif
