/* check_elementwise.c - `metrale-gpu check elementwise`: the row gather, RMSNorm (with the
 * residual add) and argmax of metrale/ops_elementwise.h on the backend under test against the
 * CPU reference, on random inputs of awkward shapes with outputs poisoned first: the gather
 * and the residual sum bit for bit (out-of-range ids give zero rows), RMSNorm within one BF16
 * spacing (the FP32 sum of squares may be added in another order), argmax exactly (ties go to
 * the lowest index, NaN never wins). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops_elementwise.h"

static uint16_t random_bf16(uint64_t *rng, float range) {
    return mg_f32_to_bf16(((float)(mg_check_rng_next(rng) >> 40) * 0x1p-23f - 1.0f) * range);
}

/* Whether BF16 a is within one spacing of b. */
static bool near_bf16(uint16_t a, uint16_t b) {
    double x = mg_bf16_to_f32(a), y = mg_bf16_to_f32(b);
    int exponent;
    frexp(y, &exponent);
    return fabs(x - y) <= ldexp(1.0, (y == 0 || exponent < -125 ? -125 : exponent) - 8);
}

typedef struct buffers {
    mg_devptr p[5];
} buffers;

static void free_all(mg_backend *b, buffers *d) {
    for (int i = 0; i < 5; i++)
        if (d->p[i])
            mg_free(b, d->p[i]);
}

/* gather: ids, src, add -> out (read back). */
static mg_status gather_on(mg_backend *b, const int32_t *ids, uint32_t rows, uint32_t cols,
                           const uint16_t *src, const uint16_t *add, uint32_t src_rows,
                           uint16_t *out) {
    buffers d = {{0}};
    size_t src_bytes = (size_t)src_rows * cols * 2, out_bytes = (size_t)rows * cols * 2;
    mg_status st = mg_check_upload(b, ids, rows * 4u, &d.p[0]);
    if (!st)
        st = mg_check_upload(b, src, src_bytes, &d.p[1]);
    if (!st && add)
        st = mg_check_upload(b, add, src_bytes, &d.p[2]);
    if (!st)
        st = mg_check_alloc_poisoned(b, out_bytes, &d.p[3]);
    if (!st)
        st = mg_gather_rows_bf16(b, NULL, rows, cols, d.p[0], src_rows, d.p[1], d.p[2], d.p[3]);
    if (!st)
        st = mg_stream_synchronize(mg_stream_default(b));
    if (!st)
        st = mg_copy_d2h(b, out, d.p[3], out_bytes);
    free_all(b, &d);
    return st;
}

static void check_gather(mg_check_ctx *ctx, mg_check_result *result) {
    uint64_t rng = mg_check_rng_seed(ctx, "gather_rows");
    const uint32_t rows = 45, cols = 1000, src_rows = 777;
    size_t src_n = (size_t)src_rows * cols, out_n = (size_t)rows * cols;
    uint16_t *src = malloc(src_n * 2), *add = malloc(src_n * 2);
    uint16_t *got = malloc(out_n * 2), *want = malloc(out_n * 2);
    int32_t ids[45];
    EXPECT(src && add && got && want, "out of host memory");
    for (size_t i = 0; i < src_n; i++) {
        src[i] = random_bf16(&rng, 4.0f);
        add[i] = random_bf16(&rng, 4.0f);
    }
    for (uint32_t r = 0; r < rows; r++)
        ids[r] = (int32_t)(mg_check_rng_next(&rng) % src_rows);
    ids[3] = -1;
    ids[7] = (int32_t)src_rows; /* out of range: zero rows */
    ids[8] = ids[9];            /* a repeated row */
    for (int with_add = 0; with_add < 2; with_add++) {
        const uint16_t *a = with_add ? add : NULL;
        OK(gather_on(ctx->backend, ids, rows, cols, src, a, src_rows, got));
        OK(gather_on(ctx->reference, ids, rows, cols, src, a, src_rows, want));
        for (size_t i = 0; i < out_n; i++)
            EXPECT(got[i] == want[i], "%s: out[%zu, %zu] = 0x%04x, reference 0x%04x",
                   with_add ? "with add" : "plain", i / cols, i % cols, got[i], want[i]);
        for (uint32_t c = 0; c < cols; c++)
            EXPECT(want[3 * cols + c] == 0 && want[7 * cols + c] == 0,
                   "an out-of-range id's row is not zero");
    }
    snprintf(result->detail, sizeof result->detail,
             "%u rows of %u from %u, with and without the add, 2 ids out of range: bit-exact", rows,
             cols, src_rows);
    PASS();
done:
    free(src);
    free(add);
    free(got);
    free(want);
}

