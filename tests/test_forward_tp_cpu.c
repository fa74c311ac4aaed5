/*
 * test_forward_tp_cpu.c - the tensor-parallel forward model (model.h: mg_fwd_create_tp,
 * mg_fwd_create_rank) on N CPU backends against the one-device run of the same config.
 *
 * Teacher-forced: the one-device run goes first; the tensor-parallel run then replaces every
 * request's token after each pass with the one-device run's (mg_fwd_force_tokens), so both see
 * the same inputs at every pass, and every pass's logits (every request, every vocabulary id,
 * the host buffer poisoned with NaN first) are compared. The bound (LOGIT_BOUND, absolute; the
 * weights here give logits of |l| about 1 to 3): a rank's row-parallel products (wo, w_down)
 * are rounded to BF16 before the all-reduce sums them, and the sum is rounded again, instead of
 * one rounding of the whole dot product; the residual stream carries the difference through
 * every layer and the final norm rescales it. The bound 2^-4 is empirical, not derived:
 * measured (the maximum is printed) 0.012 on the presets' generated weights (fixed), up to
 * 0.027 on the random checkpoints written here over 40 runs (Qwen3's q and k head norms
 * amplify it), so the bound is about 2.3 times the worst seen. It holds for the CPU reducer,
 * which sums the ranks' BF16 partials in double and rounds once; a reducer that rounds after
 * each addition (e.g. a ring all-reduce) would need its own measurement. Greedy tokens must
 * equal the one-device run's wherever its top-1 / top-2 margin exceeds twice the bound (a
 * closer pair may flip legitimately).
 *
 * Shapes: tiny (tp 2, batch 4 and 1), and two made-up presets with awkward sizes:
 * vocabularies that no tp divides (the first V % tp ranks one row more; vocab 6 over 4 ranks),
 * odd head counts, intermediate sizes of 300 / 344 (tp 3 and 4). Checkpoints written here (random
 * values, METRALE_TEST_SEED replays them): MLX-quantized (4-bit group 32 at tp 2 and 3, 8-bit group
 * 64 at tp 3) and Hugging Face BF16 Qwen2 (q/k/v biases), Qwen3 (head norms) and a tied Llama, at
 * tp 2. Then the refusals (tp not dividing heads, kv_heads or the intermediate size, a vocabulary
 * smaller than tp, MoE, NVFP4 / FP8 weights, MLX groups that a rank's o_proj columns would cut, bad
 * rank counts), nothing left in any backend's ledger after destroy or after any device allocation
 * of the create failed, sampling on a split model, the one-rank-per-thread form
 * (mg_fwd_create_rank) equal to the driver's bit for bit, and a peer that stops after the
 * prefill: aborting its communicator, or silently, the other rank's next decode fails with
 * MG_ERR_DEVICE within the communicator's timeout instead of hanging.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "metrale/comm.h"
#include "metrale/dtype.h"
#include "metrale/ops_sample.h"
#include "model.h"
#include "test_util.h"

#define MAX_RANKS 4
#define LOGIT_BOUND 0.0625f

static mg_backend *backends[MAX_RANKS];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every pass's logits [passes][batch][vocab] and chosen tokens [passes][batch] of one run. */
typedef struct run_record {
    uint32_t passes, batch, vocab;
    float *logits;
    int32_t *tokens;
    double decode_ms; /* per decode step, the mean */
} run_record;

/* A record of config c's passes over a vocabulary of `vocab`. */
static bool record_init(run_record *r, const mg_fwd_config *c, uint32_t vocab) {
    r->passes = c->steps + 1;
    r->batch = c->batch;
    r->vocab = vocab;
    r->logits = malloc((size_t)r->passes * r->batch * r->vocab * sizeof *r->logits);
    r->tokens = malloc((size_t)r->passes * r->batch * sizeof *r->tokens);
    r->decode_ms = 0;
    return r->logits && r->tokens;
}

static void record_free(run_record *r) {
    free(r->logits);
    free(r->tokens);
}

/* The pass's logits (poisoned with NaN first: a value the model did not write shows) and each
 * request's latest token into pass `p` of *r. */
static bool record_pass(mg_fwd *m, run_record *r, uint32_t p) {
    float *logits = r->logits + (size_t)p * r->batch * r->vocab;
    for (size_t i = 0; i < (size_t)r->batch * r->vocab; i++)
        logits[i] = NAN;
    if (mg_fwd_logits(m, logits))
        return false;
    for (uint32_t q = 0; q < r->batch; q++) {
        uint32_t count = 0;
        const int32_t *t = mg_fwd_tokens(m, q, &count);
        if (count != p + 1)
            return false;
        r->tokens[(size_t)p * r->batch + q] = t[p];
    }
    return true;
}

/* When not NULL, run_tp samples with these parameters (one per request) instead of argmax. */
static const mg_sample_params *run_sampling;

/* Runs config c on `n` ranks (1: mg_fwd_create) into *r; with `follow`, each pass's tokens are
 * then replaced by follow's (teacher forcing). */
