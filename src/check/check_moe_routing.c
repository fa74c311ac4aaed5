/* check_moe_routing.c - the "moe_routing" check group: the MoE routing helpers of
 * metrale/ops_moe.h on the backend under test against results computed here independently
 * (a float64 softmax and a selection by repeated scans for top-k, a plain stable counting sort,
 * the combine's fmaf loop), on fresh random inputs of awkward sizes (T = 1, 3, 1000, 5000;
 * E = 1 .. 256; skewed routings with empty experts; logits with ties and NaN), outputs poisoned
 * with guard bytes; the whole routing captured once and replayed with new logits; out-of-range
 * expert ids (refused by the CPU backend, dropped by device backends); bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops_moe.h"
#include "metrale/status.h"

#define POISON MG_CHECK_POISON
#define GUARD_BYTES 64
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
/* Top-k weights: the backends' expf and sums differ by a few ulp from float64. */
#define WEIGHT_TOLERANCE 2e-5

static uint32_t rng_below(uint64_t *rng, uint32_t n) {
    return (uint32_t)(mg_check_rng_next(rng) % n);
}

static double rng_unit(uint64_t *rng) { /* uniform in [-1, 1) */
    return (double)(mg_check_rng_next(rng) >> 11) * 0x1p-52 - 1.0;
}

static mg_status download(mg_backend *b, void *host, mg_devptr p, size_t bytes) {
    mg_status st = mg_stream_synchronize(mg_stream_default(b));
    return st ? st : mg_copy_d2h(b, host, p, bytes);
}

static bool guard_intact(const void *after_end) {
    const unsigned char *p = after_end;
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (p[i] != POISON)
            return false;
    return true;
}

static void free_all(mg_backend *b, mg_devptr *p, int count) {
    for (int i = 0; i < count; i++)
        mg_free(b, p[i]);
}

/* ------------------------------------------------------------------ expected results */

/* Logits [T, E] as FP32 values (BF16-rounded when `bf16`, stored in `raw` as the op reads
 * them): coarse values (many ties), one NaN in 97, rows of one repeated value now and then. */
static float *make_logits(uint64_t *rng, uint32_t tokens, uint32_t experts, uint32_t pitch,
                          bool bf16, void *raw) {
    float *v = malloc((size_t)tokens * pitch * sizeof *v);
    for (uint32_t t = 0; v && t < tokens; t++) {
        bool flat = rng_below(rng, 17) == 0;
        for (uint32_t e = 0; e < pitch; e++) {
            float x = flat ? 0.5f : (float)(rng_below(rng, 64) / 8.0 - 4.0 + rng_unit(rng) * 1e-3);
            if (e >= experts)
                x = 1e30f; /* the gap between rows: never a candidate */
            else if (rng_below(rng, 97) == 0)
                x = NAN;
            size_t i = (size_t)t * pitch + e;
            if (bf16) {
                uint16_t h = mg_f32_to_bf16(x);
                ((uint16_t *)raw)[i] = h;
                x = mg_bf16_to_f32(h);
            } else {
                ((float *)raw)[i] = x;
            }
            v[i] = x;
        }
    }
    return v;
}

static void expect_topk(const float *logits, uint32_t tokens, uint32_t experts, uint32_t k,
                        uint32_t pitch, bool renormalize, int32_t *ids, double *weights) {
    for (uint32_t t = 0; t < tokens; t++) {
        const float *row = logits + (size_t)t * pitch;
        double rank_value[MG_MOE_MAX_EXPERTS];
        bool used[MG_MOE_MAX_EXPERTS] = {false};
        for (uint32_t e = 0; e < experts; e++)
            rank_value[e] = isnan(row[e]) ? -INFINITY : row[e];
        for (uint32_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (uint32_t e = 0; e < experts; e++)
                if (!used[e] && (best < 0 || rank_value[e] > rank_value[best]))
                    best = (int32_t)e;
            used[best] = true;
            ids[(size_t)t * k + j] = best;
        }
        double max = rank_value[ids[(size_t)t * k]], sum = 0;
        for (uint32_t e = 0; e < experts; e++)
            if (!renormalize || used[e])
                sum += exp(rank_value[e] - max);
        for (uint32_t j = 0; j < k; j++)
            weights[(size_t)t * k + j] = exp(rank_value[ids[(size_t)t * k + j]] - max) / sum;
    }
}

