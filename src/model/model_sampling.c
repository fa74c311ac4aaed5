/* model_sampling.c - sampled decoding in the forward model (model.h: mg_fwd_set_sampling;
 * model_sampling.h): the requests' parameters, their steps and penalty histories uploaded
 * before each pass, and mg_sample launched over the logits after it. */
#include "model_sampling.h"
#include "model_format.h"

#include <stdlib.h>
#include <string.h>

#include "metrale/ops_sample.h"
#include "model_mlx.h" /* mg_error_report */

struct mg_fwd_sampling {
    mg_sample_params *params; /* [batch]: the caller's, step and history_len set per pass */
    int32_t *history;         /* [batch][window] host staging */
    uint32_t window;          /* penalty_last_n */
    mg_devptr d_params, d_history, d_workspace;
    size_t workspace_bytes;
    mg_sample_desc desc;
};

bool mg_fwd_sampling_on(const mg_fwd *m) {
    return m->sampling != NULL;
}

void mg_fwd_sampling_destroy(mg_fwd *m) {
    struct mg_fwd_sampling *sp = m->sampling;
    if (!sp)
        return;
    mg_devptr p[] = {sp->d_params, sp->d_history, sp->d_workspace};
    for (size_t i = 0; i < 3; i++)
        if (p[i])
            mg_free(m->b, p[i]);
    free(sp->params);
    free(sp->history);
    free(sp);
    m->sampling = NULL;
}

static mg_status set_sampling_rank(mg_fwd *m, const mg_sample_params *params,
                                   uint32_t penalty_last_n);

mg_status mg_fwd_set_sampling(mg_fwd *m, const mg_sample_params *params, uint32_t penalty_last_n) {
    mg_status st = mg_fwd_tp_usable(m);
    if (st)
        return st;
    /* rank 0 checks the parameters for every rank (all have the same batch and vocabulary): a
     * refusal changes nothing anywhere */
    const uint32_t B = m->c.batch, V = m->sh.vocab;
    if (params && penalty_last_n > MG_SAMPLE_MAX_HISTORY)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "penalty_last_n=%u exceeds %u",
                               penalty_last_n, MG_SAMPLE_MAX_HISTORY);
    for (uint32_t r = 0; params && r < B; r++) {
        mg_sample_params p = params[r];
        p.history_len = 0;
        if (mg_sample_params_check(&p, V, 0))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT, "request %u's sampling: %s", r,
                                   mg_last_error());
    }
    /* every rank samples the same gathered logits with the same parameters, so they draw the
     * same tokens; a rank failing now (its sampler then off, others' on) stops them all */
    uint32_t peers = 0;
    mg_fwd *const *peer = mg_fwd_tp_peers(m, &peers);
    if ((st = set_sampling_rank(m, params, penalty_last_n)))
        return mg_fwd_tp_setter_failed(m, m->tp_rank, st, "setting the sampling");
    for (uint32_t r = 0; r < peers; r++)
        if ((st = set_sampling_rank(peer[r], params, penalty_last_n)))
            return mg_fwd_tp_setter_failed(m, peer[r]->tp_rank, st, "setting the sampling");
    return MG_OK;
}

