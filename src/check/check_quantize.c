/* check_quantize.c - the "quantize" check group: the device FP8 quantizers of
 * metrale/ops_quantize.h on the backend under test, bit for bit against the CPU reference
 * backend and the host quantizers of metrale/ops_gemm.h, on fresh random inputs of awkward
 * shapes with special values, gaps between input rows, poisoned outputs and guard bytes; the
 * documented special-value codes; their outputs fed to the FP8 GEMMs; capture and replay with
 * a changed input; bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_quantize.h"
#include "metrale/status.h"

#define POISON MG_CHECK_POISON
/* Bytes past the end of each output that must keep the poison. */
#define GUARD_BYTES 64
/* A finite BF16 value (about 1.7e38) in the gap between input rows: read by mistake, it would
 * dominate every amax it reached. */
#define PITCH_GAP_BF16 0x7f00

#define BF16_POS_INF 0x7f80
#define BF16_NEG_INF 0xff80
#define BF16_NAN 0x7fc0
#define BF16_NEG_NAN 0xffc0
#define BF16_NEG_ZERO 0x8000

static const uint32_t awkward_rows[] = {1, 3, 17, 130};
/* One 16-element row; 128 + 16 (a partial 1x128 block); 33 blocks. */
static const uint32_t awkward_cols[] = {16, 144, 4224};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *mode_name(mg_fp8_quant_mode mode) {
    static const char *const names[] = {"tensor", "row", "1x128", "1x128_gemm_layout"};
    return (unsigned)mode < COUNT(names) ? names[mode] : "?";
}

/* ------------------------------------------------------------------ inputs */

static float rng_unit(uint64_t *rng) { /* uniform in [-1, 1) */
    return (float)(mg_check_rng_next(rng) >> 40) * 0x1p-23f - 1.0f;
}

static uint32_t rng_below(uint64_t *rng, uint32_t n) {
    return (uint32_t)(mg_check_rng_next(rng) % n);
}

/* A value halfway between two neighbouring finite E4M3 codes (c, c + 1), of random sign, times
 * 2^exponent: exact in BF16, and an exact tie for the conversion when the scale is 2^exponent. */
static uint16_t e4m3_tie(uint64_t *rng, int exponent) {
    uint8_t c = (uint8_t)rng_below(rng, 0x7e);
    float mid = (mg_fp8_e4m3_to_f32(c) + mg_fp8_e4m3_to_f32((uint8_t)(c + 1))) * 0.5f;
    return mg_f32_to_bf16(ldexpf(rng_below(rng, 2) ? -mid : mid, exponent));
}

static uint16_t special_value(uint64_t *rng, float magnitude) {
    static const uint16_t specials[] = {0,        BF16_NEG_ZERO, BF16_POS_INF, BF16_NEG_INF,
                                        BF16_NAN, BF16_NEG_NAN};
    uint32_t pick = rng_below(rng, COUNT(specials) + 1);
    return pick < COUNT(specials) ? specials[pick] : mg_f32_to_bf16(-magnitude * 0x1p-30f);
}

/* Host input [rows, pitch]; the columns past `cols` hold PITCH_GAP_BF16. Each row is random in
 * [-m, m) with its own m = 2^e, e in [-24, 24], so rows and blocks get different scales; with
 * `specials`, one element in 61 is 0, -0, +-inf, +-NaN or a tiny value, and, when there are
 * enough rows, row 1 is all zero, row 2 one repeated value, row 5 only infinities and row 9
 * exact ties (every 128-block led by 448 * 2^e, so its scale is 2^e). */
static uint16_t *make_input(uint64_t *rng, uint32_t rows, uint32_t cols, uint32_t pitch,
                            bool specials) {
    uint16_t *in = malloc((size_t)rows * pitch * sizeof *in);
    for (uint32_t r = 0; in && r < rows; r++) {
        uint16_t *row = in + (size_t)r * pitch;
        int exponent = (int)rng_below(rng, 49) - 24;
        float magnitude = ldexpf(1.0f, exponent);
        uint16_t repeated = mg_f32_to_bf16(rng_unit(rng) * magnitude);
        for (uint32_t c = 0; c < pitch; c++) {
            uint16_t v = mg_f32_to_bf16(rng_unit(rng) * magnitude);
            if (c >= cols)
                v = PITCH_GAP_BF16;
            else if (specials && r == 1)
                v = 0;
            else if (specials && r == 2)
                v = repeated;
            else if (specials && r == 5)
                v = c % 2 ? BF16_NEG_INF : BF16_POS_INF;
            else if (specials && r == 9)
                v = c % MG_FP8_SCALE_BLOCK ? e4m3_tie(rng, exponent)
                                           : mg_f32_to_bf16(ldexpf(MG_FP8_E4M3_MAX, exponent));
            else if (specials && rng_below(rng, 61) == 0)
                v = special_value(rng, magnitude);
            row[c] = v;
        }
    }
    return in;
}