typedef struct sort_result {
    int32_t *offsets, *sorted, *positions;
} sort_result;

/* A stable counting sort; ids outside [0, E) dropped as the device backends drop them. */
static void expect_sort(const int32_t *ids, uint32_t pairs, uint32_t experts, uint32_t k,
                        sort_result *r) {
    int32_t row = 0;
    for (uint32_t e = 0; e < experts; e++) {
        r->offsets[e] = row;
        for (uint32_t p = 0; p < pairs; p++)
            if (ids[p] == (int32_t)e) {
                r->sorted[row] = (int32_t)(p / k);
                r->positions[p] = row++;
            }
    }
    r->offsets[experts] = row;
    for (uint32_t p = 0; p < pairs; p++)
        if (ids[p] < 0 || ids[p] >= (int32_t)experts)
            r->positions[p] = -1;
    for (uint32_t q = (uint32_t)row; q < pairs; q++)
        r->sorted[q] = -1;
}

/* ------------------------------------------------------------------ top-k */

static bool topk_case(mg_check_ctx *ctx, mg_check_result *result, uint64_t *rng, uint32_t tokens,
                      uint32_t experts, uint32_t k, bool bf16, bool renormalize) {
    mg_backend *b = ctx->backend;
    uint32_t pitch = experts + (tokens % 2 ? 0 : 3);
    size_t size = bf16 ? 2 : 4, pairs = (size_t)tokens * k;
    void *raw = malloc((size_t)tokens * pitch * size);
    float *logits = raw ? make_logits(rng, tokens, experts, pitch, bf16, raw) : NULL;
    int32_t *want_ids = malloc(pairs * 4), *got_ids = malloc(pairs * 4 + GUARD_BYTES);
    double *want_w = malloc(pairs * sizeof(double));
    float *got_w = malloc(pairs * 4 + GUARD_BYTES);
    mg_devptr d[3] = {0};
    bool ok = false;
    char what[96];
    snprintf(what, sizeof what, "topk T=%u E=%u k=%u %s%s", tokens, experts, k,
             bf16 ? "bf16" : "f32", renormalize ? " renormalized" : "");
    if (!logits || !want_ids || !got_ids || !want_w || !got_w) {
        MG_CHECK_FAIL(result, "out of host memory");
        goto done;
    }
    expect_topk(logits, tokens, experts, k, pitch, renormalize, want_ids, want_w);
    mg_moe_topk_desc desc = {
        tokens,     experts, k, bf16 ? MG_DTYPE_BF16 : MG_DTYPE_F32, pitch == experts ? 0 : pitch,
        renormalize};
    mg_status st;
    if ((st = mg_check_upload(b, raw, (size_t)tokens * pitch * size, &d[0])) ||
        (st = mg_check_alloc_poisoned(b, pairs * 4 + GUARD_BYTES, &d[1])) ||
        (st = mg_check_alloc_poisoned(b, pairs * 4 + GUARD_BYTES, &d[2])) ||
        (st = mg_moe_topk(b, NULL, &desc, d[0], d[1], d[2])) ||
        (st = download(b, got_ids, d[1], pairs * 4 + GUARD_BYTES)) ||
        (st = download(b, got_w, d[2], pairs * 4 + GUARD_BYTES))) {
        MG_CHECK_FAIL(result, "%s: %s", what, mg_last_error());
        goto done;
    }
    for (size_t p = 0; p < pairs; p++) {
        if (got_ids[p] != want_ids[p]) {
            MG_CHECK_FAIL(result, "%s: token %zu slot %zu: expert %d, expected %d", what, p / k,
                          p % k, got_ids[p], want_ids[p]);
            goto done;
        }
        double err = fabs(got_w[p] - want_w[p]);
        bool both_nan = isnan(got_w[p]) && isnan(want_w[p]);
        if (!both_nan && !(err <= WEIGHT_TOLERANCE * want_w[p] + 1e-30)) {
            MG_CHECK_FAIL(result, "%s: token %zu slot %zu: weight %.9g, expected %.9g", what, p / k,
                          p % k, got_w[p], want_w[p]);
            goto done;
        }
        if (result->error < err / want_w[p])
            result->error = err / want_w[p];
    }
    if (!guard_intact(got_ids + pairs) || !guard_intact(got_w + pairs)) {
        MG_CHECK_FAIL(result, "%s: written past the outputs", what);
        goto done;
    }
    ok = true;
done:
    free_all(b, d, 3);
    free(raw), free(logits), free(want_ids), free(got_ids), free(want_w), free(got_w);
    return ok;
}

