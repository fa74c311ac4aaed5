/*
 * test_sample.c - mg_sample (metrale/ops_sample.h) on every usable backend (the CPU always,
 * CUDA where a GPU is), against an independent float64 implementation of the header's
 * definition written here:
 *  - Philox4x32-10 against Random123's published known-answer vectors;
 *  - greedy (temperature 0) gives mg_argmax_f32's ids, ties included, F32 and BF16 logits;
 *  - exact enumeration: for random logits of awkward sizes and random parameters (temperature,
 *    top-k, top-p, min-p, the three penalties), the float64 filtered distribution and each
 *    draw's uniform (mg_sample_uniform) give the id every row must choose; a row may differ
 *    only where its uniform lies within the rounding of the FP32 sums (sum_window) of a boundary
 *    of the float64 distribution;
 *  - a chi-square test of many seeds' draws against the float64 probabilities;
 *  - the same (seed, step) gives the same id whatever the batch around it, and a graph replay
 *    with the step changed between replays gives the eager ids;
 *  - edge cases: ties, top_p = 1, top_k beyond the vocabulary, all -inf but one, all -inf,
 *    NaN and +inf logits, parameters out of range on the device, history ids out of range;
 *  - bad arguments: each refused with MG_ERR_INVALID_ARGUMENT and a message naming it.
 * Outputs are poisoned before every call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_sample.h"
#include "test_util.h"

#define POISON 0x7f7f7f7f

typedef struct dev {
    mg_backend *b;
    mg_stream *s;
    mg_devptr logits, params, history, workspace, ids;
    size_t logits_bytes, params_bytes, history_bytes, workspace_bytes;
} dev;

/* Buffers for up to `rows` rows of `vocab` F32 logits and `hist` history ids. */
static bool dev_alloc(dev *d, uint32_t rows, uint32_t vocab, uint32_t hist) {
    mg_sample_desc desc = {.rows = rows, .vocab = vocab, .logits_dtype = MG_DTYPE_F32};
    d->logits_bytes = (size_t)rows * vocab * 4;
    d->params_bytes = (size_t)rows * sizeof(mg_sample_params);
    d->history_bytes = (size_t)rows * (hist ? hist : 1) * 4;
    d->workspace_bytes = mg_sample_workspace_bytes(&desc);
    return !mg_alloc(d->b, d->logits_bytes, &d->logits) &&
           !mg_alloc(d->b, d->params_bytes, &d->params) &&
           !mg_alloc(d->b, d->history_bytes, &d->history) &&
           !mg_alloc(d->b, d->workspace_bytes, &d->workspace) &&
           !mg_alloc(d->b, (size_t)rows * 4, &d->ids);
}

static void dev_free(dev *d) {
    mg_devptr p[] = {d->logits, d->params, d->history, d->workspace, d->ids};
    for (size_t i = 0; i < 5; i++)
        if (p[i])
            mg_free(d->b, p[i]);
    d->logits = d->params = d->history = d->workspace = d->ids = 0;
}

/* Uploads, poisons ids, samples on d->s, reads ids back. */
static mg_status run_sample(dev *d, const mg_sample_desc *desc, const void *logits,
                            size_t logit_bytes, const mg_sample_params *params,
                            const int32_t *history, int32_t *ids) {
    const uint32_t rows = desc->rows;
    int32_t *poison = malloc(rows * 4);
    for (uint32_t r = 0; r < rows; r++)
        poison[r] = POISON;
    mg_status st = mg_copy_h2d(d->b, d->logits, logits, logit_bytes);
    if (!st)
        st = mg_copy_h2d(d->b, d->params, params, rows * sizeof *params);
    if (!st && history && desc->history_pitch)
        st = mg_copy_h2d(d->b, d->history, history, (size_t)rows * desc->history_pitch * 4);
    if (!st)
        st = mg_copy_h2d(d->b, d->ids, poison, rows * 4);
    if (!st)
        st = mg_sample(d->b, d->s, desc, d->logits, d->params, d->history, d->workspace,
                       d->workspace_bytes, d->ids);
    if (!st)
        st = mg_stream_synchronize(d->s);
    if (!st)
        st = mg_copy_d2h(d->b, ids, d->ids, rows * 4);
    free(poison);
    return st;
}

/* ------------------------------------------------------------------ float64 definition */

