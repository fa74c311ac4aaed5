/*
 * model_plan.c - the memory plan of the forward model: the one table that describes every
 * device buffer a pass uses (name, size rule, lifetime, the mg_fwd field it fills), planned
 * into one arena (metrale/arena.h). Nothing else in src/model decides a pass's buffers: the
 * ops' workspaces (paged attention, the NVFP4 prefill's BF16 expansion, the MLX GEMM's
 * dequantized matrix, the experts' sort and grouped GEMMs) are rows of this table, and the
 * memory check before the weights load sizes the same plan. The weights and the KV pool are
 * the model's only other device memory.
 *
 * Lifetimes are steps of the pass (mg_model_step): the layer body repeats over the same
 * buffers, so a buffer with a lifetime is written and last read within one layer; buffers
 * without one (whole pass) are read across layers or across passes (ids, page tables, the
 * attention plans' workspace) or read by the caller after the pass (logits, final hidden).
 * Row counts: Mp = ceil16(tokens per pass) for every activation a GEMM writes, as cuBLASLt's
 * kernels are tuned for; the LM head's rows ceil16(batch).
 */
#include "model_plan.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/mlx.h"
#include "metrale/ops_moe.h"
#include "metrale/ops_moe_gemm.h"
#include "metrale/ops_nvfp4.h"
#include "metrale/status.h"

static uint64_t ceil16(uint64_t v) {
    return (v + 15) / 16 * 16;
}