static void check_topk(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "topk");
    static const uint32_t tokens[] = {1, 3, 1000};
    static const uint32_t shapes[][2] = {{1, 1}, {8, 2}, {60, 4}, {128, 8}, {256, 8}, {33, 8}};
    int cases = 0;
    for (size_t t = 0; t < COUNT(tokens); t++)
        for (size_t s = 0; s < COUNT(shapes); s++)
            for (int variant = 0; variant < 4; variant++, cases++)
                if (!topk_case(ctx, result, &rng, tokens[t], shapes[s][0], shapes[s][1],
                               variant & 1, variant & 2))
                    return;
    snprintf(result->detail, sizeof result->detail,
             "%d cases (T 1..1000, E 1..256, k 1..8, BF16/FP32, renormalized or not, ties, NaN): "
             "ids exact, weights within %.0e",
             cases, WEIGHT_TOLERANCE);
}

/* ------------------------------------------------------------------ sort */

/* Routes of a named kind: uniform, all to one expert, half the experts empty, or with
 * `bad` ids out of range. */
static void make_ids(uint64_t *rng, int32_t *ids, uint32_t pairs, uint32_t experts, int kind) {
    uint32_t hot = rng_below(rng, experts);
    for (uint32_t p = 0; p < pairs; p++) {
        switch (kind) {
        case 0:
            ids[p] = (int32_t)rng_below(rng, experts);
            break;
        case 1:
            ids[p] = (int32_t)hot;
            break;
        case 2: /* only odd experts (or expert 0 when E = 1), skewed towards small ids */
            ids[p] = experts == 1
                         ? 0
                         : (int32_t)(rng_below(rng, rng_below(rng, experts / 2) + 1) * 2 + 1);
            if (ids[p] >= (int32_t)experts)
                ids[p] = 1;
            break;
        default: /* out of range now and then */
            ids[p] = rng_below(rng, 50) == 0 ? (rng_below(rng, 2) ? -1 : (int32_t)experts + 3)
                                             : (int32_t)rng_below(rng, experts);
        }
    }
}

static bool has_bad_id(const int32_t *ids, uint32_t pairs, uint32_t experts) {
    for (uint32_t p = 0; p < pairs; p++)
        if (ids[p] < 0 || ids[p] >= (int32_t)experts)
            return true;
    return false;
}

static bool same_i32(mg_check_result *result, const char *what, const char *name,
                     const int32_t *got, const int32_t *want, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (got[i] != want[i]) {
            MG_CHECK_FAIL(result, "%s: %s[%zu] = %d, expected %d", what, name, i, got[i], want[i]);
            return false;
        }
    if (!guard_intact(got + count)) {
        MG_CHECK_FAIL(result, "%s: %s written past its end", what, name);
        return false;
    }
    return true;
}

