/* check_nvfp4_format.c - the "nvfp4_format" check group: the NVFP4 format tools of
 * metrale/nvfp4.h on the backend under test, bit for bit against results computed here
 * independently (float64 arithmetic rounded where the rule rounds, nearest-value searches
 * instead of thresholds, the swizzle by its tile formula), on fresh random inputs of awkward
 * shapes with special values and exact rounding ties, poisoned outputs with guard bytes; a
 * quantize -> dequantize round trip of representable weights; the transposes' and swizzle's
 * round trips; capture and replay with a new input and global scale; bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "metrale/status.h"

#define POISON MG_CHECK_POISON
#define GUARD_BYTES 64
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const uint32_t awkward_n[] = {1, 3, 130};
static const uint32_t awkward_k[] = {16, 48, 4112};
/* The transposes pack pairs of N: even N only. */
static const uint32_t awkward_even_n[] = {2, 6, 130};

/* ------------------------------------------------------------------ independent rules */

static uint32_t rng_below(uint64_t *rng, uint32_t n) {
    return (uint32_t)(mg_check_rng_next(rng) % n);
}

static double rng_unit(uint64_t *rng) { /* uniform in [-1, 1) */
    return (double)(mg_check_rng_next(rng) >> 11) * 0x1p-52 - 1.0;
}

/* Any E4M3 code, sign included; 0x7f / 0xff are NaN. */
static double e4m3_decode(uint8_t code) {
    int e = (code >> 3) & 0xf, m = code & 7;
    double magnitude = (e == 0xf && m == 7) ? NAN : e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return (code & 0x80) ? -magnitude : magnitude;
}

/* The nearest non-negative finite E4M3 code to s > 0, ties to the even code, 448 beyond. */
static uint8_t e4m3_nearest(double s) {
    uint8_t best = 0;
    for (uint8_t c = 1; c <= 0x7e; c++) {
        double dc = fabs(e4m3_decode(c) - s), db = fabs(e4m3_decode(best) - s);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return best;
}

static const double e2m1_values[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* The nibble of magnitude m (nearest E2M1 value, ties to the even code, beyond 6 -> 6). */
static uint8_t e2m1_nearest(double m) {
    if (isnan(m))
        return 0;
    if (m >= 6) /* infinities included, whose distances to every value tie */
        return 7;
    uint8_t best = 0;
    for (uint8_t c = 1; c < 8; c++) {
        double dc = fabs(e2m1_values[c] - m), db = fabs(e2m1_values[best] - m);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return best;
}

/* Single-precision division and product, from float64 (correctly rounded twice is exact for a
 * single operation on floats). */
static float f32_div(double a, double b) {
    return (float)(a / b);
}

static uint16_t bf16_round(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if (isnan(v))
        return 0x7fc0; /* the canonical NaN the tools write */
    uint32_t lower = u & 0xffff, upper = u >> 16;
    if (lower > 0x8000 || (lower == 0x8000 && (upper & 1)))
        upper++;
    return (uint16_t)upper;
}

/* The expected quantization of BF16 `x` [n, k] (pitch) with `global`. */
static void expect_quantize(const uint16_t *x, uint32_t n, uint32_t k, uint32_t pitch, float global,
                            uint8_t *packed, uint8_t *scales) {
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t g = 0; g < k / 16; g++) {
            const uint16_t *b = x + (size_t)r * pitch + g * 16;
            double amax = 0;
            for (int i = 0; i < 16; i++) {
                double v = fabs(mg_bf16_to_f32(b[i]));
                if (isfinite(v) && v > amax)
                    amax = v;
            }
            float s = f32_div(f32_div(amax, 6.0), global);
            uint8_t scale = global > 0 && s > 0 ? e4m3_nearest(s) : 0; /* nvfp4.h */
            scales[(size_t)r * (k / 16) + g] = scale;
            float d = (float)(e4m3_decode(scale) * global);
            for (int i = 0; i < 16; i += 2) {
                uint8_t nib[2] = {0, 0};
                for (int h = 0; h < 2; h++) {
                    float v = mg_bf16_to_f32(b[i + h]);
                    uint8_t c = scale ? e2m1_nearest(f32_div(fabs(v), d)) : 0;
                    nib[h] = (uint8_t)(c | (c && signbit(v) ? 8 : 0));
                }
                packed[(size_t)r * (k / 2) + g * 8 + i / 2] = (uint8_t)(nib[0] | nib[1] << 4);
            }
        }
}

static float expect_value(uint8_t nibble, uint8_t scale, float global) {
    double v = (nibble & 8 ? -1 : 1) * e2m1_values[nibble & 7] * e4m3_decode(scale) * global;
    return isnan(v) ? NAN : (float)v;
}

/* ------------------------------------------------------------------ inputs */

/* BF16 [n, pitch]: each row random in [-2^e, 2^e), e in [-20, 20]; the gap past k holds a huge
 * finite value (read by mistake, it would dominate a block's amax). With `specials`, one value
 * in 29 is 0, -0, +-inf, NaN or tiny, row 1 is all zero, and row 2 holds exact rounding ties:
 * each block 6 * 2^e then +-{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} * 2^e and others. */
static uint16_t *make_weights(uint64_t *rng, uint32_t n, uint32_t k, uint32_t pitch, bool specials,
                              int tie_exponent) {
    static const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f,
                                 1.0f,  1.5f,  3.0f,  4.0f,  6.0f, 0.1f, 5.5f};
    static const uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x0001};
    uint16_t *x = malloc((size_t)n * pitch * 2);
    for (uint32_t r = 0; x && r < n; r++) {
        double magnitude = ldexp(1.0, (int)rng_below(rng, 41) - 20);
        for (uint32_t c = 0; c < pitch; c++) {
            uint16_t *v = x + (size_t)r * pitch + c;
            if (c >= k)
                *v = 0x7f00;
            else if (specials && r == 1)
                *v = 0;
            else if (specials && r == 2)
                *v = mg_f32_to_bf16(ldexpf(c % 16 == 0 ? 6.0f : ties[c % 16 - 1], tie_exponent) *
                                    (rng_below(rng, 2) ? -1.0f : 1.0f));
            else if (specials && rng_below(rng, 29) == 0)
                *v = special[rng_below(rng, COUNT(special))];
            else
                *v = mg_f32_to_bf16((float)(rng_unit(rng) * magnitude));
        }
    }
    return x;
}