static int cmp_desc_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* How far, relative to the total, a sum of `terms` FP32 values (each >= 0) in some order may lie
 * from the exact one: the recursive-summation bound (terms - 1) 2^-24, plus 1e-6 for the
 * rounding of the terms themselves (expf) and of the target compared with it. A running sum over
 * thousands of kept tokens can move a boundary by far more than 1e-6 (seen: 49157 logits,
 * top_p 0.9). */
static double sum_window(uint32_t terms) {
    return 1e-6 + (terms ? terms - 1 : 0) * 0x1p-24;
}

/* The filtered distribution of ops_sample.h in float64: prob[i] (0 when not kept); returns
 * false when a filter's decision lies within rounding of its boundary (1e-5 for min_p, the sums'
 * sum_window for top_p: the case is then not comparable between precisions), and the greedy id
 * in *greedy. */
static bool distribution64(const float *x, uint32_t V, const mg_sample_params *p,
                           const int32_t *hist, double *prob, int32_t *greedy) {
    double *z = malloc(V * sizeof *z), *tmp = malloc(V * sizeof *tmp);
    bool ok = true;
    for (uint32_t i = 0; i < V; i++)
        z[i] = x[i];
    for (uint32_t j = 0; j < p->history_len; j++) {
        const int32_t t = hist[j];
        bool first = true;
        for (uint32_t k = 0; k < j; k++)
            first = first && hist[k] != t;
        if (!first)
            continue;
        uint32_t c = 0;
        for (uint32_t k = 0; k < p->history_len; k++)
            c += hist[k] == t;
        double v = x[t];
        v = v > 0 ? v / p->repetition_penalty : v * p->repetition_penalty;
        z[t] = v - (p->presence_penalty + p->frequency_penalty * (double)c);
    }
    double m = -INFINITY;
    *greedy = -1;
    for (uint32_t i = 0; i < V; i++)
        if (z[i] > m) {
            m = z[i];
            *greedy = (int32_t)i;
        }
    for (uint32_t i = 0; i < V; i++)
        z[i] = (z[i] - m) / (p->temperature > 0 ? p->temperature : 1.0);
    uint32_t n = 0, finite;
    for (uint32_t i = 0; i < V; i++)
        if (z[i] != -INFINITY)
            tmp[n++] = z[i];
    finite = n;
    qsort(tmp, n, sizeof *tmp, cmp_desc_d);
    if (p->top_k && p->top_k < n) {
        const double t = tmp[p->top_k - 1];
        for (uint32_t i = 0; i < V; i++)
            if (z[i] < t)
                z[i] = -INFINITY;
        n = p->top_k;
        while (n < finite && tmp[n] == t)
            n++;
    }
    if (p->top_p < 1.0f) {
        double S = 0;
        for (uint32_t j = 0; j < n; j++)
            S += exp(tmp[j]);
        const double target = (double)p->top_p * S;
        double acc = 0, t = tmp[n - 1];
        for (uint32_t j = 0; j < n;) {
            const double v = tmp[j];
            while (j < n && tmp[j] == v)
                acc += exp(tmp[j++]);
            if (fabs(acc - target) <= fmax(1e-5, sum_window(n)) * S)
                ok = false;
            if (acc >= target) {
                t = v;
                break;
            }
        }
        for (uint32_t i = 0; i < V; i++)
            if (z[i] < t)
                z[i] = -INFINITY;
    }
    double W = 0;
    for (uint32_t i = 0; i < V; i++) {
        double w = z[i] == -INFINITY ? 0 : exp(z[i]);
        if (p->min_p > 0 && w > 0 && fabs(w - p->min_p) <= 1e-5)
            ok = false;
        if (w < p->min_p)
            w = 0;
        prob[i] = w;
        W += w;
    }
    for (uint32_t i = 0; i < V; i++)
        prob[i] /= W;
    free(z);
    free(tmp);
    return ok;
}

/* The id a uniform u chooses from prob (ascending ids); *near: u within 1e-5, or the kept
 * tokens' sum_window, of a boundary. */
static int32_t choose64(const double *prob, uint32_t V, double u, bool *near) {
    double cdf = 0;
    int32_t chosen = -1, last = -1;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < V; i++)
        kept += prob[i] > 0;
    const double window = fmax(1e-5, sum_window(kept));
    *near = false;
    for (uint32_t i = 0; i < V; i++) {
        if (prob[i] <= 0)
            continue;
        cdf += prob[i];
        last = (int32_t)i;
        if (fabs(cdf - u) <= window)
            *near = true;
        if (chosen < 0 && cdf > u)
            chosen = (int32_t)i;
    }
    return chosen >= 0 ? chosen : last;
}