/* ------------------------------------------------------------------ running */

static size_t input_bytes(const mg_fp8_quant_desc *d) {
    return (size_t)d->rows * (d->in_pitch ? d->in_pitch : d->cols) * 2;
}

static size_t scale_bytes(const mg_fp8_quant_desc *d) {
    return mg_fp8_quant_scale_count(d) * sizeof(float);
}

/* Host buffers for one run's outputs, each followed by GUARD_BYTES. */
typedef struct quant_output {
    uint8_t *codes;
    float *scales;
} quant_output;

static bool output_alloc(const mg_fp8_quant_desc *d, quant_output *o) {
    o->codes = malloc(mg_fp8_quant_output_bytes(d) + GUARD_BYTES);
    o->scales = malloc(scale_bytes(d) + GUARD_BYTES);
    return o->codes && o->scales;
}

static void output_free(quant_output *o) {
    free(o->codes);
    free(o->scales);
}

/* Uploads `in` ([rows, pitch]), poisons the outputs and GUARD_BYTES past them, quantizes on
 * stream `s` and downloads both outputs with their guards. */
static mg_status run_quantize(mg_backend *b, mg_stream *s, const mg_fp8_quant_desc *d,
                              const uint16_t *in, quant_output *o) {
    size_t code_bytes = mg_fp8_quant_output_bytes(d) + GUARD_BYTES;
    size_t scale_total = scale_bytes(d) + GUARD_BYTES;
    mg_devptr x = 0, codes = 0, scales = 0;
    mg_status st;
    if (!(st = mg_check_upload(b, in, input_bytes(d), &x)) &&
        !(st = mg_check_alloc_poisoned(b, code_bytes, &codes)) &&
        !(st = mg_check_alloc_poisoned(b, scale_total, &scales)) &&
        !(st = mg_fp8_quantize(b, s, d, x, codes, scales)) &&
        !(st = mg_stream_synchronize(s ? s : mg_stream_default(b))) &&
        !(st = mg_copy_d2h(b, o->codes, codes, code_bytes)))
        st = mg_copy_d2h(b, o->scales, scales, scale_total);
    mg_free(b, x);
    mg_free(b, codes);
    mg_free(b, scales);
    return st;
}

/* The host quantizers' result for `d`, laid out as the device op writes it (the GEMM layout:
 * mg_fp8_quantize_1x128's scales moved to index g * rows_pad + r, padding rows zero). */
static mg_status host_quantize(const mg_fp8_quant_desc *d, const uint16_t *in, quant_output *o) {
    uint32_t pitch = d->in_pitch ? d->in_pitch : d->cols, blocks = mg_fp8_k_blocks(d->cols);
    uint16_t *dense = malloc((size_t)d->rows * d->cols * sizeof *dense);
    float *natural = malloc((size_t)d->rows * blocks * sizeof *natural);
    mg_status st = MG_ERR_OUT_OF_MEMORY;
    if (!dense || !natural)
        goto done;
    for (uint32_t r = 0; r < d->rows; r++)
        memcpy(dense + (size_t)r * d->cols, in + (size_t)r * pitch, d->cols * sizeof *dense);
    memset(o->codes, 0, mg_fp8_quant_output_bytes(d));
    switch (d->mode) {
    case MG_FP8_QUANT_TENSOR:
        st = mg_fp8_quantize_tensorwise(dense, d->rows, d->cols, o->codes, o->scales);
        break;
    case MG_FP8_QUANT_ROW:
        st = mg_fp8_quantize_rowwise(dense, d->rows, d->cols, o->codes, o->scales);
        break;
    case MG_FP8_QUANT_1X128:
        st = mg_fp8_quantize_1x128(dense, d->rows, d->cols, o->codes, o->scales);
        break;
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT:
        st = mg_fp8_quantize_1x128(dense, d->rows, d->cols, o->codes, natural);
        for (uint32_t g = 0; g < blocks; g++)
            for (uint32_t r = 0; r < d->rows_pad; r++)
                o->scales[(size_t)g * d->rows_pad + r] =
                    r < d->rows ? natural[(size_t)r * blocks + g] : 0.0f;
        break;
    }
done:
    free(dense);
    free(natural);
    return st;
}

/* Index of the first differing byte, or -1. */
static long first_difference(const void *a, const void *b, size_t bytes) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i])
            return (long)i;
    return -1;
}

static bool guard_intact(const void *after_end) {
    const unsigned char *p = after_end;
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (p[i] != POISON)
            return false;
    return true;
}

static void describe_desc(const mg_fp8_quant_desc *d, char *buf, size_t bytes) {
    snprintf(buf, bytes, "%s rows=%u cols=%u in_pitch=%u rows_pad=%u", mode_name(d->mode), d->rows,
             d->cols, d->in_pitch, d->rows_pad);
}