/* ------------------------------------------------------------------ device helpers */

static mg_status download(mg_backend *b, void *host, mg_devptr p, size_t bytes) {
    mg_status st = mg_stream_synchronize(mg_stream_default(b));
    return st ? st : mg_copy_d2h(b, host, p, bytes);
}

static long first_difference(const void *a, const void *b, size_t bytes) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i])
            return (long)i;
    return -1;
}

static bool guard_intact(const unsigned char *after_end) {
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (after_end[i] != POISON)
            return false;
    return true;
}

/* `got` (with GUARD_BYTES after `bytes`) equals `want`, guards poisoned. */
static bool same_bytes(mg_check_result *result, const char *what, const void *got, const void *want,
                       size_t bytes) {
    long at = first_difference(got, want, bytes);
    if (at >= 0) {
        MG_CHECK_FAIL(result, "%s: byte %ld is 0x%02x, expected 0x%02x", what, at,
                      ((const unsigned char *)got)[at], ((const unsigned char *)want)[at]);
        return false;
    }
    if (!guard_intact((const unsigned char *)got + bytes)) {
        MG_CHECK_FAIL(result, "%s: written past its end", what);
        return false;
    }
    return true;
}

static void free_all(mg_backend *b, mg_devptr *p, int count) {
    for (int i = 0; i < count; i++)
        mg_free(b, p[i]);
}

/* ------------------------------------------------------------------ quantize */