/* ------------------------------------------------------------------ tests */

static void test_philox(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        mg_philox4x32_10(kat[v], kat[v] + 4, out);
        for (int i = 0; i < 4; i++)
            CHECK(out[i] == kat[v][6 + i]);
    }
    /* the uniform: in [0, 1), the first word's top 24 bits, a function of (seed, step) only */
    const uint32_t ctr[4] = {7, 0, 0, 0}, key[2] = {0x12345678u, 0x9abcdef0u};
    uint32_t out[4];
    mg_philox4x32_10(ctr, key, out);
    CHECK(mg_sample_uniform(0x9abcdef012345678ull, 7) == (float)(out[0] >> 8) / 16777216.0f);
    double mean = 0;
    for (uint64_t s = 0; s < 100000; s++) {
        const float u = mg_sample_uniform(s * 0x9E3779B97F4A7C15ull, s);
        CHECK(u >= 0.0f && u < 1.0f);
        mean += u;
    }
    CHECK(fabs(mean / 100000 - 0.5) < 0.005);
}

static void fill_logits(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(test_rand() >> 11) / 9007199254740992.0 * 2 - 1) * scale;
}

static void test_greedy(dev *d) {
    static const uint32_t vocabs[] = {1, 7, 1000, 49157};
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        const uint32_t V = vocabs[v], rows = 5, pitch = (V + 3) & ~3u;
        float *x = calloc((size_t)rows * pitch, 4);
        uint16_t *xb = calloc((size_t)rows * pitch, 2);
        mg_sample_params params[5];
        int32_t ids[5], want[5], ids_bf16[5];
        fill_logits(x, (size_t)rows * pitch, 8);
        if (V > 10) { /* ties: the lowest id wins */
            x[3] = x[V - 2] = 20.0f;
            x[pitch + 5] = x[pitch + 6] = 30.0f;
        }
        for (size_t i = 0; i < (size_t)rows * pitch; i++) {
            xb[i] = mg_f32_to_bf16(x[i]);
            x[i] = mg_bf16_to_f32(xb[i]); /* the same values in both dtypes */
        }
        for (uint32_t r = 0; r < rows; r++) {
            params[r] = mg_sample_params_greedy();
            params[r].seed = test_rand();
            params[r].step = r;
        }
        mg_sample_desc desc = {
            .rows = rows, .vocab = V, .logits_dtype = MG_DTYPE_F32, .logits_pitch = pitch};
        CHECK_OK(run_sample(d, &desc, x, (size_t)rows * pitch * 4, params, NULL, ids));
        CHECK_OK(mg_copy_h2d(d->b, d->logits, x, (size_t)rows * pitch * 4));
        CHECK_OK(mg_argmax_f32(d->b, d->s, rows, V, d->logits, pitch, d->ids));
        CHECK_OK(mg_stream_synchronize(d->s));
        CHECK_OK(mg_copy_d2h(d->b, want, d->ids, sizeof want));
        desc.logits_dtype = MG_DTYPE_BF16;
        CHECK_OK(run_sample(d, &desc, xb, (size_t)rows * pitch * 2, params, NULL, ids_bf16));
        for (uint32_t r = 0; r < rows; r++) {
            CHECK(ids[r] == want[r]);
            CHECK(ids_bf16[r] == want[r]);
        }
        if (V > 10) {
            CHECK(ids[0] == 3);
            CHECK(ids[1] == 5);
        }
        free(x);
        free(xb);
    }
}

/* Random parameters: each filter on about half the time. */
static mg_sample_params random_params(uint32_t V, uint32_t history_len) {
    mg_sample_params p = mg_sample_params_greedy();
    p.temperature = 0.3f + (float)(test_rand() % 1000) / 500.0f;
    if (test_rand() % 2)
        p.top_k = (uint32_t)test_rand_range(1, V + 3);
    if (test_rand() % 2)
        p.top_p = 0.2f + (float)(test_rand() % 800) / 1000.0f;
    if (test_rand() % 3 == 0)
        p.min_p = (float)(test_rand() % 300) / 1000.0f;
    if (history_len && test_rand() % 2) {
        p.history_len = history_len;
        p.repetition_penalty = 0.5f + (float)(test_rand() % 1000) / 500.0f;
        if (test_rand() % 2)
            p.presence_penalty = (float)((int)(test_rand() % 200) - 100) / 50.0f;
        if (test_rand() % 2)
            p.frequency_penalty = (float)((int)(test_rand() % 200) - 100) / 100.0f;
    }
    return p;
}