static bool run_tp(int n, const mg_fwd_config *c, const run_record *follow, run_record *r) {
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    memset(r, 0, sizeof *r);
    bool ok = mg_stream_create(backends[0], &s) == MG_OK &&
              mg_fwd_create_tp(backends, n, c, &m) == MG_OK &&
              record_init(r, c, mg_fwd_get_preset(m, NULL)->shape.vocab) && /* a checkpoint's */
              (!run_sampling || mg_fwd_set_sampling(m, run_sampling, 0) == MG_OK);
    double decode_s = 0;
    for (uint32_t p = 0; ok && p < r->passes; p++) {
        double t0 = now_s();
        ok = (p ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s)) == MG_OK;
        if (p)
            decode_s += now_s() - t0;
        ok = ok && record_pass(m, r, p);
        if (ok && follow)
            ok = mg_fwd_force_tokens(m, follow->tokens + (size_t)p * r->batch) == MG_OK;
    }
    if (ok) {
        mg_fwd_info info;
        mg_fwd_get_info(m, &info);
        /* a split decode runs unfused (model.h) */
        ok = info.tp_ranks == (uint32_t)n && info.tp_rank == 0 && (n == 1 || !info.fused_decode);
    }
    r->decode_ms = r->passes > 1 ? decode_s * 1e3 / (r->passes - 1) : 0;
    if (!ok)
        fprintf(stderr, "run on %d ranks failed: %s\n", n, mg_last_error());
    mg_fwd_destroy(m);
    if (s)
        mg_stream_destroy(s);
    return ok;
}

/* The largest |a - b| over every logit of every pass; counts the greedy tokens of `b` that
 * differ from `a`'s where a's margin exceeds twice the bound into *clear_flips. */
static float compare_records(const run_record *a, const run_record *b, uint32_t *clear_flips,
                             float *largest_logit) {
    float worst = 0;
    *clear_flips = 0;
    *largest_logit = 0;
    for (uint32_t p = 0; p < a->passes; p++)
        for (uint32_t q = 0; q < a->batch; q++) {
            const float *la = a->logits + ((size_t)p * a->batch + q) * a->vocab;
            const float *lb = b->logits + ((size_t)p * a->batch + q) * a->vocab;
            float top1 = -INFINITY, top2 = -INFINITY;
            for (uint32_t j = 0; j < a->vocab; j++) {
                float d = fabsf(la[j] - lb[j]);
                if (!(d <= worst)) /* NaN counts as the worst */
                    worst = isnan(d) ? INFINITY : d;
                *largest_logit = fmaxf(*largest_logit, fabsf(la[j]));
                if (la[j] > top1)
                    top2 = top1, top1 = la[j];
                else if (la[j] > top2)
                    top2 = la[j];
            }
            const int32_t ta = a->tokens[(size_t)p * a->batch + q];
            const int32_t tb = b->tokens[(size_t)p * a->batch + q];
            if (ta != tb && top1 - top2 > 2 * LOGIT_BOUND)
                ++*clear_flips;
        }
    return worst;
}

/* Config c on 1 rank and on each of ranks[0..count), teacher-forced, every logit compared. */
static void check_equal_runs(const char *what, const mg_fwd_config *c, const int *ranks,
                             int count) {
    run_record one;
    CHECK(run_tp(1, c, NULL, &one));
    for (int i = 0; i < count; i++) {
        run_record tp;
        bool ok = run_tp(ranks[i], c, &one, &tp);
        CHECK(ok);
        if (ok) {
            uint32_t flips = 0;
            float largest = 0;
            float worst = compare_records(&one, &tp, &flips, &largest);
            printf("%s tp %d vs 1: max |logit diff| %.5f (bound %.4f; |logits| up to %.2f), "
                   "decode step %.2f ms vs %.2f ms\n",
                   what, ranks[i], worst, LOGIT_BOUND, largest, tp.decode_ms, one.decode_ms);
            CHECK(worst <= LOGIT_BOUND);
            CHECK(worst > 0 || ranks[i] == 1); /* a split run that equals bit for bit: suspect */
            CHECK(flips == 0);
        }
        record_free(&tp);
    }
    record_free(&one);
}

/* An awkward shape of tiny's kind: 12 q / 6 kv heads of 32, hidden 160, intermediate 300,
 * vocab 1001 (tp 2: slices of 501 and 500; tp 3: 334, 334, 333). */
static const mg_fwd_preset awkward3 = {.name = "awkward-3",
                                       .description = "tp 2 and 3, uneven vocabulary slices",
                                       .shape = {.hidden = 160,
                                                 .heads = 12,
                                                 .kv_heads = 6,
                                                 .head_dim = 32,
                                                 .intermediate = 300,
                                                 .vocab = 1001},
                                       .layers = 3,
                                       .rope_theta = 10000.0f,
                                       .norm_eps = 1e-5f,
                                       .max_batch_tokens = 512,
                                       .max_batch_size = 8,
                                       .batch = 3,
                                       .prompt_len = 13,
                                       .steps = 5};

