/* model_forward.c - one pass of the forward model (model.h's layers) over the public ops. */
#include "model_format.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrale/dtype.h"
#include "metrale/mlx.h"
#include "metrale/ops.h"
#include "metrale/ops_activation.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_kv_cache.h"
#include "metrale/ops_moe.h"
#include "metrale/ops_moe_gemm.h"
#include "metrale/ops_nvfp4.h"
#include "metrale/ops_quantize.h"
#include "metrale/status.h"

mg_paged_attention_desc mg_fwd_attention_desc_of(const mg_model_shape *sh) {
    return (mg_paged_attention_desc){.num_qo_heads = sh->heads,
                                     .num_kv_heads = sh->kv_heads,
                                     .head_dim = sh->head_dim,
                                     .page_size = PAGE_SIZE,
                                     .window_left = -1,
                                     .sm_scale = 1.0f / sqrtf((float)sh->head_dim)};
}

mg_paged_attention_desc mg_fwd_attention_desc(const mg_fwd *m) {
    mg_paged_attention_desc d = mg_fwd_attention_desc_of(&m->sh);
    d.workspace = m->attention_workspace;
    d.workspace_bytes = m->attention_workspace_bytes;
    return d;
}

/* Readies act[rows, k] as the next GEMM group's input, for a format that needs it (FP8). */
static mg_status prepare(mg_fwd *m, mg_stream *s, uint32_t rows, uint32_t k, mg_devptr act) {
    return m->format->prepare_input ? m->format->prepare_input(m, s, rows, k, act) : MG_OK;
}

/* The MoE MLP of layer l over norm_out[rows] into proj_out (model.h): router, top-k, sort, the
 * format's experts (gate_up fused with SiLU, then down), the weighted combine. */
static mg_status moe_mlp(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows) {
    mg_backend *b = m->b;
    const mg_model_shape *sh = &m->sh;
    uint32_t E = sh->experts, K = sh->experts_per_token, H = sh->hidden;
    OP("moe_router",
       TRY(mg_gemm_bf16(b, s, rows, E, H, m->norm_out, *layer_tensor(m, l, MG_FWD_ROUTER),
                        m->router_logits, MG_DTYPE_F32, E),
           "router"));
    mg_moe_topk_desc td = {
        .tokens = rows, .experts = E, .k = K, .logits_dtype = MG_DTYPE_F32, .renormalize = true};
    OP("moe_topk",
       TRY(mg_moe_topk(b, s, &td, m->router_logits, m->topk_ids, m->topk_weights), "top-k"));
    mg_moe_sort_desc sd = {.tokens = rows, .experts = E, .k = K};
    OP("moe_sort",
       TRY(mg_moe_sort(b, s, &sd, m->topk_ids, m->sort_workspace, m->sort_workspace_bytes,
                       m->expert_offsets, m->sorted_token_ids, m->pair_positions),
           "expert sort"));
    mg_status st = m->format->experts(m, s, l, rows);
    if (st)
        return st;
    mg_moe_combine_desc cd = {.tokens = rows, .k = K, .hidden = H};
    OP("moe_combine", TRY(mg_moe_combine(b, s, &cd, m->moe_down, m->pair_positions, m->topk_weights,
                                         0, m->proj_out),
                          "expert combine"));
    return MG_OK;
}

/* ------------------------------------------------------------------ the fused decode step
 *
 * A dense BF16 or row-wise FP8 layer's decode step in 7 kernels instead of 10 (FP8: 9 instead
 * of 14, the inputs of the output and down projections still quantized apart, since a row's
 * scale needs the whole row): the attention norm folded into
 * the q and kv projections (each reads the un-normed residual stream), the output
 * projection's residual add and the down projection's made in place in the residual stream
 * (so the next norm has no add of its own), the MLP norm and SiLU-mul folded into gate_up.
 * At batch 1 (one token row) the q and kv projections are one GEMV over the joined matrix
 * (mg_fwd_join_qkv): its output row is q's row then kv's, which is where the pass puts kv
 * for that step (6 kernels), and where the layers have no q/k norm or bias and the cache is
 * BF16 that GEMV also applies RoPE and writes the new key and value into the cache (the
 * KV-append epilogue, 5 kernels). On the CPU each fused call is the composition of the unfused
 * ones (metrale/ops_gemm.h), so the fused and the unfused step agree bit for bit; on a device
 * within the GEMM's tolerance. */