static bool sort_case(mg_check_ctx *ctx, mg_check_result *result, const char **how, uint64_t *rng,
                      uint32_t tokens, uint32_t experts, uint32_t k, int kind) {
    mg_backend *b = ctx->backend;
    uint32_t pairs = tokens * k;
    mg_moe_sort_desc desc = {tokens, experts, k};
    size_t ws = mg_moe_sort_workspace_bytes(&desc);
    int32_t *ids = malloc(pairs * 4);
    sort_result want = {malloc((experts + 1) * 4), malloc(pairs * 4), malloc(pairs * 4)};
    sort_result got = {malloc((experts + 1) * 4 + GUARD_BYTES), malloc(pairs * 4 + GUARD_BYTES),
                       malloc(pairs * 4 + GUARD_BYTES)};
    mg_devptr d[5] = {0};
    bool ok = false;
    char what[96];
    snprintf(what, sizeof what, "sort T=%u E=%u k=%u routing %d", tokens, experts, k, kind);
    if (!ids || !want.offsets || !want.sorted || !want.positions || !got.offsets || !got.sorted ||
        !got.positions || ws == 0) {
        MG_CHECK_FAIL(result, "%s: out of host memory or no workspace size", what);
        goto done;
    }
    make_ids(rng, ids, pairs, experts, kind);
    expect_sort(ids, pairs, experts, k, &want);
    mg_status st;
    if ((st = mg_check_upload(b, ids, pairs * 4, &d[0])) ||
        (st = mg_check_alloc_poisoned(b, ws, &d[1])) ||
        (st = mg_check_alloc_poisoned(b, (experts + 1) * 4 + GUARD_BYTES, &d[2])) ||
        (st = mg_check_alloc_poisoned(b, pairs * 4 + GUARD_BYTES, &d[3])) ||
        (st = mg_check_alloc_poisoned(b, pairs * 4 + GUARD_BYTES, &d[4]))) {
        MG_CHECK_FAIL(result, "%s: setup: %s", what, mg_last_error());
        goto done;
    }
    st = mg_moe_sort(b, NULL, &desc, d[0], d[1], ws, d[2], d[3], d[4]);
    const bool bad = has_bad_id(ids, pairs, experts);
    const bool refuses = bad && mg_backend_get_kind(b) == MG_BACKEND_CPU;
    if (!st && bad)
        st = mg_stream_synchronize(mg_stream_default(b));
    /* A device backend's kernels drop the bad pairs (metrale/ops_moe.h), except on a device
     * whose kernels are the CPU reference's (the Metal test double): that one refuses them when
     * the work runs, which the next synchronize reports as a device fault carrying the
     * reference's message -- one no device kernel writes, so a GPU cannot pass this way. */
    const bool reference_refused =
        bad && !refuses && st == MG_ERR_DEVICE_FAULT && strstr(mg_last_error(), "topk_ids[");
    if (bad && how)
        *how = refuses ? "refused with a clear error, nothing written"
               : reference_refused
                   ? "refused when run (device fault naming the pair, nothing written): this "
                     "device runs the CPU reference kernels; a GPU's kernels drop them instead"
                   : "dropped: position -1, offsets[E] counts the valid pairs, tail tokens -1";
    if (refuses || reference_refused) {
        /* The reference checks every id before writing: a clear error, outputs untouched. */
        if ((st != (refuses ? MG_ERR_INVALID_ARGUMENT : MG_ERR_DEVICE_FAULT)) ||
            !strstr(mg_last_error(), "topk_ids[")) {
            MG_CHECK_FAIL(result, "%s: out-of-range ids gave %s: %s", what, mg_status_name(st),
                          mg_last_error());
            goto done;
        }
        if ((st = download(b, got.offsets, d[2], (experts + 1) * 4 + GUARD_BYTES)))
            goto done;
        for (uint32_t e = 0; e <= experts; e++)
            if (got.offsets[e] != (int32_t)0xa5a5a5a5) {
                MG_CHECK_FAIL(result, "%s: a refused sort wrote expert_offsets", what);
                goto done;
            }
        ok = true;
        goto done;
    }
    if (st || (st = download(b, got.offsets, d[2], (experts + 1) * 4 + GUARD_BYTES)) ||
        (st = download(b, got.sorted, d[3], pairs * 4 + GUARD_BYTES)) ||
        (st = download(b, got.positions, d[4], pairs * 4 + GUARD_BYTES))) {
        MG_CHECK_FAIL(result, "%s: %s: %s", what, mg_status_name(st), mg_last_error());
        goto done;
    }
    ok = same_i32(result, what, "expert_offsets", got.offsets, want.offsets, experts + 1) &&
         same_i32(result, what, "sorted_token_ids", got.sorted, want.sorted, pairs) &&
         same_i32(result, what, "pair_positions", got.positions, want.positions, pairs);
done:
    free_all(b, d, 5);
    free(ids), free(want.offsets), free(want.sorted), free(want.positions);
    free(got.offsets), free(got.sorted), free(got.positions);
    return ok;
}

