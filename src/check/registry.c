/* registry.c - every check group, in the order `metrale-gpu check` runs them, and the ops
 * their checks need (check.h). */
#include "check.h"

extern const mg_check_case mg_checks_conformance[];
extern const mg_check_case mg_checks_gemm[];
extern const mg_check_case mg_checks_gemm_fusion[];
extern const mg_check_case mg_checks_quantize[];
extern const mg_check_case mg_checks_attention[];
extern const mg_check_case mg_checks_activation[];
extern const mg_check_case mg_checks_nvfp4_format[];
extern const mg_check_case mg_checks_moe_routing[];
extern const mg_check_case mg_checks_nvfp4_gemm[];
extern const mg_check_case mg_checks_mlx[];
extern const mg_check_case mg_checks_kv_cache[];
extern const mg_check_case mg_checks_elementwise[];
extern const mg_check_case mg_checks_moe_gemm[];

const mg_check_case *const mg_check_groups[] = {
    mg_checks_conformance,
    mg_checks_gemm,
    mg_checks_gemm_fusion, /* group "gemm" too: the fused GEMMs */
    mg_checks_quantize,
    mg_checks_attention,
    mg_checks_activation,
    mg_checks_nvfp4_format,
    mg_checks_moe_routing,
    mg_checks_nvfp4_gemm,
    mg_checks_mlx,
    mg_checks_kv_cache,
    mg_checks_elementwise,
    mg_checks_moe_gemm,
    NULL,
};

const mg_check_needs mg_check_needs_table[] = {
    {"quantize/", {MG_OP_FP8_QUANTIZE}, 1},
    {"attention/", {MG_OP_ATTENTION_RAGGED}, 1},
    {"activation/", {MG_OP_SILU_MUL}, 1},
    {"nvfp4_format/", {MG_OP_NVFP4_FORMAT}, 1},
    {"moe_routing/", {MG_OP_MOE_ROUTING}, 1},
    {"nvfp4_gemm/", {MG_OP_NVFP4_GEMM}, 1},
    {"nvfp4_gemm/moe", {MG_OP_NVFP4_MOE_GEMM}, 1},
    {"mlx/", {MG_OP_MLX_QUANT}, 1},
    {"mlx/gemm", {MG_OP_GEMM_BF16}, 1},
    {"kv_cache/", {MG_OP_KV_APPEND, MG_OP_ATTENTION_PAGED}, 2},
    {"elementwise/gather", {MG_OP_GATHER_ROWS}, 1},
    {"elementwise/rmsnorm", {MG_OP_RMSNORM}, 1},
    {"elementwise/argmax", {MG_OP_ARGMAX}, 1},
    {"moe_gemm/", {MG_OP_MOE_GEMM}, 1},
    {NULL, {MG_OP_GEMM_BF16}, 0},
};