/* Exact enumeration and chi-square over `draws` seeds of one random row, `trials` times. */
static void test_distribution(dev *d, uint32_t V, uint32_t draws, int trials) {
    const uint32_t H = 24;
    float *x = malloc((size_t)draws * V * 4);
    double *prob = malloc(V * sizeof *prob);
    mg_sample_params *params = malloc(draws * sizeof *params);
    int32_t *hist = malloc((size_t)draws * H * 4), *ids = malloc(draws * 4);
    uint32_t *counts = malloc(V * sizeof *counts);
    int done = 0, attempts = 0, near_total = 0, mismatched = 0, drawn_total = 0;
    while (done < trials && attempts++ < 20 * trials) {
        fill_logits(x, V, 4);
        if (V > 8) { /* a tie and a masked token */
            x[1] = x[V / 2];
            x[V - 1] = -INFINITY;
        }
        for (uint32_t j = 0; j < H; j++)
            hist[j] = (int32_t)(test_rand() % (V < 6 ? V : 6)); /* repeats on purpose */
        const mg_sample_params p = random_params(V, H);
        int32_t greedy;
        if (!distribution64(x, V, &p, hist, prob, &greedy))
            continue; /* a filter's boundary within rounding: not comparable */
        const uint64_t seed = test_rand();
        for (uint32_t r = 0; r < draws; r++) {
            memcpy(x + (size_t)r * V, x, V * 4);
            memcpy(hist + (size_t)r * H, hist, H * 4);
            params[r] = p;
            params[r].seed = seed + r / 4; /* several steps of several seeds */
            params[r].step = r % 4;
        }
        mg_sample_desc desc = {
            .rows = draws, .vocab = V, .logits_dtype = MG_DTYPE_F32, .history_pitch = H};
        mg_status st = run_sample(d, &desc, x, (size_t)draws * V * 4, params, hist, ids);
        CHECK_OK(st);
        if (st)
            break;
        memset(counts, 0, V * sizeof *counts);
        int bad = 0;
        for (uint32_t r = 0; r < draws; r++) {
            bool near;
            const double u = mg_sample_uniform(params[r].seed, params[r].step);
            const int32_t want = choose64(prob, V, u, &near);
            near_total += near;
            if (ids[r] < 0 || (uint32_t)ids[r] >= V) {
                bad++;
                continue;
            }
            counts[ids[r]]++;
            if (ids[r] != want && !near) {
                if (mismatched++ < 5)
                    fprintf(stderr,
                            "vocab %u row %u: id %d, float64 says %d (u %.9f; T %g k %u p %g "
                            "min_p %g rep %g pres %g freq %g)\n",
                            V, r, ids[r], want, u, p.temperature, p.top_k, p.top_p, p.min_p,
                            p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
            }
            if (prob[ids[r]] <= 0 && !near)
                bad++;
        }
        CHECK(bad == 0);
        /* chi-square over the bins with an expected count >= 5 (the rest merged) */
        double chi = 0, rest_e = 0, rest_o = 0;
        int bins = 0;
        for (uint32_t i = 0; i < V; i++) {
            const double e = prob[i] * draws;
            if (e >= 5) {
                chi += (counts[i] - e) * (counts[i] - e) / e;
                bins++;
            } else {
                rest_e += e;
                rest_o += counts[i];
            }
        }
        if (rest_e >= 5) {
            chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
            bins++;
        }
        if (bins >= 2) {
            const double df = bins - 1, zq = 4.75; /* p = 1e-6, Wilson-Hilferty */
            const double limit = df * pow(1 - 2 / (9 * df) + zq * sqrt(2 / (9 * df)), 3);
            test_checks++;
            if (chi > limit) {
                test_failures++;
                fprintf(stderr, "FAIL: vocab %u: chi-square %.1f over %d bins exceeds %.1f\n", V,
                        chi, bins, limit);
            }
        }
        drawn_total += draws;
        done++;
    }
    CHECK(done == trials);
    CHECK(mismatched == 0);
    printf("  vocab %u: %d parameter sets, %d draws, %d within rounding of a boundary, %d "
           "mismatches\n",
           V, done, drawn_total, near_total, mismatched);
    free(x);
    free(prob);
    free(params);
    free(hist);
    free(ids);
    free(counts);
}

/* A row's id does not depend on the rows around it. */
static void test_batch_independence(dev *d) {
    const uint32_t V = 301, rows = 9;
    float *x = malloc((size_t)rows * V * 4);
    mg_sample_params params[9];
    int32_t ids[9], one[1];
    fill_logits(x, (size_t)rows * V, 3);
    for (uint32_t r = 0; r < rows; r++) {
        params[r] = random_params(V, 0);
        params[r].seed = test_rand();
        params[r].step = test_rand() % 1000;
    }
    mg_sample_desc desc = {.rows = rows, .vocab = V, .logits_dtype = MG_DTYPE_F32};
    CHECK_OK(run_sample(d, &desc, x, (size_t)rows * V * 4, params, NULL, ids));
    desc.rows = 1;
    for (uint32_t r = 0; r < rows; r++) {
        CHECK_OK(run_sample(d, &desc, x + (size_t)r * V, V * 4, &params[r], NULL, one));
        CHECK(one[0] == ids[r]);
    }
    /* the same again: reproducible */
    int32_t again[9];
    desc.rows = rows;
    CHECK_OK(run_sample(d, &desc, x, (size_t)rows * V * 4, params, NULL, again));
    CHECK(!memcmp(ids, again, sizeof ids));
    free(x);
}

/* A captured graph samples with the parameters uploaded before each replay. */
static void test_graph(dev *d) {
    const uint32_t V = 64, rows = 3;
    float x[3 * 64];
    mg_sample_params params[3];
    fill_logits(x, rows * V, 2);
    for (uint32_t r = 0; r < rows; r++) {
        params[r] = mg_sample_params_greedy();
        params[r].temperature = 1.0f;
        params[r].seed = 100 + r;
    }
    mg_sample_desc desc = {.rows = rows, .vocab = V, .logits_dtype = MG_DTYPE_F32};
    CHECK_OK(mg_copy_h2d(d->b, d->logits, x, sizeof x));
    CHECK_OK(mg_copy_h2d(d->b, d->params, params, sizeof params));
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_begin_capture(d->s));
    CHECK_OK(mg_sample(d->b, d->s, &desc, d->logits, d->params, 0, d->workspace, d->workspace_bytes,
                       d->ids));
    CHECK_OK(mg_graph_end_capture(d->s, &g));
    int distinct = 0, prev = -1;
    for (uint64_t step = 0; g && step < 20; step++) {
        int32_t eager[3], replayed[3];
        for (uint32_t r = 0; r < rows; r++)
            params[r].step = step;
        CHECK_OK(run_sample(d, &desc, x, sizeof x, params, NULL, eager));
        CHECK_OK(mg_copy_h2d(d->b, d->params, params, sizeof params));
        CHECK_OK(mg_graph_launch(g, d->s));
        CHECK_OK(mg_stream_synchronize(d->s));
        CHECK_OK(mg_copy_d2h(d->b, replayed, d->ids, sizeof replayed));
        CHECK(!memcmp(eager, replayed, sizeof eager));
        distinct += eager[0] != prev;
        prev = eager[0];
    }
    CHECK(distinct > 3); /* the step does change the draw */
    if (g)
        mg_graph_destroy(g);
}

