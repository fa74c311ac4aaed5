/* model_tp.c - tensor parallelism of the forward model (model.h): each rank's shape and share of
 * the weights, the all-reduce after the row-parallel projections, the vocabulary-parallel LM
 * head, and mg_fwd_create_tp's driver (a thread and a stream per rank). */
#include "model_tp.h"
#include "model_format.h"
#include "model_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/comm.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/status.h"

/* What mg_fwd_create_tp's rank 0 owns: the other ranks, their streams (rank 0 runs on the
 * caller's) and every rank's communicator. */
struct mg_fwd_tp_group {
    uint32_t n;
    mg_fwd *rank[MG_COMM_MAX_RANKS];
    mg_stream *stream[MG_COMM_MAX_RANKS];
    mg_comm *comm[MG_COMM_MAX_RANKS];
};

const mg_fwd_tp_matrix mg_fwd_tp_matrices[MG_FWD_TP_MATRICES] = {
    {MG_FWD_WQ, 1, MG_COMM_SHARD_ROWS, "q_proj"},
    {MG_FWD_WKV, 2, MG_COMM_SHARD_ROWS, "k_proj/v_proj"},
    {MG_FWD_WO, 1, MG_COMM_SHARD_COLUMNS, "o_proj"},
    {MG_FWD_W_GATE_UP, 2, MG_COMM_SHARD_ROWS, "gate_proj/up_proj"},
    {MG_FWD_W_DOWN, 1, MG_COMM_SHARD_COLUMNS, "down_proj"}};

mg_status mg_fwd_tp_check(const mg_fwd_config *c, uint32_t ranks) {
    const mg_fwd_preset *p = c->preset;
    const mg_model_shape *sh = &p->shape;
    const char *format = mg_fwd_weights_name(c->weights);
    if (sh->experts)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "tensor parallelism over %u ranks: %s is a mixture of experts; "
                               "only dense models are split",
                               ranks, p->name);
    /* a split would change their quantization: NVFP4's scale is the whole tensor's, FP8's the
     * whole row's (of wo and w_down, whose rows are cut) */
    if (c->weights == MG_FWD_WEIGHTS_NVFP4 || c->weights == MG_FWD_WEIGHTS_FP8)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "tensor parallelism over %u ranks: %s weights are not split (%s); "
                               "BF16 and MLX weights are",
                               ranks, format ? format : "these",
                               c->weights == MG_FWD_WEIGHTS_NVFP4
                                   ? "one global scale per whole tensor"
                                   : "one scale per whole row of wo and w_down");
    if (sh->kv_heads % ranks)
        return mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "tensor parallelism over %u ranks: kv_heads %u of %s does not divide "
            "by %u (each rank holds whole KV heads)",
            ranks, sh->kv_heads, p->name, ranks);
    /* heads divide by kv_heads for the loaders' checkpoints, not necessarily for a preset */
    if (sh->heads % ranks)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %u ranks: heads %u of %s does not divide "
                               "by %u",
                               ranks, sh->heads, p->name, ranks);
    if (sh->intermediate % ranks)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %u ranks: intermediate %u of %s does not "
                               "divide by %u",
                               ranks, sh->intermediate, p->name, ranks);
    uint32_t first, count; /* the last rank holds the fewest rows */
    mg_fwd_tp_vocab_rows(sh->vocab, ranks, ranks - 1, &first, &count);
    if (!count)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %u ranks: vocab %u of %s is smaller than "
                               "%u: rank %u would hold no rows of the LM head",
                               ranks, sh->vocab, p->name, ranks, ranks - 1);
    return MG_OK;
}

void mg_fwd_tp_set_shape(mg_fwd *m) {
    const uint32_t n = m->tp_ranks ? m->tp_ranks : 1;
    m->sh = m->full_sh;
    m->sh.heads /= n; /* mg_fwd_tp_check: heads, kv_heads and intermediate divide by n */
    m->sh.kv_heads /= n;
    m->sh.intermediate /= n;
    const uint32_t V = m->full_sh.vocab;
    mg_fwd_tp_vocab_rows(V, n, m->tp_rank, &m->vocab_first, &m->vocab_count);
    m->vocab_pitch = mg_fwd_tp_vocab_pitch(V, n);
}