/* `got` must equal `want` bit for bit (codes and scales); `got`'s guards must be intact. */
static void expect_same(mg_check_result *r, const mg_fp8_quant_desc *d, const quant_output *got,
                        const quant_output *want, const char *against) {
    char what[128];
    describe_desc(d, what, sizeof what);
    size_t code_bytes = mg_fp8_quant_output_bytes(d);
    long at = first_difference(got->codes, want->codes, code_bytes);
    if (at >= 0) {
        MG_CHECK_FAIL(r, "%s: code %ld (row %ld, col %ld) is 0x%02x, %s has 0x%02x", what, at,
                      at / (long)d->cols, at % (long)d->cols, got->codes[at], against,
                      want->codes[at]);
        return;
    }
    at = first_difference(got->scales, want->scales, scale_bytes(d));
    if (at >= 0) {
        size_t i = (size_t)at / sizeof(float);
        MG_CHECK_FAIL(r, "%s: scale %zu is %a, %s has %a", what, i, got->scales[i], against,
                      want->scales[i]);
        return;
    }
    if (!guard_intact(got->codes + code_bytes) ||
        !guard_intact((const unsigned char *)got->scales + scale_bytes(d)))
        MG_CHECK_FAIL(r, "%s: wrote past the end of out or scales", what);
}

/* ------------------------------------------------------------------ modes vs the references */

static void check_mode(mg_check_ctx *ctx, mg_check_result *r, mg_fp8_quant_mode mode) {
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    if (!ctx->reference) {
        MG_CHECK_FAIL(r, "no CPU reference backend");
        return;
    }
    uint64_t rng = mg_check_rng_seed(ctx, mode_name(mode));
    int shapes = 0;
    for (size_t i = 0; i < COUNT(awkward_rows) && r->passed; i++) {
        for (size_t j = 0; j < COUNT(awkward_cols) && r->passed; j++) {
            uint32_t rows = awkward_rows[i], cols = awkward_cols[j];
            mg_fp8_quant_desc d = {.mode = mode, .rows = rows, .cols = cols};
            /* Alternate contiguous rows (in_pitch 0) and rows with a gap of 24 elements. */
            d.in_pitch = (i + j) % 2 ? cols + 24 : 0;
            if (mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT) /* the least padding, or 4 more */
                d.rows_pad = mg_fp8_rows_padded(rows) + (j == 1 ? 4 : 0);
            uint16_t *in = make_input(&rng, rows, cols, d.in_pitch ? d.in_pitch : cols, true);
            quant_output got = {0}, ref = {0}, host = {0};
            mg_status st = MG_ERR_OUT_OF_MEMORY;
            if (in && output_alloc(&d, &got) && output_alloc(&d, &ref) && output_alloc(&d, &host) &&
                !(st = run_quantize(ctx->backend, NULL, &d, in, &got)) &&
                !(st = run_quantize(ctx->reference, NULL, &d, in, &ref)))
                st = host_quantize(&d, in, &host);
            if (st) {
                char what[128];
                describe_desc(&d, what, sizeof what);
                MG_CHECK_FAIL(r, "%s: %s: %s", what, mg_status_name(st), mg_last_error());
            } else {
                expect_same(r, &d, &got, &ref, "the CPU reference");
                expect_same(r, &d, &ref, &host, "the host quantizer");
                shapes++;
            }
            free(in);
            output_free(&got);
            output_free(&ref);
            output_free(&host);
        }
    }
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "%d shapes (rows 1,3,17,130 x cols 16,144,4224, row gaps, zeros, +-inf, NaN, "
                 "ties, all-zero/equal/inf rows): bit-exact vs the CPU reference and the host "
                 "quantizer, guards intact",
                 shapes);
}

static void check_tensor(mg_check_ctx *ctx, mg_check_result *r) {
    check_mode(ctx, r, MG_FP8_QUANT_TENSOR);
}

static void check_row(mg_check_ctx *ctx, mg_check_result *r) {
    check_mode(ctx, r, MG_FP8_QUANT_ROW);
}

static void check_1x128(mg_check_ctx *ctx, mg_check_result *r) {
    check_mode(ctx, r, MG_FP8_QUANT_1X128);
}

static void check_1x128_gemm_layout(mg_check_ctx *ctx, mg_check_result *r) {
    check_mode(ctx, r, MG_FP8_QUANT_1X128_GEMM_LAYOUT);
}

/* ------------------------------------------------------------------ special values */

/* The documented codes, on four 16-element rows whose every group has scale 1: row 0's amax is
 * 448; rows 1-3 have no finite non-zero value (infinities, zeros, NaN). Every mode gives the
 * same codes and scales of exactly 1. */
