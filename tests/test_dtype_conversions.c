/*
 * test_dtype_conversions.c - metrale/dtype.h against independent references: every BF16 and
 * FP8 E4M3 code decoded from its sign, exponent and mantissa fields; encoding compared with a
 * search for the nearest code (ties to the even code) over random floats of every magnitude
 * and the edge cases: NaN (quiet and signalling, both signs), infinities, the largest finite
 * floats, float denormals, exact ties, and the E4M3 saturation and subnormal range. Also the
 * element sizes and names of every type.
 */
#include <math.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "utils_test_support.h"

static float float_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ------------------------------------------------------------------ bf16 */

/* The value of a bf16 code from its fields (1 sign, 8 exponent, 7 mantissa bits). */
static double bf16_reference_value(uint16_t code) {
    int sign = code >> 15, exponent = (code >> 7) & 0xff, mantissa = code & 0x7f;
    double magnitude;
    if (exponent == 0xff)
        magnitude = mantissa ? NAN : INFINITY;
    else if (exponent == 0)
        magnitude = ldexp(mantissa / 128.0, -126);
    else
        magnitude = ldexp(1.0 + mantissa / 128.0, exponent - 127);
    return sign ? -magnitude : magnitude;
}

/* Round to nearest even, by comparing the two bf16 neighbours of x in double. */
static uint16_t bf16_reference_encode(float x) {
    uint32_t u = bits_of(x);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40);
    uint16_t down = (uint16_t)(u >> 16); /* truncation: toward zero */
    if ((u & 0xffff) == 0)
        return down;
    uint16_t up = (uint16_t)(down + 1); /* away from zero; may become infinity */
    double lo = fabs(bf16_reference_value(down)), hi = fabs(bf16_reference_value(up));
    if (isinf(hi)) /* the rounding threshold above the largest finite bf16 is its half ulp */
        hi = ldexp(2.0, 127);
    double ax = fabs((double)x);
    if (ax - lo < hi - ax)
        return down;
    if (ax - lo > hi - ax)
        return up;
    return (down & 1) ? up : down;
}

static void test_bf16_decode_all(void) {
    size_t wrong = 0;
    for (uint32_t c = 0; c <= 0xffff; c++) {
        double want = bf16_reference_value((uint16_t)c);
        float got = mg_bf16_to_f32((uint16_t)c);
        wrong += isnan(want) ? !isnan(got) : (double)got != want || !signbit(got) != !signbit(want);
    }
    CHECKF(wrong == 0, "%zu bf16 codes decode wrongly", wrong);
}

static void check_bf16(uint32_t float_bits, uint16_t want) {
    uint16_t got = mg_f32_to_bf16(float_of(float_bits));
    CHECKF(got == want, "bf16(%#010x) = %#06x, expected %#06x", float_bits, got, want);
}

static void test_bf16_edges(void) {
    check_bf16(0x7fc00000, 0x7fc0); /* quiet NaN */
    check_bf16(0xffc00000, 0xffc0); /* negative quiet NaN keeps its sign */
    check_bf16(0x7f800001, 0x7fc0); /* signalling NaN: quiet NaN, not infinity */
    check_bf16(0xff800001, 0xffc0);
    check_bf16(0x7fffffff, 0x7fff); /* NaN with every payload bit: stays NaN */
    check_bf16(0x7f800000, 0x7f80); /* infinities are exact */
    check_bf16(0xff800000, 0xff80);
    check_bf16(0x7f7fffff, 0x7f80); /* the largest float rounds up to infinity */
    check_bf16(0x7f7f7fff, 0x7f7f); /* just below the half ulp: the largest bf16 */
    check_bf16(0x7f7f8000, 0x7f80); /* the tie at the top: to even, which is infinity */
    check_bf16(0x00000000, 0x0000);
    check_bf16(0x80000000, 0x8000); /* negative zero */
    check_bf16(0x00000001, 0x0000); /* the smallest denormal rounds to zero */
    check_bf16(0x00008000, 0x0000); /* tie, even: down */
    check_bf16(0x00018000, 0x0002); /* tie, odd: up */
    check_bf16(0x00008001, 0x0001); /* above the tie: up */
    check_bf16(0x007fffff, 0x0080); /* the largest denormal rounds to the smallest normal */
    check_bf16(0x3f808000, 0x3f80); /* 1 + 2^-8: tie, even: down to 1 */
    check_bf16(0x3f818000, 0x3f82); /* tie, odd: up */
    check_bf16(0xbf818000, 0xbf82); /* the same below zero */
    check_bf16(0x3f80ffff, 0x3f81);
}

static void test_bf16_random(void) {
    size_t wrong = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)test_rand();
        if (i % 4 == 0)
            u &= 0x807fffff; /* denormals */
        else if (i % 4 == 1)
            u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        float x = float_of(u);
        uint16_t got = mg_f32_to_bf16(x), want = bf16_reference_encode(x);
        if (got != want && wrong++ < 5)
            fprintf(stderr, "bf16(%#010x) = %#06x, expected %#06x\n", u, got, want);
    }
    CHECKF(wrong == 0, "%zu of 200000 random floats encode wrongly", wrong);
}

/* ------------------------------------------------------------------ fp8 e4m3 */

/* The value of an E4M3 code from its fields (1 sign, 4 exponent with bias 7, 3 mantissa bits;
 * S.1111.111 is NaN, there are no infinities). */
static double fp8_reference_value(uint8_t code) {
    int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
    double magnitude;
    if (exponent == 0xf && mantissa == 0x7)
        magnitude = NAN;
    else if (exponent == 0)
        magnitude = ldexp(mantissa / 8.0, -6);
    else
        magnitude = ldexp(1.0 + mantissa / 8.0, exponent - 7);
    return sign ? -magnitude : magnitude;
}