mg_status mg_fwd_tp_cut_buffer(mg_backend *b, mg_devptr *w, size_t rows, size_t row_bytes,
                               mg_comm_shard_axis axis, uint32_t parts, uint32_t rank,
                               uint32_t ranks) {
    const size_t bytes = rows * row_bytes, shard_bytes = bytes / ranks;
    void *host = malloc(bytes);
    if (!host)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights' shards");
    mg_devptr shard = 0;
    mg_status st = mg_copy_d2h(b, host, *w, bytes);
    if (!st)
        st = mg_comm_shard(host, rows, row_bytes, axis, parts, (int)rank, (int)ranks, host);
    if (!st && !(st = mg_alloc(b, shard_bytes, &shard)))
        st = mg_copy_h2d(b, shard, host, shard_bytes);
    free(host);
    if (st) {
        if (shard)
            mg_free(b, shard);
        return mg_fwd_lib_fail(st, "cutting the weights into tensor-parallel shards");
    }
    mg_free(b, *w);
    *w = shard;
    return MG_OK;
}

/* *w [rows, row_bytes] cut to this rank's shard; the model's weight bytes follow. */
static mg_status shard_buffer(mg_fwd *m, mg_devptr *w, size_t rows, size_t row_bytes,
                              mg_comm_shard_axis axis, uint32_t parts) {
    mg_status st =
        mg_fwd_tp_cut_buffer(m->b, w, rows, row_bytes, axis, parts, m->tp_rank, m->tp_ranks);
    if (!st)
        m->weight_bytes -= rows * row_bytes - rows * row_bytes / m->tp_ranks;
    return st;
}

mg_status mg_fwd_tp_shard_weights(mg_fwd *m) {
    if (m->tp_ranks < 2)
        return MG_OK;
    if (m->fp4 || m->fp8_scales) /* mg_fwd_tp_check refuses them first */
        return mg_error_report(MG_ERR_UNSUPPORTED, "tensor parallelism: quantized weights");
    const mg_fwd_tp_matrix *matrices = mg_fwd_tp_matrices; /* model_tp.h */
    const mg_model_shape *full = &m->full_sh;
    const size_t QD = (size_t)full->heads * full->head_dim,
                 KD = (size_t)full->kv_heads * full->head_dim;
    mg_status st = MG_OK;
    for (uint32_t l = 0; !st && l < m->layers; l++) {
        for (size_t i = 0; !st && i < MG_FWD_TP_MATRICES; i++) {
            uint32_t rows = 0, cols = 0;
            float offset, scale;
            mg_devptr *w = layer_tensor(m, l, matrices[i].slot);
            if (!*w)
                continue;
            if ((st = mg_fwd_tensor_shape(full, m->layers, mg_fwd_layer_tensor(l, matrices[i].slot),
                                          &rows, &cols, &offset, &scale)))
                return mg_fwd_lib_fail(st, "tensor-parallel shards");
            st = shard_buffer(m, w, rows, (size_t)cols * 2, matrices[i].axis, matrices[i].parts);
        }
        /* a checkpoint's FP32 q bias and joined k and v biases follow their matrices' rows;
         * the head norms ([head_dim], shared by every head) stay whole */
        mg_devptr *x = m->layer_extra ? m->layer_extra + (size_t)l * MG_FWD_EXTRA_TENSORS : NULL;
        if (!st && x && x[MG_FWD_Q_BIAS])
            st = shard_buffer(m, &x[MG_FWD_Q_BIAS], QD, 4, MG_COMM_SHARD_ROWS, 1);
        if (!st && x && x[MG_FWD_KV_BIAS])
            st = shard_buffer(m, &x[MG_FWD_KV_BIAS], 2 * KD, 4, MG_COMM_SHARD_ROWS, 2);
    }
    if (!st && m->mlx) { /* the MLX matrices (model_mlx.c), the same split */
        const uint64_t whole = mg_fwd_mlx_bytes(m->mlx);
        if (!(st = mg_fwd_mlx_shard(m->mlx, &m->sh, m->tp_rank, m->tp_ranks)))
            m->weight_bytes = m->weight_bytes - whole + mg_fwd_mlx_bytes(m->mlx);
    }
    if (st)
        return st;
    /* the LM head's vocabulary rows (a tied head: a copy of the embedding's, which stays whole) */
    const size_t row = (size_t)full->hidden * 2, bytes = (size_t)m->vocab_count * row;
    mg_devptr head = 0;
    if ((st = mg_alloc(m->b, bytes, &head)) ||
        (st = mg_copy_d2d(m->b, head, m->lm_head + (uint64_t)m->vocab_first * row, bytes))) {
        if (head)
            mg_free(m->b, head);
        return mg_fwd_lib_fail(st, "the LM head's vocabulary slice");
    }
    if (m->lm_head != m->embedding) {
        mg_free(m->b, m->lm_head);
        m->weight_bytes -= (uint64_t)full->vocab * row;
    }
    m->lm_head = head;
    m->weight_bytes += bytes;
    return MG_OK;
}

