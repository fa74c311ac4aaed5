/*
 * generate.h - generation over the forward model (model.h): several requests in one batch, each
 * with its own prompt, sampling parameters (metrale/ops_sample.h), token limit and stop ids,
 * and a callback per new token for streaming.
 *
 *   mg_gen_request r = {.prompt = ids, .prompt_len = n, .max_tokens = 128,
 *                       .sampling = mg_sample_params_greedy(), .stop_ids = &eos,
 *                       .stop_count = 1};
 *   r.sampling.temperature = 0.7f; r.sampling.top_p = 0.9f; r.sampling.seed = 42;
 *   mg_gen_options o = {.model_path = "SmolLM2-135M-Instruct.Q4_1.gguf"};
 *   mg_gen_result res;
 *   mg_generate(backend, &o, &r, 1, on_token, user, &res, NULL);
 *   ... res.tokens[0 .. res.count), res.finish ...
 *   mg_gen_results_free(&res, 1);
 *
 * What a caller may rely on:
 *  - Bad requests get a status and a one-line mg_last_error naming the request, before any
 *    pass runs: a NULL or empty prompt, max_tokens 0, stop ids missing, sampling parameters
 *    out of range (mg_sample_params_check; these before the model is loaded), an id outside
 *    the vocabulary, a prompt plus the batch's largest max_tokens past the model's context
 *    (nothing is truncated), more requests than the model's batch limit.
 *  - The requests run in lockstep, one batch of the model, until every one has finished; a
 *    finished request's later tokens are neither reported nor kept.
 *  - A request's tokens depend on its own prompt and parameters only: its draws are keyed by
 *    its seed and the token's index (mg_fwd_set_sampling), not by the batch. All-greedy
 *    batches without penalties decode with the argmax op, as model.h's greedy steps.
 *  - The model (weights, arena, KV cache, sampler buffers) is created for the call and freed
 *    before it returns; nothing is allocated on the device inside the decode loop.
 */
#ifndef METRALE_GENERATE_H
#define METRALE_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"

typedef enum mg_gen_finish {
    MG_GEN_UNFINISHED = 0, /* only when mg_generate failed */
    MG_GEN_STOP_ID,        /* the last token is one of the request's stop ids (kept) */
    MG_GEN_MAX_TOKENS,     /* max_tokens were generated */
    MG_GEN_CALLBACK,       /* the callback asked to stop after the last token */
} mg_gen_finish;

typedef struct mg_gen_request {
    const int32_t *prompt; /* token ids, each in [0, vocab) */
    uint32_t prompt_len;   /* >= 1 */
    uint32_t max_tokens;   /* >= 1: the most tokens generated */
    /* seed, temperature, filters, penalties; step and history_len are set by the generator */
    mg_sample_params sampling;
    const int32_t *stop_ids; /* e.g. the tokenizer's end-of-sequence id; may be NULL if 0 */
    uint32_t stop_count;
} mg_gen_request;

typedef struct mg_gen_result {
    int32_t *tokens; /* the generated ids (malloc'ed; mg_gen_results_free) */
    uint32_t count;
    mg_gen_finish finish;
} mg_gen_result;

typedef struct mg_gen_stats {
    double load_s, prefill_s, decode_s; /* wall seconds of creation, the prefill, the steps */
    uint32_t prompt_tokens, decode_steps, graph_steps;
} mg_gen_stats;

/* Called for every new token of every unfinished request, in order of index (0 for the
 * prefill's token) and, within a step, of request; returning false finishes that request after
 * this token (MG_GEN_CALLBACK). */
typedef bool (*mg_gen_token_fn)(void *user, uint32_t request, uint32_t index, int32_t token);

typedef struct mg_gen_options {
    /* A checkpoint (model.h's model_path), or NULL for `preset` with deterministic random
     * weights of format `weights` and seed `weight_seed` (tests, benchmarks). */
    const char *model_path;
    const mg_fwd_preset *preset;
    mg_fwd_weights weights;
    uint64_t weight_seed;
    bool use_graphs;         /* decode steps replay one captured graph (CUDA) */
    uint32_t penalty_last_n; /* the penalties' window (<= MG_SAMPLE_MAX_HISTORY); 0: 64 */
} mg_gen_options;

/* Generates for requests[0 .. count) (count <= the model's batch limit) on `b`; on_token may
 * be NULL. results[count] are filled (free them with mg_gen_results_free, also after a
 * failure); stats may be NULL. */
mg_status mg_generate(mg_backend *b, const mg_gen_options *o, const mg_gen_request *requests,
                      uint32_t count, mg_gen_token_fn on_token, void *user, mg_gen_result *results,
                      mg_gen_stats *stats);
void mg_gen_results_free(mg_gen_result *results, uint32_t count);

#endif
