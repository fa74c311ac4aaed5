/*
 * fill_test_body.h - the checks of mg_fill_uniform_bf16, mg_uniform_bf16_host and mg_amax_bf16
 * (metrale/ops_elementwise.h) on one backend, shared by test_fill_cpu.c and test_fill_cuda.c:
 * every value against SplitMix64 and the FP32 steps written out here again (an independent
 * statement of the definition), at awkward counts and offsets, the counter wrapping past 2^64,
 * outputs poisoned first with guard bytes after them; the amax of data with NaN, infinities,
 * signed zeros and the largest magnitude negative; and the refusals, which write nothing.
 */
#ifndef METRALE_FILL_TEST_BODY_H
#define METRALE_FILL_TEST_BODY_H

#include <math.h>

#include "metrale/dtype.h"
#include "metrale/ops_elementwise.h"
#include "test_util.h"

static uint64_t fill_test_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The definition: u from the top 24 bits, then one rounded product and one rounded sum. */
static uint16_t fill_test_value(uint64_t counter, float offset, float scale) {
    const float u = (float)(double)(fill_test_mix(counter) >> 40) / 8388608.0f - 1.0f;
    volatile float product = scale * u;
    volatile float sum = offset + product;
    return mg_f32_to_bf16(sum);
}

#define FILL_GUARD 64 /* poisoned bytes after each output */

static void fill_test_case(mg_backend *b, uint64_t count, uint64_t counter, float offset,
                           float scale, size_t at) {
    const size_t bytes = at + (size_t)count * 2 + FILL_GUARD;
    mg_devptr buf = 0;
    uint16_t *got = malloc(bytes), *host = malloc((size_t)count * 2);
    CHECK(got && host);
    CHECK_OK(mg_alloc(b, bytes, &buf));
    if (!got || !host || !buf)
        goto done;
    CHECK_OK(mg_memset(b, buf, 0xff, bytes));
    CHECK_OK(mg_fill_uniform_bf16(b, NULL, count, counter, offset, scale, buf + at));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    CHECK_OK(mg_copy_d2h(b, got, buf, bytes));
    mg_uniform_bf16_host(counter, offset, scale, count, host);
    size_t wrong = 0, wrong_host = 0, guard = 0;
    const uint16_t *values = got + at / 2;
    for (uint64_t i = 0; i < count; i++) {
        const uint16_t want = fill_test_value(counter + i, offset, scale);
        wrong += values[i] != want;
        wrong_host += host[i] != want;
        if (values[i] != want && wrong <= 3)
            fprintf(stderr, "FAIL fill count=%llu counter=%llu [%llu]: 0x%04x, want 0x%04x\n",
                    (unsigned long long)count, (unsigned long long)counter, (unsigned long long)i,
                    values[i], want);
    }
    for (size_t i = 0; i < at / 2; i++)
        guard += got[i] != 0xffff;
    for (size_t i = 0; i < FILL_GUARD / 2; i++)
        guard += values[count + i] != 0xffff;
    CHECK(wrong == 0);
    CHECK(wrong_host == 0);
    CHECK(guard == 0);
done:
    if (buf)
        mg_free(b, buf);
    free(got);
    free(host);
}

/* amax of `x` [count] (host data) on b, out poisoned first. */
static float fill_test_amax(mg_backend *b, const uint16_t *x, uint64_t count) {
    mg_devptr dx = 0, out = 0;
    float got = NAN;
    CHECK_OK(mg_alloc(b, (size_t)count * 2, &dx));
    CHECK_OK(mg_alloc(b, 4, &out));
    if (dx && out) {
        CHECK_OK(mg_copy_h2d(b, dx, x, (size_t)count * 2));
        CHECK_OK(mg_memset(b, out, 0xff, 4));
        CHECK_OK(mg_amax_bf16(b, NULL, count, dx, out));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
        CHECK_OK(mg_copy_d2h(b, &got, out, 4));
    }
    if (dx)
        mg_free(b, dx);
    if (out)
        mg_free(b, out);
    return got;
}

