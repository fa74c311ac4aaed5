/* registry.c - every check group, in the order `metrale-gpu check` runs them. */
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