mg_status mg_fwd_tp_reduce(mg_fwd *m, mg_stream *s, uint32_t rows) {
    if (m->tp_ranks < 2)
        return MG_OK;
    OP("all_reduce",
       TRY(mg_comm_all_reduce(m->comm, s, m->proj_out, m->proj_out, (size_t)rows * m->sh.hidden,
                              MG_DTYPE_BF16, MG_COMM_SUM),
           "all-reduce of the row-parallel projection"));
    return MG_OK;
}

/* The gathered slices [ranks, rows, vocab_pitch] laid out as whole rows of logits (pitch
 * logits_pitch): rank r's mg_fwd_tp_vocab_rows columns of each. */
static mg_status lay_out_logits(mg_fwd *m, mg_stream *s, uint32_t rows) {
    const uint64_t P = m->vocab_pitch;
    for (uint32_t r = 0; r < m->tp_ranks; r++) {
        uint32_t first, count;
        mg_fwd_tp_vocab_rows(m->sh.vocab, m->tp_ranks, r, &first, &count);
        TRY(mg_copy_2d_d2d_async(m->b, m->logits + 4ull * first, 4ull * m->logits_pitch,
                                 m->tp_gathered + 4 * r * rows * P, 4 * P, 4ull * count, rows, s),
            "laying out the gathered logits");
    }
    return MG_OK;
}

mg_status mg_fwd_tp_lm_head(mg_fwd *m, mg_stream *s, uint32_t rows) {
    const mg_model_shape *sh = &m->sh;
    mg_status st;
    OP("lm_head", TRY(mg_gemm_bf16(m->b, s, rows, m->vocab_count, sh->hidden, m->logits_hidden,
                                   m->lm_head, m->tp_logits, MG_DTYPE_F32, m->vocab_pitch),
                      "LM head (this rank's vocabulary)"));
    OP("logits_gather", TRY(mg_comm_all_gather(m->comm, s, m->tp_logits, m->tp_gathered,
                                               (size_t)rows * m->vocab_pitch, MG_DTYPE_F32),
                            "all-gather of the logits");
       if ((st = lay_out_logits(m, s, rows))) return st);
    OP("argmax",
       TRY(mg_argmax_f32(m->b, s, rows, sh->vocab, m->logits, m->logits_pitch, m->step_ids),
           "argmax"));
    return MG_OK;
}

void mg_fwd_tp_stop(mg_fwd *m, const char *why) {
    if (m->tp_ranks < 2)
        return;
    if (!m->tp_stopped[0]) /* the first reason stays */
        snprintf(m->tp_stopped, sizeof m->tp_stopped, "%s", why && *why ? why : "a failure");
    mg_comm_abort(m->comm);
}