static void amax_test_case(mg_backend *b, uint64_t count) {
    uint16_t *x = malloc((size_t)count * 2);
    CHECK(x != NULL);
    if (!x)
        return;
    float want = 0.0f;
    for (uint64_t i = 0; i < count; i++) {
        const uint64_t r = test_rand();
        /* mostly ordinary values, with NaN, infinities and zeros of both signs mixed in */
        switch (r % 61) {
        case 0:
            x[i] = 0x7fc1;
            break; /* NaN */
        case 1:
            x[i] = 0xff80;
            break; /* -inf */
        case 2:
            x[i] = 0x7f80;
            break; /* +inf */
        case 3:
            x[i] = 0x8000;
            break; /* -0 */
        default:
            x[i] = (uint16_t)(((r >> 8) & 0x8000) | (((r >> 16) % 0x3f00) + 0x0080));
            break;
        }
        const float a = fabsf(mg_bf16_to_f32(x[i]));
        if (isfinite(a) && a > want)
            want = a;
    }
    /* the largest magnitude once, negative, at a random place */
    const uint64_t at = test_rand() % count;
    x[at] = 0xc77f; /* -65280 */
    want = 65280.0f;
    const float got = fill_test_amax(b, x, count);
    CHECK(got == want);
    if (got != want)
        fprintf(stderr, "FAIL amax count=%llu: %g, want %g\n", (unsigned long long)count, got,
                want);
    for (uint64_t i = 0; i < count; i++) /* none finite: +0 */
        x[i] = i % 2 ? 0x7fc0 : 0xff80;
    const float none = fill_test_amax(b, x, count);
    CHECK(none == 0.0f && !signbit(none));
    free(x);
}

static void fill_test_errors(mg_backend *b) {
    mg_devptr buf = 0;
    CHECK_OK(mg_alloc(b, 256, &buf));
    if (!buf)
        return;
    CHECK_OK(mg_memset(b, buf, 0xff, 256));
    CHECK_STATUS(mg_fill_uniform_bf16(b, NULL, 0, 1, 0.0f, 1.0f, buf), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("count=0");
    CHECK_STATUS(mg_fill_uniform_bf16(b, NULL, 8, 1, 0.0f, 1.0f, buf + 2), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    CHECK_STATUS(mg_fill_uniform_bf16(b, NULL, 8, 1, NAN, 1.0f, buf), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("finite");
    CHECK_STATUS(mg_fill_uniform_bf16(b, NULL, 8, 1, 0.0f, INFINITY, buf), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_fill_uniform_bf16(b, NULL, 1000, 1, 0.0f, 1.0f, buf),
                 MG_ERR_INVALID_ARGUMENT); /* past the allocation */
    CHECK_STATUS(mg_fill_uniform_bf16(NULL, NULL, 8, 1, 0.0f, 1.0f, buf), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_amax_bf16(b, NULL, 0, buf, buf + 128), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("count=0");
    CHECK_STATUS(mg_amax_bf16(b, NULL, 64, buf, buf + 64), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_amax_bf16(b, NULL, 8, buf, buf + 130), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    CHECK_STATUS(mg_amax_bf16(b, NULL, 8, buf + 8, buf + 128), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    uint8_t after[256];
    CHECK_OK(mg_copy_d2h(b, after, buf, 256));
    size_t touched = 0;
    for (size_t i = 0; i < 256; i++)
        touched += after[i] != 0xff;
    CHECK(touched == 0);
    mg_free(b, buf);
}

/* Everything above on b. */
static void fill_test_run(mg_backend *b) {
    static const uint64_t counts[] = {1, 7, 8, 9, 15, 17, 4099, 65537, 1000003};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        const uint64_t counter = test_rand();
        const float offset = i % 3 == 0 ? 1.0f : 0.0f;
        const float scale = (i % 2 ? -1.0f : 1.0f) * ldexpf(1.0f, (int)(test_rand() % 12) - 8);
        fill_test_case(b, counts[i], counter, offset, scale, 16 * (size_t)(i % 3));
    }
    /* the counter wraps past 2^64 inside the tensor */
    fill_test_case(b, 100, UINT64_MAX - 40, 0.0f, 0.02f, 0);
    /* the forward model's scales: a matrix entry and a norm weight */
    fill_test_case(b, 4096 + 3, 0x1234567890abcdefull, 0.0f, 0.0221f, 0);
    fill_test_case(b, 2048, 42, 1.0f, 0.1f, 0);
    static const uint64_t amax_counts[] = {1, 9, 4097, 300007};
    for (size_t i = 0; i < sizeof amax_counts / sizeof *amax_counts; i++)
        amax_test_case(b, amax_counts[i]);
    fill_test_errors(b);
}

#endif