static void check_sort(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "sort");
    static const uint32_t tokens[] = {1, 3, 1000, 5000};
    static const uint32_t shapes[][2] = {{1, 1}, {7, 2}, {64, 6}, {256, 8}};
    int cases = 0;
    for (size_t t = 0; t < COUNT(tokens); t++)
        for (size_t s = 0; s < COUNT(shapes); s++)
            for (int kind = 0; kind < 3; kind++, cases++)
                if (!sort_case(ctx, result, NULL, &rng, tokens[t], shapes[s][0], shapes[s][1],
                               kind))
                    return;
    snprintf(result->detail, sizeof result->detail,
             "%d cases (T 1..5000, E 1..256, k 1..8; uniform, one hot expert, empty experts): "
             "stable, exact",
             cases);
}

/* Out-of-range ids: the CPU backend refuses them before writing, device backends drop them. */
static void check_sort_bad_ids(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "sort_bad_ids");
    static const uint32_t tokens[] = {1, 3, 1000};
    const char *how = "no case drew a bad id";
    for (size_t t = 0; t < COUNT(tokens); t++)
        if (!sort_case(ctx, result, &how, &rng, tokens[t], 16, 4, 3))
            return;
    snprintf(result->detail, sizeof result->detail, "%s", how);
}

/* ------------------------------------------------------------------ combine */

static void expect_combine(const uint16_t *rows, const int32_t *positions, const float *weights,
                           const uint16_t *residual, uint16_t *out, uint32_t tokens, uint32_t k,
                           uint32_t hidden) {
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t h = 0; h < hidden; h++) {
            float acc = residual ? mg_bf16_to_f32(residual[(size_t)t * hidden + h]) : 0.0f;
            for (uint32_t j = 0; j < k; j++) {
                int32_t row = positions[(size_t)t * k + j];
                if (row >= 0 && (uint32_t)row < tokens * k)
                    acc = fmaf(weights[(size_t)t * k + j],
                               mg_bf16_to_f32(rows[(size_t)row * hidden + h]), acc);
            }
            out[(size_t)t * hidden + h] = mg_f32_to_bf16(acc);
        }
}