void mg_fwd_tp_stop_group(mg_fwd *m, const char *why) {
    char copy[sizeof m->tp_stopped]; /* `why` may be mg_last_error or a rank's record */
    snprintf(copy, sizeof copy, "%s", why ? why : "");
    if (!m->group) {
        mg_fwd_tp_stop(m, copy);
        return;
    }
    for (uint32_t r = 0; r < m->group->n; r++)
        mg_fwd_tp_stop(m->group->rank[r], copy);
}

mg_status mg_fwd_tp_usable(const mg_fwd *m) {
    if (!m->tp_stopped[0])
        return MG_OK;
    return mg_error_report(MG_ERR_DEVICE,
                           "the tensor-parallel model was stopped after an earlier failure (%s): "
                           "its ranks may be out of step, so it is only good for mg_fwd_destroy",
                           m->tp_stopped);
}

mg_status mg_fwd_tp_setter_failed(mg_fwd *m, uint32_t rank, mg_status st, const char *what) {
    if (m->tp_ranks < 2)
        return st;
    char why[sizeof m->tp_stopped];
    snprintf(why, sizeof why, "tensor-parallel rank %u, %s: %s", rank, what, mg_last_error());
    mg_fwd_tp_stop_group(m, why);
    return mg_error_report(st,
                           "%s; the other ranks may hold the change, so every communicator is "
                           "aborted: the model is only good for mg_fwd_destroy",
                           why);
}

mg_fwd *const *mg_fwd_tp_peers(const mg_fwd *m, uint32_t *count) {
    *count = m->group ? m->group->n - 1 : 0;
    return m->group ? m->group->rank + 1 : NULL;
}

/* ------------------------------------------------------------------ the driver */

typedef struct rank_pass {
    mg_fwd *m;
    mg_stream *s;
    bool prefill;
    atomic_int *failures; /* shared: the order in which ranks failed */
    mg_status st;
    int order;
    char message[512];
} rank_pass;

static void *rank_pass_run(void *arg) {
    rank_pass *p = arg;
    /* a failing rank aborts its own communicator (mg_fwd_tp_stop), so its peers fail at their
     * next collective instead of waiting for it */
    p->st = p->prefill ? mg_fwd_prefill_rank(p->m, p->s) : mg_fwd_decode_rank(p->m, p->s);
    if (p->st) {
        p->order = atomic_fetch_add(p->failures, 1);
        snprintf(p->message, sizeof p->message, "%s", mg_last_error());
    }
    return NULL;
}

/* Whether every rank's latest tokens are rank 0's; a failing report naming the first that is
 * not. */
static mg_status check_tokens_agree(const struct mg_fwd_tp_group *g) {
    const mg_fwd *m0 = g->rank[0];
    const size_t stride = m0->c.steps + 1, latest = m0->token_count - 1;
    for (uint32_t r = 1; r < g->n; r++)
        for (uint32_t q = 0; q < m0->c.batch; q++) {
            const int32_t a = m0->tokens[q * stride + latest];
            const int32_t b = g->rank[r]->tokens[q * stride + latest];
            if (g->rank[r]->token_count != m0->token_count || a != b)
                return mg_error_report(MG_ERR_INTERNAL,
                                       "tensor-parallel ranks disagree: request %u's token %zu is "
                                       "%d on rank 0, %d on rank %u",
                                       q, latest, a, b, r);
        }
    return MG_OK;
}

