/* model_format_mlx.c - MLX affine weights (model.h, model_mlx.h): the layer matrices run the MLX
 * GEMVs (decode rows) or mg_mlx_gemm through the arena's scratch (prefill), the decode MLP as
 * the gate_up GEMV with the SiLU-mul epilogue and a plain down GEMV (layers with biases: the
 * down GEMV fused with silu(g) * u); the LM head stays BF16. Dense models
 * only: no experts. Checkpoints are checked as this format (their matrices may be MLX). */
#include "model_format.h"

#include "metrale/status.h"

static mg_status mlx_linear(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t slot,
                            uint32_t rows, uint32_t n, uint32_t k, mg_devptr act, mg_devptr out) {
    (void)prefill, (void)n, (void)k;
    return mg_fwd_mlx_linear(m->mlx, s, l, slot, rows, act, out);
}

static mg_status mlx_mlp(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows) {
    OP("mlp",
       TRY(mg_fwd_mlx_mlp(m->mlx, s, l, rows, m->norm_out, m->gate_up, m->mlp_act, m->proj_out),
           "MLP"));
    return MG_OK;
}

static mg_status mlx_gate_up(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t rows) {
    (void)m, (void)s, (void)prefill, (void)l, (void)rows;
    return mg_error_report(MG_ERR_INTERNAL, "MLX weights run their MLP whole");
}

static mg_status mlx_check(mg_backend *b, const mg_fwd_config *c) {
    return c->weights == MG_FWD_WEIGHTS_CHECKPOINT ? MG_OK : mg_fwd_mlx_check_config(b, c);
}

static double mlx_weight_bytes(const mg_fwd_preset *p, mg_fwd_weights w) {
    /* the packed values and, per group of 32 or more, a BF16 scale and bias */
    return mg_fwd_weight_bytes_with(p, w == MG_FWD_WEIGHTS_MLX4 ? 0.5625 : 1.0625, 0.0);
}

static const mg_op mlx_ops[] = {MG_OP_MLX_QUANT, MG_OP_GEMM_BF16, MG_OP_SILU_MUL};

const mg_fwd_format mg_fwd_format_mlx = {
    .name = "mlx",
    .ops = mlx_ops,
    .op_count = sizeof mlx_ops / sizeof mlx_ops[0],
    .check = mlx_check,
    .weight_bytes = mlx_weight_bytes,
    .linear = mlx_linear,
    .gate_up = mlx_gate_up,
    .mlp = mlx_mlp,
    .lm_head = mg_fwd_lm_head_bf16,
};