enum {
    FUSED_Q,
    FUSED_KV,
    FUSED_O,
    FUSED_GATE_UP,
    FUSED_DOWN,
    FUSED_QKV,
    FUSED_QKV_APPEND, /* FUSED_QKV with the KV-append epilogue */
    FUSED_GEMMS
};

/* GEMM `which` of layer l's fused step over `rows` tokens: its plan (the format's kind, the
 * fusion) and its tensors; FUSED_QKV_APPEND's append arguments are *append (NULL when only
 * planning). Row-wise FP8: the RMSNorm prologue quantizes the normed rows itself; the output
 * and down projections read the codes and scales prepare_input made of their inputs. */
static void fused_gemm(const mg_fwd *m, uint32_t l, uint32_t rows, int which,
                       const mg_kv_append_args *append, mg_gemm_plan *p, mg_gemm_tensors *t) {
    const mg_model_shape *sh = &m->sh;
    const uint32_t H = sh->hidden, QD = sh->heads * sh->head_dim, I = sh->intermediate;
    const uint32_t KVD = 2 * sh->kv_heads * sh->head_dim;
    const mg_devptr *w = &m->layer_w[(size_t)l * MG_FWD_LAYER_TENSORS];
    const mg_gemm_fusion norm = {MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_NONE,
                                 m->c.preset->norm_eps};
    const mg_gemm_fusion add = {MG_GEMM_PROLOGUE_NONE, MG_GEMM_EPILOGUE_RESIDUAL_ADD, 0.0f};
    const bool fp8 = m->format->gemm_kind == MG_GEMM_FP8_ROWWISE;
    *p = (mg_gemm_plan){.kind = m->format->gemm_kind, .m = rows, .out_type = MG_DTYPE_BF16};
    *t = (mg_gemm_tensors){0};
    int slot = MG_FWD_W_GATE_UP; /* the weight matrix, for its FP8 row scales */
    switch (which) {
    case FUSED_QKV:
    case FUSED_QKV_APPEND:
        p->n = p->ldc = QD + KVD;
        p->k = H;
        p->fusion = norm;
        *t = (mg_gemm_tensors){.act = m->residual,
                               .weight = w[MG_FWD_WQ], /* q's rows, then kv's */
                               .out = m->qkv,
                               .fusion = {.norm_weight = w[MG_FWD_ATTN_NORM]}};
        slot = MG_FWD_WQ;
        if (which == FUSED_QKV_APPEND) {
            p->fusion.epilogue = MG_GEMM_EPILOGUE_KV_APPEND;
            t->fusion.kv_cache = &m->kv;
            t->fusion.kv_append = append;
        }
        break;
    case FUSED_Q:
    case FUSED_KV: {
        const bool q = which == FUSED_Q;
        p->n = p->ldc = q ? QD : KVD;
        p->k = H;
        p->fusion = norm;
        *t = (mg_gemm_tensors){.act = m->residual,
                               .weight = w[q ? MG_FWD_WQ : MG_FWD_WKV],
                               .out = q ? m->qkv : m->qkv + (uint64_t)m->tokens_padded * QD * 2,
                               .fusion = {.norm_weight = w[MG_FWD_ATTN_NORM]}};
        slot = q ? MG_FWD_WQ : MG_FWD_WKV;
        break;
    }
    case FUSED_O:
    case FUSED_DOWN: {
        const bool o = which == FUSED_O;
        p->n = p->ldc = H;
        p->k = o ? QD : I;
        p->fusion = add;
        *t = (mg_gemm_tensors){.act = fp8 ? m->act_fp8
                                      : o ? m->attn_out
                                          : m->mlp_act,
                               .act_scale = fp8 ? m->act_scales : 0,
                               .weight = w[o ? MG_FWD_WO : MG_FWD_W_DOWN],
                               .out = m->residual,
                               .fusion = {.residual = m->residual}};
        slot = o ? MG_FWD_WO : MG_FWD_W_DOWN;
        break;
    }
    default: /* FUSED_GATE_UP */
        p->n = 2 * I;
        p->ldc = I;
        p->k = H;
        p->fusion = (mg_gemm_fusion){MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_SILU_MUL,
                                     m->c.preset->norm_eps};
        *t = (mg_gemm_tensors){.act = m->residual,
                               .weight = w[MG_FWD_W_GATE_UP],
                               .out = m->mlp_act,
                               .fusion = {.norm_weight = w[MG_FWD_MLP_NORM]}};
        break;
    }
    if (fp8) /* the joined q/kv matrix's scales are joined too (mg_fwd_join_qkv) */
        t->weight_scale = m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS + slot];
}