static void test_edges(dev *d) {
    const uint32_t V = 13;
    float x[13];
    int32_t id[1];
    mg_sample_desc desc = {.rows = 1, .vocab = V, .logits_dtype = MG_DTYPE_F32};
    mg_sample_params p = mg_sample_params_greedy();
    p.temperature = 1.0f;
    /* all -inf but one: that one, whatever the seed and filters */
    for (uint32_t i = 0; i < V; i++)
        x[i] = -INFINITY;
    x[9] = -3.0f;
    for (int t = 0; t < 50; t++) {
        p.seed = test_rand();
        p.top_k = t % 3 ? 0 : 5;
        p.top_p = t % 2 ? 1.0f : 0.5f;
        p.min_p = t % 5 ? 0.0f : 0.9f;
        CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
        CHECK(id[0] == 9);
    }
    /* all -inf: no candidate, greedy or not */
    x[9] = -INFINITY;
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
    CHECK(id[0] == MG_SAMPLE_NO_CANDIDATE);
    mg_sample_params g = mg_sample_params_greedy();
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &g, NULL, id));
    CHECK(id[0] == MG_SAMPLE_NO_CANDIDATE);
    /* NaN and +inf logits are refused, greedy or not */
    for (uint32_t i = 0; i < V; i++)
        x[i] = (float)i;
    x[4] = NAN;
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
    CHECK(id[0] == MG_SAMPLE_BAD_LOGITS);
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &g, NULL, id));
    CHECK(id[0] == MG_SAMPLE_BAD_LOGITS);
    x[4] = INFINITY;
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
    CHECK(id[0] == MG_SAMPLE_BAD_LOGITS);
    /* ties: four equal maxima, top_k 1 keeps all four (ties kept), each drawn about 1/4 */
    for (uint32_t i = 0; i < V; i++)
        x[i] = (i % 3 == 0) ? 2.0f : -1.0f; /* ids 0 3 6 9 12 */
    p.top_k = 1;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    int hits[13] = {0};
    for (int t = 0; t < 2000; t++) {
        p.seed = (uint64_t)t;
        CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
        if (id[0] >= 0 && id[0] < (int32_t)V)
            hits[id[0]]++;
    }
    for (uint32_t i = 0; i < V; i++)
        CHECK(i % 3 == 0 ? hits[i] > 300 && hits[i] < 500 : hits[i] == 0);
    /* top_k beyond the vocabulary and top_p = 1 are off: the same ids as no filter */
    fill_logits(x, V, 2);
    for (int t = 0; t < 100; t++) {
        int32_t a[1], b[1];
        p = mg_sample_params_greedy();
        p.temperature = 0.7f;
        p.seed = test_rand();
        CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, a));
        p.top_k = V + (uint32_t)(test_rand() % 1000);
        p.top_p = 1.0f;
        CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, b));
        CHECK(a[0] == b[0]);
        p.top_k = V; /* == vocab: off too */
        CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, b));
        CHECK(a[0] == b[0]);
    }
    /* min_p 1: only the maximum; a repetition penalty demotes it in greedy decoding */
    p = mg_sample_params_greedy();
    p.temperature = 1.5f;
    p.min_p = 1.0f;
    for (uint32_t i = 0; i < V; i++)
        x[i] = (float)i * 0.25f;
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
    CHECK(id[0] == 12);
    const int32_t hist[4] = {12, 12, 11, 3};
    desc.history_pitch = 4;
    g.history_len = 4;
    g.repetition_penalty = 1.2f; /* 3.0 / 1.2 = 2.5 < 2.75 (id 11: 2.75 / 1.2 = 2.29) */
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &g, hist, id));
    CHECK(id[0] == 10);
    g.repetition_penalty = 1.0f;
    g.frequency_penalty = 0.3f; /* 12: 3 - 0.6; 11: 2.75 - 0.3 = 2.45; 10: 2.5 */
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &g, hist, id));
    CHECK(id[0] == 10);
    g.frequency_penalty = -0.1f; /* negative: favours them (12: 3.2) */
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &g, hist, id));
    CHECK(id[0] == 12);
    /* a history id outside the vocabulary, parameters out of range: refused on the device */
    const int32_t bad_hist[4] = {1, 2, 13, 0};
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &g, bad_hist, id));
    CHECK(id[0] == MG_SAMPLE_BAD_PARAMS);
    desc.history_pitch = 0;
    g = mg_sample_params_greedy();
    const float bad_t[] = {-1.0f, NAN, INFINITY};
    for (size_t i = 0; i < 3; i++) {
        p = g;
        p.temperature = bad_t[i];
        CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
        CHECK(id[0] == MG_SAMPLE_BAD_PARAMS);
    }
    p = g;
    p.history_len = 1; /* beyond history_pitch 0 */
    CHECK_OK(run_sample(d, &desc, x, sizeof x, &p, NULL, id));
    CHECK(id[0] == MG_SAMPLE_BAD_PARAMS);
}

