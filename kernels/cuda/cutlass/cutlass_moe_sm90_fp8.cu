// cutlass_moe_sm90_fp8.cu - the FP8 Hopper grouped MoE GEMM with 128x128 block-scaled weights
// (cutlass_moe_sm90.h; how it works: cutlass_moe_sm90_fp8.cuh). One kernel instantiation.
#include "cutlass_moe_sm90_fp8.cuh"

MG_MOE_FP8_GEMM(BlockGemm, 128)
using BlockUnit = mg_moe_fp8::FP8Unit<MG_CUTLASS_MOE_FP8_BLOCKSCALED, BlockGemm>;

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_fp8_workspace(const mg_cutlass_moe_problem *p,
                                                             size_t *bytes, mg_plugin_error *err) {
    return mg_moe::unit_workspace<BlockUnit>("mg_cutlass_moe_sm90_fp8_workspace", p, bytes, err);
}

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_fp8_run(const mg_cutlass_moe_problem *p,
                                                       void *stream, mg_plugin_error *err) {
    return mg_moe::unit_run<BlockUnit>("mg_cutlass_moe_sm90_fp8_run", p, stream, err);
}