static void check_special_values(mg_check_ctx *ctx, mg_check_result *r) {
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    enum { ROWS = 4, COLS = 16 };
    static const struct {
        float value;
        uint16_t bits; /* used when value is 0 and bits != 0 */
        uint8_t code;
    } row0[COLS] = {
        /* 448, the amax, and the values that must saturate or keep their sign */
        {448.0f, 0, 0x7e},
        {-448.0f, 0, 0xfe},
        {0, BF16_POS_INF, 0x7e},
        {0, BF16_NEG_INF, 0xfe},
        {0, BF16_NAN, 0x7f},
        {0, BF16_NEG_NAN, 0xff},
        {0, 0, 0x00},
        {0, BF16_NEG_ZERO, 0x80},
        /* exact ties, to the even code: 1, 1.25, 0, -0, 2^-8; then plain values */
        {1.0625f, 0, 0x38},
        {1.1875f, 0, 0x3a},
        {0x1p-10f, 0, 0x00},
        {-0x1p-10f, 0, 0x80},
        {0x1.8p-9f, 0, 0x02},
        {0x1p-9f, 0, 0x01},
        {-1.5f, 0, 0xbc},
        {240.0f, 0, 0x77},
    };
    uint16_t in[ROWS * COLS];
    uint8_t want[ROWS * COLS];
    for (int c = 0; c < COLS; c++) {
        in[c] = row0[c].bits ? row0[c].bits : mg_f32_to_bf16(row0[c].value);
        want[c] = row0[c].code;
        in[COLS + c] = c % 2 ? BF16_NEG_INF : BF16_POS_INF; /* clipped; amax 0, scale 1 */
        want[COLS + c] = c % 2 ? 0xfe : 0x7e;
        in[2 * COLS + c] = 0;
        want[2 * COLS + c] = 0;
        in[3 * COLS + c] = BF16_NAN;
        want[3 * COLS + c] = 0x7f;
    }
    for (int mode = MG_FP8_QUANT_TENSOR; mode <= MG_FP8_QUANT_1X128_GEMM_LAYOUT && r->passed;
         mode++) {
        mg_fp8_quant_desc d = {.mode = (mg_fp8_quant_mode)mode, .rows = ROWS, .cols = COLS};
        if (mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT)
            d.rows_pad = ROWS;
        quant_output got = {0};
        mg_status st = MG_ERR_OUT_OF_MEMORY;
        if (!output_alloc(&d, &got) || (st = run_quantize(ctx->backend, NULL, &d, in, &got))) {
            MG_CHECK_FAIL(r, "%s: %s: %s", mode_name(d.mode), mg_status_name(st), mg_last_error());
        } else {
            long at = first_difference(got.codes, want, sizeof want);
            if (at >= 0)
                MG_CHECK_FAIL(r, "%s: row %ld col %ld: code 0x%02x, expected 0x%02x",
                              mode_name(d.mode), at / COLS, at % COLS, got.codes[at], want[at]);
            for (size_t i = 0; i < mg_fp8_quant_scale_count(&d) && r->passed; i++)
                if (got.scales[i] != 1.0f)
                    MG_CHECK_FAIL(r, "%s: scale %zu is %g, expected 1", mode_name(d.mode), i,
                                  got.scales[i]);
        }
        output_free(&got);
    }
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "every mode: +-inf -> 0x7e/0xfe and left out of amax, NaN -> 0x7f/0xff, -0 -> "
                 "0x80, ties to even, all-inf/zero/NaN rows scale 1");
}

/* ------------------------------------------------------------------ feeding the GEMMs */

/* Device buffers of one FP8 activation operand. */
typedef struct act_operand {
    mg_devptr codes, scales;
} act_operand;

static void free_operand(mg_backend *b, act_operand *o) {
    mg_free(b, o->codes);
    mg_free(b, o->scales);
}

typedef struct gemm_feed {
    const char *name;
    mg_fp8_quant_mode mode;
} gemm_feed;

static mg_status run_feed_gemm(mg_backend *b, const gemm_feed *f, uint32_t m, uint32_t n,
                               uint32_t k, const act_operand *act, mg_devptr weight,
                               mg_devptr weight_scale, mg_devptr out) {
    switch (f->mode) {
    case MG_FP8_QUANT_TENSOR:
        return mg_gemm_fp8_tensorwise(b, NULL, m, n, k, act->codes, act->scales, weight,
                                      weight_scale, out, n);
    case MG_FP8_QUANT_ROW:
        return mg_gemm_fp8_rowwise(b, NULL, m, n, k, act->codes, act->scales, weight, weight_scale,
                                   out, n);
    default:
        return mg_gemm_fp8_blockscaled(b, NULL, m, n, k, act->codes, act->scales,
                                       MG_FP8_BLOCK_1X128, weight, weight_scale,
                                       MG_FP8_BLOCK_128X128, out, n);
    }
}

