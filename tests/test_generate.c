/*
 * test_generate.c - generation over the forward model (src/model/generate.h, model.h's
 * mg_fwd_set_sampling) on the CPU backend with the tiny preset's random weights:
 *  - greedy generation gives the model's own greedy steps (mg_fwd_prefill / mg_fwd_decode);
 *  - with sampling and penalties on, every step's token is what mg_sample gives on that step's
 *    logits with the request's seed, the token's index as the step and the request's last
 *    tokens (prompt included) as the history, computed here with the op itself on host copies;
 *  - the same seed gives the same tokens; a request gives the same tokens alone and in a batch
 *    of requests with other prompts and parameters; graph replays give the eager tokens;
 *  - stop ids, max_tokens and the callback's stop end a request where they should, the
 *    callback sees every token in order;
 *  - bad requests (empty prompt, id outside the vocabulary, max_tokens 0, missing stop ids,
 *    sampling out of range, more requests than the batch limit) are refused with a message.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "metrale/ops_sample.h"
#include "model.h"
#include "test_util.h"

#define CHECK_FWD_MESSAGE(needle)                                                                  \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!strstr(mg_last_error(), (needle))) {                                                  \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: message \"%s\" does not mention \"%s\"\n", __FILE__,      \
                    __LINE__, mg_last_error(), (needle));                                          \
        }                                                                                          \
    } while (0)

static mg_backend *b;
static const mg_fwd_preset *tiny;

static mg_gen_options options(void) {
    return (mg_gen_options){.preset = tiny, .weight_seed = 5};
}

static void random_prompt(int32_t *ids, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)(test_rand() % tiny->shape.vocab);
}

static mg_sample_params sampled(uint64_t seed) {
    mg_sample_params p = mg_sample_params_greedy();
    p.temperature = 0.9f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.seed = seed;
    return p;
}

/* Greedy mg_generate == the model's greedy passes. */
static void test_greedy_matches_model(void) {
    int32_t prompt[11];
    random_prompt(prompt, 11);
    mg_fwd_config c = mg_fwd_config_default(tiny);
    c.batch = 1;
    c.steps = 9;
    c.seed = 5;
    c.prompt_ids = prompt;
    c.prompt_ids_count = 11;
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_STATUS(mg_fwd_create(b, &c, &m), MG_OK);
    if (!m)
        return;
    CHECK_OK(mg_fwd_prefill(m, s));
    for (int i = 0; i < 9; i++)
        CHECK_OK(mg_fwd_decode(m, s));
    uint32_t have = 0;
    const int32_t *want = mg_fwd_tokens(m, 0, &have);
    mg_gen_request q = {.prompt = prompt,
                        .prompt_len = 11,
                        .max_tokens = 10,
                        .sampling = mg_sample_params_greedy()};
    mg_gen_result res;
    mg_gen_options o = options();
    CHECK_OK(mg_generate(b, &o, &q, 1, NULL, NULL, &res, NULL));
    CHECK(res.count == 10 && have == 10 && res.finish == MG_GEN_MAX_TOKENS);
    CHECK(res.tokens && !memcmp(res.tokens, want, 10 * sizeof *want));
    mg_gen_results_free(&res, 1);
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
}

