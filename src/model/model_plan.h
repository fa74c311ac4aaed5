/*
 * model_plan.h - private to src/model: the forward model's memory plan (model_plan.c), the one
 * description of every device buffer of a pass. The memory check before the weights load and
 * mg_fwd_create size the same plan from the same input.
 */
#ifndef METRALE_MODEL_PLAN_H
#define METRALE_MODEL_PLAN_H

#include "model_internal.h"

#include "metrale/ops_kv_cache.h"
#include "metrale/ops_moe_gemm.h"

/* Steps of the pass that lifetimes in the plan refer to. The layer body (ATTN_NORM ..
 * MOE_COMBINE) repeats for every layer over the same buffers, so a buffer is layer-local only
 * when it is written and last read within one layer; anything read across layers lives the
 * whole pass. Dense models use the MLP_* steps, MoE models the MOE_* steps with the same
 * numbers. */
typedef enum mg_model_step {
    MG_STEP_EMBED = 0,          /* token embedding -> residual */
    MG_STEP_ATTN_NORM = 1,      /* residual (+= proj_out) -> norm_out */
    MG_STEP_QKV_PROJ = 2,       /* norm_out -> qkv (Qwen3: k_normed) */
    MG_STEP_ROPE = 3,           /* qkv in place */
    MG_STEP_KV_WRITE = 4,       /* k, v -> KV cache */
    MG_STEP_ATTENTION = 5,      /* q + paged KV cache -> attn_out */
    MG_STEP_O_PROJ = 6,         /* attn_out -> proj_out */
    MG_STEP_MLP_NORM = 7,       /* residual += proj_out; -> norm_out */
    MG_STEP_MLP_GATE_UP = 8,    /* dense: norm_out -> gate_up (NVFP4: mlp_act) */
    MG_STEP_MLP_ACT = 9,        /* dense: silu(gate) * up -> mlp_act */
    MG_STEP_MLP_DOWN = 10,      /* dense: mlp_act -> proj_out */
    MG_STEP_MOE_ROUTER = 8,     /* MoE: norm_out -> router_logits */
    MG_STEP_MOE_TOPK = 9,       /* router_logits -> topk_ids, topk_weights */
    MG_STEP_MOE_ALIGN = 10,     /* the sort: sorted_token_ids, expert_offsets, pair positions */
    MG_STEP_MOE_PERMUTE = 11,   /* (none: the experts read norm_out's rows directly) */
    MG_STEP_MOE_GATE_UP = 12,   /* grouped GEMM with SiLU-mul -> moe_act */
    MG_STEP_MOE_ACT = 13,       /* (fused into the gate_up) */
    MG_STEP_MOE_DOWN = 14,      /* grouped GEMM -> moe_down */
    MG_STEP_MOE_COMBINE = 15,   /* weighted sum of moe_down rows -> proj_out */
    MG_STEP_LOGITS_GATHER = 16, /* last rows of residual + proj_out -> logits_hidden */
    MG_STEP_FINAL_NORM = 17,    /* logits_hidden in place */
    MG_STEP_LM_HEAD = 18,       /* logits_hidden -> logits */
    MG_STEP_SAMPLE = 19,        /* logits -> step_ids */
} mg_model_step;

/* What the plan is sized from: the backend (ops report their workspaces for it), the model's
 * shape and weight format (`mlx`: its layer matrices run the MLX ops), and the run: tokens per pass
 * (the prompts' total, at least the batch), requests, KV pages, the prompts' tokens, decode steps,
 * each request's longest sequence (prompt + steps, batch entries), the KV page size and the paged
 * attention descriptor the passes plan with. */
typedef struct mg_fwd_plan_input {
    mg_backend *b;
    const mg_model_shape *shape; /* this rank's (model_internal.h: mg_fwd.sh) */
    uint32_t tp_ranks;           /* tensor parallelism: the LM head's logits slices; 1: none */
    mg_fwd_weights weights;
    bool mlx, qk_norm;
    bool rope_table; /* a scaled RoPE's frequency table (mg_fwd_preset.rope_llama3) */
    uint32_t tokens, batch, pages;
    uint64_t prompt_tokens;
    uint32_t steps;
    const uint32_t *seq_len;
    uint32_t page_size;
    const mg_paged_attention_desc *attention;
} mg_fwd_plan_input;

/* The logits' row pitch in elements: the vocabulary rounded up to 8, as the argmax ops need a
 * pitch that is a multiple of 4 (FP32) or 8 (BF16) whatever the vocabulary. */
static inline uint32_t mg_fwd_logits_pitch(uint32_t vocab) {
    return (vocab + 7) / 8 * 8;
}

/* The plan of `in` (the caller destroys it), and the device bytes its arena takes
 * (mg_arena_summary.device_bytes). */
mg_status mg_fwd_plan_build(const mg_fwd_plan_input *in, mg_arena_plan **out);
mg_status mg_fwd_plan_bytes(const mg_fwd_plan_input *in, uint64_t *device_bytes);
/* Creates m->arena for `in` (the only device allocation of a pass) and fills every field the
 * table names: buffers the model does not use stay 0, and so do their sizes. */
mg_status mg_fwd_plan_create(mg_fwd *m, const mg_fwd_plan_input *in);

#endif
