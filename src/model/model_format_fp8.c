/* model_format_fp8.c - FP8 weights (model.h): E4M3 codes with one FP32 scale per row, every GEMM
 * input quantized per token just before (prepare_input), the experts mg_moe_gemm's FP8
 * row-wise kind (which quantizes its own input), BF16 logits. */
#include "model_format.h"

#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_quantize.h"
#include "metrale/status.h"

static mg_status fp8_prepare(mg_fwd *m, mg_stream *s, uint32_t rows, uint32_t k, mg_devptr act) {
    mg_fp8_quant_desc d = {.mode = MG_FP8_QUANT_ROW, .rows = rows, .cols = k};
    m->act_fp8_source = act;
    m->act_fp8_rows = rows;
    OP("fp8_quant",
       TRY(mg_fp8_quantize(m->b, s, &d, act, m->act_fp8, m->act_scales), "quantizing to FP8"));
    return MG_OK;
}

/* act must be what fp8_prepare quantized last (a pass that skipped it is a bug here). */
static mg_status fp8_linear(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t slot,
                            uint32_t rows, uint32_t n, uint32_t k, mg_devptr act, mg_devptr out) {
    (void)prefill;
    if (m->act_fp8_source != act || m->act_fp8_rows != rows)
        return mg_error_report(MG_ERR_INTERNAL, "forward model: FP8 GEMM input not quantized");
    return mg_gemm_fp8_rowwise(m->b, s, rows, n, k, m->act_fp8, m->act_scales,
                               *layer_tensor(m, l, slot),
                               m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS + slot], out, n);
}

static mg_status fp8_lm_head(mg_fwd *m, mg_stream *s, uint32_t rows) {
    const mg_model_shape *sh = &m->sh;
    mg_status st = fp8_prepare(m, s, rows, sh->hidden, m->logits_hidden);
    if (st)
        return st;
    OP("lm_head",
       TRY(mg_gemm_fp8_rowwise(m->b, s, rows, sh->vocab, sh->hidden, m->act_fp8, m->act_scales,
                               m->lm_head, m->lm_head_scales, m->logits, m->logits_pitch),
           "LM head"));
    OP("argmax",
       TRY(mg_argmax_bf16(m->b, s, rows, sh->vocab, m->logits, m->logits_pitch, m->step_ids),
           "argmax"));
    return MG_OK;
}

static double fp8_weight_bytes(const mg_fwd_preset *p, mg_fwd_weights w) {
    (void)w;
    return mg_fwd_weight_bytes_with(p, 1.0, 4.0); /* codes, and an FP32 scale per row */
}

static const mg_op fp8_ops[] = {MG_OP_GEMM_FP8, MG_OP_FP8_QUANTIZE, MG_OP_SILU_MUL};
static const mg_op fp8_moe_ops[] = {MG_OP_GEMM_BF16, MG_OP_MOE_ROUTING, MG_OP_MOE_GEMM};

const mg_fwd_format mg_fwd_format_fp8 = {
    .name = "fp8",
    .ops = fp8_ops,
    .op_count = sizeof fp8_ops / sizeof fp8_ops[0],
    .moe_ops = fp8_moe_ops,
    .moe_op_count = sizeof fp8_moe_ops / sizeof fp8_moe_ops[0],
    .weight_bytes = fp8_weight_bytes,
    .prepare_input = fp8_prepare,
    .linear = fp8_linear,
    .gate_up = mg_fwd_gate_up_unfused,
    .experts = mg_fwd_experts_grouped,
    .lm_head = fp8_lm_head,
    .bf16_logits = true,
    .fused_gemms = true,
    .gemm_kind = MG_GEMM_FP8_ROWWISE,
};