/* Each sampled step == mg_sample on that step's logits, step = index, history = last tokens. */
static void test_sampling_wiring(void) {
    const uint32_t V = tiny->shape.vocab, B = 2, P = 7, steps = 12, window = 8;
    int32_t prompt[2 * 7];
    random_prompt(prompt, B * P);
    const uint32_t lengths[2] = {P, P};
    mg_fwd_config c = mg_fwd_config_default(tiny);
    c.batch = B;
    c.steps = steps;
    c.seed = 5;
    c.prompt_ids = prompt;
    c.prompt_ids_count = B * P;
    c.prompt_lengths = lengths;
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_STATUS(mg_fwd_create(b, &c, &m), MG_OK);
    if (!m)
        return;
    mg_sample_params params[2] = {sampled(11), sampled(12)};
    params[0].repetition_penalty = 1.3f;
    params[1].temperature = 1.4f;
    params[1].top_k = 0;
    params[1].frequency_penalty = 0.5f;
    params[1].presence_penalty = 0.25f;
    CHECK_OK(mg_fwd_set_sampling(m, params, window));
    /* the op on copies of the logits, in buffers of its own: the definition applied by hand */
    mg_backend *ref = b;
    mg_sample_desc d = {
        .rows = 1, .vocab = V, .logits_dtype = MG_DTYPE_F32, .history_pitch = window};
    mg_devptr dl = 0, dp = 0, dh = 0, dw = 0, di = 0;
    CHECK_OK(mg_alloc(ref, V * 4, &dl));
    CHECK_OK(mg_alloc(ref, sizeof(mg_sample_params), &dp));
    CHECK_OK(mg_alloc(ref, window * 4, &dh));
    CHECK_OK(mg_alloc(ref, mg_sample_workspace_bytes(&d), &dw));
    CHECK_OK(mg_alloc(ref, 4, &di));
    float *logits = malloc((size_t)B * V * 4);
    int distinct_greedy = 0;
    for (uint32_t i = 0; i <= steps; i++) {
        CHECK_OK(i == 0 ? mg_fwd_prefill(m, s) : mg_fwd_decode(m, s));
        CHECK_OK(mg_fwd_logits(m, logits));
        for (uint32_t r = 0; r < B; r++) {
            uint32_t have;
            const int32_t *tok = mg_fwd_tokens(m, r, &have);
            int32_t seq[7 + 13], hist[8];
            memcpy(seq, prompt + r * P, P * 4);
            memcpy(seq + P, tok, i * 4); /* the tokens before this step's */
            const uint32_t len = P + i, h = len < window ? len : window;
            memcpy(hist, seq + len - h, h * 4);
            mg_sample_params p = params[r];
            p.step = i;
            p.history_len = h;
            int32_t want = -9;
            CHECK_OK(mg_copy_h2d(ref, dl, logits + (size_t)r * V, V * 4));
            CHECK_OK(mg_copy_h2d(ref, dp, &p, sizeof p));
            CHECK_OK(mg_copy_h2d(ref, dh, hist, h * 4));
            CHECK_OK(mg_sample(ref, NULL, &d, dl, dp, dh, dw, mg_sample_workspace_bytes(&d), di));
            CHECK_OK(mg_copy_d2h(ref, &want, di, 4));
            CHECK(have == i + 1 && tok[i] == want);
            /* and it is a sample: not always the argmax */
            uint32_t best = 0;
            for (uint32_t j = 1; j < V; j++)
                best = logits[(size_t)r * V + j] > logits[(size_t)r * V + best] ? j : best;
            distinct_greedy += (uint32_t)tok[i] != best;
        }
    }
    CHECK(distinct_greedy > 0);
    mg_devptr all[] = {dl, dp, dh, dw, di};
    for (int i = 0; i < 5; i++)
        if (all[i])
            mg_free(ref, all[i]);
    free(logits);
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
}

typedef struct seen {
    uint32_t calls, next_index[4], stop_at[4];
    int32_t tokens[4][64];
} seen;

static bool on_token(void *user, uint32_t r, uint32_t index, int32_t token) {
    seen *v = user;
    v->calls++;
    CHECK(r < 4 && index == v->next_index[r]);
    if (r < 4 && index < 64) {
        v->tokens[r][index] = token;
        v->next_index[r]++;
    }
    return !(r < 4 && v->stop_at[r] && index + 1 == v->stop_at[r]);
}

static void test_batch_and_stops(void) {
    int32_t prompts[3][20];
    const uint32_t lens[3] = {5, 20, 1};
    for (int r = 0; r < 3; r++)
        random_prompt(prompts[r], lens[r]);
    mg_gen_request q[3];
    for (int r = 0; r < 3; r++)
        q[r] = (mg_gen_request){.prompt = prompts[r],
                                .prompt_len = lens[r],
                                .max_tokens = 16,
                                .sampling = sampled(1000 + r)};
    q[1].sampling.repetition_penalty = 1.2f;
    q[2].sampling = mg_sample_params_greedy();
    q[2].max_tokens = 9;
    mg_gen_options o = options();
    mg_gen_result batch[3], alone, again[3];
    mg_gen_stats st;
    seen v = {0};
    CHECK_OK(mg_generate(b, &o, q, 3, on_token, &v, batch, &st));
    CHECK(batch[0].count == 16 && batch[1].count == 16 && batch[2].count == 9);
    CHECK(st.prompt_tokens == 26 && st.decode_steps == 15);
    CHECK(v.calls == 16 + 16 + 9);
    for (int r = 0; r < 3; r++)
        CHECK(batch[r].tokens && !memcmp(v.tokens[r], batch[r].tokens, batch[r].count * 4));
    /* alone: the same tokens */
    for (int r = 0; r < 3; r++) {
        CHECK_OK(mg_generate(b, &o, &q[r], 1, NULL, NULL, &alone, NULL));
        CHECK(alone.count == batch[r].count &&
              !memcmp(alone.tokens, batch[r].tokens, alone.count * 4));
        mg_gen_results_free(&alone, 1);
    }
    /* again, with graph replays: the same tokens */
    o.use_graphs = true;
    CHECK_OK(mg_generate(b, &o, q, 3, NULL, NULL, again, &st));
    CHECK(st.graph_steps > 0);
    for (int r = 0; r < 3; r++)
        CHECK(again[r].count == batch[r].count &&
              !memcmp(again[r].tokens, batch[r].tokens, batch[r].count * 4));
    mg_gen_results_free(again, 3);
    o.use_graphs = false;
    /* another seed: other tokens */
    q[0].sampling.seed = 77;
    CHECK_OK(mg_generate(b, &o, q, 1, NULL, NULL, &alone, NULL));
    CHECK(memcmp(alone.tokens, batch[0].tokens, 16 * 4) != 0);
    mg_gen_results_free(&alone, 1);
    q[0].sampling.seed = 1000;
    /* a stop id: request 0 ends at its 4th token (kept), the first time it appears */
    const int32_t stop = batch[0].tokens[3];
    uint32_t first = 0;
    while (batch[0].tokens[first] != stop)
        first++;
    q[0].stop_ids = &stop;
    q[0].stop_count = 1;
    memset(&v, 0, sizeof v);
    v.stop_at[1] = 2; /* the callback ends request 1 after 2 tokens */
    CHECK_OK(mg_generate(b, &o, q, 3, on_token, &v, again, NULL));
    CHECK(again[0].count == first + 1 && again[0].finish == MG_GEN_STOP_ID);
    CHECK(again[1].count == 2 && again[1].finish == MG_GEN_CALLBACK);
    CHECK(again[2].count == 9 && again[2].finish == MG_GEN_MAX_TOKENS);
    CHECK(v.calls == first + 1 + 2 + 9);
    mg_gen_results_free(again, 3);
    /* max_tokens 1: the prefill's token only */
    q[0].max_tokens = 1;
    q[0].stop_count = 0;
    CHECK_OK(mg_generate(b, &o, q, 1, NULL, NULL, &alone, NULL));
    CHECK(alone.count == 1 && alone.tokens[0] == batch[0].tokens[0]);
    mg_gen_results_free(&alone, 1);
    mg_gen_results_free(batch, 3);
}

