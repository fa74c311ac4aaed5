/*
 * arena_model.c - the arena plan of a decoder-only transformer's forward pass, and the
 * built-in model presets (metrale/arena.h documents every buffer and its lifetime).
 *
 * Choices written down here:
 *  - decode rows = max_batch_size: at most one sampled row per sequence in a pass;
 *  - logits rows = min(M, max(160, decode_rows + 1)), and the logits
 *    buffers get ceil16 of that because the LM head is a cuBLASLt GEMM;
 *  - MoE expert rows = ceil16(M * top_k + experts * 15): the routed rows plus room to pad
 *    every expert's group to a multiple of 16 rows;
 *  - attention split-KV partials for max(ceil16(M), 16 * max_batch_size) rows, i.e. up to 16
 *    KV splits per decode sequence, each row holding heads x head_dim outputs and heads LSE
 *    values in FP32; FlashInfer's int workspace ("attn_plan") holds 8 int32 index arrays of
 *    that many + 1 entries. Both are sized from the limits (no fixed 256 MiB workspaces);
 *  - one 32 MiB cuBLASLt workspace (NVIDIA's recommendation for Hopper) for the arena's stream.
 */
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "metrale/arena.h"

#define CUBLASLT_WORKSPACE_BYTES (32ull << 20)
#define ATTN_PLAN_ARRAYS 8
#define ATTN_SPLITS_PER_SEQUENCE 16
#define LOGITS_MIN_ROWS 160
#define MOE_GROUP_ARGS_BYTES 128
#define CUBLASLT_ROW_MULTIPLE 16

static uint64_t ceil_div(uint64_t a, uint64_t b) {
    return a / b + (a % b != 0);
}

static uint64_t ceil16(uint64_t v) {
    return ceil_div(v, CUBLASLT_ROW_MULTIPLE) * CUBLASLT_ROW_MULTIPLE;
}

static uint64_t max_u64(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

static uint64_t min_u64(uint64_t a, uint64_t b) {
    return a < b ? a : b;
}

static bool is_moe(const mg_model_shape *shape) {
    return shape->experts != 0;
}

static mg_status validate(const mg_model_shape *s, const mg_engine_limits *l) {
    if (!s || !l)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_for_model: NULL %s",
                        s ? "limits" : "shape");
    const struct {
        const char *name;
        uint32_t value;
    } positive[] = {
        {"hidden", s->hidden},
        {"heads", s->heads},
        {"kv_heads", s->kv_heads},
        {"head_dim", s->head_dim},
        {"intermediate", s->intermediate},
        {"vocab", s->vocab},
        {"max_batch_tokens", l->max_batch_tokens},
        {"max_seq_len", l->max_seq_len},
        {"kv_block_size", l->kv_block_size},
        {"max_batch_size", l->max_batch_size},
    };
    /* Every count must fit a signed 32-bit kernel index; that bound also keeps the row
     * arithmetic below (m * top_k + experts * 15, ceil16) far from overflowing 64 bits. */
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value == 0 || positive[i].value > INT32_MAX)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_arena_plan_for_model: %s is %u (1..%d allowed)", positive[i].name,
                            positive[i].value, INT32_MAX);
    if (s->experts > INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_for_model: experts is %u (at most %d)", s->experts,
                        INT32_MAX);
    if (s->heads % s->kv_heads != 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_for_model: heads %u is not a multiple of kv_heads %u",
                        s->heads, s->kv_heads);
    if (s->experts == 1)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_for_model: experts is 1 (0 means dense, MoE needs >= 2)");
    if (!is_moe(s) && s->experts_per_token != 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_for_model: experts_per_token %u on a dense model",
                        s->experts_per_token);
    if (is_moe(s) && (s->experts_per_token == 0 || s->experts_per_token > s->experts))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_arena_plan_for_model: experts_per_token %u not in [1, experts %u]",
                        s->experts_per_token, s->experts);
    return MG_OK;
}