/* 8 q / 4 kv heads of 64, intermediate 344, vocab 999 (tp 4: slices of 250, the last 249). */
static const mg_fwd_preset awkward4 = {.name = "awkward-4",
                                       .description = "tp 4, uneven vocabulary slices",
                                       .shape = {.hidden = 256,
                                                 .heads = 8,
                                                 .kv_heads = 4,
                                                 .head_dim = 64,
                                                 .intermediate = 344,
                                                 .vocab = 999},
                                       .layers = 2,
                                       .rope_theta = 10000.0f,
                                       .norm_eps = 1e-5f,
                                       .max_batch_tokens = 512,
                                       .max_batch_size = 8,
                                       .batch = 2,
                                       .prompt_len = 9,
                                       .steps = 4};

static void test_equal_runs(void) {
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    c.steps = 6;
    check_equal_runs("tiny", &c, (const int[]){2}, 1);
    c.batch = 1; /* the one-token decode (the fused GEMV's case on one device) */
    check_equal_runs("tiny batch 1", &c, (const int[]){2}, 1);
    mg_fwd_config a = mg_fwd_config_default(&awkward3);
    check_equal_runs("awkward-3", &a, (const int[]){2, 3}, 2);
    mg_fwd_config b = mg_fwd_config_default(&awkward4);
    check_equal_runs("awkward-4", &b, (const int[]){4}, 1);
    /* vocab 6 over 4 ranks: 2, 2, 1 and 1 rows (ceil-sized slices would leave the last none) */
    mg_fwd_preset small = awkward4;
    small.shape.vocab = 6;
    mg_fwd_config v = mg_fwd_config_default(&small);
    v.prompt_len = 3;
    check_equal_runs("awkward-4 vocab 6", &v, (const int[]){4}, 1);
}

typedef struct ledger_state {
    uint64_t bytes[MAX_RANKS], count[MAX_RANKS];
} ledger_state;

static ledger_state ledgers(void) {
    ledger_state l = {{0}, {0}};
    for (int r = 0; r < MAX_RANKS; r++)
        CHECK_OK(mg_ledger_live(backends[r], &l.bytes[r], &l.count[r]));
    return l;
}

static bool ledgers_equal(const ledger_state *a, const ledger_state *b) {
    return !memcmp(a, b, sizeof *a);
}

/* Each refusal model.h lists, with its status and a message naming the field or format, and
 * nothing left allocated on any backend. */