/* The checked parameters onto rank m (on failure its sampler is off). */
static mg_status set_sampling_rank(mg_fwd *m, const mg_sample_params *params,
                                   uint32_t penalty_last_n) {
    const uint32_t B = m->c.batch, V = m->sh.vocab;
    /* a captured decode graph holds the pass as it was: sampling on or off changes it */
    if (m->graph && (params != NULL) != (m->sampling != NULL)) {
        mg_graph_destroy(m->graph);
        m->graph = NULL;
    }
    mg_fwd_sampling_destroy(m);
    if (!params)
        return MG_OK;
    struct mg_fwd_sampling *sp = calloc(1, sizeof *sp);
    if (!sp)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    m->sampling = sp;
    sp->window = penalty_last_n;
    const bool bf16 = m->format->bf16_logits; /* model_format.h */
    sp->desc = (mg_sample_desc){.rows = B,
                                .vocab = V,
                                .logits_dtype = bf16 ? MG_DTYPE_BF16 : MG_DTYPE_F32,
                                .logits_pitch = m->logits_pitch,
                                .history_pitch = sp->window};
    sp->workspace_bytes = mg_sample_workspace_bytes(&sp->desc);
    sp->params = malloc(B * sizeof *sp->params);
    sp->history = malloc((size_t)B * (sp->window ? sp->window : 1) * sizeof *sp->history);
    mg_status st = !sp->params || !sp->history ? MG_ERR_OUT_OF_MEMORY : MG_OK;
    if (!st && !(st = mg_alloc(m->b, B * sizeof(mg_sample_params), &sp->d_params)) &&
        !(st = mg_alloc(m->b, (size_t)B * (sp->window ? sp->window : 1) * 4, &sp->d_history)))
        st = mg_alloc(m->b, sp->workspace_bytes, &sp->d_workspace);
    if (st) {
        mg_fwd_sampling_destroy(m);
        return st == MG_ERR_OUT_OF_MEMORY && !mg_last_error()[0]
                   ? mg_error_report(st, "out of host memory")
                   : mg_fwd_lib_fail(st, "allocating the sampler's buffers");
    }
    memcpy(sp->params, params, B * sizeof *sp->params);
    return MG_OK;
}

/* Token t of request r's sequence so far: its prompt, then the tokens generated. */
static int32_t sequence_token(const mg_fwd *m, uint32_t r, uint64_t t, uint32_t prompt_len,
                              const int32_t *prompt) {
    return t < prompt_len ? prompt[t] : m->tokens[(size_t)r * (m->c.steps + 1) + (t - prompt_len)];
}

mg_status mg_fwd_sampling_upload(mg_fwd *m) {
    struct mg_fwd_sampling *sp = m->sampling;
    if (!sp)
        return MG_OK;
    const uint32_t B = m->c.batch;
    uint64_t offset = 0; /* request r's prompt in prompt_ids (per-request prompts) */
    for (uint32_t r = 0; r < B; r++) {
        const uint32_t len = mg_fwd_prompt_length(&m->c, r);
        const int32_t *prompt = m->c.prompt_ids ? m->c.prompt_ids + offset : NULL;
        if (m->c.prompt_lengths)
            offset += len;
        const uint64_t have = (uint64_t)len + m->token_count;
        const uint32_t n = have < sp->window ? (uint32_t)have : sp->window;
        for (uint32_t j = 0; j < n; j++) {
            const uint64_t t = have - n + j;
            sp->history[(size_t)r * sp->window + j] =
                t < len && !prompt ? mg_fwd_prompt_token(m->c.seed, m->sh.vocab, r, (uint32_t)t)
                                   : sequence_token(m, r, t, len, prompt);
        }
        sp->params[r].step = m->token_count;
        sp->params[r].history_len = n;
    }
    TRY(mg_copy_h2d(m->b, sp->d_params, sp->params, B * sizeof *sp->params),
        "uploading the sampling parameters");
    if (sp->window)
        TRY(mg_copy_h2d(m->b, sp->d_history, sp->history, (size_t)B * sp->window * 4),
            "uploading the penalty history");
    return MG_OK;
}

mg_status mg_fwd_sampling_launch(mg_fwd *m, mg_stream *s) {
    struct mg_fwd_sampling *sp = m->sampling;
    if (!sp)
        return MG_OK;
    TRY(mg_sample(m->b, s, &sp->desc, m->logits, sp->d_params, sp->window ? sp->d_history : 0,
                  sp->d_workspace, sp->workspace_bytes, m->step_ids),
        "sampling");
    return MG_OK;
}

mg_status mg_fwd_sampling_check_ids(const mg_fwd *m, const int32_t *ids) {
    for (uint32_t r = 0; r < m->c.batch; r++)
        if (ids[r] < 0)
            return mg_error_report(
                MG_ERR_INVALID_ARGUMENT, "request %u, token %u: %s", r, m->token_count,
                ids[r] == MG_SAMPLE_BAD_LOGITS ? "the logits hold NaN or +inf; nothing was sampled"
                : ids[r] == MG_SAMPLE_NO_CANDIDATE
                    ? "every logit is -inf; no token can be sampled"
                    : "the sampling parameters or history are out of range");
    return MG_OK;
}