/* The host quantizer's operand for `mode`, uploaded the documented way: 1x128 scales in the
 * natural layout transposed on the backend, the M - m padding rows zero. */
static mg_status host_operand(mg_backend *b, mg_fp8_quant_mode mode, const uint16_t *act,
                              uint32_t m, uint32_t m_gemm, uint32_t k, act_operand *o) {
    size_t blocks = mg_fp8_k_blocks(k);
    uint8_t *codes = calloc((size_t)m_gemm * k, 1);
    float *scales = malloc((size_t)m * blocks * sizeof *scales);
    mg_devptr natural = 0;
    mg_status st = MG_ERR_OUT_OF_MEMORY;
    if (codes && scales) {
        st = mode == MG_FP8_QUANT_TENSOR ? mg_fp8_quantize_tensorwise(act, m, k, codes, scales)
             : mode == MG_FP8_QUANT_ROW  ? mg_fp8_quantize_rowwise(act, m, k, codes, scales)
                                         : mg_fp8_quantize_1x128(act, m, k, codes, scales);
    }
    if (!st)
        st = mg_check_upload(b, codes, (size_t)m_gemm * k, &o->codes);
    if (!st && mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT) {
        if (!(st = mg_check_upload(b, scales, (size_t)m * blocks * 4, &natural)) &&
            !(st = mg_alloc(b, blocks * m_gemm * 4, &o->scales)))
            st = mg_fp8_act_scales_transpose(b, NULL, m, m_gemm, k, natural, o->scales);
    } else if (!st) {
        st = mg_check_upload(b, scales, (mode == MG_FP8_QUANT_TENSOR ? 1 : m) * sizeof *scales,
                             &o->scales);
    }
    mg_free(b, natural);
    free(codes);
    free(scales);
    return st;
}

/* The device quantizer's operand: the quantizer writes straight into the GEMM's buffers. */
static mg_status device_operand(mg_backend *b, mg_fp8_quant_mode mode, mg_devptr act_bf16,
                                uint32_t m, uint32_t m_gemm, uint32_t k, act_operand *o) {
    mg_fp8_quant_desc d = {.mode = mode, .rows = m, .cols = k};
    if (mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT)
        d.rows_pad = m_gemm;
    mg_status st;
    if (!(st = mg_check_alloc_poisoned(b, mg_fp8_quant_output_bytes(&d), &o->codes)) &&
        !(st = mg_check_alloc_poisoned(b, scale_bytes(&d), &o->scales)))
        st = mg_fp8_quantize(b, NULL, &d, act_bf16, o->codes, o->scales);
    return st;
}

/* Quantizing on the device and feeding the GEMM gives the very bits of the host quantizer's
 * path, per-tensor, row-wise and block-scaled (M = 17 padded to 20 for blocks). */