static mg_status run_fused_gemm(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows, int which,
                                const mg_kv_append_args *append) {
    mg_gemm_plan p;
    mg_gemm_tensors t;
    fused_gemm(m, l, rows, which, append, &p, &t);
    return mg_gemm(m->b, s, &p, &t);
}

/* Plans the fused GEMMs `which[0..count)` of a step at the model's batch (mg_gemm_prewarm). */
static mg_status prewarm_fused(mg_fwd *m, mg_stream *s, const int *which, int count) {
    /* Every layer's pointers are planned: the least aligned of each GEMM's over the layers. */
    mg_gemm_plan plans[FUSED_GEMMS];
    for (int i = 0; i < count; i++) {
        mg_devptr bits = 0;
        for (uint32_t l = 0; l < m->layers; l++) {
            mg_gemm_tensors t;
            fused_gemm(m, l, m->c.batch, which[i], NULL, &plans[i], &t);
            bits |= t.act | t.weight | t.out | t.fusion.norm_weight;
        }
        uint32_t align = 16;
        while (align > 1 && bits % align)
            align /= 2;
        plans[i].pointer_alignment = align;
    }
    return mg_gemm_prewarm(m->b, s, plans, (size_t)count);
}

/* Whether some layer has a q/k head norm or a q/kv bias (between the projection and RoPE). */
static bool has_qkv_extras(const mg_fwd *m) {
    for (uint32_t l = 0; m->layer_extra && l < m->layers; l++) {
        const mg_devptr *x = m->layer_extra + (size_t)l * MG_FWD_EXTRA_TENSORS;
        if (x[MG_FWD_Q_BIAS] || x[MG_FWD_KV_BIAS] || x[MG_FWD_Q_NORM] || x[MG_FWD_K_NORM])
            return true;
    }
    return false;
}

mg_status mg_fwd_decide_fusion(mg_fwd *m, mg_stream *s) {
    m->fusion_decided = true;
    m->fused_decode = false;
    m->qkv_mode = MG_FWD_QKV_APART;
    /* tensor parallelism: the fused output and down projections add their rows to the residual
     * stream, which a rank's partial rows must not be before the all-reduce */
    if (m->c.unfused || m->sh.experts || !m->format->fused_gemms || m->format->mlp ||
        m->tp_ranks > 1)
        return MG_OK;
    /* The q and kv projections' forms, most fused first: with the KV append (joined
     * matrices, no extras, a BF16 cache), joined, apart. The first the backend plans wins. */
    const bool joined = m->qkv_joined && m->c.batch == 1;
    const bool append = joined && !has_qkv_extras(m) && m->kv.kv_dtype == MG_KV_BF16;
    static const struct {
        mg_fwd_qkv_mode mode;
        int gemms[2];
    } forms[] = {{MG_FWD_QKV_JOINED_APPEND, {FUSED_QKV_APPEND, -1}},
                 {MG_FWD_QKV_JOINED, {FUSED_QKV, -1}},
                 {MG_FWD_QKV_APART, {FUSED_Q, FUSED_KV}}};
    mg_status st = MG_ERR_UNSUPPORTED;
    for (size_t f = append ? 0 : joined ? 1 : 2; f < 3 && st == MG_ERR_UNSUPPORTED; f++) {
        int which[5] = {FUSED_O, FUSED_GATE_UP, FUSED_DOWN, forms[f].gemms[0], forms[f].gemms[1]};
        mg_clear_error();
        st = prewarm_fused(m, s, which, forms[f].gemms[1] < 0 ? 4 : 5);
        if (!st)
            m->qkv_mode = forms[f].mode;
    }
    if (st == MG_ERR_UNSUPPORTED) { /* no provider fuses at this size: the unfused step */
        mg_clear_error();
        return MG_OK;
    }
    if (st)
        return mg_fwd_lib_fail(st, "planning the fused decode GEMMs");
    m->fused_decode = true;
    return MG_OK;
}