static void test_params_check(void) {
    mg_sample_params p = mg_sample_params_greedy();
    CHECK_OK(mg_sample_params_check(&p, 10, 0));
    CHECK_STATUS(mg_sample_params_check(NULL, 10, 0), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_sample_params_check(&p, 0, 0), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("vocab");
    struct {
        size_t offset;
        float value;
        const char *needle;
    } cases[] = {
        {offsetof(mg_sample_params, temperature), -0.5f, "temperature"},
        {offsetof(mg_sample_params, temperature), NAN, "temperature"},
        {offsetof(mg_sample_params, temperature), INFINITY, "temperature"},
        {offsetof(mg_sample_params, top_p), 0.0f, "top_p"},
        {offsetof(mg_sample_params, top_p), 1.5f, "top_p"},
        {offsetof(mg_sample_params, top_p), NAN, "top_p"},
        {offsetof(mg_sample_params, min_p), -0.1f, "min_p"},
        {offsetof(mg_sample_params, min_p), 1.01f, "min_p"},
        {offsetof(mg_sample_params, repetition_penalty), 0.0f, "repetition_penalty"},
        {offsetof(mg_sample_params, repetition_penalty), -2.0f, "repetition_penalty"},
        {offsetof(mg_sample_params, repetition_penalty), NAN, "repetition_penalty"},
        {offsetof(mg_sample_params, presence_penalty), 1001.0f, "presence_penalty"},
        {offsetof(mg_sample_params, presence_penalty), NAN, "presence_penalty"},
        {offsetof(mg_sample_params, frequency_penalty), -1e30f, "frequency_penalty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mg_sample_params q = p;
        memcpy((char *)&q + cases[i].offset, &cases[i].value, sizeof(float));
        CHECK_STATUS(mg_sample_params_check(&q, 10, 0), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE(cases[i].needle);
    }
    mg_sample_params q = p;
    q.history_len = 5;
    CHECK_STATUS(mg_sample_params_check(&q, 10, 4), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("history_len");
    q.history_len = 4;
    CHECK_OK(mg_sample_params_check(&q, 10, 4));
}

static void test_bad_arguments(dev *d) {
    const uint32_t V = 100;
    mg_sample_desc ok = {.rows = 2, .vocab = V, .logits_dtype = MG_DTYPE_F32};
    const size_t ws = mg_sample_workspace_bytes(&ok);
    CHECK(ws == 2 * 2 * 100 * 4);
    CHECK(mg_sample_workspace_bytes(NULL) == 0);
    mg_sample_desc bad = ok;
    bad.rows = 0;
    CHECK(mg_sample_workspace_bytes(&bad) == 0);
    int32_t poison[2] = {POISON, POISON}, after[2];
    CHECK_OK(mg_copy_h2d(d->b, d->ids, poison, sizeof poison));
#define REFUSED(call, needle)                                                                      \
    do {                                                                                           \
        CHECK_STATUS(call, MG_ERR_INVALID_ARGUMENT);                                               \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)
    REFUSED(mg_sample(NULL, d->s, &ok, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "backend");
    REFUSED(mg_sample(d->b, d->s, NULL, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "descriptor");
    bad = ok;
    bad.rows = 0;
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "rows=0");
    bad = ok;
    bad.vocab = 0;
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "vocab=0");
    bad = ok;
    bad.logits_dtype = MG_DTYPE_F16;
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "logits_dtype");
    bad = ok;
    bad.logits_pitch = V - 1;
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "logits_pitch");
    bad = ok;
    bad.history_pitch = MG_SAMPLE_MAX_HISTORY + 1;
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, d->history, d->workspace, ws, d->ids),
            "history_pitch");
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits, d->params, 0, d->workspace, ws - 4, d->ids),
            "workspace_bytes");
    REFUSED(mg_sample(d->b, d->s, &ok, 0, d->params, 0, d->workspace, ws, d->ids), "logits");
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits, 0, 0, d->workspace, ws, d->ids), "params");
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits, d->params, 0, d->workspace, ws, 0), "ids");
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits + 2, d->params, 0, d->workspace, ws, d->ids),
            "logits");
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits, d->params + 4, 0, d->workspace, ws, d->ids),
            "params");
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits, d->params, 0, d->workspace + 4, ws, d->ids),
            "workspace");
    bad = ok;
    bad.history_pitch = 8;
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, 0, d->workspace, ws, d->ids),
            "history");
    /* ids inside the logits, logits larger than their buffer */
    REFUSED(mg_sample(d->b, d->s, &ok, d->logits, d->params, 0, d->workspace, ws, d->logits),
            "ids");
    bad = ok;
    bad.rows = 4000; /* 4000 rows of 100 do not fit the buffers */
    REFUSED(mg_sample(d->b, d->s, &bad, d->logits, d->params, 0, d->workspace,
                      mg_sample_workspace_bytes(&bad), d->ids),
            "mg_sample");
