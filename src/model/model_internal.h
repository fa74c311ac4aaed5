/*
 * model_internal.h - private to src/model: what the files of the forward model share (model.c
 * creation and passes, model_presets.c the presets and the random weights, model_weights.c
 * the weights of a preset or checkpoint, model_plan.c the memory plan, model_format*.c the
 * weight formats' tables, model_forward.c one pass). Nothing here is an interface for other
 * layers.
 */
#ifndef METRALE_MODEL_INTERNAL_H
#define METRALE_MODEL_INTERNAL_H

#include "model.h"
#include "model_checkpoint.h"
#include "model_mlx.h"

#include "metrale/ops_kv_cache.h"
#include "metrale/ops_moe_gemm.h"
#include "metrale/ops_nvfp4.h"

#define PAGE_SIZE 16u

/* The NVFP4 matrices of a layer: w_gate_up becomes two weights (gate rows, up rows). FP4_V is
 * used by NVFP4 checkpoints only, whose k and v projections carry global scales of their own:
 * FP4_KV then holds k alone, FP4_V v, and the kv projection is two GEMMs into the two halves
 * of its output rows (presets: FP4_V empty, FP4_KV the joined k and v). */
enum { FP4_Q, FP4_KV, FP4_O, FP4_GATE, FP4_UP, FP4_DOWN, FP4_V, FP4_SLOTS };

/* A weight format's table of functions (model_format.h). */
typedef struct mg_fwd_format mg_fwd_format;

/* How a fused decode step computes the q and kv projections: two GEMVs; one over the joined
 * matrices (batch 1, mg_fwd_join_qkv); that one with the KV-append epilogue (RoPE and the
 * cache write in the GEMV, so no append kernel). */
typedef enum mg_fwd_qkv_mode {
    MG_FWD_QKV_APART,
    MG_FWD_QKV_JOINED,
    MG_FWD_QKV_JOINED_APPEND,
} mg_fwd_qkv_mode;

struct mg_fwd {
    mg_backend *b;
    const mg_fwd_format *format; /* the loaded weights' (mg_fwd_format_of_model) */
    mg_fwd_config c;
    /* a checkpoint's architecture (c.preset points here) and the open checkpoint */
    mg_fwd_checkpoint *ckpt;
    mg_fwd_preset arch;
    char arch_name[128];
    int32_t *prompt; /* the config's prompt ids, copied */
    /* This rank's shape: the model's (full_sh) with heads, kv_heads and intermediate divided by
     * tp_ranks (model_tp.c); vocab stays whole (the embedding, the gathered logits). */
    mg_model_shape sh, full_sh;
    /* Tensor parallelism (model.h, model_tp.c): this rank's communicator (NULL: one device),
     * its rank of tp_ranks (0 of 1), the LM head's vocabulary rows [vocab_first, vocab_first +
     * vocab_count) (mg_fwd_tp_vocab_rows), and the arena's logits slice [batch, vocab_pitch]
     * and gathered slices [tp_ranks, batch, vocab_pitch] (FP32; vocab_pitch:
     * mg_fwd_tp_vocab_pitch, each rank's count columns of it written). */
    mg_comm *comm;
    uint32_t tp_rank, tp_ranks;
    uint32_t vocab_first, vocab_count, vocab_pitch;
    mg_devptr tp_logits, tp_gathered;
    /* mg_fwd_create_tp's rank 0 only: the other ranks, their streams and every communicator,
     * owned by it (NULL otherwise) */
    struct mg_fwd_tp_group *group;
    /* Not empty once a failure may have left the ranks out of step (mg_fwd_tp_stop): why. The
     * communicator is then aborted and every pass and setter refused. */
    char tp_stopped[512];
    uint32_t layers;
    mg_devptr embedding, final_norm, lm_head;
    mg_devptr *layer_w; /* [layers][MG_FWD_LAYER_TENSORS]; NVFP4: the matrices' are 0; FP8:
                           the matrices' E4M3 codes (their allocation also holds the scales) */
    /* mg_fwd_join_qkv: each layer's q and kv matrices lie back to back in one allocation
     * (MG_FWD_WKV points into MG_FWD_WQ's, and is not freed on its own; FP8: so do the scales) */
    bool qkv_joined;
    /* checkpoints: the biases and head norms of model_checkpoint.h, [layers][MG_FWD_EXTRA_TENSORS]
     * (NULL for the presets); qk_norm models: the normed keys of a pass, packed [rows, kv_heads
     * head_dim] (the joined k and v rows of the projection are not), an arena buffer */
    mg_devptr *layer_extra;
    mg_devptr k_normed;
    mg_devptr rope_inv_freq; /* a scaled RoPE's frequencies (plan row "rope_inv_freq"), or 0 */
    /* FP8 only: each matrix's FP32 row scales (inside its allocation, after the codes), the
     * LM head's; the device-quantized activation of the next GEMM(s) and its per-token scales,
     * and which BF16 buffer (of how many rows) they were quantized from. */
    mg_devptr *fp8_scales; /* [layers][MG_FWD_LAYER_TENSORS] */
    uint32_t logits_pitch; /* mg_fwd_logits_pitch (model_plan.h) */
    mg_devptr lm_head_scales, act_fp8, act_scales, act_fp8_source;
    uint32_t act_fp8_rows;
    uint64_t weight_bytes;
    /* NVFP4 only: prepared weights (each `values` the base of one allocation holding the
     * values then the scales), their global scales (FP32 [layers * FP4_SLOTS + 1] in one
     * allocation, the LM head's last), and the prefill's BF16 expansion workspace (0 when the
     * prompts have fewer than MG_NVFP4_BF16_PATH_MIN_M tokens). */
    mg_nvfp4_weight *fp4; /* [layers][FP4_SLOTS] */
    mg_fwd_mlx *mlx;      /* MLX weights (model_mlx.h), unless dequantized to BF16 at load */
    mg_nvfp4_weight lm_head_fp4;
    mg_devptr fp4_globals;