/* rmsnorm: x (updated in place with an add), add, weight -> out; reads back x and out. */
static mg_status rmsnorm_on(mg_backend *b, uint32_t rows, uint32_t cols, const uint16_t *x,
                            const uint16_t *add, const uint16_t *w, bool in_place, uint16_t *x_out,
                            uint16_t *out) {
    buffers d = {{0}};
    size_t bytes = (size_t)rows * cols * 2;
    mg_status st = mg_check_upload(b, x, bytes, &d.p[0]);
    if (!st && add)
        st = mg_check_upload(b, add, bytes, &d.p[1]);
    if (!st)
        st = mg_check_upload(b, w, cols * 2u, &d.p[2]);
    if (!st && !in_place)
        st = mg_check_alloc_poisoned(b, bytes, &d.p[3]);
    mg_devptr o = in_place ? d.p[0] : d.p[3];
    if (!st)
        st = mg_rmsnorm_bf16(b, NULL, rows, cols, 1e-5f, d.p[0], d.p[1], d.p[2], o);
    if (!st)
        st = mg_stream_synchronize(mg_stream_default(b));
    if (!st)
        st = mg_copy_d2h(b, out, o, bytes);
    if (!st)
        st = mg_copy_d2h(b, x_out, d.p[0], bytes);
    free_all(b, &d);
    return st;
}

static void check_rmsnorm(mg_check_ctx *ctx, mg_check_result *result) {
    uint64_t rng = mg_check_rng_seed(ctx, "rmsnorm");
    const uint32_t rows = 29, cols = 4104; /* 513 vectors: threads take uneven counts */
    size_t n = (size_t)rows * cols;
    uint16_t *x = malloc(n * 2), *add = malloc(n * 2), *w = malloc(cols * 2u);
    uint16_t *got = malloc(n * 2), *want = malloc(n * 2);
    uint16_t *got_x = malloc(n * 2), *want_x = malloc(n * 2);
    size_t differ = 0;
    EXPECT(x && add && w && got && want && got_x && want_x, "out of host memory");
    for (size_t i = 0; i < n; i++) {
        x[i] = random_bf16(&rng, (float)(1 + i / cols)); /* rows of different scales */
        add[i] = random_bf16(&rng, 2.0f);
    }
    for (uint32_t c = 0; c < cols; c++)
        w[c] = random_bf16(&rng, 1.5f);
    for (int mode = 0; mode < 3; mode++) { /* with an add; without; in place without */
        const uint16_t *a = mode == 0 ? add : NULL;
        bool in_place = mode == 2;
        OK(rmsnorm_on(ctx->backend, rows, cols, x, a, w, in_place, got_x, got));
        OK(rmsnorm_on(ctx->reference, rows, cols, x, a, w, in_place, want_x, want));
        for (size_t i = 0; i < n; i++) {
            if (!in_place)
                EXPECT(got_x[i] == want_x[i],
                       "mode %d: x[%zu, %zu] (the residual sum) = 0x%04x, "
                       "reference 0x%04x",
                       mode, i / cols, i % cols, got_x[i], want_x[i]);
            EXPECT(near_bf16(got[i], want[i]), "mode %d: out[%zu, %zu] = %g, reference %g", mode,
                   i / cols, i % cols, mg_bf16_to_f32(got[i]), mg_bf16_to_f32(want[i]));
            differ += got[i] != want[i];
        }
    }
    result->error = (double)differ / (3.0 * (double)n);
    snprintf(result->detail, sizeof result->detail,
             "%ux%u with an add, without, in place: sums bit-exact, %zu outputs one BF16 spacing "
             "off",
             rows, cols, differ);
    PASS();
done:
    free(x), free(add), free(w), free(got), free(want), free(got_x), free(want_x);
}