mg_status mg_model_rows_compute(const mg_model_shape *shape, const mg_engine_limits *limits,
                                mg_model_rows *out) {
    mg_status st = validate(shape, limits);
    if (st != MG_OK)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_model_rows_compute: NULL output");
    /* validate() bounds every count by 2^31, so these stay far below 2^64. */
    uint64_t m = limits->max_batch_tokens, b = limits->max_batch_size;
    *out = (mg_model_rows){
        .tokens = m,
        .tokens_padded = ceil16(m),
        .decode_rows = b,
        .logits_rows = min_u64(m, max_u64(LOGITS_MIN_ROWS, b + 1)),
        .expert_rows = is_moe(shape)
                           ? ceil16(m * shape->experts_per_token +
                                    (uint64_t)shape->experts * (CUBLASLT_ROW_MULTIPLE - 1))
                           : 0,
        .kv_blocks_per_seq = ceil_div(limits->max_seq_len, limits->kv_block_size),
        .attn_split_rows = max_u64(ceil16(m), ATTN_SPLITS_PER_SEQUENCE * b),
    };
    out->logits_rows_padded = ceil16(out->logits_rows);
    return MG_OK;
}

/* Adds buffers to a plan, remembering the first failure so the sizing reads as a list. */
typedef struct plan_builder {
    mg_arena_plan *plan;
    mg_status status;
} plan_builder;

/* a * b, or UINT64_MAX when that overflows: sizes saturate, and a saturated size is
 * reported by add_sized, so products of products need no check of their own. */
static uint64_t sat_mul(uint64_t a, uint64_t b) {
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/* A buffer of rows x cols elements of element_bytes each; `lifetime` NULL: whole pass. */
static void add_sized(plan_builder *pb, const char *name, uint64_t rows, uint64_t cols,
                      uint64_t element_bytes, const mg_arena_lifetime *lifetime) {
    if (pb->status != MG_OK)
        return;
    uint64_t bytes = sat_mul(sat_mul(rows, cols), element_bytes);
    if (bytes == UINT64_MAX) {
        pb->status = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                              "mg_arena_plan_for_model: buffer '%s' overflows 64 bits", name);
        return;
    }
    pb->status = mg_arena_plan_add(pb->plan, name, bytes, 0, lifetime, NULL);
}

static void add_live(plan_builder *pb, const char *name, uint64_t rows, uint64_t cols,
                     uint64_t element_bytes, mg_model_step first, mg_model_step last) {
    mg_arena_lifetime lt = {(uint32_t)first, (uint32_t)last};
    add_sized(pb, name, rows, cols, element_bytes, &lt);
}

static void add_always(plan_builder *pb, const char *name, uint64_t rows, uint64_t cols,
                       uint64_t element_bytes) {
    add_sized(pb, name, rows, cols, element_bytes, NULL);
}

enum { BF16 = 2, F32 = 4, I32 = 4, I64 = 8, BYTE = 1 };

