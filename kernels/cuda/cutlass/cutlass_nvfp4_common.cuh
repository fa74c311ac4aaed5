// cutlass_nvfp4_common.cuh - what the Blackwell NVFP4 units share: the workspace carving and the
// grouped form's scale-row bases (host and device), the CUTLASS scale-factor config every
// architecture's mainloop must use, and the kernels that quantize the activation and build the
// grouped arguments. Included by cutlass_nvfp4_layout.cu (host code only) and by the arch units.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cutlass/detail/sm100_blockscaled_layout.hpp>

#include "cutlass_nvfp4.h"

namespace mg_nvfp4_cutlass {

// The scale-factor layout of both operands on sm_100 and sm_120 (one E4M3 scale per 16 values);
// each arch unit checks that its mainloop uses this very config.
using SfConfig = cutlass::detail::Sm1xxBlockScaledConfig<16>;

constexpr size_t kAlign = 256;
// Bytes of the grouped arguments of one expert (problem shape, six pointers, four strides, two
// scale layouts, one alpha pointer); the arch units static_assert that theirs fit.
constexpr size_t kGroupArgBytesPerExpert = 512;

__host__ __device__ inline size_t round_up(size_t x, size_t to) {
    return (x + to - 1) / to * to;
}

__host__ __device__ inline uint32_t moe_sf_row_base(uint32_t offset, uint32_t expert) {
    // round_up(off[e+1]) - round_up(off[e]) >= round_up(rows of e) - 128, so the extra 128 rows
    // per expert keep every expert's tiles apart.
    return (uint32_t)round_up(offset, 128) + 128u * expert;
}

// Bytes of one [rows, k] operand's scales in the 128x4 layout.
__host__ __device__ inline size_t sf_bytes(size_t rows, uint32_t k) {
    return round_up(rows, 128) * round_up(k / 16, 4);
}

// Where the activation quantizer writes scale (row, col) of a matrix with `cols` scale columns:
// the 128x4 layout of mg_nvfp4_swizzled_offset.
__host__ __device__ inline size_t sf_offset(uint32_t row, uint32_t col, uint32_t cols) {
    const size_t col_tiles = (cols + 3) / 4;
    const size_t tile = (size_t)(row / 128) * col_tiles + col / 4;
    return tile * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4;
}

// Its inverse, for the weight re-layout that writes every byte: the (row, col) byte `offset`
// holds (row or col beyond the matrix for padding).
__host__ __device__ inline void sf_position(size_t offset, uint32_t cols, uint32_t *row,
                                            uint32_t *col) {
    const size_t col_tiles = (cols + 3) / 4, tile = offset / 512, within = offset % 512;
    *row = (uint32_t)(tile / col_tiles) * 128 + (uint32_t)((within % 16) / 4) * 32 +
           (uint32_t)(within / 16);
    *col = (uint32_t)(tile % col_tiles) * 4 + (uint32_t)(within % 4);
}

inline mg_status workspace_layout(uint32_t rows, uint32_t experts, uint32_t k, bool grouped,
                                  mg_cutlass_nvfp4_workspace_layout *w) {
    if (rows == 0 || experts == 0 || k == 0 || k % 32 != 0 || (!grouped && experts != 1))
        return MG_ERR_INVALID_ARGUMENT;
    size_t at = 0;
    w->amax = at;
    at = round_up(at + 4, kAlign);
    w->alpha = at;
    at = round_up(at + 4 * (size_t)experts, kAlign);
    w->act_codes = at;
    at = round_up(at + (size_t)rows * (k / 2), kAlign);
    w->act_scales = at;
    // Dense: one matrix. Grouped: expert e's tiles from row moe_sf_row_base(offsets[e], e),
    // the last ending before round_up(rows, 128) + 128 * experts.
    w->act_scale_bytes =
        !grouped ? sf_bytes(rows, k) : sf_bytes(round_up(rows, 128) + 128 * (size_t)experts, k);
    at = round_up(at + w->act_scale_bytes, kAlign);
    w->group_args = at;
    if (grouped)
        at = round_up(at + kGroupArgBytesPerExpert * (size_t)experts, kAlign);
    w->cutlass = at;
    w->fixed_bytes = at;
    return MG_OK;
}

} // namespace mg_nvfp4_cutlass