static bool quantize_case(mg_check_ctx *ctx, mg_check_result *result, uint64_t *rng, uint32_t n,
                          uint32_t k, uint32_t pitch, float global, int tie_exponent) {
    mg_backend *b = ctx->backend;
    size_t pb = mg_nvfp4_packed_bytes(n, k), sb = mg_nvfp4_scale_bytes(n, k);
    uint16_t *x = make_weights(rng, n, k, pitch, true, tie_exponent);
    uint8_t *want_p = malloc(pb), *want_s = malloc(sb);
    uint8_t *got_p = malloc(pb + GUARD_BYTES), *got_s = malloc(sb + GUARD_BYTES);
    mg_devptr d[4] = {0};
    bool ok = false;
    char what[96];
    snprintf(what, sizeof what, "quantize n=%u k=%u pitch=%u global=%a", n, k, pitch, global);
    if (!x || !want_p || !want_s || !got_p || !got_s) {
        MG_CHECK_FAIL(result, "out of host memory");
        goto done;
    }
    expect_quantize(x, n, k, pitch, global, want_p, want_s);
    mg_status st;
    if ((st = mg_check_upload(b, x, (size_t)n * pitch * 2, &d[0])) ||
        (st = mg_check_upload(b, &global, 4, &d[1])) ||
        (st = mg_check_alloc_poisoned(b, pb + GUARD_BYTES, &d[2])) ||
        (st = mg_check_alloc_poisoned(b, sb + GUARD_BYTES, &d[3])) ||
        (st = mg_nvfp4_quantize(b, NULL, n, k, pitch == k ? 0 : pitch, d[0], d[1], d[2], d[3])) ||
        (st = download(b, got_p, d[2], pb + GUARD_BYTES)) ||
        (st = download(b, got_s, d[3], sb + GUARD_BYTES))) {
        MG_CHECK_FAIL(result, "%s: %s: %s", what, mg_status_name(st), mg_last_error());
        goto done;
    }
    char name[128];
    snprintf(name, sizeof name, "%s scales", what);
    if (!same_bytes(result, name, got_s, want_s, sb))
        goto done;
    snprintf(name, sizeof name, "%s packed", what);
    ok = same_bytes(result, name, got_p, want_p, pb);
    /* a global that is not > 0, or +inf: every block scale 0 and every code 0 (nvfp4.h) */
    for (size_t i = 0; ok && !(global > 0 && isfinite(global)) && i < pb + sb; i++)
        if (i < pb ? got_p[i] : got_s[i - pb]) {
            MG_CHECK_FAIL(result, "%s: %s byte %zu is 0x%02x, not 0 (a zero weight)", what,
                          i < pb ? "packed" : "scale", i < pb ? i : i - pb,
                          i < pb ? got_p[i] : got_s[i - pb]);
            ok = false;
        }
done:
    free_all(b, d, 4);
    free(x), free(want_p), free(want_s), free(got_p), free(got_s);
    return ok;
}

static void check_quantize(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    uint64_t rng = mg_check_rng_seed(ctx, "quantize");
    int cases = 0;
    for (size_t i = 0; i < COUNT(awkward_n); i++)
        for (size_t j = 0; j < COUNT(awkward_k); j++) {
            uint32_t n = awkward_n[i], k = awkward_k[j];
            /* A power-of-two global (the tie row is then exact), the usual amax / 2688 of a
             * typical row, and one that saturates most scales at 448. */
            const float globals[] = {0x1p-3f, 1.0f / 2688.0f * 0.75f, 0x1p-30f};
            for (size_t g = 0; g < COUNT(globals); g++, cases++)
                if (!quantize_case(ctx, result, &rng, n, k, g == 1 ? k + 8 : k, globals[g],
                                   (int)rng_below(&rng, 9) - 4 - 3))
                    return;
        }
    /* Globals that define no scale: the weight quantizes to zero. */
    const float degenerate[] = {0.0f, -0.0f, -0x1p-3f, NAN, INFINITY};
    for (size_t g = 0; g < COUNT(degenerate); g++, cases++)
        if (!quantize_case(ctx, result, &rng, 3, 48, 56, degenerate[g], -5))
            return;
    snprintf(result->detail, sizeof result->detail,
             "%d shapes x globals (N 1..130, K 16..4112, row gaps, ties, NaN/inf/-0; globals "
             "+-0, negative, NaN, inf: zero), bit-exact",
             cases);
}

/* Weights built as e2m1 * e4m3 * 2^-4 (the tensor's amax block holding 6) quantize back to
 * exactly their codes, and dequantize to exactly the weights. */