static void check_feeds_gemm(mg_check_ctx *ctx, mg_check_result *r) {
    mg_backend *b = ctx->backend;
    if (!mg_op_supported(b, MG_OP_GEMM_FP8)) {
        r->skipped = true;
        snprintf(r->detail, sizeof r->detail, "the backend has no FP8 GEMMs");
        return;
    }
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    static const gemm_feed feeds[] = {{"tensor", MG_FP8_QUANT_TENSOR},
                                      {"row", MG_FP8_QUANT_ROW},
                                      {"1x128", MG_FP8_QUANT_1X128_GEMM_LAYOUT}};
    const uint32_t m = 17, n = 208, k = 1152;
    uint64_t rng = mg_check_rng_seed(ctx, "feeds_gemm");
    uint16_t *act = make_input(&rng, m, k, k, false);
    uint16_t *weight = make_input(&rng, n, k, k, false);
    uint8_t *weight_codes = malloc((size_t)n * k);
    /* Room for row-wise (N) and for 128x128 scales. */
    float *weight_scales = malloc((n + mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, n, k)) * 4);
    size_t out_bytes = (size_t)mg_fp8_rows_padded(m) * n * 2;
    uint16_t *via_device = malloc(out_bytes), *via_host = malloc(out_bytes);
    if (!act || !weight || !weight_codes || !weight_scales || !via_device || !via_host) {
        MG_CHECK_FAIL(r, "out of host memory");
        goto done;
    }
    for (size_t i = 0; i < COUNT(feeds) && r->passed; i++) {
        const gemm_feed *f = &feeds[i];
        uint32_t m_gemm = f->mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT ? mg_fp8_rows_padded(m) : m;
        size_t weight_scale_count = f->mode == MG_FP8_QUANT_TENSOR ? 1
                                    : f->mode == MG_FP8_QUANT_ROW
                                        ? n
                                        : mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, n, k);
        act_operand dev = {0}, host = {0};
        mg_devptr act_bf16 = 0, w = 0, ws = 0, out_dev = 0, out_host = 0;
        mg_status st = f->mode == MG_FP8_QUANT_TENSOR
                           ? mg_fp8_quantize_tensorwise(weight, n, k, weight_codes, weight_scales)
                       : f->mode == MG_FP8_QUANT_ROW
                           ? mg_fp8_quantize_rowwise(weight, n, k, weight_codes, weight_scales)
                           : mg_fp8_quantize_128x128(weight, n, k, weight_codes, weight_scales);
        if (st || (st = mg_check_upload(b, weight_codes, (size_t)n * k, &w)) ||
            (st = mg_check_upload(b, weight_scales, weight_scale_count * 4, &ws)) ||
            (st = mg_check_upload(b, act, (size_t)m * k * 2, &act_bf16)) ||
            (st = mg_check_alloc_poisoned(b, (size_t)m_gemm * n * 2, &out_dev)) ||
            (st = mg_check_alloc_poisoned(b, (size_t)m_gemm * n * 2, &out_host)) ||
            (st = device_operand(b, f->mode, act_bf16, m, m_gemm, k, &dev)) ||
            (st = host_operand(b, f->mode, act, m, m_gemm, k, &host)) ||
            (st = run_feed_gemm(b, f, m_gemm, n, k, &dev, w, ws, out_dev)) ||
            (st = run_feed_gemm(b, f, m_gemm, n, k, &host, w, ws, out_host)) ||
            (st = mg_stream_synchronize(mg_stream_default(b))) ||
            (st = mg_copy_d2h(b, via_device, out_dev, (size_t)m_gemm * n * 2)) ||
            (st = mg_copy_d2h(b, via_host, out_host, (size_t)m_gemm * n * 2))) {
            MG_CHECK_FAIL(r, "%s: %s: %s", f->name, mg_status_name(st), mg_last_error());
        } else {
            long at = first_difference(via_device, via_host, (size_t)m_gemm * n * 2);
            if (at >= 0)
                MG_CHECK_FAIL(r,
                              "%s: GEMM output element %ld differs: %g via the device "
                              "quantizer, %g via the host quantizer",
                              f->name, at / 2, mg_bf16_to_f32(via_device[at / 2]),
                              mg_bf16_to_f32(via_host[at / 2]));
        }
        free_operand(b, &dev);
        free_operand(b, &host);
        mg_free(b, act_bf16);
        mg_free(b, w);
        mg_free(b, ws);
        mg_free(b, out_dev);
        mg_free(b, out_host);
    }
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "M=%u N=%u K=%u: fp8 tensorwise, rowwise and 1x128 x 128x128 GEMM outputs "
                 "bitwise equal to the host quantizer path",
                 m, n, k);
done:
    free(act), free(weight), free(weight_codes), free(weight_scales);
    free(via_device), free(via_host);
}

/* ------------------------------------------------------------------ capture and replay */

/* Per-tensor and GEMM-layout 1x128 quantizers captured once; each replay, after the input
 * was changed in place and the outputs poisoned, matches the CPU reference on that input. */