    /* The arena (model_plan.c fills every field below that it names) */
    mg_arena *arena;
    /* the ops' workspaces: NVFP4 prefill's BF16 expansion (0 when the prompts have fewer than
     * MG_NVFP4_BF16_PATH_MIN_M tokens), the MLX GEMM's dequantized matrix, the paged
     * attention plans' (0 where the backend's provider takes none) */
    mg_devptr prefill_workspace, mlx_scratch, attention_workspace;
    size_t prefill_workspace_bytes, mlx_scratch_bytes, attention_workspace_bytes;
    mg_devptr residual, proj_out, norm_out, qkv, attn_out, gate_up, mlp_act, logits_hidden, logits;
    mg_devptr step_ids, qo_indptr, kv_indptr, kv_indices, last_page_len, logits_indices;
    /* MoE only (arena) */
    mg_devptr router_logits, topk_ids, topk_weights, sorted_token_ids, expert_offsets, moe_act,
        moe_down, pair_positions, sort_workspace;
    size_t sort_workspace_bytes;
    uint64_t expert_bytes;        /* the experts' weights, every layer */
    mg_devptr moe_gemm_workspace; /* BF16 / FP8 experts: the grouped GEMMs' workspace */
    size_t moe_gemm_workspace_bytes;
    uint32_t tokens_cap, tokens_padded;

    mg_kv_cache_desc kv;
    size_t kv_layer_bytes;
    mg_devptr kv_pool;
    mg_kv_page_allocator *allocator;
    uint32_t pages_per_request;
    int32_t *pages;   /* [batch][pages_per_request], each request's pages in token order */
    uint32_t *kv_len; /* [batch] tokens cached per request */
    int32_t *h_qo, *h_kv_indptr, *h_kv_indices, *h_last, *h_logits_indices;

    mg_attention_plan *decode_plan;
    mg_graph *graph;
    mg_timing *timing;        /* mg_fwd_set_timing; NULL when not attached */
    mg_timing_span open_span; /* the op span begun and not yet ended (OP), 0 when none */
    uint32_t lane_prefill, lane_decode;
    uint32_t decode_calls, graph_steps;
    /* model_forward.c: whether the decode passes run the fused GEMMs (mg_fwd_decide_fusion,
     * at the first decode step) */
    bool fused_decode, fusion_decided;
    mg_fwd_qkv_mode qkv_mode; /* the fused step's q and kv projections (model_forward.c) */
    uint32_t graph_kernels, graph_nodes; /* of the captured decode step (0: none captured) */
    /* the step's kernels outside the layers and in its first layer (count_layer_kernels) */
    uint32_t graph_outside_kernels, graph_layer_kernels;
    int32_t *tokens;                  /* [batch][steps + 1] */
    struct mg_fwd_sampling *sampling; /* model_sampling.c; NULL: greedy argmax */
    uint32_t token_count;
    uint64_t prompt_tokens, decode_kv_bytes;
};