/* One pass over `rows` new tokens (their ids in step_ids), launched on `s`: every layer, the
 * last token rows of each request, the LM head and the argmax into step_ids[0..batch). A
 * decode pass of a model with m->fused_decode runs the fused GEMMs above. */
mg_status mg_fwd_forward(mg_fwd *m, mg_stream *s, bool prefill, uint32_t rows,
                         mg_attention_plan *plan) {
    mg_backend *b = m->b;
    const mg_model_shape *sh = &m->sh;
    uint32_t H = sh->hidden, QD = sh->heads * sh->head_dim, KVD = 2 * sh->kv_heads * sh->head_dim;
    uint32_t I = sh->intermediate, B = m->c.batch;
    float eps = m->c.preset->norm_eps;
    mg_devptr q = m->qkv, kv = m->qkv + (uint64_t)m->tokens_padded * QD * 2;
    const mg_fwd_format *f = m->format;
    const bool fused = !prefill && m->fused_decode;
    const mg_fwd_qkv_mode qkv_mode = fused && rows == 1 ? m->qkv_mode : MG_FWD_QKV_APART;
    if (qkv_mode != MG_FWD_QKV_APART) /* the joined GEMV's row: q, then kv */
        kv = q + (uint64_t)QD * 2;
    mg_status st;
    OP("embedding",
       TRY(mg_gather_rows_bf16(b, s, rows, H, m->step_ids, sh->vocab, m->embedding, 0, m->residual),
           "embedding"));
    for (uint32_t l = 0; l < m->layers; l++) {
        mg_devptr *w = layer_tensor(m, l, 0);
        mg_devptr k_pages, v_pages;
        TRY(mg_kv_cache_pools(&m->kv, m->kv_pool + (uint64_t)l * m->kv_layer_bytes, &k_pages,
                              &v_pages),
            "KV pools");
        if (qkv_mode == MG_FWD_QKV_JOINED_APPEND) {
            /* RoPE and the append in the GEMV; it sets k, v, q, their strides, num_tokens */
            const mg_kv_append_args a = {.batch_size = B,
                                         .num_kv_indices = m->kv.num_pages,
                                         .num_qo_heads = sh->heads,
                                         .rope = true,
                                         .rope_theta = m->c.preset->rope_theta,
                                         .rope_inv_freq = m->rope_inv_freq,
                                         .qo_indptr = m->qo_indptr,
                                         .kv_indptr = m->kv_indptr,
                                         .kv_indices = m->kv_indices,
                                         .kv_last_page_len = m->last_page_len,
                                         .k_pages = k_pages,
                                         .v_pages = v_pages};
            OP("qkv_gemm", TRY(run_fused_gemm(m, s, l, rows, FUSED_QKV_APPEND, &a),
                               "normed q and kv projection with RoPE and KV append"));
        } else if (qkv_mode == MG_FWD_QKV_JOINED) {
            OP("qkv_gemm",
               TRY(run_fused_gemm(m, s, l, rows, FUSED_QKV, NULL), "normed q and kv projection"));
        } else if (fused) {
            OP("qkv_gemm", TRY(run_fused_gemm(m, s, l, rows, FUSED_Q, NULL), "normed q projection");
               TRY(run_fused_gemm(m, s, l, rows, FUSED_KV, NULL), "normed kv projection"));
        } else {
            OP("rmsnorm", TRY(mg_rmsnorm_bf16(b, s, rows, H, eps, m->residual, l ? m->proj_out : 0,
                                              w[MG_FWD_ATTN_NORM], m->norm_out),
                              "attention norm"));
            if ((st = prepare(m, s, rows, H, m->norm_out)))
                return st;
            OP("qkv_gemm", TRY(f->linear(m, s, prefill, l, MG_FWD_WQ, rows, QD, H, m->norm_out, q),
                               "q projection");
               TRY(f->linear(m, s, prefill, l, MG_FWD_WKV, rows, KVD, H, m->norm_out, kv),
                   "kv projection"));
        }
        mg_devptr k = kv;
        uint32_t k_stride = KVD;
        const mg_devptr *x =
            m->layer_extra ? m->layer_extra + (size_t)l * MG_FWD_EXTRA_TENSORS : NULL;
        if (x && x[MG_FWD_Q_BIAS])
            OP("qkv_bias",
               TRY(mg_mlx_add_bias(b, s, rows, QD, q, x[MG_FWD_Q_BIAS], MG_DTYPE_F32), "q bias");
               TRY(mg_mlx_add_bias(b, s, rows, KVD, kv, x[MG_FWD_KV_BIAS], MG_DTYPE_F32),
                   "k and v biases"));
        if (x && x[MG_FWD_Q_NORM]) {
            /* q rows are whole heads back to back, so its heads are RMSNorm rows as they lie;
             * the keys are packed first, away from the values they are joined with */
            const uint32_t D = sh->head_dim, KD = sh->kv_heads * D;
            OP("qk_norm",
               TRY(mg_rmsnorm_bf16(b, s, rows * sh->heads, D, eps, q, 0, x[MG_FWD_Q_NORM], q),
                   "q head norm");
               TRY(mg_copy_2d_d2d_async(b, m->k_normed, 2ull * KD, kv, 2ull * KVD, 2ull * KD, rows,
                                        s),
                   "packing the keys");
               TRY(mg_rmsnorm_bf16(b, s, rows * sh->kv_heads, D, eps, m->k_normed, 0,
                                   x[MG_FWD_K_NORM], m->k_normed),
                   "k head norm"));
            k = m->k_normed;
            k_stride = KD;
        }
        mg_kv_append_args a = {.batch_size = B,
                               .num_tokens = rows,
                               .num_kv_indices = m->kv.num_pages,
                               .k = k,
                               .v = kv + (uint64_t)(KVD / 2) * 2,
                               .k_stride = k_stride,
                               .v_stride = KVD,
                               .q = q,
                               .q_stride = QD,
                               .num_qo_heads = sh->heads,
                               .rope = true,
                               .rope_theta = m->c.preset->rope_theta,
                               .rope_inv_freq = m->rope_inv_freq,
                               .qo_indptr = m->qo_indptr,
                               .kv_indptr = m->kv_indptr,
                               .kv_indices = m->kv_indices,
                               .kv_last_page_len = m->last_page_len,
                               .k_pages = k_pages,
                               .v_pages = v_pages};
        if (qkv_mode != MG_FWD_QKV_JOINED_APPEND)
            OP("rope_append", TRY(mg_kv_append(b, s, &m->kv, &a), "RoPE and KV append"));
        mg_paged_attention_tensors t = {.q = q,
                                        .o = m->attn_out,
                                        .qo_rows = rows,
                                        .k_pages = k_pages,
                                        .v_pages = v_pages,
                                        .num_pages = m->kv.num_pages,
                                        .kv_indices = m->kv_indices,
                                        .num_kv_indices = m->kv.num_pages};
        OP("attention", TRY(mg_paged_attention_run(plan, &t, s), "attention"));
        if (fused) { /* the residual stream updated in place twice; proj_out is not used */
            if ((st = prepare(m, s, rows, QD, m->attn_out)))
                return st;
            OP("o_gemm",
               TRY(run_fused_gemm(m, s, l, rows, FUSED_O, NULL), "output projection + residual"));
            OP("gate_up", TRY(run_fused_gemm(m, s, l, rows, FUSED_GATE_UP, NULL),
                              "normed gate_up projection with SiLU-mul"));
            if ((st = prepare(m, s, rows, I, m->mlp_act)))
                return st;
            OP("down",
               TRY(run_fused_gemm(m, s, l, rows, FUSED_DOWN, NULL), "down projection + residual"));
            continue;
        }
        if ((st = prepare(m, s, rows, QD, m->attn_out)))
            return st;
        OP("o_gemm",
           TRY(f->linear(m, s, prefill, l, MG_FWD_WO, rows, H, QD, m->attn_out, m->proj_out),
               "output projection"));
        if ((st = mg_fwd_tp_reduce(m, s, rows)))
            return st;
        OP("rmsnorm", TRY(mg_rmsnorm_bf16(b, s, rows, H, eps, m->residual, m->proj_out,
                                          w[MG_FWD_MLP_NORM], m->norm_out),
                          "MLP norm"));
        if (sh->experts) {
            if ((st = moe_mlp(m, s, l, rows)))
                return st;
            continue;
        }
        if (f->mlp) {
            if ((st = f->mlp(m, s, l, rows)) || (st = mg_fwd_tp_reduce(m, s, rows)))
                return st;
            continue;
        }
        if ((st = prepare(m, s, rows, H, m->norm_out)) ||
            (st = f->gate_up(m, s, prefill, l, rows)) || (st = prepare(m, s, rows, I, m->mlp_act)))
            return st;
        OP("down",
           TRY(f->linear(m, s, prefill, l, MG_FWD_W_DOWN, rows, H, I, m->mlp_act, m->proj_out),
               "down projection"));
        if ((st = mg_fwd_tp_reduce(m, s, rows)))
            return st;
    }
    OP("last_rows", TRY(mg_gather_rows_bf16(b, s, B, H, m->logits_indices, rows, m->residual,
                                            fused ? 0 : m->proj_out, m->logits_hidden),
                        "last-token rows"));
    OP("rmsnorm",
       TRY(mg_rmsnorm_bf16(b, s, B, H, eps, m->logits_hidden, 0, m->final_norm, m->logits_hidden),
           "final norm"));
    return f->lm_head(m, s, B);
}

/* forward() inside a lane span ("prefill" or "decode", step = the pass's index) when a timing
 * object is attached; the pass's op spans are armed by that step. */
mg_status mg_fwd_timed_forward(mg_fwd *m, mg_stream *s, bool prefill, uint32_t rows,
                               mg_attention_plan *plan) {
    if (!m->timing)
        return mg_fwd_forward(m, s, prefill, rows, plan);
    mg_timing_span lane = 0;
    TRY(mg_timing_step_begin(m->timing, m->token_count), "timing step");
    TRY(mg_timing_lane_begin(m->timing, prefill ? m->lane_prefill : m->lane_decode, s, &lane),
        "timing span");
    mg_status st = mg_fwd_forward(m, s, prefill, rows, plan);
    if (st) {
        /* An op failed mid-pass: its span and the lane's are ended anyway, so the timing object
         * holds no span left open (their times mean nothing; the status is what counts). */
        if (m->open_span)
            mg_timing_span_end(m->timing, m->open_span, s);
        m->open_span = 0;
        mg_timing_span_end(m->timing, lane, s);
        return st;
    }
    TRY(mg_timing_span_end(m->timing, lane, s), "timing span");
    return MG_OK;
}