static void check_graph_replay(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "the backend has no graphs");
        return;
    }
    result->passed = true; /* until MG_CHECK_FAIL says otherwise */
    if (!ctx->reference) {
        MG_CHECK_FAIL(result, "no CPU reference backend");
        return;
    }
    enum { REPLAYS = 3 };
    const uint32_t rows = 17, cols = 4224, pitch = cols + 8;
    mg_fp8_quant_desc descs[2] = {
        {.mode = MG_FP8_QUANT_TENSOR, .rows = rows, .cols = cols, .in_pitch = pitch},
        {.mode = MG_FP8_QUANT_1X128_GEMM_LAYOUT,
         .rows = rows,
         .cols = cols,
         .in_pitch = pitch,
         .rows_pad = mg_fp8_rows_padded(rows)}};
    uint64_t rng = mg_check_rng_seed(ctx, "graph_replay");
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_devptr x = 0, codes[2] = {0}, scales[2] = {0};
    quant_output got[2] = {{0}}, ref[2] = {{0}};
    uint16_t *in = NULL;
    mg_status st;
    size_t code_bytes[2], scale_total[2];
    for (int i = 0; i < 2; i++) {
        code_bytes[i] = mg_fp8_quant_output_bytes(&descs[i]) + GUARD_BYTES;
        scale_total[i] = scale_bytes(&descs[i]) + GUARD_BYTES;
        if (!output_alloc(&descs[i], &got[i]) || !output_alloc(&descs[i], &ref[i]))
            FAIL("out of host memory");
    }
    if ((st = mg_stream_create(b, &s)) || (st = mg_alloc(b, input_bytes(&descs[0]), &x)) ||
        (st = mg_alloc(b, code_bytes[0], &codes[0])) ||
        (st = mg_alloc(b, code_bytes[1], &codes[1])) ||
        (st = mg_alloc(b, scale_total[0], &scales[0])) ||
        (st = mg_alloc(b, scale_total[1], &scales[1])))
        FAIL("setup: %s", mg_last_error());
    if ((st = mg_graph_begin_capture(s)))
        FAIL("begin capture: %s", mg_last_error());
    for (int i = 0; i < 2 && !st; i++)
        st = mg_fp8_quantize(b, s, &descs[i], x, codes[i], scales[i]);
    if (st) {
        MG_CHECK_FAIL(result, "quantize in the capture: %s", mg_last_error());
        mg_graph_abort_capture(s);
        goto done;
    }
    if ((st = mg_graph_end_capture(s, &g)))
        FAIL("end capture: %s", mg_last_error());
    for (int replay = 0; replay < REPLAYS; replay++) {
        free(in);
        in = make_input(&rng, rows, cols, pitch, true);
        if (!in)
            FAIL("out of host memory");
        for (int i = 0; i < 2; i++)
            if ((st = mg_memset(b, codes[i], POISON, code_bytes[i])) ||
                (st = mg_memset(b, scales[i], POISON, scale_total[i])))
                FAIL("poisoning: %s", mg_last_error());
        if ((st = mg_copy_h2d(b, x, in, input_bytes(&descs[0]))) || (st = mg_graph_launch(g, s)) ||
            (st = mg_stream_synchronize(s)))
            FAIL("replay %d: %s", replay, mg_last_error());
        for (int i = 0; i < 2; i++) {
            if ((st = mg_copy_d2h(b, got[i].codes, codes[i], code_bytes[i])) ||
                (st = mg_copy_d2h(b, got[i].scales, scales[i], scale_total[i])) ||
                (st = run_quantize(ctx->reference, NULL, &descs[i], in, &ref[i])))
                FAIL("replay %d: %s", replay, mg_last_error());
            expect_same(result, &descs[i], &got[i], &ref[i], "the CPU reference");
            if (!result->passed) {
                size_t used = strlen(result->detail);
                snprintf(result->detail + used, sizeof result->detail - used, " (replay %d)",
                         replay);
                goto done;
            }
        }
    }
    PASS();
    snprintf(result->detail, sizeof result->detail,
             "per-tensor and 1x128 GEMM layout, %ux%u pitch %u: %d replays with a new input each, "
             "bit-exact vs the CPU reference",
             rows, cols, pitch, REPLAYS);
done:
    mg_graph_destroy(g);
    mg_free(b, x);
    for (int i = 0; i < 2; i++) {
        mg_free(b, codes[i]);
        mg_free(b, scales[i]);
        output_free(&got[i]);
        output_free(&ref[i]);
    }
    mg_stream_destroy(s);
    free(in);
}

/* ------------------------------------------------------------------ bad arguments */

