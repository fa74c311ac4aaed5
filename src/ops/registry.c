/* registry.c - the ops of this library, one line each (op_registry.h). */
#include "op_registry.h"

extern const mg_op_def mg_gemm_bf16_op, mg_gemm_fp8_op, mg_attention_ragged_op, mg_fp8_quantize_op,
    mg_silu_mul_op, mg_mlx_quant_op;
extern const mg_op_def mg_nvfp4_format_op, mg_moe_routing_op, mg_nvfp4_gemm_op,
    mg_nvfp4_moe_gemm_op;
extern const mg_op_def mg_kv_append_op, mg_attention_paged_op;
extern const mg_op_def mg_gather_rows_op, mg_rmsnorm_op, mg_argmax_op, mg_fill_uniform_op,
    mg_amax_op;
extern const mg_op_def mg_moe_gemm_op;
extern const mg_op_def mg_sample_op;
extern const mg_op_def mg_comm_op;

const mg_op_def *const mg_op_defs[MG_OP_COUNT] = {
    [MG_OP_GEMM_BF16] = &mg_gemm_bf16_op,
    [MG_OP_GEMM_FP8] = &mg_gemm_fp8_op,
    [MG_OP_ATTENTION_RAGGED] = &mg_attention_ragged_op,
    [MG_OP_FP8_QUANTIZE] = &mg_fp8_quantize_op,
    [MG_OP_SILU_MUL] = &mg_silu_mul_op,
    [MG_OP_NVFP4_FORMAT] = &mg_nvfp4_format_op,
    [MG_OP_MOE_ROUTING] = &mg_moe_routing_op,
    [MG_OP_NVFP4_GEMM] = &mg_nvfp4_gemm_op,
    [MG_OP_NVFP4_MOE_GEMM] = &mg_nvfp4_moe_gemm_op,
    [MG_OP_MLX_QUANT] = &mg_mlx_quant_op,
    [MG_OP_KV_APPEND] = &mg_kv_append_op,
    [MG_OP_ATTENTION_PAGED] = &mg_attention_paged_op,
    [MG_OP_GATHER_ROWS] = &mg_gather_rows_op,
    [MG_OP_RMSNORM] = &mg_rmsnorm_op,
    [MG_OP_ARGMAX] = &mg_argmax_op,
    [MG_OP_MOE_GEMM] = &mg_moe_gemm_op,
    [MG_OP_SAMPLE] = &mg_sample_op,
    [MG_OP_COMM] = &mg_comm_op,
    [MG_OP_FILL_UNIFORM] = &mg_fill_uniform_op,
    [MG_OP_AMAX] = &mg_amax_op,
};