mg_status mg_arena_plan_for_model(const mg_model_shape *shape, const mg_engine_limits *limits,
                                  mg_arena_plan **out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_arena_plan_for_model: NULL output pointer");
    *out = NULL;
    mg_model_rows r;
    mg_status st = mg_model_rows_compute(shape, limits, &r);
    if (st != MG_OK)
        return st;
    plan_builder pb = {NULL, MG_OK};
    st = mg_arena_plan_create(&pb.plan);
    if (st != MG_OK)
        return st;

    const bool moe = is_moe(shape);
    const uint64_t m = r.tokens, mp = r.tokens_padded, b = r.decode_rows;
    const uint64_t hidden = shape->hidden, hq = shape->heads, hkv = shape->kv_heads;
    const uint64_t d = shape->head_dim, inter = shape->intermediate;
    const uint64_t experts = shape->experts, topk = shape->experts_per_token;
    const mg_model_step layer_end = moe ? MG_STEP_MOE_COMBINE : MG_STEP_MLP_DOWN;

    /* inputs and metadata, uploaded at EMBED and read by every layer */
    add_live(&pb, "input_ids", m, 1, I32, MG_STEP_EMBED, MG_STEP_EMBED);
    add_live(&pb, "positions", m, 1, I32, MG_STEP_EMBED, layer_end);
    add_live(&pb, "slot_mapping", m, 1, I64, MG_STEP_EMBED, layer_end);
    add_live(&pb, "seq_lens", b, 1, I32, MG_STEP_EMBED, layer_end);
    add_live(&pb, "qo_indptr", b + 1, 1, I32, MG_STEP_EMBED, layer_end);
    add_live(&pb, "kv_indptr", b + 1, 1, I32, MG_STEP_EMBED, layer_end);
    add_live(&pb, "block_tables", b, r.kv_blocks_per_seq, I32, MG_STEP_EMBED, layer_end);
    add_live(&pb, "attn_plan", r.attn_split_rows + 1, ATTN_PLAN_ARRAYS, I32, MG_STEP_EMBED,
             layer_end);
    add_live(&pb, "logits_indices", r.logits_rows, 1, I32, MG_STEP_EMBED, MG_STEP_LOGITS_GATHER);

    /* carried across layers */
    add_always(&pb, "residual", m, hidden, BF16);
    add_always(&pb, "proj_out", mp, hidden, BF16);
    add_always(&pb, "cublaslt_workspace", CUBLASLT_WORKSPACE_BYTES, 1, BYTE);

    /* attention block */
    add_live(&pb, "norm_out", mp, hidden, BF16, MG_STEP_ATTN_NORM,
             moe ? MG_STEP_MOE_PERMUTE : MG_STEP_MLP_GATE_UP);
    add_live(&pb, "qkv", mp, sat_mul(hq + 2 * hkv, d), BF16, MG_STEP_QKV_PROJ, MG_STEP_ATTENTION);
    add_live(&pb, "attn_out", mp, sat_mul(hq, d), BF16, MG_STEP_ATTENTION, MG_STEP_O_PROJ);
    add_live(&pb, "attn_partial", r.attn_split_rows, sat_mul(hq, d + 1), F32, MG_STEP_ATTENTION,
             MG_STEP_ATTENTION);

    /* MLP block */
    if (!moe) {
        add_live(&pb, "gate_up", mp, 2 * inter, BF16, MG_STEP_MLP_GATE_UP, MG_STEP_MLP_ACT);
        add_live(&pb, "mlp_act", mp, inter, BF16, MG_STEP_MLP_ACT, MG_STEP_MLP_DOWN);
    } else {
        const uint64_t er = r.expert_rows;
        add_live(&pb, "router_logits", mp, experts, F32, MG_STEP_MOE_ROUTER, MG_STEP_MOE_TOPK);
        add_live(&pb, "topk_ids", m, topk, I32, MG_STEP_MOE_TOPK, MG_STEP_MOE_COMBINE);
        add_live(&pb, "topk_weights", m, topk, F32, MG_STEP_MOE_TOPK, MG_STEP_MOE_COMBINE);
        add_live(&pb, "sorted_token_ids", er, 1, I32, MG_STEP_MOE_ALIGN, MG_STEP_MOE_COMBINE);
        add_live(&pb, "expert_offsets", experts + 1, 1, I32, MG_STEP_MOE_ALIGN, MG_STEP_MOE_DOWN);
        add_live(&pb, "moe_group_args", experts, MOE_GROUP_ARGS_BYTES, BYTE, MG_STEP_MOE_ALIGN,
                 MG_STEP_MOE_DOWN);
        add_live(&pb, "moe_permuted", er, hidden, BF16, MG_STEP_MOE_PERMUTE, MG_STEP_MOE_GATE_UP);
        add_live(&pb, "moe_gate_up", er, 2 * inter, BF16, MG_STEP_MOE_GATE_UP, MG_STEP_MOE_ACT);
        add_live(&pb, "moe_act", er, inter, BF16, MG_STEP_MOE_ACT, MG_STEP_MOE_DOWN);
        add_live(&pb, "moe_down", er, hidden, BF16, MG_STEP_MOE_DOWN, MG_STEP_MOE_COMBINE);
    }

    /* FP8 activation quantization: one buffer for the largest GEMM input of the layer */
    if (limits->fp8_activations) {
        const uint64_t inputs[][2] = {
            {mp, hidden},                                     /* QKV, gate_up / router */
            {mp, hq * d},                                     /* O projection */
            {moe ? r.expert_rows : mp, moe ? hidden : inter}, /* down, or expert gate_up */
            {moe ? r.expert_rows : 0, inter},                 /* expert down */
        };
        uint64_t fp8_bytes = 0, scale_count = 0;
        for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
            fp8_bytes = max_u64(fp8_bytes, sat_mul(inputs[i][0], inputs[i][1]));
            scale_count = max_u64(scale_count, sat_mul(inputs[i][0], ceil_div(inputs[i][1], 128)));
        }
        add_live(&pb, "act_fp8", fp8_bytes, 1, BYTE, MG_STEP_QKV_PROJ, layer_end);
        add_live(&pb, "act_scales", scale_count, 1, F32, MG_STEP_QKV_PROJ, layer_end);
    }

    /* LM head on the sampled rows only */
    add_live(&pb, "logits_hidden", r.logits_rows_padded, hidden, BF16, MG_STEP_LOGITS_GATHER,
             MG_STEP_LM_HEAD);
    add_live(&pb, "logits", r.logits_rows_padded, shape->vocab, F32, MG_STEP_LM_HEAD,
             MG_STEP_SAMPLE);
    add_live(&pb, "sampled_ids", b, 1, I32, MG_STEP_SAMPLE, MG_STEP_SAMPLE);

    if (pb.status != MG_OK) {
        mg_arena_plan_destroy(pb.plan);
        return pb.status;
    }
    *out = pb.plan;
    return MG_OK;
}