/* mode 0: no residual, 1: residual, 2: residual added in place (out is the residual). */
static bool combine_case(mg_check_ctx *ctx, mg_check_result *result, uint64_t *rng, uint32_t tokens,
                         uint32_t k, uint32_t hidden, int mode) {
    mg_backend *b = ctx->backend;
    size_t pairs = (size_t)tokens * k, row_elems = pairs * hidden,
           tok_elems = (size_t)tokens * hidden;
    uint16_t *rows = malloc(row_elems * 2), *residual = malloc(tok_elems * 2);
    uint16_t *want = malloc(tok_elems * 2), *got = malloc(tok_elems * 2 + GUARD_BYTES);
    int32_t *positions = malloc(pairs * 4);
    float *weights = malloc(pairs * 4);
    mg_devptr d[5] = {0};
    bool ok = false;
    char what[96];
    snprintf(what, sizeof what, "combine T=%u k=%u H=%u %s", tokens, k, hidden,
             mode == 0   ? ""
             : mode == 1 ? "residual"
                         : "in-place residual");
    if (!rows || !residual || !want || !got || !positions || !weights) {
        MG_CHECK_FAIL(result, "out of host memory");
        goto done;
    }
    for (size_t i = 0; i < row_elems; i++)
        rows[i] = mg_f32_to_bf16((float)(rng_unit(rng) * 8));
    for (size_t i = 0; i < tok_elems; i++)
        residual[i] = mg_f32_to_bf16((float)rng_unit(rng));
    /* A random permutation of the rows, with one pair in 23 dropped (-1). */
    for (size_t p = 0; p < pairs; p++)
        positions[p] = (int32_t)p;
    for (size_t p = pairs; p > 1; p--) {
        size_t q = rng_below(rng, (uint32_t)p);
        int32_t tmp = positions[p - 1];
        positions[p - 1] = positions[q];
        positions[q] = tmp;
    }
    for (size_t p = 0; p < pairs; p++) {
        if (rng_below(rng, 23) == 0)
            positions[p] = -1;
        weights[p] = (float)(rng_unit(rng) * 0.5 + 0.5);
    }
    expect_combine(rows, positions, weights, mode ? residual : NULL, want, tokens, k, hidden);
    mg_status st;
    if ((st = mg_check_upload(b, rows, row_elems * 2, &d[0])) ||
        (st = mg_check_upload(b, positions, pairs * 4, &d[1])) ||
        (st = mg_check_upload(b, weights, pairs * 4, &d[2]))) {
        MG_CHECK_FAIL(result, "%s: setup: %s", what, mg_last_error());
        goto done;
    }
    if (mode == 2) {
        if ((st = mg_alloc(b, tok_elems * 2 + GUARD_BYTES, &d[3])) ||
            (st = mg_memset(b, d[3], POISON, tok_elems * 2 + GUARD_BYTES)) ||
            (st = mg_copy_h2d(b, d[3], residual, tok_elems * 2)))
            goto failed;
        d[4] = d[3];
    } else if ((mode == 1 && (st = mg_check_upload(b, residual, tok_elems * 2, &d[3]))) ||
               (st = mg_check_alloc_poisoned(b, tok_elems * 2 + GUARD_BYTES, &d[4]))) {
        goto failed;
    }
    mg_moe_combine_desc desc = {tokens, k, hidden};
    if ((st = mg_moe_combine(b, NULL, &desc, d[0], d[1], d[2], d[3], d[4])) ||
        (st = download(b, got, d[4], tok_elems * 2 + GUARD_BYTES)))
        goto failed;
    for (size_t i = 0; i < tok_elems; i++)
        if (got[i] != want[i]) {
            MG_CHECK_FAIL(result, "%s: out[%zu][%zu] = 0x%04x, expected 0x%04x", what, i / hidden,
                          i % hidden, got[i], want[i]);
            goto done;
        }
    if (!guard_intact(got + tok_elems)) {
        MG_CHECK_FAIL(result, "%s: written past out", what);
        goto done;
    }
    ok = true;
    goto done;
failed:
    MG_CHECK_FAIL(result, "%s: %s: %s", what, mg_status_name(st), mg_last_error());
done:
    if (mode == 2)
        d[4] = 0;
    free_all(b, d, 5);
    free(rows), free(residual), free(want), free(got), free(positions), free(weights);
    return ok;
}

static void check_combine(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "combine");
    static const uint32_t shapes[][3] = {{1, 1, 8}, {3, 8, 136}, {1000, 2, 264}, {17, 6, 2048}};
    int cases = 0;
    for (size_t s = 0; s < COUNT(shapes); s++)
        for (int mode = 0; mode < 3; mode++, cases++)
            if (!combine_case(ctx, result, &rng, shapes[s][0], shapes[s][1], shapes[s][2], mode))
                return;
    snprintf(result->detail, sizeof result->detail,
             "%d cases (T 1..1000, k 1..8, H 8..2048; no/with/in-place residual, dropped pairs): "
             "bit-exact",
             cases);
}

/* ------------------------------------------------------------------ pipeline replay */