static void test_bad_requests(void) {
    int32_t prompt[4] = {1, 2, 3, 4};
    mg_gen_options o = options();
    mg_gen_result res[2];
    mg_gen_request q = {
        .prompt = prompt, .prompt_len = 4, .max_tokens = 3, .sampling = mg_sample_params_greedy()};
    mg_gen_request bad = q;
    bad.prompt_len = 0;
    CHECK_STATUS(mg_generate(b, &o, &bad, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1); /* the contract: results are freed after a failure too */
    CHECK_FWD_MESSAGE("empty prompt");
    bad = q;
    bad.max_tokens = 0;
    CHECK_STATUS(mg_generate(b, &o, &bad, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1);
    CHECK_FWD_MESSAGE("max_tokens");
    bad = q;
    bad.stop_count = 2;
    CHECK_STATUS(mg_generate(b, &o, &bad, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1);
    CHECK_FWD_MESSAGE("stop_ids");
    bad = q;
    bad.sampling.top_p = 0.0f;
    mg_gen_request two[2] = {q, bad};
    CHECK_STATUS(mg_generate(b, &o, two, 2, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 2);
    CHECK_FWD_MESSAGE("request 1's sampling: mg_sample_params_check: top_p");
    bad = q;
    bad.sampling.temperature = NAN;
    CHECK_STATUS(mg_generate(b, &o, &bad, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1);
    CHECK_FWD_MESSAGE("temperature");
    prompt[2] = (int32_t)tiny->shape.vocab;
    CHECK_STATUS(mg_generate(b, &o, &q, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1);
    CHECK_FWD_MESSAGE("outside the vocabulary");
    prompt[2] = -1;
    CHECK_STATUS(mg_generate(b, &o, &q, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1);
    CHECK_FWD_MESSAGE("outside the vocabulary");
    prompt[2] = 3;
    CHECK_STATUS(mg_generate(b, &o, NULL, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_generate(b, &o, &q, 0, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_generate(NULL, &o, &q, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_FWD_MESSAGE("backend");
    mg_gen_options none = {0};
    CHECK_STATUS(mg_generate(b, &none, &q, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_FWD_MESSAGE("preset");
    /* more requests than the tiny arena's batch limit */
    const uint32_t many = tiny->max_batch_size + 1;
    mg_gen_request *lots = malloc(many * sizeof *lots);
    mg_gen_result *lots_res = malloc(many * sizeof *lots_res);
    for (uint32_t r = 0; r < many; r++)
        lots[r] = q;
    CHECK_STATUS(mg_generate(b, &o, lots, many, NULL, NULL, lots_res, NULL),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_FWD_MESSAGE("requests");
    mg_gen_results_free(lots_res, many);
    free(lots);
    free(lots_res);
    /* the model's own checks: a penalty window beyond the op's */
    o.penalty_last_n = MG_SAMPLE_MAX_HISTORY + 1;
    bad = q;
    bad.sampling.repetition_penalty = 1.1f;
    CHECK_STATUS(mg_generate(b, &o, &bad, 1, NULL, NULL, res, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_gen_results_free(res, 1);
    CHECK_FWD_MESSAGE("penalty_last_n");
}

int main(void) {
    test_seed();
    tiny = mg_fwd_preset_find("tiny");
    CHECK(tiny != NULL);
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!tiny || !b)
        return test_finish();
    test_greedy_matches_model();
    test_sampling_wiring();
    test_batch_and_stops();
    test_bad_requests();
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
