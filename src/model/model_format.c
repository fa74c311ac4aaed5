/* model_format.c - what the weight formats (model_format.h) share, and which one a config or a
 * loaded model runs. */
#include "model_format.h"

#include "metrale/ops_activation.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_moe_gemm.h"
#include "metrale/status.h"

const mg_fwd_format *mg_fwd_format_of_config(const mg_fwd_config *c) {
    switch (c->weights) {
    case MG_FWD_WEIGHTS_BF16:
        return &mg_fwd_format_bf16;
    case MG_FWD_WEIGHTS_FP8:
        return &mg_fwd_format_fp8;
    case MG_FWD_WEIGHTS_NVFP4:
        return &mg_fwd_format_nvfp4;
    case MG_FWD_WEIGHTS_MLX8:
    case MG_FWD_WEIGHTS_MLX4:
        return c->mlx_dequantized ? &mg_fwd_format_bf16 : &mg_fwd_format_mlx;
    case MG_FWD_WEIGHTS_CHECKPOINT:
        return &mg_fwd_format_checkpoint;
    }
    return NULL;
}

const mg_fwd_format *mg_fwd_format_of_model(const mg_fwd *m) {
    if (m->mlx)
        return &mg_fwd_format_mlx;
    if (m->fp8_scales)
        return &mg_fwd_format_fp8;
    if (m->fp4) /* an NVFP4 checkpoint may keep its LM head float */
        return m->lm_head_fp4.values ? &mg_fwd_format_nvfp4 : &mg_fwd_format_nvfp4_float_head;
    return &mg_fwd_format_bf16; /* BF16 presets, MLX dequantized, BF16 checkpoints */
}

mg_status mg_fwd_lm_head_bf16(mg_fwd *m, mg_stream *s, uint32_t rows) {
    if (m->tp_ranks > 1) /* this rank's vocabulary slice, gathered */
        return mg_fwd_tp_lm_head(m, s, rows);
    const mg_model_shape *sh = &m->sh;
    OP("lm_head", TRY(mg_gemm_bf16(m->b, s, rows, sh->vocab, sh->hidden, m->logits_hidden,
                                   m->lm_head, m->logits, MG_DTYPE_F32, m->logits_pitch),
                      "LM head"));
    OP("argmax",
       TRY(mg_argmax_f32(m->b, s, rows, sh->vocab, m->logits, m->logits_pitch, m->step_ids),
           "argmax"));
    return MG_OK;
}

mg_status mg_fwd_gate_up_unfused(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t rows) {
    const uint32_t I = m->sh.intermediate, H = m->sh.hidden;
    const mg_fwd_format *f = m->format;
    OP("gate_up",
       TRY(f->linear(m, s, prefill, l, MG_FWD_W_GATE_UP, rows, 2 * I, H, m->norm_out, m->gate_up),
           "gate_up projection"));
    OP("silu_mul",
       TRY(mg_silu_mul_bf16(m->b, s, rows, I, m->gate_up, 2 * I, m->mlp_act, I), "SiLU-mul"));
    return MG_OK;
}

mg_status mg_fwd_experts_grouped(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows) {
    const size_t gu = (size_t)l * MG_FWD_LAYER_TENSORS + MG_FWD_W_GATE_UP;
    const size_t dn = (size_t)l * MG_FWD_LAYER_TENSORS + MG_FWD_W_DOWN;
    mg_moe_gemm_desc gd = mg_fwd_moe_gemm_desc(&m->sh, m->c.weights, true, rows);
    mg_moe_gemm_tensors gt = {.act = m->norm_out,
                              .sorted_token_ids = m->sorted_token_ids,
                              .expert_offsets = m->expert_offsets,
                              .weight = m->layer_w[gu],
                              .weight_scale = m->fp8_scales ? m->fp8_scales[gu] : 0,
                              .out = m->moe_act,
                              .workspace = m->moe_gemm_workspace,
                              .workspace_bytes = m->moe_gemm_workspace_bytes};
    OP("moe_gate_up", TRY(mg_moe_gemm(m->b, s, &gd, &gt), "experts' gate_up with SiLU-mul"));
    mg_moe_gemm_desc dd = mg_fwd_moe_gemm_desc(&m->sh, m->c.weights, false, rows);
    mg_moe_gemm_tensors dt = {.act = m->moe_act,
                              .expert_offsets = m->expert_offsets,
                              .weight = m->layer_w[dn],
                              .weight_scale = m->fp8_scales ? m->fp8_scales[dn] : 0,
                              .out = m->moe_down,
                              .workspace = m->moe_gemm_workspace,
                              .workspace_bytes = m->moe_gemm_workspace_bytes};
    OP("moe_down", TRY(mg_moe_gemm(m->b, s, &dd, &dt), "experts' down"));
    return MG_OK;
}

double mg_fwd_weight_bytes_with(const mg_fwd_preset *p, double per_element, double per_row) {
    double total = 2.0 * p->shape.vocab * p->shape.hidden; /* the BF16 embedding table */
    for (uint32_t l = 0; l < p->layers; l++)
        for (uint32_t slot = 0; slot < MG_FWD_LAYER_TENSORS; slot++) {
            uint32_t rows = 0, cols = 0;
            float offset, scale;
            if ((slot == MG_FWD_ROUTER && !p->shape.experts) ||
                mg_fwd_tensor_shape(&p->shape, p->layers, mg_fwd_layer_tensor(l, slot), &rows,
                                    &cols, &offset, &scale))
                continue;
            const bool quantized = mg_fwd_is_quantized_matrix(slot);
            total += (double)rows * cols * (quantized ? per_element : 2.0);
            total += quantized ? per_row * rows : 0.0;
        }
    /* the LM head, quantized like the matrices */
    return total + (double)p->shape.vocab * (p->shape.hidden * per_element + per_row);
}

/* A checkpoint's matrices are BF16 or MLX (its experts BF16) and known only once it loads, so
 * create checks what either may need; the loaded model then runs the table
 * mg_fwd_format_of_model picks. Only checked against: it has no hooks. */
static const mg_op checkpoint_ops[] = {MG_OP_MLX_QUANT, MG_OP_GEMM_BF16, MG_OP_SILU_MUL};
static const mg_op checkpoint_moe_ops[] = {MG_OP_GEMM_BF16, MG_OP_MOE_ROUTING, MG_OP_MOE_GEMM};

const mg_fwd_format mg_fwd_format_checkpoint = {
    .name = "checkpoint",
    .ops = checkpoint_ops,
    .op_count = sizeof checkpoint_ops / sizeof checkpoint_ops[0],
    .moe_ops = checkpoint_moe_ops,
    .moe_op_count = sizeof checkpoint_moe_ops / sizeof checkpoint_moe_ops[0],
};