/* top-k, sort and combine captured once; each replay gets new logits and expert rows. */
static void check_graph_replay(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "the backend has no graphs");
        return;
    }
    result->passed = true;
    enum { REPLAYS = 3, T = 37, E = 64, K = 6, H = 136 };
    const uint32_t pairs = T * K;
    uint64_t rng = mg_check_rng_seed(ctx, "graph_replay");
    mg_moe_topk_desc td = {T, E, K, MG_DTYPE_F32, 0, true};
    mg_moe_sort_desc sd = {T, E, K};
    mg_moe_combine_desc cd = {T, K, H};
    size_t ws = mg_moe_sort_workspace_bytes(&sd);
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_devptr d[8] = {0}; /* logits ids weights ws offsets sorted positions rows; out below */
    mg_devptr out = 0;
    float *raw = malloc(T * E * 4), *logits = NULL;
    int32_t *want_ids = malloc(pairs * 4), *got_pos = malloc(pairs * 4 + GUARD_BYTES);
    double *want_w = malloc(pairs * sizeof(double));
    float *got_w = malloc(pairs * 4);
    uint16_t *rows = malloc((size_t)pairs * H * 2), *got_out = malloc(T * H * 2);
    sort_result want = {malloc((E + 1) * 4), malloc(pairs * 4), malloc(pairs * 4)};
    mg_status st;
    if (!raw || !want_ids || !got_pos || !want_w || !got_w || !rows || !got_out || !want.offsets ||
        !want.sorted || !want.positions)
        FAIL("out of host memory");
    size_t sizes[8] = {T * E * 4,   pairs * 4, pairs * 4, ws,
                       (E + 1) * 4, pairs * 4, pairs * 4, (size_t)pairs * H * 2};
    if ((st = mg_stream_create(b, &s)) || (st = mg_alloc(b, (size_t)T * H * 2, &out)))
        FAIL("setup: %s", mg_last_error());
    for (int i = 0; i < 8; i++)
        if ((st = mg_alloc(b, sizes[i], &d[i])))
            FAIL("setup: %s", mg_last_error());
    if ((st = mg_graph_begin_capture(s)))
        FAIL("begin capture: %s", mg_last_error());
    if ((st = mg_moe_topk(b, s, &td, d[0], d[1], d[2])) ||
        (st = mg_moe_sort(b, s, &sd, d[1], d[3], ws, d[4], d[5], d[6])) ||
        (st = mg_moe_combine(b, s, &cd, d[7], d[6], d[2], 0, out))) {
        MG_CHECK_FAIL(result, "routing in the capture: %s", mg_last_error());
        mg_graph_abort_capture(s);
        goto done;
    }
    if ((st = mg_graph_end_capture(s, &g)))
        FAIL("end capture: %s", mg_last_error());
    for (int replay = 0; replay < REPLAYS; replay++) {
        free(logits);
        logits = make_logits(&rng, T, E, E, false, raw);
        if (!logits)
            FAIL("out of host memory");
        for (size_t i = 0; i < (size_t)pairs * H; i++)
            rows[i] = mg_f32_to_bf16((float)rng_unit(&rng));
        expect_topk(logits, T, E, K, E, true, want_ids, want_w);
        expect_sort(want_ids, pairs, E, K, &want);
        if ((st = mg_memset(b, d[6], POISON, pairs * 4)) ||
            (st = mg_memset(b, out, POISON, T * H * 2)) ||
            (st = mg_copy_h2d(b, d[0], raw, T * E * 4)) ||
            (st = mg_copy_h2d(b, d[7], rows, (size_t)pairs * H * 2)) ||
            (st = mg_graph_launch(g, s)) || (st = mg_stream_synchronize(s)) ||
            (st = mg_copy_d2h(b, got_pos, d[6], pairs * 4)) ||
            (st = mg_copy_d2h(b, got_w, d[2], pairs * 4)) ||
            (st = mg_copy_d2h(b, got_out, out, T * H * 2)))
            FAIL("replay %d: %s", replay, mg_last_error());
        for (uint32_t p = 0; p < pairs; p++)
            EXPECT(got_pos[p] == want.positions[p],
                   "replay %d: pair_positions[%u] = %d, expected %d", replay, p, got_pos[p],
                   want.positions[p]);
        /* The combine with the device's own weights, computed here. */
        uint16_t *want_out = malloc(T * H * 2);
        if (!want_out)
            FAIL("out of host memory");
        expect_combine(rows, want.positions, got_w, NULL, want_out, T, K, H);
        bool same = memcmp(want_out, got_out, T * H * 2) == 0;
        free(want_out);
        EXPECT(same, "replay %d: combined output differs", replay);
    }
    snprintf(result->detail, sizeof result->detail,
             "top-k + sort + combine (T=%d E=%d k=%d H=%d): %d replays with new logits, exact", T,
             E, K, H, REPLAYS);
done:
    mg_graph_destroy(g);
    free_all(b, d, 8);
    mg_free(b, out);
    if (s)
        mg_stream_destroy(s);
    free(raw), free(logits), free(want_ids), free(got_pos), free(want_w), free(got_w);
    free(rows), free(got_out), free(want.offsets), free(want.sorted), free(want.positions);
}

/* ------------------------------------------------------------------ bad arguments */

