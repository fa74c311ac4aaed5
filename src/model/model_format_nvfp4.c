/* model_format_nvfp4.c - NVFP4 weights (model.h): prepared E2M1 values with E4M3 block scales
 * and a global scale per tensor; the prefill's GEMMs expand a weight to BF16 in the arena's
 * workspace (mg_nvfp4_gemm_with_workspace), decode steps decode it in the GEMM tiles; the MLP's
 * gate_up is fused with SiLU-mul; the experts run mg_nvfp4_moe_gemm; BF16 logits. */
#include "model_format.h"

#include "metrale/ops_elementwise.h"
#include "metrale/ops_nvfp4.h"

/* The NVFP4 matrix of layer slot `slot` (w_gate_up: its gate half; FP4_UP follows it). */
static const mg_nvfp4_weight *fp4_weight(const mg_fwd *m, uint32_t l, uint32_t slot) {
    const uint32_t fp4 = slot == MG_FWD_WQ       ? FP4_Q
                         : slot == MG_FWD_WKV    ? FP4_KV
                         : slot == MG_FWD_WO     ? FP4_O
                         : slot == MG_FWD_W_DOWN ? FP4_DOWN
                                                 : FP4_GATE;
    return &m->fp4[(size_t)l * FP4_SLOTS + fp4];
}

static mg_status nvfp4_gemm(mg_fwd *m, mg_stream *s, bool prefill, const mg_nvfp4_weight *w,
                            uint32_t rows, uint32_t n, uint32_t k, mg_devptr act, mg_devptr out,
                            uint32_t ldc) {
    if (prefill && m->prefill_workspace)
        return mg_nvfp4_gemm_with_workspace(m->b, s, rows, n, k, act, k, w, out, ldc,
                                            m->prefill_workspace, m->prefill_workspace_bytes);
    return mg_nvfp4_gemm(m->b, s, rows, n, k, act, k, w, out, ldc);
}

static mg_status nvfp4_linear(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t slot,
                              uint32_t rows, uint32_t n, uint32_t k, mg_devptr act, mg_devptr out) {
    const mg_nvfp4_weight *w = fp4_weight(m, l, slot), *v = &m->fp4[(size_t)l * FP4_SLOTS + FP4_V];
    if (slot != MG_FWD_WKV || !v->values)
        return nvfp4_gemm(m, s, prefill, w, rows, n, k, act, out, n);
    /* k and v with global scales of their own (a checkpoint's): the k columns of each output
     * row, then the v columns, each weight exactly as stored */
    mg_status st = nvfp4_gemm(m, s, prefill, w, rows, n / 2, k, act, out, n);
    return st ? st : nvfp4_gemm(m, s, prefill, v, rows, n / 2, k, act, out + (n / 2) * 2, n);
}

static mg_status nvfp4_gate_up(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t rows) {
    (void)prefill;
    const uint32_t I = m->sh.intermediate, H = m->sh.hidden;
    const mg_nvfp4_weight *fw = &m->fp4[(size_t)l * FP4_SLOTS];
    OP("gate_up", TRY(mg_nvfp4_gemm_gate_up(m->b, s, rows, I, H, m->norm_out, H, &fw[FP4_GATE],
                                            &fw[FP4_UP], m->mlp_act, I),
                      "gate_up projection with SiLU-mul"));
    return MG_OK;
}

static mg_status nvfp4_experts(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows) {
    const mg_model_shape *sh = &m->sh;
    const uint32_t E = sh->experts, K = sh->experts_per_token, H = sh->hidden, I = sh->intermediate;
    const mg_nvfp4_weight *fw = &m->fp4[(size_t)l * FP4_SLOTS];
    mg_nvfp4_moe_desc gd = {.experts = E, .rows = rows * K, .act_rows = rows, .n = I, .k = H};
    mg_nvfp4_moe_tensors gt = {.act = m->norm_out,
                               .sorted_token_ids = m->sorted_token_ids,
                               .expert_offsets = m->expert_offsets,
                               .w = fw[FP4_GATE],
                               .up = &fw[FP4_UP],
                               .out = m->moe_act};
    OP("moe_gate_up", TRY(mg_nvfp4_moe_gemm(m->b, s, &gd, &gt), "experts' gate_up with SiLU-mul"));
    mg_nvfp4_moe_desc dd = {.experts = E, .rows = rows * K, .act_rows = rows * K, .n = H, .k = I};
    mg_nvfp4_moe_tensors dt = {.act = m->moe_act,
                               .expert_offsets = m->expert_offsets,
                               .w = fw[FP4_DOWN],
                               .out = m->moe_down};
    OP("moe_down", TRY(mg_nvfp4_moe_gemm(m->b, s, &dd, &dt), "experts' down"));
    return MG_OK;
}

static mg_status nvfp4_lm_head(mg_fwd *m, mg_stream *s, uint32_t rows) {
    const mg_model_shape *sh = &m->sh;
    OP("lm_head", TRY(mg_nvfp4_gemm(m->b, s, rows, sh->vocab, sh->hidden, m->logits_hidden,
                                    sh->hidden, &m->lm_head_fp4, m->logits, m->logits_pitch),
                      "LM head"));
    OP("argmax",
       TRY(mg_argmax_bf16(m->b, s, rows, sh->vocab, m->logits, m->logits_pitch, m->step_ids),
           "argmax"));
    return MG_OK;
}

static double nvfp4_weight_bytes(const mg_fwd_preset *p, mg_fwd_weights w) {
    (void)w;
    return mg_fwd_weight_bytes_with(p, 0.5625, 0.0); /* 4-bit values, an E4M3 scale per 16 */
}

static const mg_op nvfp4_ops[] = {MG_OP_NVFP4_FORMAT, MG_OP_NVFP4_GEMM};
static const mg_op nvfp4_moe_ops[] = {MG_OP_GEMM_BF16, MG_OP_MOE_ROUTING, MG_OP_NVFP4_MOE_GEMM};

/* An NVFP4 checkpoint whose LM head stayed float (ModelOpt's and compressed-tensors' usual
 * `ignore: ["lm_head"]`, or a tied embedding): the NVFP4 layers, the BF16 head's FP32 logits. */
const mg_fwd_format mg_fwd_format_nvfp4_float_head = {
    .name = "nvfp4",
    .ops = nvfp4_ops,
    .op_count = sizeof nvfp4_ops / sizeof nvfp4_ops[0],
    .weight_bytes = nvfp4_weight_bytes,
    .linear = nvfp4_linear,
    .gate_up = nvfp4_gate_up,
    .lm_head = mg_fwd_lm_head_bf16,
};

const mg_fwd_format mg_fwd_format_nvfp4 = {
    .name = "nvfp4",
    .ops = nvfp4_ops,
    .op_count = sizeof nvfp4_ops / sizeof nvfp4_ops[0],
    .moe_ops = nvfp4_moe_ops,
    .moe_op_count = sizeof nvfp4_moe_ops / sizeof nvfp4_moe_ops[0],
    .weight_bytes = nvfp4_weight_bytes,
    .linear = nvfp4_linear,
    .gate_up = nvfp4_gate_up,
    .experts = nvfp4_experts,
    .lm_head = nvfp4_lm_head,
    .bf16_logits = true,
};