#undef REFUSED
    CHECK_OK(mg_copy_d2h(d->b, after, d->ids, sizeof after));
    CHECK(after[0] == POISON && after[1] == POISON); /* nothing was launched */
}

/* A large vocabulary (the reference's selection and sort paths), F32 and BF16. */
static void test_large_vocab(dev *d) {
    const uint32_t V = 49157, rows = 6;
    float *x = malloc((size_t)rows * V * 4);
    double *prob = malloc(V * sizeof *prob);
    mg_sample_params params[6];
    int32_t ids[6];
    fill_logits(x, (size_t)rows * V, 10);
    int checked = 0;
    for (uint32_t r = 0; r < rows; r++) {
        params[r] = mg_sample_params_greedy();
        params[r].temperature = 0.8f;
        params[r].top_k = r % 2 ? 0 : 40 + r;
        params[r].top_p = r % 3 ? 0.9f : 1.0f;
        params[r].min_p = r == 5 ? 0.05f : 0.0f;
        params[r].seed = test_rand();
        params[r].step = r;
    }
    mg_sample_desc desc = {.rows = rows, .vocab = V, .logits_dtype = MG_DTYPE_F32};
    CHECK_OK(run_sample(d, &desc, x, (size_t)rows * V * 4, params, NULL, ids));
    for (uint32_t r = 0; r < rows; r++) {
        int32_t greedy;
        bool near;
        if (!distribution64(x + (size_t)r * V, V, &params[r], NULL, prob, &greedy))
            continue;
        const int32_t want =
            choose64(prob, V, mg_sample_uniform(params[r].seed, params[r].step), &near);
        CHECK(near || ids[r] == want);
        checked++;
    }
    CHECK(checked >= 3);
    free(x);
    free(prob);
}

