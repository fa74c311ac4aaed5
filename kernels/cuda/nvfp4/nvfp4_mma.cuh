// nvfp4_mma.cuh - what the NVFP4 GEMM kernels of Hopper share (nvfp4_gemm.cu for up to 16
// tokens, nvfp4_gemm_tile.cu from 17): decoding the layout of nvfp4_hopper_layout.h into BF16
// MMA fragments (the mma.sync itself is common/mma_bf16.cuh), the kernels' argument block (the
// argument list of src/ops/nvfp4/nvfp4_gemm_reference.h) and the search of a grouped problem's
// token tiles.
#ifndef METRALE_NVFP4_MMA_CUH
#define METRALE_NVFP4_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "common/bf16.cuh"
#include "common/mma_bf16.cuh"
#include "nvfp4/nvfp4_hopper_layout.h"

namespace mg_nvfp4 {

// Pair j of a word (nvfp4_hopper_layout.h): two codes -> two BF16 of e2m1 * 2^-126.
__device__ __forceinline__ uint32_t decode_pair(uint32_t word, int j) {
    const uint32_t q = word << (4 * j);
    return (q & 0x80008000u) | ((q >> 6) & 0x01c001c0u);
}

// Byte `b` of `word` (a ue5m3 scale) as a BF16 pair (scale * 2^118, twice).
__device__ __forceinline__ uint32_t scale_pair(uint32_t word, uint32_t b) {
    uint32_t spread = __byte_perm(word, 0u, 0x4040u | (b << 8) | b);
    return spread * 16u + (MG_NVFP4_SCALE_BF16_BIAS | (MG_NVFP4_SCALE_BF16_BIAS << 16));
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

struct gemm_args {
    const __nv_bfloat16 *act;
    uint32_t act_pitch, act_rows;
    const int32_t *token_ids;      // null: row r reads act row r
    const int32_t *expert_offsets; // null: one group of `rows` rows (dense)
    uint32_t experts, rows;
    const uint8_t *values, *scales;
    uint64_t expert_value_bytes, expert_scale_bytes;
    const float *global_scales;
    const uint8_t *up_values, *up_scales;
    const float *up_global_scales;
    __nv_bfloat16 *out;
    uint32_t ldc, n, k;
    // The fused small-tile kernels' (nvfp4_gemm.cu) fusion operands; null in the others.
    const __nv_bfloat16 *norm_weight; // RMSNorm prologue: BF16 [k]
    const __nv_bfloat16 *residual;    // residual-add epilogue: BF16 [rows, ldc], may be out
    float eps;
};

// The kernels' parameter list (nvfp4_gemm_reference.h's argument list) and the gemm_args it
// makes, for the kernel-defining macros of both families.
#define MG_NVFP4_GEMM_PARAMS                                                                       \
    const __nv_bfloat16 *act, uint32_t act_pitch, uint32_t act_rows, const int32_t *token_ids,     \
        const int32_t *expert_offsets, uint32_t experts, uint32_t rows, const uint8_t *values,     \
        const uint8_t *scales, uint64_t expert_value_bytes, uint64_t expert_scale_bytes,           \
        const float *global_scales, const uint8_t *up_values, const uint8_t *up_scales,            \
        const float *up_global_scales, __nv_bfloat16 *out, uint32_t ldc, uint32_t n, uint32_t k
#define MG_NVFP4_GEMM_ARGS                                                                         \
    mg_nvfp4::gemm_args {                                                                          \
        act, act_pitch, act_rows, token_ids, expert_offsets, experts, rows, values, scales,        \
            expert_value_bytes, expert_scale_bytes, global_scales, up_values, up_scales,           \
            up_global_scales, out, ldc, n, k                                                       \
    }

// Stores output (r, n), in range: 0 for a row whose token id is outside the activation (it read
// zeros; negative ids wrap to large). With a residual, the output rounded to BF16 plus the
// residual's element, rounded again (mg_rmsnorm_bf16's add); read and written by this thread
// alone, so the residual may be out itself.
__device__ __forceinline__ void store_output(const gemm_args &a, uint32_t r, uint32_t n,
                                             float value) {
    if (a.token_ids && (uint32_t)a.token_ids[r] >= a.act_rows)
        value = 0.0f;
    const uint64_t at = (uint64_t)r * a.ldc + n;
    if (a.residual)
        value = __bfloat162float(mg_num_to_nv_bf16(value)) + __bfloat162float(a.residual[at]);
    a.out[at] = mg_num_to_nv_bf16(value);
}

struct token_tile {
    int expert; // -1: no tile
    uint32_t row0, row_end;
};

// Tile `index` of `tile_rows` rows among the experts' groups, in expert order (each warp
// computes it alone: no barrier before a CTA without a tile exits).
__device__ token_tile find_tile(const gemm_args &a, uint32_t index, uint32_t tile_rows) {
    if (!a.expert_offsets) {
        uint32_t row0 = index * tile_rows;
        return {row0 < a.rows ? 0 : -1, row0, a.rows};
    }
    const uint32_t lane = threadIdx.x % 32;
    uint32_t remaining = index;
    for (uint32_t e0 = 0; e0 < a.experts; e0 += 32) {
        uint32_t e = e0 + lane, begin = 0, end = 0, tiles = 0;
        if (e < a.experts) {
            int32_t o0 = a.expert_offsets[e], o1 = a.expert_offsets[e + 1];
            begin = (uint32_t)min(max(o0, 0), (int32_t)a.rows);
            end = (uint32_t)min(max(o1, 0), (int32_t)a.rows);
            tiles = end > begin ? (end - begin + tile_rows - 1) / tile_rows : 0;
        }
        uint32_t inclusive = tiles;
        for (int d = 1; d < 32; d *= 2) {
            uint32_t v = __shfl_up_sync(0xffffffffu, inclusive, d);
            if (lane >= (uint32_t)d)
                inclusive += v;
        }
        uint32_t total = __shfl_sync(0xffffffffu, inclusive, 31);
        if (remaining < total) {
            uint32_t hit = __ballot_sync(0xffffffffu, inclusive > remaining);
            int first = __ffs(hit) - 1;
            uint32_t before = __shfl_sync(0xffffffffu, inclusive - tiles, first);
            uint32_t b = __shfl_sync(0xffffffffu, begin, first);
            uint32_t en = __shfl_sync(0xffffffffu, end, first);
            return {(int)(e0 + first), b + (remaining - before) * tile_rows, en};
        }
        remaining -= total;
    }
    return {-1, 0, 0};
}

} // namespace mg_nvfp4

#endif