static void test_refusals(void) {
    const ledger_state before = ledgers();
    mg_fwd *m = NULL;
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    CHECK_STATUS(mg_fwd_create_tp(backends, 3, &c, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_heads 2");
    CHECK(m == NULL);
    CHECK_STATUS(mg_fwd_create_tp(backends, 0, &c, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_fwd_create_tp(backends, MG_COMM_MAX_RANKS + 1, &c, &m),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_fwd_create_tp(NULL, 2, &c, &m), MG_ERR_INVALID_ARGUMENT);
    static const struct {
        mg_fwd_weights weights;
        const char *named;
    } formats[] = {{MG_FWD_WEIGHTS_FP8, "fp8 weights"}, {MG_FWD_WEIGHTS_NVFP4, "nvfp4 weights"}};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        mg_fwd_config q = c;
        q.weights = formats[i].weights;
        CHECK_STATUS(mg_fwd_create_tp(backends, 2, &q, &m), MG_ERR_UNSUPPORTED);
        CHECK_MESSAGE(formats[i].named);
    }
    /* the committed MLX checkpoint of micro: its one KV head cannot be split */
    mg_fwd_config x = mg_fwd_config_default(mg_fwd_preset_find("micro"));
    x.weights = MG_FWD_WEIGHTS_MLX8;
    CHECK_STATUS(mg_fwd_create_tp(backends, 2, &x, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_heads 1");
    mg_fwd_config e = mg_fwd_config_default(mg_fwd_preset_find("tiny-moe"));
    CHECK_STATUS(mg_fwd_create_tp(backends, 2, &e, &m), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("mixture of experts");
    mg_fwd_preset odd = awkward4;
    odd.shape.intermediate = 342; /* kv_heads 4 divide by 4, 342 does not */
    mg_fwd_config o = mg_fwd_config_default(&odd);
    CHECK_STATUS(mg_fwd_create_tp(backends, 4, &o, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("intermediate 342");
    odd = awkward4;
    odd.shape.heads = 6; /* kv_heads 4 divide by 4, heads 6 do not (no loader checked them) */
    o = mg_fwd_config_default(&odd);
    CHECK_STATUS(mg_fwd_create_tp(backends, 4, &o, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("heads 6");
    odd = awkward4;
    odd.shape.vocab = 3; /* fewer rows than ranks: the fourth would hold none */
    o = mg_fwd_config_default(&odd);
    o.prompt_len = 3;
    CHECK_STATUS(mg_fwd_create_tp(backends, 4, &o, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("vocab 3");
    CHECK_MESSAGE("rank 3");
    /* a rank's communicator must be on the rank's backend */
    mg_comm *comms[2] = {NULL, NULL};
    CHECK_OK(mg_comm_create_local(backends, 2, NULL, comms));
    CHECK_STATUS(mg_fwd_create_rank(backends[1], comms[0], &c, &m), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("another backend");
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_comm_destroy(comms[r]));
    const ledger_state after = ledgers();
    CHECK(ledgers_equal(&before, &after));
}

/* A split run with sampling on (every rank samples its own copy of the gathered logits: the
 * driver checks they agree at every pass); then top_k 1 against the one-device greedy tokens;
 * nothing left allocated after either. */
static void test_sampling_and_ledger(void) {
    const ledger_state before = ledgers();
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    c.steps = 4;
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(backends[0], &s));
    CHECK_OK(mg_fwd_create_tp(backends, 2, &c, &m));
    mg_sample_params params[8];
    for (uint32_t r = 0; r < c.batch; r++) {
        params[r] = mg_sample_params_greedy();
        params[r].seed = 100 + r;
        params[r].temperature = 1.5f;
        params[r].top_k = 50;
    }
    if (m) {
        CHECK_OK(mg_fwd_set_sampling(m, params, 8));
        CHECK_OK(mg_fwd_prefill(m, s));
        for (uint32_t i = 0; i < c.steps; i++)
            CHECK_OK(mg_fwd_decode(m, s));
        CHECK_STATUS(mg_fwd_decode(m, s), MG_ERR_INVALID_ARGUMENT); /* past the planned steps */
        uint32_t count = 0;
        mg_fwd_tokens(m, 0, &count);
        CHECK(count == c.steps + 1);
    }
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
    /* top_k 1 (at temperature 1.5): the sampler over the gathered logits must pick the one-device
     * run's greedy tokens, teacher-forced, wherever that run's top-1 / top-2 margin is clear */
    run_record one, split;
    CHECK(run_tp(1, &c, NULL, &one));
    for (uint32_t r = 0; r < c.batch; r++)
        params[r].top_k = 1;
    run_sampling = params;
    const bool ok = run_tp(2, &c, &one, &split);
    run_sampling = NULL;
    CHECK(ok);
    if (ok) {
        uint32_t flips = 0, differ = 0;
        float largest = 0;
        const float worst = compare_records(&one, &split, &flips, &largest);
        for (size_t i = 0; i < (size_t)one.passes * one.batch; i++)
            differ += one.tokens[i] != split.tokens[i];
        printf("tiny tp 2 sampling top_k 1 vs one-device greedy: %u of %u tokens differ (%u "
               "with a clear margin), max |logit diff| %.5f\n",
               differ, one.passes * one.batch, flips, worst);
        CHECK(worst <= LOGIT_BOUND);
        CHECK(flips == 0);
    }
    record_free(&one);
    record_free(&split);
    const ledger_state after = ledgers();
    CHECK(ledgers_equal(&before, &after));
}

/* A peer's setter failing after rank 0's succeeded (its sampler's first device allocation
 * fails on rank 1's backend: rank 0 would sample, rank 1 not) stops the model: the call fails
 * naming rank 1, and every later pass or setter fails with MG_ERR_DEVICE saying why, never
 * returning tokens; destroy still frees everything. */
static void test_peer_setter_failure(void) {
    const ledger_state before = ledgers();
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    c.steps = 2;
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(backends[0], &s));
    CHECK_OK(mg_fwd_create_tp(backends, 2, &c, &m));
    mg_sample_params params[8];
    for (uint32_t r = 0; r < c.batch; r++) {
        params[r] = mg_sample_params_greedy();
        params[r].seed = 7 + r;
        params[r].temperature = 1.0f;
    }
    if (m) {
        CHECK_OK(mg_cpu_fail_nth_allocation(backends[1], 1));
        const mg_status st = mg_fwd_set_sampling(m, params, 0);
        CHECK_OK(mg_cpu_fail_nth_allocation(backends[1], 0));
        CHECK_STATUS(st, MG_ERR_OUT_OF_MEMORY);
        CHECK_MESSAGE("tensor-parallel rank 1");
        CHECK_MESSAGE("only good for mg_fwd_destroy");
        CHECK_STATUS(mg_fwd_prefill(m, s), MG_ERR_DEVICE);
        CHECK_MESSAGE("stopped after an earlier failure");
        CHECK_MESSAGE("rank 1, setting the sampling");
        uint32_t count = 1;
        mg_fwd_tokens(m, 0, &count);
        CHECK(count == 0);
        CHECK_STATUS(mg_fwd_set_sampling(m, NULL, 0), MG_ERR_DEVICE);
        CHECK_STATUS(mg_fwd_decode(m, s), MG_ERR_DEVICE);
    }
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
    const ledger_state after = ledgers();
    CHECK(ledgers_equal(&before, &after));
}

/* ------------------------------------------------------------------ one rank per thread */

typedef struct rank_thread {
    int rank;
    mg_comm *comm;
    const mg_fwd_config *c;
    /* the peer that stops after the prefill: it aborts its communicator (a rank that gives
     * up), or makes no further call (a rank that hangs or died) */
    bool stop_after_prefill, abort_when_stopping;
    run_record rec;
    mg_status create_st, last_st;
    double last_s; /* how long the last failing call took */
} rank_thread;

static void *rank_thread_run(void *arg) {
    rank_thread *t = arg;
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    t->last_st = MG_OK;
    if (!record_init(&t->rec, t->c, t->c->preset->shape.vocab) ||
        mg_stream_create(backends[t->rank], &s)) {
        t->create_st = MG_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    if ((t->create_st = mg_fwd_create_rank(backends[t->rank], t->comm, t->c, &m))) {
        mg_stream_destroy(s);
        return NULL;
    }
    for (uint32_t p = 0; p < t->rec.passes; p++) {
        if (p == 1 && t->stop_after_prefill) {
            if (t->abort_when_stopping)
                mg_comm_abort(t->comm);
            break;
        }
        double t0 = now_s();
        mg_status st = p ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s);
        if (st) {
            t->last_st = st;
            t->last_s = now_s() - t0;
            break;
        }
        if (!record_pass(m, &t->rec, p))
            t->last_st = MG_ERR_INTERNAL;
    }
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
    return NULL;
}

/* Two ranks driven by a thread each through mg_fwd_create_rank equal mg_fwd_create_tp's run bit
 * for bit. Then one rank stops after the prefill, aborting its communicator (the other's decode
 * fails with MG_ERR_DEVICE at once) or silently (it fails with MG_ERR_DEVICE once the
 * communicator's timeout ran out, not later); every backend's ledger is clean after. */
static void test_rank_threads(void) {
    const ledger_state before = ledgers();
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    c.steps = 3;
    run_record driver;
    CHECK(run_tp(2, &c, NULL, &driver));
    const uint32_t timeout_ms = 1500;
    enum { NO_FAULT, PEER_ABORTS, PEER_SILENT };
    for (int fault = NO_FAULT; fault <= PEER_SILENT; fault++) {
        mg_comm *comms[2] = {NULL, NULL};
        mg_comm_options options = {.timeout_ms = timeout_ms};
        CHECK_OK(mg_comm_create_local(backends, 2, &options, comms));
        rank_thread t[2];
        pthread_t tid[2];
        for (int r = 0; r < 2; r++) {
            t[r] = (rank_thread){.rank = r, .comm = comms[r], .c = &c};
            t[r].stop_after_prefill = fault != NO_FAULT && r == 1;
            t[r].abort_when_stopping = fault == PEER_ABORTS;
            CHECK(pthread_create(&tid[r], NULL, rank_thread_run, &t[r]) == 0);
        }
        for (int r = 0; r < 2; r++)
            pthread_join(tid[r], NULL);
        CHECK_OK(t[0].create_st);
        CHECK_OK(t[1].create_st);
        if (!fault) {
            for (int r = 0; r < 2; r++) {
                CHECK_OK(t[r].last_st);
                const size_t n = (size_t)driver.passes * driver.batch;
                CHECK(!memcmp(t[r].rec.tokens, driver.tokens, n * sizeof *driver.tokens));
                CHECK(!memcmp(t[r].rec.logits, driver.logits, n * driver.vocab * sizeof(float)));
            }
        } else {
            CHECK_STATUS(t[0].last_st, MG_ERR_DEVICE);
            printf("a peer %s after the prefill: the other rank's decode failed in %.3f s "
                   "(timeout %.1f s): %s\n",
                   fault == PEER_ABORTS ? "aborted" : "stopped silently", t[0].last_s,
                   timeout_ms / 1e3, mg_status_name(t[0].last_st));
            CHECK(t[0].last_s < timeout_ms / 1e3 + 1.0);
            if (fault == PEER_SILENT)
                CHECK(t[0].last_s > timeout_ms / 1e3 * 0.9);
        }
        for (int r = 0; r < 2; r++) {
            record_free(&t[r].rec);
            CHECK_OK(mg_comm_destroy(comms[r]));
        }
    }
    record_free(&driver);
    const ledger_state after = ledgers();
    CHECK(ledgers_equal(&before, &after));
}

/* ------------------------------------------------------------------ MLX-quantized weights
 * A checkpoint written here (model_mlx.h's layout: config.json and model.safetensors with each
 * layer's q/k/v/o_proj and gate/up/down_proj as U32 codes with BF16 scales and biases), random
 * codes and scales that dequantize to about U(-1, 1) / sqrt(k), for preset mlx_split: 6 heads of
 * 32 (o_proj's 192 input features: 96 per rank at tp 2, 64 at tp 3), intermediate 384. */
static const mg_fwd_preset mlx_split = {.name = "mlx-split",
                                        .description = "MLX weights over 2 and 3 ranks",
                                        .shape = {.hidden = 128,
                                                  .heads = 6,
                                                  .kv_heads = 6,
                                                  .head_dim = 32,
                                                  .intermediate = 384,
                                                  .vocab = 515},
                                        .layers = 2,
                                        .rope_theta = 10000.0f,
                                        .norm_eps = 1e-5f,
                                        .max_batch_tokens = 256,
                                        .max_batch_size = 4,
                                        .batch = 2,
                                        .prompt_len = 11,
                                        .steps = 4};

typedef struct st_tensor {
    char name[96];
    const char *dtype;
    uint32_t rows, cols; /* elements of dtype */
    size_t bytes;
    void *data;
} st_tensor;

/* One quantized [n, k] layer `path` at `bits` / `group` as three tensors into t[0..3). */
static void mlx_layer(st_tensor *t, const char *path, uint32_t n, uint32_t k, uint32_t bits,
                      uint32_t group) {
    const uint32_t words = k * bits / 32, groups = k / group;
    t[0] = (st_tensor){.dtype = "U32", .rows = n, .cols = words, .bytes = (size_t)n * words * 4};
    snprintf(t[0].name, sizeof t[0].name, "%s.weight", path);
    t[0].data = malloc(t[0].bytes);
    test_fill_random(t[0].data, t[0].bytes);
    const float step = 2.0f / sqrtf((float)k) / (float)((1u << bits) - 1);
    for (int i = 1; i < 3; i++) {
        t[i] = (st_tensor){
            .dtype = "BF16", .rows = n, .cols = groups, .bytes = (size_t)n * groups * 2};
        snprintf(t[i].name, sizeof t[i].name, "%s.%s", path, i == 1 ? "scales" : "biases");
        uint16_t *v = t[i].data = malloc(t[i].bytes);
        for (size_t j = 0; j < (size_t)n * groups; j++) {
            const float u = (float)(test_rand() % 1000) / 1000.0f; /* [0, 1) */
            v[j] =
                mg_f32_to_bf16(i == 1 ? step * (0.5f + u) : -(0.8f + 0.4f * u) / sqrtf((float)k));
        }
    }
}

/* dir/name holding `text`; false on failure. */
static bool write_text(const char *dir, const char *name, const char *text) {
    char file[512];
    snprintf(file, sizeof file, "%s/%s", dir, name);
    FILE *f = fopen(file, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f))
        ok = false;
    return ok;
}

/* dir/model.safetensors holding t[0..count) (the format: an 8-byte header length, the JSON
 * header, the data); frees their data either way; false on failure. */
static bool write_safetensors(const char *dir, st_tensor *t, size_t count) {
    char file[512], *header = malloc(count * 192 + 64);
    bool ok = header != NULL;
    size_t len = 0, offset = 0;
    if (ok) {
        len += (size_t)sprintf(header + len, "{\"__metadata__\": {\"format\": \"pt\"}");
        for (size_t i = 0; i < count; i++) {
            len += (size_t)sprintf(header + len, ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%u",
                                   t[i].name, t[i].dtype, t[i].rows);
            if (t[i].cols)
                len += (size_t)sprintf(header + len, ", %u", t[i].cols);
            len += (size_t)sprintf(header + len, "], \"data_offsets\": [%zu, %zu]}", offset,
                                   offset + t[i].bytes);
            offset += t[i].bytes;
        }
        len += (size_t)sprintf(header + len, "}");
        while (len % 8) /* the data 8-byte aligned, as the format's writers pad */
            header[len++] = ' ';
    }
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    FILE *f = ok ? fopen(file, "wb") : NULL;
    uint64_t n = len;
    ok = f && fwrite(&n, 8, 1, f) == 1 && fwrite(header, 1, len, f) == len;
    for (size_t i = 0; ok && i < count; i++)
        ok = fwrite(t[i].data, 1, t[i].bytes, f) == t[i].bytes;
    if (f && fclose(f))
        ok = false;
    for (size_t i = 0; i < count; i++)
        free(t[i].data);
    free(header);
    return ok;
}

/* Writes the checkpoint of `p` into the new directory `dir` (mkdtemp's template); false on
 * failure. */
static bool write_mlx_checkpoint(const mg_fwd_preset *p, uint32_t bits, uint32_t group, char *dir) {
    if (!mkdtemp(dir))
        return false;
    const mg_model_shape *sh = &p->shape;
    const uint32_t H = sh->hidden, QD = sh->heads * sh->head_dim, KD = sh->kv_heads * sh->head_dim;
    const uint32_t I = sh->intermediate;
    const size_t count = (size_t)p->layers * 7 * 3;
    st_tensor *t = calloc(count, sizeof *t);
    if (!t)
        return false;
    static const char *const names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};
    const uint32_t shapes[7][2] = {{QD, H}, {KD, H}, {KD, H}, {H, QD}, {I, H}, {I, H}, {H, I}};
    for (uint32_t l = 0; l < p->layers; l++)
        for (int i = 0; i < 7; i++) {
            char path[80];
            snprintf(path, sizeof path, "model.layers.%u.%s", l, names[i]);
            mlx_layer(t + ((size_t)l * 7 + i) * 3, path, shapes[i][0], shapes[i][1], bits, group);
        }
    bool ok = write_safetensors(dir, t, count);
    free(t);
    char config[512];
    snprintf(config, sizeof config,
             "{\"model_type\": \"metrale\", \"hidden_size\": %u, \"num_hidden_layers\": %u, "
             "\"num_attention_heads\": %u, \"num_key_value_heads\": %u, \"head_dim\": %u, "
             "\"intermediate_size\": %u, \"quantization\": {\"group_size\": %u, \"bits\": %u, "
             "\"mode\": \"affine\"}}\n",
             H, p->layers, sh->heads, sh->kv_heads, sh->head_dim, I, group, bits);
    return ok && write_text(dir, "config.json", config);
}

static void remove_checkpoint(const char *dir) {
    char file[512];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    remove(file);
    snprintf(file, sizeof file, "%s/config.json", dir);
    remove(file);
    rmdir(dir);
}

/* MLX-quantized layers split exactly (whole rows; o_proj and down_proj in whole groups): tp 2
 * and 3 of 4-bit group-32 weights, tp 3 of 8-bit group-64 ones, against one device, the MLX
 * GEMVs (decode) and GEMMs (prefill) on each rank's share; at tp 2 the 8-bit weights' o_proj
 * (96 features per rank in groups of 64) is refused naming it, with nothing left allocated. */
static void test_mlx_weights(void) {
    static const struct {
        uint32_t bits, group;
        int ranks[2], count;
    } cases[] = {{4, 32, {2, 3}, 2}, {8, 64, {3}, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[] = "/tmp/metrale_tp_mlx_XXXXXX";
        const bool written = write_mlx_checkpoint(&mlx_split, cases[i].bits, cases[i].group, dir);
        CHECK(written);
        if (!written)
            continue;
        mg_fwd_config c = mg_fwd_config_default(&mlx_split);
        c.weights = cases[i].bits == 4 ? MG_FWD_WEIGHTS_MLX4 : MG_FWD_WEIGHTS_MLX8;
        c.checkpoint = dir;
        char what[64];
        snprintf(what, sizeof what, "mlx%u group %u", cases[i].bits, cases[i].group);
        check_equal_runs(what, &c, cases[i].ranks, cases[i].count);
        if (cases[i].group == 64) {
            const ledger_state before = ledgers();
            mg_fwd *m = NULL;
            CHECK_STATUS(mg_fwd_create_tp(backends, 2, &c, &m), MG_ERR_UNSUPPORTED);
            CHECK_MESSAGE("o_proj has 192 input features in groups of 64");
            const ledger_state after = ledgers();
            CHECK(ledgers_equal(&before, &after));
        }
        remove_checkpoint(dir);
    }
}

/* Every device allocation of mg_fwd_create_tp failing in turn, on rank 0's backend and on rank
 * 1's (the weights whole, their shards, the arena, the KV pool, the communicator's): each
 * failure is MG_ERR_OUT_OF_MEMORY with no model and nothing left on any backend, until the
 * create succeeds when no allocation is left to fail. */
static void test_allocation_failures(void) {
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    c.steps = 1;
    for (int r = 0; r < 2; r++) {
        const ledger_state before = ledgers();
        uint32_t failed = 0;
        for (uint64_t n = 1; n < 400; n++) {
            mg_fwd *m = NULL;
            CHECK_OK(mg_cpu_fail_nth_allocation(backends[r], n));
            mg_status st = mg_fwd_create_tp(backends, 2, &c, &m);
            CHECK_OK(mg_cpu_fail_nth_allocation(backends[r], 0));
            const ledger_state after_fail = ledgers();
            if (st == MG_OK) {
                CHECK(m != NULL);
                mg_fwd_destroy(m);
                break;
            }
            failed++;
            CHECK_STATUS(st, MG_ERR_OUT_OF_MEMORY);
            CHECK(m == NULL);
            CHECK(ledgers_equal(&before, &after_fail));
        }
        printf("rank %d's backend: %u allocations of mg_fwd_create_tp failed in turn, each "
               "cleanly\n",
               r, failed);
        CHECK(failed > 10); /* the weights, their shards, the arena, the KV pool at least */
        const ledger_state after = ledgers();
        CHECK(ledgers_equal(&before, &after));
    }
}

/* ------------------------------------------------------------------ real checkpoints' layouts
 * Hugging Face BF16 directories written here (model_hf.h): Qwen2 (q, k and v biases: FP32 rows
 * split with their matrices), Qwen3 (the q and k head norms, whole on every rank) and a Llama
 * whose LM head is the embedding (tied: the LM head's vocabulary slice is a copy, the
 * embedding stays whole), each at tp 2 against one device. 4 q / 2 kv heads of 32, hidden 96,
 * intermediate 160, vocab 301. */
static void bf16_tensor(st_tensor *t, const char *name, uint32_t rows, uint32_t cols, float offset,
                        float scale) {
    *t = (st_tensor){
        .dtype = "BF16", .rows = rows, .cols = cols, .bytes = (size_t)rows * (cols ? cols : 1) * 2};
    snprintf(t->name, sizeof t->name, "%s", name);
    uint16_t *v = t->data = malloc(t->bytes);
    for (size_t i = 0; i < t->bytes / 2; i++)
        v[i] = mg_f32_to_bf16(offset + scale * ((float)(test_rand() % 2001) / 1000.0f - 1.0f));
}

static bool write_hf_checkpoint(const char *arch, bool tied, char *dir) {
    if (!mkdtemp(dir))
        return false;
    const uint32_t H = 96, heads = 4, kv = 2, D = 32, I = 160, V = 301, layers = 2;
    const uint32_t QD = heads * D, KD = kv * D;
    const bool qwen2 = !strcmp(arch, "Qwen2ForCausalLM"), qwen3 = !strcmp(arch, "Qwen3ForCausalLM");
    st_tensor *t = calloc(3 + layers * 14, sizeof *t);
    if (!t)
        return false;
    size_t n = 0;
    /* scaled as a matrix of H columns: as the tied LM head, logits of about unit size */
    bf16_tensor(&t[n++], "model.embed_tokens.weight", V, H, 0, 1 / sqrtf((float)H));
    bf16_tensor(&t[n++], "model.norm.weight", H, 0, 1, 0.1f);
    if (!tied)
        bf16_tensor(&t[n++], "lm_head.weight", V, H, 0, 1 / sqrtf((float)H));
    for (uint32_t l = 0; l < layers; l++) {
        static const char *const names[7] = {
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
        const uint32_t shapes[7][2] = {{QD, H}, {KD, H}, {KD, H}, {H, QD}, {I, H}, {I, H}, {H, I}};
        char name[96];
        for (int i = 0; i < 7; i++) {
            snprintf(name, sizeof name, "model.layers.%u.%s.weight", l, names[i]);
            bf16_tensor(&t[n++], name, shapes[i][0], shapes[i][1], 0,
                        1 / sqrtf((float)shapes[i][1]));
            if (qwen2 && i < 3) {
                snprintf(name, sizeof name, "model.layers.%u.%s.bias", l, names[i]);
                bf16_tensor(&t[n++], name, shapes[i][0], 0, 0, 0.5f);
            }
        }
        snprintf(name, sizeof name, "model.layers.%u.input_layernorm.weight", l);
        bf16_tensor(&t[n++], name, H, 0, 1, 0.1f);
        snprintf(name, sizeof name, "model.layers.%u.post_attention_layernorm.weight", l);
        bf16_tensor(&t[n++], name, H, 0, 1, 0.1f);
        for (int k = 0; qwen3 && k < 2; k++) {
            snprintf(name, sizeof name, "model.layers.%u.self_attn.%s_norm.weight", l,
                     k ? "k" : "q");
            bf16_tensor(&t[n++], name, D, 0, 1, 0.2f);
        }
    }
    bool ok = write_safetensors(dir, t, n);
    free(t);
    char config[1024];
    snprintf(config, sizeof config,
             "{\"architectures\": [\"%s\"], \"hidden_size\": %u, \"intermediate_size\": %u, "
             "\"num_attention_heads\": %u, \"num_key_value_heads\": %u, \"head_dim\": %u, "
             "\"num_hidden_layers\": %u, \"rms_norm_eps\": 1e-06, \"vocab_size\": %u, "
             "\"tie_word_embeddings\": %s, \"max_position_embeddings\": 4096, "
             "\"rope_theta\": 10000.0, \"hidden_act\": \"silu\"}\n",
             arch, H, I, heads, kv, D, layers, V, tied ? "true" : "false");
    return ok && write_text(dir, "config.json", config);
}

static void test_hf_checkpoints(void) {
    static const struct {
        const char *arch;
        bool tied;
    } cases[] = {
        {"Qwen2ForCausalLM", false}, {"Qwen3ForCausalLM", false}, {"LlamaForCausalLM", true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[] = "/tmp/metrale_tp_hf_XXXXXX";
        const bool written = write_hf_checkpoint(cases[i].arch, cases[i].tied, dir);
        CHECK(written);
        if (written) {
            mg_fwd_config c = {
                .batch = 2, .prompt_len = 9, .steps = 4, .seed = 3, .model_path = dir};
            char what[64];
            snprintf(what, sizeof what, "%s%s", cases[i].arch, cases[i].tied ? " (tied)" : "");
            check_equal_runs(what, &c, (const int[]){2}, 1);
        }
        remove_checkpoint(dir);
    }
}

int main(void) {
    test_seed();
    for (int r = 0; r < MAX_RANKS; r++)
        if (mg_backend_open(MG_BACKEND_CPU, r, &backends[r])) {
            fprintf(stderr, "cannot open CPU backend %d: %s\n", r, mg_last_error());
            return 1;
        }
    test_equal_runs();
    test_refusals();
    test_peer_setter_failure();
    test_sampling_and_ledger();
    test_rank_threads();
    test_allocation_failures();
    test_mlx_weights();
    test_hf_checkpoints();
    for (int r = 0; r < MAX_RANKS; r++)
        mg_backend_close(backends[r]);
    return test_finish();
}