mg_status mg_fwd_tp_run(mg_fwd *m, mg_stream *s, bool prefill) {
    mg_status st = mg_fwd_pass_allowed(m, prefill);
    if (st)
        return st;
    struct mg_fwd_tp_group *g = m->group;
    rank_pass passes[MG_COMM_MAX_RANKS];
    pthread_t threads[MG_COMM_MAX_RANKS];
    bool started[MG_COMM_MAX_RANKS] = {false};
    atomic_int failures = 0;
    for (uint32_t r = 0; r < g->n; r++)
        passes[r] = (rank_pass){
            .m = g->rank[r], .s = r ? g->stream[r] : s, .prefill = prefill, .failures = &failures};
    for (uint32_t r = 1; r < g->n; r++) {
        if (pthread_create(&threads[r], NULL, rank_pass_run, &passes[r]) != 0) {
            /* first in the failure order, before the abort makes the ranks started fail (at
             * their first collective, instead of waiting for this one) */
            passes[r].order = atomic_fetch_add(&failures, 1);
            passes[r].st = MG_ERR_UNAVAILABLE;
            snprintf(passes[r].message, sizeof passes[r].message,
                     "cannot start a thread for rank %u", r);
            for (uint32_t c = 0; c < g->n; c++)
                mg_comm_abort(g->comm[c]);
            break;
        }
        started[r] = true;
    }
    if (!atomic_load(&failures))
        rank_pass_run(&passes[0]);
    else /* rank 0 never runs: its peers see the abort */
        passes[0].st = MG_OK;
    for (uint32_t r = 1; r < g->n; r++)
        if (started[r])
            pthread_join(threads[r], NULL);
    const rank_pass *first = NULL;
    for (uint32_t r = 0; r < g->n; r++)
        if (passes[r].st && (!first || passes[r].order < first->order))
            first = &passes[r];
    /* any failure, or ranks that disagree: every rank stopped (none runs now) */
    if (first) {
        st = mg_error_report(first->st, "tensor-parallel rank %u: %s", first->m->tp_rank,
                             first->message);
    } else if ((st = check_tokens_agree(g))) {
        st = mg_error_report(st,
                             "%s; every communicator is aborted: the model is only good for "
                             "mg_fwd_destroy",
                             mg_last_error());
    }
    if (st)
        mg_fwd_tp_stop_group(m, mg_last_error());
    return st;
}

void mg_fwd_tp_group_destroy(struct mg_fwd_tp_group *g) {
    if (!g)
        return;
    /* every rank (and its captured graphs) before the communicators it used */
    for (uint32_t r = 0; r < g->n; r++) {
        mg_fwd_destroy(g->rank[r]);
        if (g->stream[r])
            mg_stream_destroy(g->stream[r]);
    }
    for (uint32_t r = 0; r < g->n; r++)
        mg_comm_destroy(g->comm[r]);
    free(g);
}

mg_status mg_fwd_create_tp(mg_backend *const *backends, int n, const mg_fwd_config *c,
                           mg_fwd **out) {
    *out = NULL;
    if (!backends || !c || n < 1 || n > MG_COMM_MAX_RANKS)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "tensor parallelism over %d ranks: 1..%d ranks, each a backend", n,
                               MG_COMM_MAX_RANKS);
    if (n == 1)
        return mg_fwd_create(backends[0], c, out);
    struct mg_fwd_tp_group *g = calloc(1, sizeof *g);
    if (!g)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    g->n = (uint32_t)n;
    mg_status st = mg_comm_create_local(backends, n, NULL, g->comm);
    if (st) {
        free(g);
        return mg_fwd_lib_fail(st, "creating the tensor-parallel ranks' communicator");
    }
    for (int r = 0; !st && r < n; r++) {
        if ((st = mg_fwd_create_rank(backends[r], g->comm[r], c, &g->rank[r])) && r > 0)
            st = mg_error_report(st, "tensor-parallel rank %d: %s", r, mg_last_error());
        if (!st && r > 0 && (st = mg_stream_create(backends[r], &g->stream[r])))
            st = mg_fwd_lib_fail(st, "a stream for a tensor-parallel rank");
    }
    if (st) {
        mg_fwd_tp_group_destroy(g);
        return st;
    }
    g->rank[0]->group = g;
    *out = g->rank[0];
    return MG_OK;
}