static void check_roundtrip(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    mg_backend *b = ctx->backend;
    uint64_t rng = mg_check_rng_seed(ctx, "roundtrip");
    const uint32_t n = 3, k = 48;
    const float global = 0x1p-4f;
    uint16_t x[3 * 48];
    uint8_t want_p[3 * 24], want_s[3 * 3];
    uint8_t got_p[3 * 24 + GUARD_BYTES], got_s[3 * 3 + GUARD_BYTES];
    uint16_t got_x[3 * 48 + GUARD_BYTES / 2];
    mg_devptr d[5] = {0};
    for (uint32_t blk = 0; blk < n * k / 16; blk++) {
        /* Normal scales 2^-6 .. 2^8 with any mantissa: s*6 stays exact in BF16 and E4M3. */
        uint8_t scale = (uint8_t)(((1 + rng_below(&rng, 14)) << 3) | rng_below(&rng, 8));
        want_s[blk] = scale;
        for (uint32_t i = 0; i < 16; i++) {
            uint8_t nib = i == 0 ? 7 : (uint8_t)rng_below(&rng, 16);
            if ((nib & 7) == 0)
                nib = 0; /* the tools store a zero magnitude as +0 */
            float v = expect_value(nib, scale, global);
            x[blk * 16 + i] = mg_f32_to_bf16(v);
            uint8_t *byte = &want_p[blk * 8 + i / 2];
            *byte = (uint8_t)(i % 2 ? (*byte | nib << 4) : nib);
        }
    }
    mg_status st;
    if ((st = mg_check_upload(b, x, sizeof x, &d[0])) ||
        (st = mg_check_upload(b, &global, 4, &d[1])) ||
        (st = mg_check_alloc_poisoned(b, sizeof got_p, &d[2])) ||
        (st = mg_check_alloc_poisoned(b, sizeof got_s, &d[3])) ||
        (st = mg_check_alloc_poisoned(b, sizeof got_x, &d[4])) ||
        (st = mg_nvfp4_quantize(b, NULL, n, k, 0, d[0], d[1], d[2], d[3])) ||
        (st = mg_nvfp4_dequantize(b, NULL, n, k, d[2], d[3], d[1], MG_DTYPE_BF16, d[4])) ||
        (st = download(b, got_p, d[2], sizeof got_p)) ||
        (st = download(b, got_s, d[3], sizeof got_s)) ||
        (st = download(b, got_x, d[4], sizeof got_x)))
        FAIL("%s: %s", mg_status_name(st), mg_last_error());
    if (same_bytes(result, "round-trip scales", got_s, want_s, sizeof want_s) &&
        same_bytes(result, "round-trip packed", got_p, want_p, sizeof want_p) &&
        same_bytes(result, "round-trip dequantized", got_x, x, sizeof x))
        snprintf(result->detail, sizeof result->detail,
                 "representable weights: codes and values exact both ways");
done:
    free_all(b, d, 5);
}

/* ------------------------------------------------------------------ dequantize */

static void check_dequantize(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    mg_backend *b = ctx->backend;
    uint64_t rng = mg_check_rng_seed(ctx, "dequantize");
    int cases = 0;
    for (size_t i = 0; i < COUNT(awkward_n); i++)
        for (size_t j = 0; j < COUNT(awkward_k); j++)
            for (int f32 = 0; f32 < 2; f32++, cases++) {
                uint32_t n = awkward_n[i], k = awkward_k[j];
                size_t pb = mg_nvfp4_packed_bytes(n, k), sb = mg_nvfp4_scale_bytes(n, k);
                size_t ob = (size_t)n * k * (f32 ? 4 : 2);
                float global =
                    (float)ldexp(1.0 + rng_unit(&rng) * 0.5, (int)rng_below(&rng, 21) - 14);
                uint8_t *p = malloc(pb), *s = malloc(sb);
                unsigned char *want = malloc(ob), *got = malloc(ob + GUARD_BYTES);
                mg_devptr d[4] = {0};
                mg_status st = MG_OK;
                bool ok = p && s && want && got;
                if (!ok)
                    MG_CHECK_FAIL(result, "out of host memory");
                for (size_t q = 0; ok && q < pb; q++)
                    p[q] = (uint8_t)mg_check_rng_next(&rng);
                for (size_t q = 0; ok && q < sb; q++) {
                    /* Mostly valid unsigned scales; now and then a NaN or a signed code. */
                    uint32_t pick = rng_below(&rng, 64);
                    s[q] = pick == 0   ? 0x7f
                           : pick == 1 ? (uint8_t)(0x80 | rng_below(&rng, 0x7f))
                                       : (uint8_t)rng_below(&rng, 0x7f);
                }
                for (size_t e = 0; ok && e < (size_t)n * k; e++) {
                    uint8_t nib = (uint8_t)((p[e / 2] >> (e % 2 * 4)) & 0xf);
                    float v = expect_value(nib, s[e / 16], global);
                    if (f32)
                        memcpy(want + e * 4, &v, 4);
                    else {
                        uint16_t h = bf16_round(v);
                        memcpy(want + e * 2, &h, 2);
                    }
                }
                if (ok && ((st = mg_check_upload(b, p, pb, &d[0])) ||
                           (st = mg_check_upload(b, s, sb, &d[1])) ||
                           (st = mg_check_upload(b, &global, 4, &d[2])) ||
                           (st = mg_check_alloc_poisoned(b, ob + GUARD_BYTES, &d[3])) ||
                           (st = mg_nvfp4_dequantize(b, NULL, n, k, d[0], d[1], d[2],
                                                     f32 ? MG_DTYPE_F32 : MG_DTYPE_BF16, d[3])) ||
                           (st = download(b, got, d[3], ob + GUARD_BYTES)))) {
                    MG_CHECK_FAIL(result, "dequantize n=%u k=%u: %s", n, k, mg_last_error());
                    ok = false;
                }
                char what[64];
                snprintf(what, sizeof what, "dequantize %s n=%u k=%u", f32 ? "f32" : "bf16", n, k);
                if (ok)
                    ok = same_bytes(result, what, got, want, ob);
                free_all(b, d, 4);
                free(p), free(s), free(want), free(got);
                if (!ok)
                    return;
            }
    snprintf(result->detail, sizeof result->detail,
             "%d shapes, BF16 and FP32, random codes incl. NaN and signed scales, bit-exact",
             cases);
}

