/* model_format_bf16.c - BF16 weights (model.h): every matrix a BF16 GEMM, the experts
 * mg_moe_gemm's BF16 kind. */
#include "model_format.h"

#include "metrale/ops_gemm.h"

static mg_status bf16_linear(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t slot,
                             uint32_t rows, uint32_t n, uint32_t k, mg_devptr act, mg_devptr out) {
    (void)prefill;
    return mg_gemm_bf16(m->b, s, rows, n, k, act, *layer_tensor(m, l, slot), out, MG_DTYPE_BF16, n);
}

static double bf16_weight_bytes(const mg_fwd_preset *p, mg_fwd_weights w) {
    (void)w;
    return mg_fwd_weight_bytes_with(p, 2.0, 0.0);
}

static const mg_op bf16_ops[] = {MG_OP_GEMM_BF16, MG_OP_SILU_MUL};
static const mg_op bf16_moe_ops[] = {MG_OP_GEMM_BF16, MG_OP_MOE_ROUTING, MG_OP_MOE_GEMM};

const mg_fwd_format mg_fwd_format_bf16 = {
    .name = "bf16",
    .ops = bf16_ops,
    .op_count = sizeof bf16_ops / sizeof bf16_ops[0],
    .moe_ops = bf16_moe_ops,
    .moe_op_count = sizeof bf16_moe_ops / sizeof bf16_moe_ops[0],
    .weight_bytes = bf16_weight_bytes,
    .linear = bf16_linear,
    .gate_up = mg_fwd_gate_up_unfused,
    .experts = mg_fwd_experts_grouped,
    .lm_head = mg_fwd_lm_head_bf16,
    .fused_gemms = true,
    .gemm_kind = MG_GEMM_BF16,
};
