// cutlass_moe_sm90_fp8_rowwise.cu - the FP8 Hopper grouped MoE GEMM with one scale per weight row
// and per activation row (cutlass_moe_sm90.h; how it works: cutlass_moe_sm90_fp8.cuh). One kernel
// instantiation.
#include "cutlass_moe_sm90_fp8.cuh"

MG_MOE_FP8_GEMM(RowGemm, 1)
using RowUnit = mg_moe_fp8::FP8Unit<MG_CUTLASS_MOE_FP8_ROWWISE, RowGemm>;

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_fp8_rowwise_workspace(
    const mg_cutlass_moe_problem *p, size_t *bytes, mg_plugin_error *err) {
    return mg_moe::unit_workspace<RowUnit>("mg_cutlass_moe_sm90_fp8_rowwise_workspace", p, bytes,
                                           err);
}

MG_PLUGIN_EXPORT mg_status mg_cutlass_moe_sm90_fp8_rowwise_run(const mg_cutlass_moe_problem *p,
                                                               void *stream, mg_plugin_error *err) {
    return mg_moe::unit_run<RowUnit>("mg_cutlass_moe_sm90_fp8_rowwise_run", p, stream, err);
}