/* ------------------------------------------------------------------ transpose and swizzle */

static void check_transpose(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    mg_backend *b = ctx->backend;
    uint64_t rng = mg_check_rng_seed(ctx, "transpose");
    for (size_t i = 0; i < COUNT(awkward_even_n); i++)
        for (size_t j = 0; j < COUNT(awkward_k); j++) {
            uint32_t n = awkward_even_n[i], k = awkward_k[j];
            size_t pb = mg_nvfp4_packed_bytes(n, k), sb = mg_nvfp4_scale_bytes(n, k);
            uint8_t *p = malloc(pb), *s = malloc(sb), *want_p = malloc(pb), *want_s = malloc(sb);
            uint8_t *got_p = malloc(pb + GUARD_BYTES), *got_s = malloc(sb + GUARD_BYTES);
            mg_devptr d[6] = {0};
            bool ok = p && s && want_p && want_s && got_p && got_s;
            if (!ok)
                MG_CHECK_FAIL(result, "out of host memory");
            for (size_t q = 0; ok && q < pb; q++)
                p[q] = (uint8_t)mg_check_rng_next(&rng);
            for (size_t q = 0; ok && q < sb; q++)
                s[q] = (uint8_t)mg_check_rng_next(&rng);
            /* W[r, c] of the canonical [N, K] is nibble c of row r; the [K, N] storage holds it
             * as nibble r of row c. */
            if (ok) {
                memset(want_p, 0, pb);
                for (uint32_t r = 0; r < n; r++)
                    for (uint32_t c = 0; c < k; c++) {
                        uint8_t nib = (p[(size_t)r * (k / 2) + c / 2] >> (c % 2 * 4)) & 0xf;
                        want_p[(size_t)c * (n / 2) + r / 2] |= (uint8_t)(nib << (r % 2 * 4));
                        if (c % 16 == 0)
                            want_s[(size_t)(c / 16) * n + r] = s[(size_t)r * (k / 16) + c / 16];
                    }
            }
            mg_status st;
            if (ok && ((st = mg_check_upload(b, p, pb, &d[0])) ||
                       (st = mg_check_upload(b, s, sb, &d[1])) ||
                       (st = mg_check_alloc_poisoned(b, pb + GUARD_BYTES, &d[2])) ||
                       (st = mg_check_alloc_poisoned(b, sb + GUARD_BYTES, &d[3])) ||
                       (st = mg_check_alloc_poisoned(b, pb + GUARD_BYTES, &d[4])) ||
                       (st = mg_check_alloc_poisoned(b, sb + GUARD_BYTES, &d[5])) ||
                       (st = mg_nvfp4_transpose(b, NULL, MG_NVFP4_NK_TO_KN, n, k, d[0], d[1], d[2],
                                                d[3])) ||
                       (st = mg_nvfp4_transpose(b, NULL, MG_NVFP4_KN_TO_NK, n, k, d[2], d[3], d[4],
                                                d[5])) ||
                       (st = download(b, got_p, d[2], pb + GUARD_BYTES)) ||
                       (st = download(b, got_s, d[3], sb + GUARD_BYTES)))) {
                MG_CHECK_FAIL(result, "transpose n=%u k=%u: %s", n, k, mg_last_error());
                ok = false;
            }
            char what[64];
            snprintf(what, sizeof what, "n=%u k=%u", n, k);
            ok = ok && same_bytes(result, "NK_TO_KN packed", got_p, want_p, pb) &&
                 same_bytes(result, "NK_TO_KN scales", got_s, want_s, sb);
            if (ok && (download(b, got_p, d[4], pb + GUARD_BYTES) ||
                       download(b, got_s, d[5], sb + GUARD_BYTES))) {
                MG_CHECK_FAIL(result, "download: %s", mg_last_error());
                ok = false;
            }
            ok = ok && same_bytes(result, "KN_TO_NK of NK_TO_KN packed", got_p, p, pb) &&
                 same_bytes(result, "KN_TO_NK of NK_TO_KN scales", got_s, s, sb);
            if (!ok) {
                size_t used = strlen(result->detail);
                snprintf(result->detail + used, sizeof result->detail - used, " (%s)", what);
            }
            free_all(b, d, 6);
            free(p), free(s), free(want_p), free(want_s), free(got_p), free(got_s);
            if (!ok)
                return;
        }
    snprintf(result->detail, sizeof result->detail,
             "N 2..130, K 16..4112: both directions exact, inverse of each other");
}