static uint64_t max_u64(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

/* The numbers every size rule reads. */
typedef struct plan_dims {
    uint64_t M, Mp, B, Bp, H, QD, KD, I, E, K, V, pitch, pages, expert_rows;
    uint64_t ranks, vocab_pitch; /* tensor parallelism (ranks 1: none) */
} plan_dims;

typedef mg_status (*size_rule)(const mg_fwd_plan_input *in, const plan_dims *d, uint64_t *bytes);

#define RULE(name, expr)                                                                           \
    static mg_status name(const mg_fwd_plan_input *in, const plan_dims *d, uint64_t *bytes) {      \
        (void)in, (void)d;                                                                         \
        *bytes = (expr);                                                                           \
        return MG_OK;                                                                              \
    }

static bool is_fp8(const mg_fwd_plan_input *in) {
    return in->weights == MG_FWD_WEIGHTS_FP8;
}

static bool is_nvfp4(const mg_fwd_plan_input *in) {
    return in->weights == MG_FWD_WEIGHTS_NVFP4;
}

/* ids, page table and the LM head's rows: whole pass, uploaded before it */
RULE(step_ids, 4 * d->M)
RULE(b1_i32, 4 * (d->B + 1))
RULE(b_i32, 4 * d->B)
RULE(kv_indices, 4 * d->pages)
/* activations */
RULE(residual, 2 * d->M * d->H)
RULE(mp_hidden, 2 * d->Mp * d->H)
/* q rows [Mp, QD], then the joined k and v rows [Mp, 2 KD] (model_forward.c's offsets) */
RULE(qkv, 2 * d->Mp * (d->QD + 2 * d->KD))
RULE(k_normed, in->qk_norm ? 2 * d->M * d->KD : 0)
/* a scaled RoPE's frequencies, FP32 [head_dim / 2]: uploaded once when the model is created */
RULE(rope_inv_freq, in->rope_table ? 4 * (uint64_t)(in->shape->head_dim / 2) : 0)
RULE(attn_out, 2 * d->Mp * d->QD)
RULE(gate_up, d->E || is_nvfp4(in) ? 0 : 4 * d->Mp * d->I)
RULE(mlp_act, d->E ? 0 : 2 * d->Mp * d->I)
RULE(logits_hidden, 2 * d->Bp * d->H)
/* BF16 (NVFP4, FP8) or FP32 logits of `pitch` columns: sized for FP32 either way */
RULE(logits, 4 * d->Bp * d->pitch)
/* tensor parallelism: this rank's FP32 logits slice [batch, vocab_pitch] and every rank's,
 * gathered [ranks, batch, vocab_pitch], before they are laid out as whole rows in logits */
RULE(tp_logits, d->ranks > 1 ? 4 * d->B * d->vocab_pitch : 0)
RULE(tp_gathered, d->ranks > 1 ? 4 * d->ranks * d->B * d->vocab_pitch : 0)
/* FP8: the quantized input of the next GEMM (the widest of hidden, q heads, intermediate) and
 * its per-token scales, rewritten before every GEMM group, the LM head's included */
RULE(fp8_act, is_fp8(in) ? d->M *max_u64(max_u64(d->H, d->QD), d->I) : 0)
RULE(fp8_act_scales, is_fp8(in) ? 4 * d->M : 0)
/* MoE */
RULE(router_logits, d->E ? 4 * d->Mp * d->E : 0)
RULE(topk, d->E ? 4 * d->M * d->K : 0)
RULE(sorted_token_ids, d->E ? 4 * d->expert_rows : 0)
RULE(expert_offsets, d->E ? 4 * (d->E + 1) : 0)
RULE(moe_act, d->E ? 2 * d->expert_rows * d->I : 0)
RULE(moe_down, d->E ? 2 * d->expert_rows * d->H : 0)

static mg_status moe_sort_workspace(const mg_fwd_plan_input *in, const plan_dims *d,
                                    uint64_t *bytes) {
    (void)in;
    mg_moe_sort_desc sd = {
        .tokens = (uint32_t)d->M, .experts = (uint32_t)d->E, .k = (uint32_t)d->K};
    *bytes = d->E ? mg_moe_sort_workspace_bytes(&sd) : 0;
    return MG_OK;
}

mg_moe_gemm_desc mg_fwd_moe_gemm_desc(const mg_model_shape *sh, mg_fwd_weights w, bool gate_up,
                                      uint32_t tokens) {
    uint32_t K = sh->experts_per_token;
    return (mg_moe_gemm_desc){.kind = w == MG_FWD_WEIGHTS_FP8 ? MG_MOE_GEMM_FP8_ROWWISE
                                                              : MG_MOE_GEMM_BF16,
                              .experts = sh->experts,
                              .rows = tokens * K,
                              .act_rows = gate_up ? tokens : tokens * K,
                              .n = gate_up ? sh->intermediate : sh->hidden,
                              .k = gate_up ? sh->hidden : sh->intermediate,
                              .gate_up = gate_up};
}

/* BF16 / FP8 experts: gate_up (fused SiLU-mul) and down share one workspace, the larger. */
static mg_status moe_gemm_workspace(const mg_fwd_plan_input *in, const plan_dims *d,
                                    uint64_t *bytes) {
    *bytes = 0;
    if (!d->E || is_nvfp4(in))
        return MG_OK;
    for (int gate_up = 0; gate_up < 2; gate_up++) {
        mg_moe_gemm_desc g = mg_fwd_moe_gemm_desc(in->shape, in->weights, gate_up, (uint32_t)d->M);
        size_t need = 0;
        mg_status st = mg_moe_gemm_workspace_bytes(in->b, &g, &need);
        if (st)
            return mg_error_report(st, "sizing the experts' GEMM workspace: %s", mg_last_error());
        *bytes = max_u64(*bytes, need);
    }
    return MG_OK;
}

/* NVFP4 prefills of at least MG_NVFP4_BF16_PATH_MIN_M tokens expand each dense layer matrix
 * to BF16 here (mg_nvfp4_gemm_with_workspace): the largest expansion. */
static mg_status nvfp4_prefill_workspace(const mg_fwd_plan_input *in, const plan_dims *d,
                                         uint64_t *bytes) {
    *bytes = 0;
    if (!is_nvfp4(in) || in->prompt_tokens < MG_NVFP4_BF16_PATH_MIN_M)
        return MG_OK;
    const uint32_t M = (uint32_t)in->prompt_tokens, H = (uint32_t)d->H, QD = (uint32_t)d->QD;
    const uint32_t shapes[4][2] = {{QD, H}, {2 * (uint32_t)d->KD, H}, {H, QD}, {H, (uint32_t)d->I}};
    for (size_t i = 0; i < (d->E ? 3u : 4u); i++)
        *bytes = max_u64(*bytes, mg_nvfp4_gemm_workspace_bytes(M, shapes[i][0], shapes[i][1]));
    return MG_OK;
}

/* MLX weights: mg_mlx_gemm (prefill rows) dequantizes a matrix to BF16 here, the largest
 * (n * k * 2, mg_mlx_gemm_scratch_bytes) of wq, wkv, wo, w_gate_up and w_down. */
static mg_status mlx_gemm_scratch(const mg_fwd_plan_input *in, const plan_dims *d,
                                  uint64_t *bytes) {
    *bytes = 0;
    if (!in->mlx || d->E)
        return MG_OK;
    const uint64_t nk[] = {d->QD * d->H, 2 * d->KD * d->H, d->H * d->QD, 2 * d->I * d->H,
                           d->H * d->I};
    for (size_t i = 0; i < sizeof nk / sizeof nk[0]; i++)
        *bytes = max_u64(*bytes, 2 * nk[i]);
    return MG_OK;
}

/* Paged attention: the prefill's plan (its page table known now: each prompt's tokens) and the
 * decode steps' fixed-grid plan (batch rows over the pool) take their device buffers from
 * this one range, one plan at a time (the prefill's is destroyed before the first decode). */
static mg_status attention_workspace(const mg_fwd_plan_input *in, const plan_dims *d,
                                     uint64_t *bytes) {
    *bytes = 0;
    const uint32_t B = (uint32_t)d->B;
    int32_t *a = calloc(3 * ((size_t)B + 1), sizeof *a);
    if (!a)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    int32_t *qo = a, *kv = a + B + 1, *last = a + 2 * ((size_t)B + 1);
    mg_status st = MG_OK;
    for (int decode = 0; !st && decode < 2; decode++) {
        for (uint32_t r = 0; r < B; r++) {
            const uint32_t len = in->seq_len[r] - (decode ? 0 : in->steps);
            const uint32_t pages = (len + in->page_size - 1) / in->page_size;
            qo[r + 1] = qo[r] + (int32_t)(decode ? 1 : len);
            kv[r + 1] = kv[r] + (int32_t)pages;
            last[r] = (int32_t)(len - (pages - 1) * in->page_size);
        }
        mg_kv_page_table t = {
            .batch_size = B, .qo_indptr = qo, .kv_indptr = kv, .kv_last_page_len = last};
        mg_paged_attention_desc pd = *in->attention;
        if (decode) {
            pd.graph_qo_rows = B;
            pd.graph_kv_tokens = (uint32_t)d->pages * in->page_size;
        }
        size_t need = 0;
        if ((st = mg_paged_attention_workspace_bytes(in->b, &pd, &t, &need)))
            st = mg_error_report(st, "sizing the attention workspace: %s", mg_last_error());
        *bytes = max_u64(*bytes, need);
    }
    free(a);
    return st;
}

enum { WHOLE = -1, LAYER_END = -2, NORM_END = -3 };

#define NO_SIZE SIZE_MAX

/* The table. `field` is the offset in mg_fwd of the mg_devptr it fills (0 bytes: the buffer
 * is not part of this model, the field stays 0); `size_field`, where not NO_SIZE, the offset
 * of the size_t that receives its bytes (an op's workspace size). */
static const struct plan_row {
    const char *name;
    size_t field;
    size_rule bytes;
    int first, last; /* mg_model_step, or WHOLE; last may be LAYER_END or NORM_END */
    size_t size_field;
} rows[] = {
    {"step_ids", offsetof(mg_fwd, step_ids), step_ids, WHOLE, WHOLE, NO_SIZE},
    {"rope_inv_freq", offsetof(mg_fwd, rope_inv_freq), rope_inv_freq, WHOLE, WHOLE, NO_SIZE},
    {"page_qo_indptr", offsetof(mg_fwd, qo_indptr), b1_i32, WHOLE, WHOLE, NO_SIZE},
    {"page_kv_indptr", offsetof(mg_fwd, kv_indptr), b1_i32, WHOLE, WHOLE, NO_SIZE},
    {"page_kv_indices", offsetof(mg_fwd, kv_indices), kv_indices, WHOLE, WHOLE, NO_SIZE},
    {"page_last_len", offsetof(mg_fwd, last_page_len), b_i32, WHOLE, WHOLE, NO_SIZE},
    {"last_token_rows", offsetof(mg_fwd, logits_indices), b_i32, WHOLE, WHOLE, NO_SIZE},
    {"attention_workspace", offsetof(mg_fwd, attention_workspace), attention_workspace, WHOLE,
     WHOLE, offsetof(mg_fwd, attention_workspace_bytes)},
    {"residual", offsetof(mg_fwd, residual), residual, WHOLE, WHOLE, NO_SIZE},
    {"proj_out", offsetof(mg_fwd, proj_out), mp_hidden, WHOLE, WHOLE, NO_SIZE},
    /* the MoE's fused expert gate_up reads norm_out directly (no permuted copy) */
    {"norm_out", offsetof(mg_fwd, norm_out), mp_hidden, MG_STEP_ATTN_NORM, NORM_END, NO_SIZE},
    {"qkv", offsetof(mg_fwd, qkv), qkv, MG_STEP_QKV_PROJ, MG_STEP_ATTENTION, NO_SIZE},
    {"k_normed", offsetof(mg_fwd, k_normed), k_normed, MG_STEP_QKV_PROJ, MG_STEP_ATTENTION,
     NO_SIZE},
    {"attn_out", offsetof(mg_fwd, attn_out), attn_out, MG_STEP_ATTENTION, MG_STEP_O_PROJ, NO_SIZE},
    /* the MLX decode's down GEMV reads gate_up (silu(g) * u fused) */
    {"gate_up", offsetof(mg_fwd, gate_up), gate_up, MG_STEP_MLP_GATE_UP, MG_STEP_MLP_DOWN, NO_SIZE},
    /* NVFP4's fused gate_up writes it while reading norm_out: live from GATE_UP */
    {"mlp_act", offsetof(mg_fwd, mlp_act), mlp_act, MG_STEP_MLP_GATE_UP, MG_STEP_MLP_DOWN, NO_SIZE},
    {"fp8_act", offsetof(mg_fwd, act_fp8), fp8_act, WHOLE, WHOLE, NO_SIZE},
    {"fp8_act_scales", offsetof(mg_fwd, act_scales), fp8_act_scales, WHOLE, WHOLE, NO_SIZE},
    {"nvfp4_prefill_workspace", offsetof(mg_fwd, prefill_workspace), nvfp4_prefill_workspace,
     MG_STEP_QKV_PROJ, LAYER_END, offsetof(mg_fwd, prefill_workspace_bytes)},
    {"mlx_gemm_scratch", offsetof(mg_fwd, mlx_scratch), mlx_gemm_scratch, MG_STEP_QKV_PROJ,
     MG_STEP_MLP_DOWN, offsetof(mg_fwd, mlx_scratch_bytes)},
    {"router_logits", offsetof(mg_fwd, router_logits), router_logits, MG_STEP_MOE_ROUTER,
     MG_STEP_MOE_TOPK, NO_SIZE},
    {"topk_ids", offsetof(mg_fwd, topk_ids), topk, MG_STEP_MOE_TOPK, MG_STEP_MOE_COMBINE, NO_SIZE},
    {"topk_weights", offsetof(mg_fwd, topk_weights), topk, MG_STEP_MOE_TOPK, MG_STEP_MOE_COMBINE,
     NO_SIZE},
    {"moe_sort_workspace", offsetof(mg_fwd, sort_workspace), moe_sort_workspace, MG_STEP_MOE_ALIGN,
     MG_STEP_MOE_ALIGN, offsetof(mg_fwd, sort_workspace_bytes)},
    {"sorted_token_ids", offsetof(mg_fwd, sorted_token_ids), sorted_token_ids, MG_STEP_MOE_ALIGN,
     MG_STEP_MOE_COMBINE, NO_SIZE},
    {"expert_offsets", offsetof(mg_fwd, expert_offsets), expert_offsets, MG_STEP_MOE_ALIGN,
     MG_STEP_MOE_DOWN, NO_SIZE},
    {"moe_pair_positions", offsetof(mg_fwd, pair_positions), topk, MG_STEP_MOE_ALIGN,
     MG_STEP_MOE_COMBINE, NO_SIZE},
    {"moe_gemm_workspace", offsetof(mg_fwd, moe_gemm_workspace), moe_gemm_workspace,
     MG_STEP_MOE_GATE_UP, MG_STEP_MOE_DOWN, offsetof(mg_fwd, moe_gemm_workspace_bytes)},
    {"moe_act", offsetof(mg_fwd, moe_act), moe_act, MG_STEP_MOE_GATE_UP, MG_STEP_MOE_DOWN, NO_SIZE},
    {"moe_down", offsetof(mg_fwd, moe_down), moe_down, MG_STEP_MOE_DOWN, MG_STEP_MOE_COMBINE,
     NO_SIZE},
    {"logits_hidden", offsetof(mg_fwd, logits_hidden), logits_hidden, MG_STEP_LOGITS_GATHER,
     MG_STEP_LM_HEAD, NO_SIZE},
    {"logits", offsetof(mg_fwd, logits), logits, MG_STEP_LM_HEAD, MG_STEP_SAMPLE, NO_SIZE},
    {"tp_logits", offsetof(mg_fwd, tp_logits), tp_logits, MG_STEP_LM_HEAD, MG_STEP_LM_HEAD,
     NO_SIZE},
    {"tp_logits_gathered", offsetof(mg_fwd, tp_gathered), tp_gathered, MG_STEP_LM_HEAD,
     MG_STEP_LM_HEAD, NO_SIZE},
};

#define ROW_COUNT (sizeof rows / sizeof rows[0])

static plan_dims dims_of(const mg_fwd_plan_input *in) {
    const mg_model_shape *s = in->shape;
    plan_dims d = {.M = in->tokens,
                   .B = in->batch,
                   .H = s->hidden,
                   .QD = (uint64_t)s->heads * s->head_dim,
                   .KD = (uint64_t)s->kv_heads * s->head_dim,
                   .I = s->intermediate,
                   .E = s->experts,
                   .K = s->experts_per_token,
                   .V = s->vocab,
                   .pages = in->pages,
                   .ranks = in->tp_ranks ? in->tp_ranks : 1};
    d.vocab_pitch = mg_fwd_tp_vocab_pitch(s->vocab, (uint32_t)d.ranks);
    d.Mp = ceil16(d.M);
    d.Bp = ceil16(d.B);
    d.pitch = mg_fwd_logits_pitch(s->vocab);
    /* every routed row, plus room to pad each expert's group to 16 rows */
    d.expert_rows = d.E ? ceil16(d.M * d.K + d.E * 15) : 0;
    return d;
}

/* Builds the plan; the sizes per row in sizes[ROW_COUNT]. */
static mg_status build_sized(const mg_fwd_plan_input *in, mg_arena_plan **out, uint64_t *sizes) {
    *out = NULL;
    const plan_dims d = dims_of(in);
    mg_arena_plan *plan = NULL;
    mg_status st = mg_arena_plan_create(&plan);
    if (st)
        return mg_error_report(st, "planning the arena: %s", mg_last_error());
    const int layer_end = d.E ? MG_STEP_MOE_COMBINE : MG_STEP_MLP_DOWN;
    const int norm_end = d.E ? MG_STEP_MOE_GATE_UP : MG_STEP_MLP_GATE_UP;
    for (size_t i = 0; !st && i < ROW_COUNT; i++) {
        if ((st = rows[i].bytes(in, &d, &sizes[i])) || !sizes[i])
            continue;
        const int last = rows[i].last == LAYER_END  ? layer_end
                         : rows[i].last == NORM_END ? norm_end
                                                    : rows[i].last;
        const mg_arena_lifetime lt = {(uint32_t)rows[i].first, (uint32_t)last};
        if ((st = mg_arena_plan_add(plan, rows[i].name, sizes[i], 0,
                                    rows[i].first == WHOLE ? NULL : &lt, NULL)))
            st = mg_error_report(st, "planning the arena: %s", mg_last_error());
    }
    if (st) {
        mg_arena_plan_destroy(plan);
        return st;
    }
    *out = plan;
    return MG_OK;
}

mg_status mg_fwd_plan_build(const mg_fwd_plan_input *in, mg_arena_plan **out) {
    uint64_t sizes[ROW_COUNT];
    return build_sized(in, out, sizes);
}

const char *mg_fwd_plan_step_name(uint32_t step, bool moe) {
    static const char *const dense[] = {
        "embed",    "attn_norm",   "qkv_proj",      "rope",       "kv_write", "attention", "o_proj",
        "mlp_norm", "mlp_gate_up", "mlp_act",       "mlp_down",   NULL,       NULL,        NULL,
        NULL,       NULL,          "logits_gather", "final_norm", "lm_head",  "sample"};
    static const char *const experts[] = {"moe_router",  "moe_topk", "moe_align", "moe_permute",
                                          "moe_gate_up", "moe_act",  "moe_down",  "moe_combine"};
    if (step >= sizeof dense / sizeof dense[0])
        return NULL;
    if (moe && step >= MG_STEP_MOE_ROUTER && step <= MG_STEP_MOE_COMBINE)
        return experts[step - MG_STEP_MOE_ROUTER];
    return dense[step];
}

mg_status mg_fwd_plan_bytes(const mg_fwd_plan_input *in, uint64_t *device_bytes) {
    uint64_t sizes[ROW_COUNT];
    mg_arena_plan *plan;
    mg_arena_summary sum = {0};
    mg_status st = build_sized(in, &plan, sizes);
    if (st)
        return st;
    if ((st = mg_arena_plan_summary(plan, &sum)))
        st = mg_error_report(st, "planning the arena: %s", mg_last_error());
    mg_arena_plan_destroy(plan);
    *device_bytes = sum.device_bytes;
    return st;
}

mg_status mg_fwd_plan_create(mg_fwd *m, const mg_fwd_plan_input *in) {
    uint64_t sizes[ROW_COUNT];
    mg_arena_plan *plan;
    mg_status st = build_sized(in, &plan, sizes);
    if (st)
        return st;
    st = mg_arena_create(m->b, plan, &m->arena);
    mg_arena_plan_destroy(plan);
    if (st)
        return mg_error_report(st, "creating the arena: %s", mg_last_error());
    for (size_t i = 0; i < ROW_COUNT; i++) {
        mg_devptr *field = (mg_devptr *)((char *)m + rows[i].field);
        *field = 0;
        if (rows[i].size_field != NO_SIZE)
            *(size_t *)((char *)m + rows[i].size_field) = (size_t)sizes[i];
        if (sizes[i] && (st = mg_arena_find(m->arena, rows[i].name, field, NULL)))
            return mg_error_report(st, "arena buffer: %s", mg_last_error());
    }
    m->tokens_padded = (uint32_t)ceil16(in->tokens);
    m->logits_pitch = mg_fwd_logits_pitch(in->shape->vocab);
    return MG_OK;
}
