/* generate.c - mg_generate (generate.h): the requests' prompts into one batch of the forward
 * model, sampling set when any request samples or penalises, then passes until every request
 * has met its stop id, its token limit or its callback's stop. */
#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_mlx.h" /* mg_error_report */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static bool is_stop(const mg_gen_request *q, int32_t id) {
    for (uint32_t i = 0; i < q->stop_count; i++)
        if (q->stop_ids[i] == id)
            return true;
    return false;
}

/* What needs no model: each request's own fields. */
static mg_status check_requests(const mg_gen_request *requests, uint32_t count) {
    if (!requests || !count)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "no requests");
    for (uint32_t r = 0; r < count; r++) {
        const mg_gen_request *q = &requests[r];
        if (!q->prompt || !q->prompt_len)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "request %u: an empty prompt: give at least one token", r);
        if (!q->max_tokens)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT, "request %u: max_tokens is 0", r);
        if (q->stop_count && !q->stop_ids)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "request %u: %u stop ids but stop_ids is NULL", r,
                                   q->stop_count);
        mg_sample_params p = q->sampling;
        p.history_len = 0;
        if (mg_sample_params_check(&p, 1, 0))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT, "request %u's sampling: %s", r,
                                   mg_last_error());
    }
    return MG_OK;
}

void mg_gen_results_free(mg_gen_result *results, uint32_t count) {
    for (uint32_t r = 0; results && r < count; r++) {
        free(results[r].tokens);
        results[r].tokens = NULL;
        results[r].count = 0;
    }
}

mg_status mg_generate(mg_backend *b, const mg_gen_options *o, const mg_gen_request *requests,
                      uint32_t count, mg_gen_token_fn on_token, void *user, mg_gen_result *results,
                      mg_gen_stats *stats) {
    if (results && requests)
        memset(results, 0, count * sizeof *results);
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!b || !o || !results)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "mg_generate: NULL %s",
                               !b   ? "backend"
                               : !o ? "options"
                                    : "results");
    if (!o->model_path && !o->preset)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "mg_generate: neither a model path nor a "
                                                        "preset");
    mg_status st = check_requests(requests, count);
    if (st)
        return st;
    const uint32_t window = o->penalty_last_n ? o->penalty_last_n : 64;
    uint64_t total = 0;
    uint32_t longest = 0;
    bool sampled = false;
    for (uint32_t r = 0; r < count; r++) {
        const mg_sample_params *p = &requests[r].sampling;
        total += requests[r].prompt_len;
        longest = requests[r].max_tokens > longest ? requests[r].max_tokens : longest;
        sampled = sampled || p->temperature > 0 || p->repetition_penalty != 1.0f ||
                  p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    }
    if (total > UINT32_MAX)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "the prompts hold %llu tokens",
                               (unsigned long long)total);
    int32_t *ids = malloc(total * sizeof *ids);
    uint32_t *lengths = malloc(count * sizeof *lengths);
    mg_sample_params *params = malloc(count * sizeof *params);
    bool *done = calloc(count, sizeof *done);
    for (uint32_t r = 0; r < count && ids && lengths && params && done; r++)
        if (!(results[r].tokens = malloc(requests[r].max_tokens * sizeof(int32_t))))
            st = MG_ERR_OUT_OF_MEMORY;
    if (st || !ids || !lengths || !params || !done) {
        free(ids);
        free(lengths);
        free(params);
        free(done);
        mg_gen_results_free(results, count);
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    size_t n = 0;
    for (uint32_t r = 0; r < count; r++) {
        memcpy(ids + n, requests[r].prompt, requests[r].prompt_len * sizeof *ids);
        n += requests[r].prompt_len;
        lengths[r] = requests[r].prompt_len;
        params[r] = requests[r].sampling;
    }
    const mg_fwd_config c = {.preset = o->preset,
                             .batch = count,
                             .steps = longest - 1,
                             .seed = o->weight_seed,
                             .use_graphs = o->use_graphs,
                             .weights = o->weights,
                             .model_path = o->model_path,
                             .prompt_ids = ids,
                             .prompt_ids_count = (uint32_t)total,
                             .prompt_lengths = lengths};
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    double t0 = now_s(), prefill_s = 0, decode_s = 0;
    uint32_t steps_run = 0, active = count;
    if (!(st = mg_fwd_create(b, &c, &m)) && sampled)
        st = mg_fwd_set_sampling(m, params, window);
    const double load_s = now_s() - t0;
    if (!st && (st = mg_stream_create(b, &s)))
        st = mg_error_report(st, "creating a stream: %s", mg_last_error());
    for (uint32_t i = 0; !st && active && i < longest; i++) {
        t0 = now_s();
        st = i == 0 ? mg_fwd_prefill(m, s) : mg_fwd_decode(m, s);
        *(i ? &decode_s : &prefill_s) += now_s() - t0;
        if (st)
            break;
        steps_run = i;
        for (uint32_t r = 0; r < count; r++) {
            if (done[r])
                continue;
            uint32_t have;
            const int32_t token = mg_fwd_tokens(m, r, &have)[i];
            mg_gen_result *res = &results[r];
            res->tokens[res->count++] = token;
            const bool go_on = !on_token || on_token(user, r, i, token);
            res->finish = is_stop(&requests[r], token)           ? MG_GEN_STOP_ID
                          : res->count == requests[r].max_tokens ? MG_GEN_MAX_TOKENS
                          : !go_on                               ? MG_GEN_CALLBACK
                                                                 : MG_GEN_UNFINISHED;
            if (res->finish != MG_GEN_UNFINISHED) {
                done[r] = true;
                active--;
            }
        }
    }
    if (stats) {
        mg_fwd_info info;
        if (m)
            mg_fwd_get_info(m, &info);
        *stats = (mg_gen_stats){.load_s = load_s,
                                .prefill_s = prefill_s,
                                .decode_s = decode_s,
                                .prompt_tokens = (uint32_t)total,
                                .decode_steps = steps_run,
                                .graph_steps = m ? info.graph_steps : 0};
    }
    if (s)
        mg_stream_destroy(s);
    mg_fwd_destroy(m);
    free(ids);
    free(lengths);
    free(params);
    free(done);
    return st;
}