static void check_swizzle(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    mg_backend *b = ctx->backend;
    uint64_t rng = mg_check_rng_seed(ctx, "swizzle");
    for (size_t i = 0; i < COUNT(awkward_n); i++)
        for (size_t j = 0; j < COUNT(awkward_k); j++) {
            uint32_t n = awkward_n[i], k = awkward_k[j], cols = k / 16;
            uint32_t rows_pad = (n + 127) / 128 * 128, cols_pad = (cols + 3) / 4 * 4;
            size_t sb = (size_t)n * cols, wb = (size_t)rows_pad * cols_pad;
            uint8_t *s = malloc(sb), *want = calloc(wb, 1), *got = malloc(wb + GUARD_BYTES);
            uint8_t *back = malloc(sb + GUARD_BYTES);
            mg_devptr d[3] = {0};
            bool ok = s && want && got && back && mg_nvfp4_swizzled_scale_bytes(n, k) == wb;
            if (!ok)
                MG_CHECK_FAIL(result, "out of host memory or swizzled size %zu != %zu",
                              mg_nvfp4_swizzled_scale_bytes(n, k), wb);
            for (size_t q = 0; ok && q < sb; q++)
                s[q] = (uint8_t)(1 + rng_below(&rng, 255)); /* never 0: padding shows */
            /* Tiles of 128 x 4 in row-tile-major order, 32-row groups interleaved by 16 bytes. */
            for (uint32_t rt = 0; ok && rt < rows_pad / 128; rt++)
                for (uint32_t ct = 0; ct < cols_pad / 4; ct++) {
                    uint8_t *tile = want + ((size_t)rt * (cols_pad / 4) + ct) * 512;
                    for (uint32_t r32 = 0; r32 < 32; r32++)
                        for (uint32_t q = 0; q < 4; q++)
                            for (uint32_t c = 0; c < 4; c++) {
                                uint32_t row = rt * 128 + q * 32 + r32, col = ct * 4 + c;
                                tile[r32 * 16 + q * 4 + c] =
                                    row < n && col < cols ? s[(size_t)row * cols + col] : 0;
                            }
                }
            for (uint32_t r = 0; ok && r < n; r++)
                for (uint32_t c = 0; c < cols; c++)
                    if (want[mg_nvfp4_swizzled_offset(r, c, cols)] != s[(size_t)r * cols + c]) {
                        MG_CHECK_FAIL(result, "mg_nvfp4_swizzled_offset(%u, %u, %u) is wrong", r, c,
                                      cols);
                        ok = false;
                        r = n;
                        break;
                    }
            mg_status st;
            if (ok && ((st = mg_check_upload(b, s, sb, &d[0])) ||
                       (st = mg_check_alloc_poisoned(b, wb + GUARD_BYTES, &d[1])) ||
                       (st = mg_check_alloc_poisoned(b, sb + GUARD_BYTES, &d[2])) ||
                       (st = mg_nvfp4_scales_swizzle(b, NULL, n, k, d[0], d[1])) ||
                       (st = mg_nvfp4_scales_unswizzle(b, NULL, n, k, d[1], d[2])) ||
                       (st = download(b, got, d[1], wb + GUARD_BYTES)) ||
                       (st = download(b, back, d[2], sb + GUARD_BYTES)))) {
                MG_CHECK_FAIL(result, "swizzle n=%u k=%u: %s", n, k, mg_last_error());
                ok = false;
            }
            ok = ok && same_bytes(result, "swizzled", got, want, wb) &&
                 same_bytes(result, "unswizzled", back, s, sb);
            if (!ok) {
                size_t used = strlen(result->detail);
                snprintf(result->detail + used, sizeof result->detail - used, " (n=%u k=%u)", n, k);
            }
            free_all(b, d, 3);
            free(s), free(want), free(got), free(back);
            if (!ok)
                return;
        }
    snprintf(result->detail, sizeof result->detail,
             "N 1..130, K 16..4112: 128x4 tiles with zero padding, and back, exact");
}