static void run_backend(mg_backend_kind kind) {
    const char *name = mg_backend_kind_name(kind);
    mg_backend_probe probe;
    if (mg_backend_probe_kind(kind, &probe) || !probe.usable) {
        printf("%s: skipped: %s\n", name, probe.reason[0] ? probe.reason : "not usable");
        return;
    }
    dev d = {0};
    CHECK_OK(mg_backend_open(kind, 0, &d.b));
    if (!d.b)
        return;
    CHECK_OK(mg_stream_create(d.b, &d.s));
    /* first 6 rows of 49157, then 4000 rows of 75 */
    if (!d.s || !dev_alloc(&d, 6, 49157, 24)) {
        CHECK(false);
        mg_backend_close(d.b);
        return;
    }
    printf("%s:\n", name);
    test_greedy(&d);
    test_large_vocab(&d);
    dev_free(&d);
    if (!dev_alloc(&d, 4000, 75, 24)) {
        CHECK(false);
        mg_stream_destroy(d.s);
        mg_backend_close(d.b);
        return;
    }
    test_distribution(&d, 5, 4000, 6);
    test_distribution(&d, 37, 4000, 6);
    test_distribution(&d, 75, 3000, 4);
    test_batch_independence(&d);
    test_graph(&d);
    test_edges(&d);
    test_bad_arguments(&d);
    dev_free(&d);
    mg_stream_destroy(d.s);
    CHECK_OK(mg_backend_close(d.b));
}

/* No argument: the host checks, then every check on the CPU and (where usable) CUDA. "metal":
 * every check on the Metal backend only (ctest sample_metal points it at the test double). */
int main(int argc, char **argv) {
    test_seed();
    if (argc > 1 && !strcmp(argv[1], "metal")) {
        mg_backend_probe probe;
        CHECK(mg_backend_probe_kind(MG_BACKEND_METAL, &probe) == MG_OK && probe.usable);
        run_backend(MG_BACKEND_METAL);
        return test_finish();
    }
    test_philox();
    test_params_check();
    run_backend(MG_BACKEND_CPU);
    run_backend(MG_BACKEND_CUDA);
    return test_finish();
}