/* ------------------------------------------------------------------ presets */

/* Engine limits of both presets: 8192 tokens per pass (a long prefill chunk plus the decode
 * rows), 32768-token sequences, 16-token KV blocks, 256 sequences per pass. */
#define PRESET_LIMITS                                                                              \
    {                                                                                              \
        .max_batch_tokens = 8192, .max_seq_len = 32768, .kv_block_size = 16,                       \
        .max_batch_size = 256, .fp8_activations = false                                            \
    }

static const mg_model_preset presets[] = {
    {
        .name = "llama-3-8b",
        .description = "dense 8B-class (Llama-3-8B shapes), BF16",
        .shape = {.hidden = 4096,
                  .heads = 32,
                  .kv_heads = 8,
                  .head_dim = 128,
                  .intermediate = 14336,
                  .experts = 0,
                  .experts_per_token = 0,
                  .vocab = 128256},
        .limits = PRESET_LIMITS,
    },
    {
        .name = "qwen3-30b-a3b",
        .description = "MoE 30B-A3B-class (Qwen3-30B-A3B shapes: 128 experts, top-8), BF16",
        .shape = {.hidden = 2048,
                  .heads = 32,
                  .kv_heads = 4,
                  .head_dim = 128,
                  .intermediate = 768,
                  .experts = 128,
                  .experts_per_token = 8,
                  .vocab = 151936},
        .limits = PRESET_LIMITS,
    },
};

const mg_model_preset *mg_model_presets(size_t *count) {
    if (count)
        *count = sizeof presets / sizeof presets[0];
    return presets;
}

const mg_model_preset *mg_model_preset_find(const char *name) {
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}