/* ------------------------------------------------------------------ capture and replay */

static void check_graph_replay(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "the backend has no graphs");
        return;
    }
    result->passed = true;
    enum { REPLAYS = 3 };
    const uint32_t n = 130, k = 4112, pitch = k + 8;
    size_t pb = mg_nvfp4_packed_bytes(n, k), sb = mg_nvfp4_scale_bytes(n, k);
    uint64_t rng = mg_check_rng_seed(ctx, "graph_replay");
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_devptr d[4] = {0};
    uint16_t *x = NULL;
    uint8_t *want_p = malloc(pb), *want_s = malloc(sb);
    uint8_t *got_p = malloc(pb + GUARD_BYTES), *got_s = malloc(sb + GUARD_BYTES);
    mg_status st;
    if (!want_p || !want_s || !got_p || !got_s)
        FAIL("out of host memory");
    if ((st = mg_stream_create(b, &s)) || (st = mg_alloc(b, (size_t)n * pitch * 2, &d[0])) ||
        (st = mg_alloc(b, 4, &d[1])) || (st = mg_alloc(b, pb + GUARD_BYTES, &d[2])) ||
        (st = mg_alloc(b, sb + GUARD_BYTES, &d[3])))
        FAIL("setup: %s", mg_last_error());
    if ((st = mg_graph_begin_capture(s)))
        FAIL("begin capture: %s", mg_last_error());
    if ((st = mg_nvfp4_quantize(b, s, n, k, pitch, d[0], d[1], d[2], d[3]))) {
        MG_CHECK_FAIL(result, "quantize in the capture: %s", mg_last_error());
        mg_graph_abort_capture(s);
        goto done;
    }
    if ((st = mg_graph_end_capture(s, &g)))
        FAIL("end capture: %s", mg_last_error());
    for (int replay = 0; replay < REPLAYS; replay++) {
        free(x);
        x = make_weights(&rng, n, k, pitch, true, -3);
        float global = replay == 0 ? 0x1p-3f : (float)ldexp(1.0 + rng_unit(&rng) * 0.4, -12);
        if (!x)
            FAIL("out of host memory");
        expect_quantize(x, n, k, pitch, global, want_p, want_s);
        if ((st = mg_memset(b, d[2], POISON, pb + GUARD_BYTES)) ||
            (st = mg_memset(b, d[3], POISON, sb + GUARD_BYTES)) ||
            (st = mg_copy_h2d(b, d[0], x, (size_t)n * pitch * 2)) ||
            (st = mg_copy_h2d(b, d[1], &global, 4)) || (st = mg_graph_launch(g, s)) ||
            (st = mg_stream_synchronize(s)) ||
            (st = mg_copy_d2h(b, got_p, d[2], pb + GUARD_BYTES)) ||
            (st = mg_copy_d2h(b, got_s, d[3], sb + GUARD_BYTES)))
            FAIL("replay %d: %s", replay, mg_last_error());
        if (!same_bytes(result, "replayed scales", got_s, want_s, sb) ||
            !same_bytes(result, "replayed packed", got_p, want_p, pb))
            goto done;
    }
    snprintf(result->detail, sizeof result->detail,
             "%ux%u pitch %u: %d replays with a new input and global scale each, bit-exact", n, k,
             pitch, REPLAYS);
