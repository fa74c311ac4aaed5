/*
 * model_format.h - private to src/model: the weights seam. Each weight format of the forward
 * model (model.h: BF16, FP8 row-scaled, NVFP4, MLX affine) is one table of functions in a file
 * of its own (model_format_<name>.c); the pass (model_forward.c) and the config check
 * (model.c) call the table and never ask which format they hold.
 *
 * What a caller may rely on: a hook that is NULL means the format needs no such step
 * (prepare_input, mlp) or cannot run such a model (experts: no MoE presets, refused at create
 * with a message naming the format). Every hook launches on `s` and records its ops' timing
 * spans under model.h's names.
 */
#ifndef METRALE_MODEL_FORMAT_H
#define METRALE_MODEL_FORMAT_H

#include "model_internal.h"

#include "metrale/ops.h"
#include "metrale/ops_gemm.h"

struct mg_fwd_format {
    const char *name;
    /* The ops a backend must run for this format's dense layers and LM head, beyond the pass's
     * own (model.c), and for its experts (MoE presets; the router's BF16 GEMM, top-k and sort
     * included). A
     * format without moe_ops runs no MoE model. */
    const mg_op *ops;
    size_t op_count;
    const mg_op *moe_ops;
    size_t moe_op_count;
    /* Optional one-line refusals of a config the op list cannot express (MLX: a checkpoint
     * directory must exist). */
    mg_status (*check)(mg_backend *b, const mg_fwd_config *c);
    /* The device bytes of preset p's weights in weight format w, an estimate for the memory
     * check before anything is allocated. */
    double (*weight_bytes)(const mg_fwd_preset *p, mg_fwd_weights w);
    /* Optional: readies act[rows, k] as the input of the next GEMM(s) (FP8: quantized per
     * token); called before every linear group, the LM head's included. */
    mg_status (*prepare_input)(mg_fwd *m, mg_stream *s, uint32_t rows, uint32_t k, mg_devptr act);
    /* out[rows, n] = act[rows, k] times layer l's matrix `slot` (MG_FWD_WQ, WKV, WO, W_DOWN);
     * `prefill` says whether the pass is the prefill (NVFP4's BF16 path). */
    mg_status (*linear)(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t slot,
                        uint32_t rows, uint32_t n, uint32_t k, mg_devptr act, mg_devptr out);
    /* Dense MLP up to the down projection: mlp_act[rows, I] = silu(gate) * up of norm_out. */
    mg_status (*gate_up)(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t rows);
    /* Optional: the whole dense MLP, norm_out -> proj_out, for a format that fuses past the
     * gate_up (MLX: the gate_up GEMV makes silu(g) * u itself); gate_up is then not called. */
    mg_status (*mlp)(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows);
    /* The experts of MoE layer l (NULL exactly when moe_op_count is 0): norm_out's routed rows
     * (sorted_token_ids, expert_offsets) through gate_up with SiLU-mul into moe_act, then down into
     * moe_down. */
    mg_status (*experts)(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows);
    /* logits[rows, vocab] (pitch logits_pitch) of logits_hidden, and the argmax into step_ids. */
    mg_status (*lm_head)(mg_fwd *m, mg_stream *s, uint32_t rows);
    /* The logits lm_head writes are BF16 (else FP32). */
    bool bf16_logits;
    /* Its dense matrices are mg_gemm weights of kind gemm_kind (layer_tensor; row-wise FP8: with
     * their row scales in fp8_scales, the GEMM inputs quantized by prepare_input), so the decode
     * step may run them as fused mg_gemm calls (model_forward.c) instead of linear / gate_up. */
    bool fused_gemms;
    mg_gemm_kind gemm_kind;
};

extern const mg_fwd_format mg_fwd_format_bf16, mg_fwd_format_fp8, mg_fwd_format_nvfp4,
    mg_fwd_format_mlx;
/* NVFP4 layers with a BF16 LM head (a checkpoint's; model_format_nvfp4.c). */
extern const mg_fwd_format mg_fwd_format_nvfp4_float_head;
/* What a checkpoint (model_path) may need before it loads: ops only, no hooks (model_format.c). */
extern const mg_fwd_format mg_fwd_format_checkpoint;

/* The format config `c` asks for (MLX dequantized at load: BF16; a checkpoint:
 * mg_fwd_format_checkpoint), or NULL for an unknown weights value. */
const mg_fwd_format *mg_fwd_format_of_config(const mg_fwd_config *c);
/* The format m's loaded weights run (after mg_fwd_create_weights). */
const mg_fwd_format *mg_fwd_format_of_model(const mg_fwd *m);

/* Shared by the formats: the BF16 LM head (FP32 logits, argmax); gate_up as the format's
 * linear of w_gate_up into gate_up then the SiLU-mul op; the experts' grouped GEMMs of
 * metrale/ops_moe_gemm.h (BF16 or FP8 experts, by m's config); the preset's weight bytes with
 * `per_element` bytes per element of each quantized matrix (plus `per_row` per row), BF16
 * for the rest. */
mg_status mg_fwd_lm_head_bf16(mg_fwd *m, mg_stream *s, uint32_t rows);
mg_status mg_fwd_gate_up_unfused(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t rows);
mg_status mg_fwd_experts_grouped(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows);
double mg_fwd_weight_bytes_with(const mg_fwd_preset *p, double per_element, double per_row);

#endif