static void check_validation(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    mg_backend *b = ctx->backend;
    mg_devptr buf = 0, out = 0;
    int32_t got[64];
    if (mg_alloc(b, 4096, &buf) || mg_check_alloc_poisoned(b, 256, &out))
        FAIL("setup: %s", mg_last_error());
    mg_moe_topk_desc td = {4, 16, 2, MG_DTYPE_F32, 0, true};
    EXPECT_STATUS(mg_moe_topk(b, NULL, NULL, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    mg_moe_topk_desc bad = td;
    bad.k = 9;
    EXPECT_STATUS(mg_moe_topk(b, NULL, &bad, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    bad = td, bad.experts = 257;
    EXPECT_STATUS(mg_moe_topk(b, NULL, &bad, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    bad = td, bad.k = 17, bad.experts = 16;
    EXPECT_STATUS(mg_moe_topk(b, NULL, &bad, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    bad = td, bad.logits_dtype = MG_DTYPE_F16;
    EXPECT_STATUS(mg_moe_topk(b, NULL, &bad, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    bad = td, bad.tokens = 0;
    EXPECT_STATUS(mg_moe_topk(b, NULL, &bad, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    bad = td, bad.logits_pitch = 8;
    EXPECT_STATUS(mg_moe_topk(b, NULL, &bad, buf, out, out + 128), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_moe_topk(b, NULL, &td, buf, out, out + 16), MG_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(mg_last_error(), "overlap"), "overlap message: %s", mg_last_error());
    EXPECT_STATUS(mg_moe_topk(b, NULL, &td, buf, out + 2, out + 128), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_moe_topk(b, NULL, &td, buf, out + 240, out + 128), MG_ERR_INVALID_ARGUMENT);
    mg_moe_sort_desc sd = {4, 16, 2};
    size_t ws = mg_moe_sort_workspace_bytes(&sd);
    EXPECT(ws == 16 * 4, "workspace %zu bytes, expected 64", ws);
    EXPECT_STATUS(mg_moe_sort(b, NULL, &sd, buf, buf + 1024, ws - 4, out, out + 128, out + 192),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_moe_sort(b, NULL, &sd, buf, buf + 1032, ws, out, out + 128, out + 192),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_moe_sort(b, NULL, &sd, buf, buf + 1024, ws, out, out + 32, out + 192),
                  MG_ERR_INVALID_ARGUMENT);
    mg_moe_sort_desc big = {1u << 30, 16, 8};
    EXPECT(mg_moe_sort_workspace_bytes(&big) == 0, "2^33 pairs have a workspace size");
    EXPECT_STATUS(mg_moe_sort(b, NULL, &big, buf, buf + 1024, 64, out, out + 128, out + 192),
                  MG_ERR_INVALID_ARGUMENT);
    mg_moe_combine_desc cd = {2, 2, 12};
    EXPECT_STATUS(mg_moe_combine(b, NULL, &cd, buf, buf + 1024, buf + 1040, 0, out),
                  MG_ERR_INVALID_ARGUMENT);
    cd.hidden = 16;
    EXPECT_STATUS(mg_moe_combine(b, NULL, &cd, buf, buf + 1024, buf + 1040, 0, buf + 32),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_moe_combine(b, NULL, &cd, buf, buf + 1024, buf + 1040, out + 16, out),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_moe_combine(NULL, NULL, &cd, buf, buf + 1024, buf + 1040, 0, out),
                  MG_ERR_INVALID_ARGUMENT);
    if (download(b, got, out, 256))
        FAIL("download: %s", mg_last_error());
    for (int i = 0; i < 64; i++)
        EXPECT(got[i] == (int32_t)0xa5a5a5a5, "a refused call wrote output word %d", i);
    PASS();
    snprintf(result->detail, sizeof result->detail,
             "k, E, dtype, T, pitch, overlap, alignment, size, workspace, H, partial residual "
             "overlap: refused, nothing written");
done:
    mg_free(b, buf), mg_free(b, out);
}

const mg_check_case mg_checks_moe_routing[] = {
    {"moe_routing", "topk", check_topk},
    {"moe_routing", "sort", check_sort},
    {"moe_routing", "sort_bad_ids", check_sort_bad_ids},
    {"moe_routing", "combine", check_combine},
    {"moe_routing", "graph_replay", check_graph_replay},
    {"moe_routing", "validation", check_validation},
    {NULL, NULL, NULL},
};