done:
    mg_graph_destroy(g);
    free_all(b, d, 4);
    if (s)
        mg_stream_destroy(s);
    free(x), free(want_p), free(want_s), free(got_p), free(got_s);
}

/* ------------------------------------------------------------------ bad arguments */

static void check_validation(mg_check_ctx *ctx, mg_check_result *result) {
    result->passed = true;
    mg_backend *b = ctx->backend;
    const uint32_t n = 4, k = 64;
    mg_devptr x = 0, global = 0, packed = 0, scales = 0, small = 0, out = 0;
    unsigned char got[4 * 32];
    if (mg_alloc(b, (size_t)n * k * 2, &x) || mg_alloc(b, 16, &global) ||
        mg_check_alloc_poisoned(b, n * k / 2, &packed) ||
        mg_check_alloc_poisoned(b, n * k / 16, &scales) || mg_alloc(b, 16, &small) ||
        mg_alloc(b, (size_t)n * k * 4, &out))
        FAIL("setup: %s", mg_last_error());
    if (mg_memset(b, x, 0x3f, (size_t)n * k * 2) || mg_memset(b, global, 0x3f, 16))
        FAIL("setup: %s", mg_last_error());
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, 40, 0, x, global, packed, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(mg_last_error(), "multiple of 16"), "k=40 message: %s", mg_last_error());
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, 0, k, 0, x, global, packed, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, k, 60, x, global, packed, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, k, 0, 0, global, packed, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, k, 0, x + 2, global, packed, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(mg_last_error(), "aligned"), "alignment message: %s", mg_last_error());
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, k, 0, x, global, packed + 4, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, k, 0, x, global, small, scales),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_quantize(b, NULL, n, k, 0, x, global, packed, packed),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_dequantize(b, NULL, n, k, packed, scales, global, MG_DTYPE_F16, out),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_dequantize(b, NULL, n, 24, packed, scales, global, MG_DTYPE_F32, out),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(
        mg_nvfp4_transpose(b, NULL, MG_NVFP4_NK_TO_KN, 3, 16, packed, scales, out, out + 64),
        MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_transpose(b, NULL, (mg_nvfp4_transpose_dir)7, n, k, packed, scales, out,
                                     out + 512),
                  MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_scales_swizzle(b, NULL, n, k, scales, small), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_scales_swizzle(b, NULL, n, k, scales, out + 8), MG_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(mg_nvfp4_quantize(NULL, NULL, n, k, 0, x, global, packed, scales),
                  MG_ERR_INVALID_ARGUMENT);
    /* Nothing was written by any refused call. */
    if (download(b, got, packed, n * k / 2))
        FAIL("download: %s", mg_last_error());
    for (size_t i = 0; i < n * k / 2; i++)
        EXPECT(got[i] == POISON, "a refused call wrote packed byte %zu", i);
    PASS();
    snprintf(result->detail, sizeof result->detail,
             "K not a multiple of 16, empty, pitch, null, misaligned, small, overlapping, dtype, "
             "odd N, direction: refused, nothing written");
done:
    mg_free(b, x), mg_free(b, global), mg_free(b, packed), mg_free(b, scales);
    mg_free(b, small), mg_free(b, out);
}

const mg_check_case mg_checks_nvfp4_format[] = {
    {"nvfp4_format", "quantize", check_quantize},
    {"nvfp4_format", "roundtrip", check_roundtrip},
    {"nvfp4_format", "dequantize", check_dequantize},
    {"nvfp4_format", "transpose", check_transpose},
    {"nvfp4_format", "swizzle", check_swizzle},
    {"nvfp4_format", "graph_replay", check_graph_replay},
    {"nvfp4_format", "validation", check_validation},
    {NULL, NULL, NULL},
};
