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

/* What the plan is sized from: the backend (ops report their workspaces for it), the model's
 * shape and weight format (`mlx`: its layer matrices run the MLX ops), and the run: tokens per pass
 * (the prompts' total, at least the batch), requests, KV pages, the prompts' tokens, decode steps,
 * each request's longest sequence (prompt + steps, batch entries), the KV page size and the paged
 * attention descriptor the passes plan with. */
typedef struct mg_fwd_plan_input {
    mg_backend *b;
    const mg_model_shape *shape;
    mg_fwd_weights weights;
    bool mlx, qk_norm;
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

/* The device bytes the arena of `in` takes (mg_arena_summary.device_bytes). */
mg_status mg_fwd_plan_bytes(const mg_fwd_plan_input *in, uint64_t *device_bytes);
/* Creates m->arena for `in` (the only device allocation of a pass) and fills every field the
 * table names: buffers the model does not use stay 0, and so do their sizes. */
mg_status mg_fwd_plan_create(mg_fwd *m, const mg_fwd_plan_input *in);

#endif
