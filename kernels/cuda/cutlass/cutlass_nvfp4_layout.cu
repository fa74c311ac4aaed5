// cutlass_nvfp4_layout.cu - the Blackwell NVFP4 family's host-only code: the scale-factor layout
// exactly as CUTLASS computes it (the cute layout the sm_100 and sm_120 mainloops read), the
// index math the activation quantizer and the weight re-layout use on the device, the grouped
// form's scale-row bases and the workspace carving. No kernels and no GPU needed, so the
// tests check them against the library's own swizzle (metrale/nvfp4.h) on any machine.
#include <cute/tensor.hpp>

#include "cutlass_nvfp4_common.cuh"

namespace {

template <class Layout>
int64_t checked_offset(const Layout &layout, uint32_t row, uint32_t kblock) {
    // Coordinates (row, k element, batch 0): the layout maps all 16 k of a block to one scale.
    return (int64_t)layout(cute::make_coord((int)row, (int)kblock * 16, 0));
}

} // namespace

MG_PLUGIN_EXPORT size_t mg_cutlass_nvfp4_layout_sf_bytes(uint32_t rows, uint32_t k) {
    if (rows == 0 || k == 0 || k % 16 != 0)
        return 0;
    auto layout = mg_nvfp4_cutlass::SfConfig::tile_atom_to_shape_SFA(
        cute::make_shape((int)rows, 1, (int)k, 1));
    return (size_t)cute::cosize(layout);
}

MG_PLUGIN_EXPORT int64_t mg_cutlass_nvfp4_layout_sf_offset(uint32_t rows, uint32_t k, int is_b,
                                                           uint32_t row, uint32_t kblock) {
    if (rows == 0 || k == 0 || k % 16 != 0 || row >= rows || kblock >= k / 16)
        return -1;
    using Cfg = mg_nvfp4_cutlass::SfConfig;
    if (is_b)
        return checked_offset(
            Cfg::tile_atom_to_shape_SFB(cute::make_shape(1, (int)rows, (int)k, 1)), row, kblock);
    return checked_offset(Cfg::tile_atom_to_shape_SFA(cute::make_shape((int)rows, 1, (int)k, 1)),
                          row, kblock);
}

MG_PLUGIN_EXPORT uint32_t mg_cutlass_nvfp4_layout_moe_sf_row_base(uint32_t offset,
                                                                  uint32_t expert) {
    return mg_nvfp4_cutlass::moe_sf_row_base(offset, expert);
}

MG_PLUGIN_EXPORT mg_status
mg_cutlass_nvfp4_layout_workspace(uint32_t rows, uint32_t experts, uint32_t k, int grouped,
                                  mg_cutlass_nvfp4_workspace_layout *out) {
    if (!out)
        return MG_ERR_INVALID_ARGUMENT;
    return mg_nvfp4_cutlass::workspace_layout(rows, experts, k, grouped != 0, out);
}

MG_PLUGIN_EXPORT int64_t mg_cutlass_nvfp4_layout_act_sf_offset(uint32_t row, uint32_t col,
                                                               uint32_t cols) {
    return (int64_t)mg_nvfp4_cutlass::sf_offset(row, col, cols);
}

MG_PLUGIN_EXPORT void mg_cutlass_nvfp4_layout_sf_position(size_t offset, uint32_t cols,
                                                          uint32_t *row, uint32_t *col) {
    mg_nvfp4_cutlass::sf_position(offset, cols, row, col);
}