static inline uint32_t ceil_div(uint64_t a, uint32_t b) {
    return (uint32_t)((a + b - 1) / b);
}

static inline mg_devptr *layer_tensor(mg_fwd *m, uint32_t layer, uint32_t slot) {
    return &m->layer_w[(size_t)layer * MG_FWD_LAYER_TENSORS + slot];
}

/* A failed library call: its status, with `what` and the library's message (mg_last_error). */
mg_status mg_fwd_lib_fail(mg_status st, const char *what);

/* Returns from the calling function with mg_fwd_lib_fail(status, what) when `call` fails. */
#define TRY(call, what)                                                                            \
    do {                                                                                           \
        mg_status st_ = (call);                                                                    \
        if (st_)                                                                                   \
            return mg_fwd_lib_fail(st_, what);                                                     \
    } while (0)

/* A span named `op` (model.h's names) around the statements that follow, when a timing object
 * is attached (mg_fwd_set_timing); nothing otherwise. Needs `m` and the stream `s` in scope.
 * The span is kept in m->open_span while the statements run, so that a failing statement's
 * early return leaves it for timed_forward to close. */
#define OP(op, ...)                                                                                \
    do {                                                                                           \
        if (m->timing)                                                                             \
            TRY(mg_timing_kernel_begin(m->timing, op, s, &m->open_span), "timing span");           \
        __VA_ARGS__;                                                                               \
        const mg_timing_span span_ = m->open_span;                                                 \
        m->open_span = 0;                                                                          \
        TRY(span_ ? mg_timing_span_end(m->timing, span_, s) : MG_OK, "timing span");               \
    } while (0)

/* model_plan.c: the grouped expert GEMM of a model of shape `sh` with weights `w` (BF16 or FP8
 * experts) over `tokens` tokens: gate_up (fused SiLU-mul) or down. */
mg_moe_gemm_desc mg_fwd_moe_gemm_desc(const mg_model_shape *sh, mg_fwd_weights w, bool gate_up,
                                      uint32_t tokens);

/* model_tp.c: tensor parallelism (model.h). Whether config c (its preset's shape, its weight
 * format) can be split over `ranks` ranks, before anything loads: model.h's refusals, each a
 * one-line message naming the field or the format, all but the MLX ones (o_proj / down_proj
 * groups a rank would cut, or their biases), which need each matrix's group size and bias as
 * its checkpoint loads it: mg_fwd_mlx_shard refuses those, after loading, before any cut. */
mg_status mg_fwd_tp_check(const mg_fwd_config *c, uint32_t ranks);
/* The one rule of the LM head's vocabulary split: rank `rank` of `ranks` holds rows [*first,
 * *first + *count) of `vocab`, split evenly, the first vocab % ranks ranks one row more; every
 * rank holds at least one exactly when vocab >= ranks (mg_fwd_tp_check). */
static inline void mg_fwd_tp_vocab_rows(uint32_t vocab, uint32_t ranks, uint32_t rank,
                                        uint32_t *first, uint32_t *count) {
    const uint32_t n = ranks ? ranks : 1, base = vocab / n, extra = vocab % n;
    *count = base + (rank < extra);
    *first = rank * base + (rank < extra ? rank : extra);
}
/* The pitch of a rank's logits slice (the LM head GEMM's ldc, the all-gather's per-rank row
 * stride): the largest rank's rows rounded up to a multiple of 8, as mg_fwd_logits_pitch pads
 * the whole rows. */
static inline uint32_t mg_fwd_tp_vocab_pitch(uint32_t vocab, uint32_t ranks) {
    uint32_t first, count;
    mg_fwd_tp_vocab_rows(vocab, ranks, 0, &first, &count);
    return (count + 7) / 8 * 8;
}
/* Sets m->sh (this rank's shape) and the vocabulary slice from m->full_sh and the ranks. */
void mg_fwd_tp_set_shape(mg_fwd *m);
/* Cuts every loaded weight down to this rank's share (model.h), freeing the whole ones; the
 * weight bytes follow. Nothing to do for one rank. */
mg_status mg_fwd_tp_shard_weights(mg_fwd *m);
/* The vocabulary-parallel LM head (BF16 weights): this rank's logits slice, their all-gather
 * into m->logits (whole rows, pitch logits_pitch) and the argmax into step_ids. */
mg_status mg_fwd_tp_lm_head(mg_fwd *m, mg_stream *s, uint32_t rows);
/* The sum over the ranks of the row-parallel projection's partial rows in proj_out (in place);
 * nothing for one rank. */