/* The nearest of the 127 non-negative finite codes (ties to the even code), saturating. */
static uint8_t fp8_reference_encode(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return sign | 0x7f;
    double ax = fabs((double)x);
    uint8_t best = 0;
    double best_distance = INFINITY;
    for (uint8_t c = 0; c <= 0x7e; c++) {
        double distance = fabs(fp8_reference_value(c) - ax);
        if (distance < best_distance || (distance == best_distance && !(c & 1))) {
            best = c;
            best_distance = distance;
        }
    }
    return sign | best;
}

static void test_fp8_decode_all(void) {
    size_t wrong = 0;
    for (uint32_t c = 0; c <= 0xff; c++) {
        double want = fp8_reference_value((uint8_t)c);
        float got = mg_fp8_e4m3_to_f32((uint8_t)c);
        wrong += isnan(want) ? !isnan(got) || !signbit(got) != (c < 0x80)
                             : (double)got != want || !signbit(got) != !signbit(want);
    }
    CHECKF(wrong == 0, "%zu E4M3 codes decode wrongly", wrong);
    CHECK(mg_fp8_e4m3_to_f32(0x7e) == MG_FP8_E4M3_MAX);
    CHECK(mg_fp8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
}

static void check_fp8(float x, uint8_t want) {
    uint8_t got = mg_f32_to_fp8_e4m3(x);
    CHECKF(got == want, "e4m3(%a) = %#04x, expected %#04x", (double)x, got, want);
}

static void test_fp8_edges(void) {
    check_fp8(NAN, 0x7f);
    check_fp8(-NAN, 0xff);
    check_fp8(float_of(0x7f800001), 0x7f); /* signalling NaN */
    check_fp8(INFINITY, 0x7e);             /* saturates */
    check_fp8(-INFINITY, 0xfe);
    check_fp8(448.0f, 0x7e);
    check_fp8(463.99f, 0x7e);
    check_fp8(464.0f, 0x7e); /* the would-be tie with 480 still saturates */
    check_fp8(1e30f, 0x7e);
    check_fp8(-1e30f, 0xfe);
    check_fp8(0.0f, 0x00);
    check_fp8(-0.0f, 0x80);
    check_fp8(ldexpf(1.0f, -10), 0x00);         /* half the smallest subnormal: tie, even */
    check_fp8(ldexpf(1.0f, -10) * 1.01f, 0x01); /* just above the tie */
    check_fp8(ldexpf(3.0f, -10), 0x02);         /* tie between 1 and 2: even */
    check_fp8(ldexpf(5.0f, -10), 0x02);         /* tie between 2 and 3: even */
    check_fp8(ldexpf(15.0f, -10), 0x08);        /* 7.5 x 2^-9 rounds into the first normal */
    check_fp8(ldexpf(1.0f, -6), 0x08);          /* the smallest normal */
    check_fp8(1.0f, 0x38);
    check_fp8(1.0625f, 0x38); /* tie between 1 and 1.125: even */
    check_fp8(1.1875f, 0x3a); /* tie between 1.125 and 1.25: even */
    check_fp8(-1.1875f, 0xba);
    check_fp8(ldexpf(1.0f, -30), 0x00); /* far below the subnormals */
}

static void test_fp8_random(void) {
    size_t wrong = 0;
    for (int i = 0; i < 100000; i++) {
        /* magnitudes from 2^-12 to 2^10 */
        float x = ldexpf((float)(test_rand() % 1000000) / 1000000.0f, (int)(test_rand() % 23) - 12);
        if (test_rand() & 1)
            x = -x;
        uint8_t got = mg_f32_to_fp8_e4m3(x), want = fp8_reference_encode(x);
        if (got != want && wrong++ < 5)
            fprintf(stderr, "e4m3(%a) = %#04x, expected %#04x\n", (double)x, got, want);
    }
    CHECKF(wrong == 0, "%zu of 100000 random floats encode wrongly", wrong);
    /* every code's exact value and every midpoint between neighbours */
    wrong = 0;
    for (uint8_t c = 0; c < 0x7e; c++) {
        float v = mg_fp8_e4m3_to_f32(c), next = mg_fp8_e4m3_to_f32((uint8_t)(c + 1));
        float mid = (v + next) / 2.0f;
        wrong += mg_f32_to_fp8_e4m3(v) != c;
        wrong += mg_f32_to_fp8_e4m3(-v) != (c | 0x80);
        wrong += mg_f32_to_fp8_e4m3(mid) != fp8_reference_encode(mid);
    }
    CHECKF(wrong == 0, "%zu exact values or midpoints encode wrongly", wrong);
}

static void test_types(void) {
    static const struct {
        mg_dtype type;
        size_t bytes;
        const char *name;
    } types[] = {
        {MG_DTYPE_F32, 4, "f32"},           {MG_DTYPE_BF16, 2, "bf16"}, {MG_DTYPE_F16, 2, "f16"},
        {MG_DTYPE_FP8_E4M3, 1, "fp8_e4m3"}, {MG_DTYPE_U8, 1, "u8"},     {MG_DTYPE_I32, 4, "i32"},
        {MG_DTYPE_U32, 4, "u32"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        CHECK(mg_dtype_bytes(types[i].type) == types[i].bytes);
        CHECK(!strcmp(mg_dtype_name(types[i].type), types[i].name));
    }
    CHECK(mg_dtype_bytes((mg_dtype)40) == 0);
    CHECK(!strcmp(mg_dtype_name((mg_dtype)40), "?"));
}

int main(void) {
    test_seed();
    test_bf16_decode_all();
    test_bf16_edges();
    test_bf16_random();
    test_fp8_decode_all();
    test_fp8_edges();
    test_fp8_random();
    test_types();
    return test_finish();
}
