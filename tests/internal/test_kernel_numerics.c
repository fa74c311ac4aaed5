/*
 * test_kernel_numerics.c - the kernels' numeric headers (kernels/cuda/common/bf16.cuh,
 * f16.cuh, fp8_e4m3.cuh, fp4_e2m1.cuh) compiled as host code and compared bit for bit with the
 * library's conversions (src/core/dtype.c, mg_nvfp4_e2m1_to_f32): every BF16, FP16, E4M3 and
 * E2M1 code; for the encoders every BF16, FP16 and E4M3 value, the midpoints between neighbours and
 * one float either side of each, the specials, and a large sample of random float bit patterns. The
 * device builds of the same functions differ only where the headers say (the hardware conversions,
 * with NaN redone), which this CPU test cannot reach.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.cuh"
#include "f16.cuh"
#include "fp4_e2m1.cuh"
#include "fp8_e4m3.cuh"
#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "test_util.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Equal bits, or both NaN with equal bits (NaN payloads are part of the rule). */
static size_t bf16_encode_mismatches(uint32_t u) {
    float f = float_of(u);
    return mg_num_f32_to_bf16(f) != mg_f32_to_bf16(f);
}

static size_t f16_encode_mismatches(uint32_t u) {
    float f = float_of(u);
    return mg_num_f32_to_f16(f) != mg_f32_to_f16(f);
}

static size_t fp8_encode_mismatches(uint32_t u) {
    float f = float_of(u);
    return mg_num_f32_to_fp8_e4m3(f) != mg_f32_to_fp8_e4m3(f);
}

/* Every float near `u`: it, one ulp either side, and (toward zero) the next value. */
static size_t around(uint32_t u, size_t (*mismatches)(uint32_t)) {
    size_t bad = mismatches(u) + mismatches(u + 1u);
    if (u & 0x7fffffffu)
        bad += mismatches(u - 1u);
    return bad;
}

static void test_bf16(void) {
    size_t decode_bad = 0, encode_bad = 0, pack_bad = 0;
    for (uint32_t code = 0; code < 0x10000u; code++) {
        float want = mg_bf16_to_f32((uint16_t)code);
        decode_bad += bits_of(mg_num_bf16_to_f32(code)) != bits_of(want);
        decode_bad += bits_of(mg_num_bf16_low(code | 0xabcd0000u)) != bits_of(want);
        decode_bad += bits_of(mg_num_bf16_high(code << 16 | 0x1234u)) != bits_of(want);
        /* the value itself, and the midpoint to the next code (round to even decides) */
        uint32_t u = code << 16;
        encode_bad += around(u, bf16_encode_mismatches);
        encode_bad += around(u | 0x8000u, bf16_encode_mismatches);
    }
    for (int i = 0; i < (1 << 22); i++) {
        uint64_t r = test_rand();
        uint32_t a = (uint32_t)r, b = (uint32_t)(r >> 32);
        encode_bad += bf16_encode_mismatches(a);
        uint32_t want =
            (uint32_t)mg_f32_to_bf16(float_of(a)) | (uint32_t)mg_f32_to_bf16(float_of(b)) << 16;
        pack_bad += mg_num_bf16_pack(float_of(a), float_of(b)) != want;
    }
    CHECK(decode_bad == 0);
    CHECK(encode_bad == 0);
    CHECK(pack_bad == 0);
    /* the rule in words: nearest even, quiet NaN with its sign, infinity kept */
    CHECK(mg_num_f32_to_bf16(float_of(0x3f808000u)) == 0x3f80u); /* tie, even below */
    CHECK(mg_num_f32_to_bf16(float_of(0x3f818000u)) == 0x3f82u); /* tie, even above */
    CHECK(mg_num_f32_to_bf16(float_of(0xff800001u)) == 0xffc0u); /* signalling -NaN */
    CHECK(mg_num_f32_to_bf16(INFINITY) == 0x7f80u);
    CHECK(mg_num_f32_to_bf16(float_of(0x7f7fffffu)) == 0x7f80u); /* FLT_MAX rounds up */
}