mg_status mg_fwd_tp_reduce(mg_fwd *m, mg_stream *s, uint32_t rows);
/* mg_fwd_create_tp's driver: the pass (prefill or decode) on every rank of m's group, each on
 * a thread and a stream of its own (rank 0: the caller's and `s`); the first failing rank's
 * error, or MG_ERR_INTERNAL when the ranks' tokens disagree. */
mg_status mg_fwd_tp_run(mg_fwd *m, mg_stream *s, bool prefill);
/* A failure that may leave the ranks out of step (a pass that failed on this rank, a setter
 * applied to some ranks and not others, ranks that disagree): rank m records `why` and aborts
 * its communicator, so its peers fail at their next collective and every later pass or setter
 * of m is refused (mg_fwd_tp_usable). Nothing for one rank. Touches only m: safe from a rank's
 * own thread while the others run. */
void mg_fwd_tp_stop(mg_fwd *m, const char *why);
/* mg_fwd_tp_stop on every rank of m's group (m alone without one); no pass may be running. */
void mg_fwd_tp_stop_group(mg_fwd *m, const char *why);
/* MG_OK, or once m was stopped MG_ERR_DEVICE saying why and that the model is only good for
 * mg_fwd_destroy. */
mg_status mg_fwd_tp_usable(const mg_fwd *m);
/* A setter's change failed on rank `rank` (st, mg_last_error) after its arguments were checked,
 * so some ranks may hold the change and others not: stops the whole group (tp_ranks > 1) and
 * returns st with a message naming the rank, `what` and the stop. One rank: st unchanged. */
mg_status mg_fwd_tp_setter_failed(mg_fwd *m, uint32_t rank, mg_status st, const char *what);
/* The ranks of m's group beyond rank 0 (ranks 1..), *count of them; none without a group. */
mg_fwd *const *mg_fwd_tp_peers(const mg_fwd *m, uint32_t *count);
void mg_fwd_tp_group_destroy(struct mg_fwd_tp_group *g);

/* model.c: one rank's pass, what mg_fwd_prefill / mg_fwd_decode run on each rank; a failure
 * once the pass started stops the rank (mg_fwd_tp_stop: its communicator aborted). */
mg_status mg_fwd_prefill_rank(mg_fwd *m, mg_stream *s);
mg_status mg_fwd_decode_rank(mg_fwd *m, mg_stream *s);
/* Why m cannot run the pass now (a stopped tensor-parallel model, the prefill twice, a decode
 * before the prefill or past the planned steps), a failing mg_error_report; MG_OK when it can. */
mg_status mg_fwd_pass_allowed(const mg_fwd *m, bool prefill);

/* model_weights.c: every weight of m's config (generated, quantized, or from its checkpoint). */
mg_status mg_fwd_create_weights(mg_fwd *m);
/* Moves each layer's BF16 or FP8 q and kv matrices into one allocation, q's rows then kv's
 * (the same bytes; FP8: then q's row scales, kv's; one layer's pair of extra memory while it
 * moves), so that a decode step of one token row computes both in one normed GEMV
 * (model_forward.c). Sets m->qkv_joined. */
mg_status mg_fwd_join_qkv(mg_fwd *m);
/* Whether layer slot `slot` is one of the matrices NVFP4 / FP8 / MLX weights replace. */
bool mg_fwd_is_quantized_matrix(uint32_t slot);

/* model_forward.c: the paged attention description of a model of shape `sh`, and of m (with
 * its arena's attention workspace); one pass over `rows` new tokens (their ids in step_ids),
 * inside the timing lanes when a timing object is attached. */
mg_paged_attention_desc mg_fwd_attention_desc_of(const mg_model_shape *sh);
mg_paged_attention_desc mg_fwd_attention_desc(const mg_fwd *m);
mg_status mg_fwd_forward(mg_fwd *m, mg_stream *s, bool prefill, uint32_t rows,
                         mg_attention_plan *plan);
mg_status mg_fwd_timed_forward(mg_fwd *m, mg_stream *s, bool prefill, uint32_t rows,
                               mg_attention_plan *plan);
/* Sets m->fused_decode once, before the first decode pass (outside any capture): true when the
 * config allows it, the model is dense, its format runs BF16 matrices and the backend plans
 * every fused GEMM of a decode step at its batch (mg_gemm_prewarm); a refusal is not an error,
 * the steps then run unfused. */
mg_status mg_fwd_decide_fusion(mg_fwd *m, mg_stream *s);

#endif