/* in: FP32 [rows, pitch]; with bf16, uploaded as its BF16 rounding. */
static mg_status argmax_on(mg_backend *b, const float *in, uint32_t rows, uint32_t cols,
                           uint32_t pitch, bool bf16, int32_t *ids) {
    buffers d = {{0}};
    size_t n = (size_t)rows * pitch;
    uint16_t *h = bf16 ? malloc(n * 2) : NULL;
    if (bf16 && !h)
        return MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; bf16 && i < n; i++)
        h[i] = mg_f32_to_bf16(in[i]);
    mg_status st =
        bf16 ? mg_check_upload(b, h, n * 2, &d.p[0]) : mg_check_upload(b, in, n * 4, &d.p[0]);
    free(h);
    if (!st)
        st = mg_check_alloc_poisoned(b, rows * 4u, &d.p[1]);
    if (!st)
        st = bf16 ? mg_argmax_bf16(b, NULL, rows, cols, d.p[0], pitch, d.p[1])
                  : mg_argmax_f32(b, NULL, rows, cols, d.p[0], pitch, d.p[1]);
    if (!st)
        st = mg_stream_synchronize(mg_stream_default(b));
    if (!st)
        st = mg_copy_d2h(b, ids, d.p[1], rows * 4u);
    free_all(b, &d);
    return st;
}

static void check_argmax_rows(mg_check_ctx *ctx, mg_check_result *result, bool bf16) {
    uint64_t rng = mg_check_rng_seed(ctx, bf16 ? "argmax_bf16" : "argmax");
    /* BF16 rows need a pitch of 8 elements: another awkward one */
    const uint32_t rows = 13, cols = 128255, pitch = bf16 ? 128264 : 128260;
    size_t n = (size_t)rows * pitch;
    float *in = malloc(n * 4);
    int32_t got[13], want[13];
    EXPECT(in, "out of host memory");
    for (size_t i = 0; i < n; i++)
        in[i] = ((float)(mg_check_rng_next(&rng) >> 40) * 0x1p-23f - 1.0f) * 30.0f;
    /* row 1: a tie of the maximum at two places; row 2: NaN everywhere but one value; row 3:
     * all NaN; row 4: the maximum in the last column (the scalar tail); row 5: +inf */
    in[1 * pitch + 90000] = in[1 * pitch + 777] = 100.0f;
    for (uint32_t c = 0; c < cols; c++)
        in[2 * pitch + c] = in[3 * pitch + c] = NAN;
    in[2 * pitch + 4242] = -5.0f;
    in[4 * pitch + cols - 1] = 1000.0f;
    in[5 * pitch + 12345] = INFINITY;
    OK(argmax_on(ctx->backend, in, rows, cols, pitch, bf16, got));
    OK(argmax_on(ctx->reference, in, rows, cols, pitch, bf16, want));
    EXPECT(want[1] == 777 && want[2] == 4242 && want[3] == 0 && want[4] == (int32_t)cols - 1 &&
               want[5] == 12345,
           "the reference broke a tie, NaN or tail rule");
    for (uint32_t r = 0; r < rows; r++)
        EXPECT(got[r] == want[r], "row %u: argmax %d, reference %d", r, got[r], want[r]);
    snprintf(result->detail, sizeof result->detail,
             "%s: %u rows of %u (pitch %u): ties, NaN, all-NaN, last column, +inf: exact",
             bf16 ? "BF16" : "FP32", rows, cols, pitch);
    PASS();
done:
    free(in);
}

static void check_argmax(mg_check_ctx *ctx, mg_check_result *result) {
    check_argmax_rows(ctx, result, false);
}

static void check_argmax_bf16(mg_check_ctx *ctx, mg_check_result *result) {
    check_argmax_rows(ctx, result, true);
}

const mg_check_case mg_checks_elementwise[] = {
    {"elementwise", "gather_rows", check_gather},
    {"elementwise", "rmsnorm", check_rmsnorm},
    {"elementwise", "argmax", check_argmax},
    {"elementwise", "argmax_bf16", check_argmax_bf16},
    {NULL, NULL, NULL},
};