static void test_f16(void) {
    size_t decode_bad = 0, encode_bad = 0;
    for (uint32_t code = 0; code < 0x10000u; code++) {
        float want = mg_f16_to_f32((uint16_t)code), got = mg_num_f16_to_f32(code | 0x5a5a0000u);
        decode_bad += bits_of(got) != bits_of(want);
        if (isnan(want))
            continue;
        /* the value and the midpoint to the next code (round to even decides) */
        encode_bad += around(bits_of(want), f16_encode_mismatches);
        if ((code & 0x7fffu) < 0x7bffu) {
            float next = mg_f16_to_f32((uint16_t)(code + 1));
            encode_bad += around(bits_of((want + next) / 2), f16_encode_mismatches);
        }
    }
    const float specials[] = {65504.0f, 65519.0f, 65520.0f, 1e30f,    INFINITY,
                              NAN,      -NAN,     0x1p-24f, 0x1p-25f, 0x1.8p-25f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        encode_bad += around(bits_of(specials[i]), f16_encode_mismatches);
    for (int i = 0; i < (1 << 22); i++) {
        uint64_t r = test_rand();
        encode_bad += f16_encode_mismatches((uint32_t)r);
        /* magnitudes where FP16 lives: exponents 2^-26 .. 2^16 */
        uint32_t narrow = (uint32_t)(r >> 32);
        narrow = (narrow & 0x807fffffu) | ((101u + (narrow >> 23) % 43u) << 23);
        encode_bad += f16_encode_mismatches(narrow);
    }
    CHECK(decode_bad == 0);
    CHECK(encode_bad == 0);
    CHECK(mg_num_f32_to_f16(float_of(0xff800001u)) == 0xfe00u); /* signalling -NaN, quieted */
    CHECK(mg_num_f32_to_f16(65520.0f) == 0x7c00u && mg_num_f32_to_f16(0x1p-25f) == 0);
}

static void test_fp8(void) {
    size_t decode_bad = 0, encode_bad = 0;
    for (uint32_t code = 0; code < 0x100u; code++) {
        float got = mg_num_fp8_e4m3_to_f32(code), want = mg_fp8_e4m3_to_f32((uint8_t)code);
        decode_bad += isnan(want) ? !isnan(got) || signbit(got) != signbit(want)
                                  : bits_of(got) != bits_of(want);
        if (isnan(want))
            continue;
        /* the value and the midpoint to the next code, as floats */
        encode_bad += around(bits_of(want), fp8_encode_mismatches);
        if ((code & 0x7fu) < 0x7eu) {
            float next = mg_fp8_e4m3_to_f32((uint8_t)(code + 1));
            encode_bad += around(bits_of((want + next) / 2), fp8_encode_mismatches);
        }
    }
    /* saturation, the infinities, NaN of both signs */
    const float specials[] = {448.0f,  464.0f,  465.0f, 1e30f, INFINITY, -INFINITY,
                              -448.0f, -500.0f, NAN,    -NAN,  0x1p-10f, 0x1p-9f * 7.5f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        encode_bad += around(bits_of(specials[i]), fp8_encode_mismatches);
    for (int i = 0; i < (1 << 22); i++) {
        uint64_t r = test_rand();
        encode_bad += fp8_encode_mismatches((uint32_t)r);
        /* magnitudes where E4M3 lives: exponents 2^-12 .. 2^9 */
        uint32_t narrow = (uint32_t)(r >> 32);
        narrow = (narrow & 0x807fffffu) | ((115u + (narrow >> 23) % 22u) << 23);
        encode_bad += fp8_encode_mismatches(narrow);
    }
    /* four codes of a word, lowest byte first */
    for (uint32_t i = 0; i < 0x10000u; i++) {
        uint32_t word = (uint32_t)test_rand();
        float four[4];
        mg_num_fp8x4_e4m3_to_f32(word, four);
        for (int b = 0; b < 4; b++) {
            float want = mg_fp8_e4m3_to_f32((uint8_t)(word >> (8 * b)));
            decode_bad += isnan(want) ? !isnan(four[b]) || signbit(four[b]) != signbit(want)
                                      : bits_of(four[b]) != bits_of(want);
        }
    }
    CHECK(decode_bad == 0);
    CHECK(encode_bad == 0);
    CHECK(mg_num_f32_to_fp8_e4m3(-NAN) == 0xffu);
    CHECK(mg_num_f32_to_fp8_e4m3(INFINITY) == 0x7eu);
    CHECK(mg_num_finite_magnitude(-3.0f) == 3.0f);
    CHECK(mg_num_finite_magnitude(-INFINITY) == 0.0f && mg_num_finite_magnitude(NAN) == 0.0f);
}

/* The E2M1 magnitude nearest to m, ties to the even code; NaN and m <= 0.25 to 0. */
static uint32_t e2m1_nearest(float m) {
    static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (!(m > 0.0f))
        return 0;
    uint32_t best = 0;
    for (uint32_t c = 1; c < 8; c++) {
        float d = fabsf(m - magnitude[c]), best_d = fabsf(m - magnitude[best]);
        if (d < best_d || (d == best_d && !(c & 1u)))
            best = c;
    }
    return best;
}

static void test_fp4(void) {
    size_t decode_bad = 0, encode_bad = 0;
    for (uint32_t nibble = 0; nibble < 16; nibble++)
        decode_bad +=
            bits_of(mg_num_e2m1_to_f32(nibble)) != bits_of(mg_nvfp4_e2m1_to_f32((uint8_t)nibble));
    /* every float from 0 to above 6 whose low mantissa bits are zero (2^16 steps per binade
     * cover every midpoint exactly), and one float either side of each midpoint */
    for (uint32_t u = 0; u <= 0x40e00000u; u += 0x80u)
        encode_bad += mg_num_e2m1_magnitude_code(float_of(u)) != e2m1_nearest(float_of(u));
    const float midpoints[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (size_t i = 0; i < sizeof midpoints / sizeof midpoints[0]; i++)
        for (int d = -1; d <= 1; d++) {
            float m = float_of(bits_of(midpoints[i]) + (uint32_t)d);
            encode_bad += mg_num_e2m1_magnitude_code(m) != e2m1_nearest(m);
        }
    CHECK(decode_bad == 0);
    CHECK(encode_bad == 0);
    CHECK(mg_num_e2m1_magnitude_code(NAN) == 0 && mg_num_e2m1_magnitude_code(INFINITY) == 7);
}

int main(void) {
    test_seed();
    test_bf16();
    test_f16();
    test_fp8();
    test_fp4();
    return test_finish();
}