static void check_bad_arguments(mg_check_ctx *ctx, mg_check_result *r) {
    r->passed = true; /* until MG_CHECK_FAIL says otherwise */
    mg_backend *b = ctx->backend;
    const uint32_t rows = 8, cols = 256;
    const size_t out_bytes = (size_t)rows * cols, scale_total = 4096;
    mg_devptr in = 0, out = 0, scales = 0, small = 0;
    if (mg_check_alloc_poisoned(b, (size_t)rows * cols * 2, &in) ||
        mg_check_alloc_poisoned(b, out_bytes, &out) ||
        mg_check_alloc_poisoned(b, scale_total, &scales) ||
        mg_check_alloc_poisoned(b, 64, &small)) {
        MG_CHECK_FAIL(r, "setup: %s", mg_last_error());
        goto done;
    }
    const mg_fp8_quant_desc row = {.mode = MG_FP8_QUANT_ROW, .rows = rows, .cols = cols};
    const mg_fp8_quant_desc tensor = {.mode = MG_FP8_QUANT_TENSOR, .rows = rows, .cols = cols};
    const mg_fp8_quant_desc gemm = {
        .mode = MG_FP8_QUANT_1X128_GEMM_LAYOUT, .rows = rows - 1, .cols = cols, .rows_pad = rows};
    mg_fp8_quant_desc bad[10];
    for (size_t i = 0; i < COUNT(bad); i++)
        bad[i] = row;
    bad[0].mode = (mg_fp8_quant_mode)7;
    bad[1].rows = 0;
    bad[2].cols = 0;
    bad[3].cols = 12;
    bad[4].in_pitch = cols - 8;
    bad[5].in_pitch = cols + 4;
    bad[6] = gemm, bad[6].rows_pad = rows - 4;
    bad[7] = gemm, bad[7].rows_pad = rows + 2;
    bad[8].rows_pad = rows;
    bad[9].rows = rows + 1; /* in and out overrun their buffers */
    struct {
        const char *what;
        const char *needle;
    } expected[] = {
        {"unknown mode", "unknown mode"},
        {"rows = 0", "empty shape"},
        {"cols = 0", "empty shape"},
        {"cols = 12", "multiple of 8"},
        {"in_pitch < cols", "in_pitch"},
        {"in_pitch % 8", "in_pitch"},
        {"rows_pad < rows", "rows_pad"},
        {"rows_pad % 4", "rows_pad"},
        {"rows_pad in row mode", "rows_pad"},
        {"in overruns", "overruns"},
        {"NULL backend", "backend"},
        {"NULL descriptor", "descriptor"},
        {"null in", "in is null"},
        {"misaligned in", "in 0x"},
        {"misaligned out", "out 0x"},
        {"misaligned row scales", "scales 0x"},
        {"misaligned tensor scale", "scales 0x"},
        {"scales too small", "scales"},
        {"out overlaps scales", "overlap"},
        {"in overlaps out", "overlap"},
    };
    enum { CALLS = sizeof expected / sizeof expected[0] };
    mg_status got[CALLS];
    char messages[CALLS][200];
    size_t i = 0;
#define TRY(call)                                                                                  \
    (got[i] = (call), snprintf(messages[i], sizeof messages[i], "%s", mg_last_error()), i++)
    for (size_t j = 0; j < COUNT(bad); j++)
        TRY(mg_fp8_quantize(b, NULL, &bad[j], in, out, scales));
    TRY(mg_fp8_quantize(NULL, NULL, &row, in, out, scales));
    TRY(mg_fp8_quantize(b, NULL, NULL, in, out, scales));
    TRY(mg_fp8_quantize(b, NULL, &row, 0, out, scales));
    TRY(mg_fp8_quantize(b, NULL, &row, in + 2, out, scales));
    TRY(mg_fp8_quantize(b, NULL, &row, in, out + 8, scales));
    TRY(mg_fp8_quantize(b, NULL, &row, in, out, scales + 4));
    TRY(mg_fp8_quantize(b, NULL, &tensor, in, out, scales + 2));
    TRY(mg_fp8_quantize(b, NULL, &row, in, out, small + 48)); /* 16 bytes for 8 scales */
    TRY(mg_fp8_quantize(b, NULL, &row, in, scales, scales + 1024));
    TRY(mg_fp8_quantize(b, NULL, &tensor, in, in + 256, scales));
#undef TRY
    for (size_t j = 0; j < i && r->passed; j++)
        if (got[j] != MG_ERR_INVALID_ARGUMENT || !strstr(messages[j], expected[j].needle))
            MG_CHECK_FAIL(
                r, "%s: got %s \"%s\", expected MG_ERR_INVALID_ARGUMENT mentioning \"%s\"",
                expected[j].what, mg_status_name(got[j]), messages[j], expected[j].needle);
    /* Nothing was launched: every buffer still holds its poison. */
    const struct {
        mg_devptr p;
        size_t bytes;
    } buffers[] = {
        {in, (size_t)rows * cols * 2}, {out, out_bytes}, {scales, scale_total}, {small, 64}};
    for (size_t j = 0; j < COUNT(buffers) && r->passed; j++) {
        unsigned char *host = malloc(buffers[j].bytes);
        if (!host || mg_copy_d2h(b, host, buffers[j].p, buffers[j].bytes)) {
            MG_CHECK_FAIL(r, "reading buffer %zu back: %s", j, mg_last_error());
        } else {
            for (size_t k = 0; k < buffers[j].bytes; k++)
                if (host[k] != POISON) {
                    MG_CHECK_FAIL(r, "a rejected call wrote buffer %zu (byte %zu)", j, k);
                    break;
                }
        }
        free(host);
    }
    if (r->passed)
        snprintf(r->detail, sizeof r->detail,
                 "%zu bad calls rejected with MG_ERR_INVALID_ARGUMENT and a message naming the "
                 "argument; nothing written",
                 i);
done:
    mg_free(b, in);
    mg_free(b, out);
    mg_free(b, scales);
    mg_free(b, small);
}

/* ------------------------------------------------------------------ the group */

const mg_check_case mg_checks_quantize[] = {
    {"quantize", "tensor", check_tensor},
    {"quantize", "row", check_row},
    {"quantize", "1x128", check_1x128},
    {"quantize", "1x128_gemm_layout", check_1x128_gemm_layout},
    {"quantize", "special_values", check_special_values},
    {"quantize", "feeds_gemm", check_feeds_gemm},
    {"quantize", "graph_replay", check_graph_replay},
    {"quantize", "bad_arguments", check_bad_arguments},
    {NULL, NULL, NULL},
};
