/* test_moe_gemm_cpu.c - the grouped MoE GEMM (metrale/ops_moe_gemm.h) on the CPU backend
 * against float64 loops written here: every kind, plain and gate_up, awkward sizes, empty and
 * skewed experts, a routing that leaves tail rows out; then bad arguments and bad routing. */
#include "moe_gemm_test_util.h"

/* E4M3 quantization of one group of BF16 values, the rule of metrale/ops_quantize.h: writes
 * the decoded values (code * scale) into q. */
static void quantize_group(const uint16_t *x, uint32_t count, double *q) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < count; i++) {
        float v = fabsf(mg_bf16_to_f32(x[i]));
        amax = v > amax ? v : amax;
    }
    float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (uint32_t i = 0; i < count; i++)
        q[i] = (double)mg_fp8_e4m3_to_f32(mg_f32_to_fp8_e4m3(mg_bf16_to_f32(x[i]) / scale)) * scale;
}

static double weight_value(const moe_data *d, uint32_t e, uint32_t j, uint32_t i) {
    size_t at = ((size_t)e * d->n_w + j) * d->c.k + i;
    if (d->c.kind == MG_MOE_GEMM_BF16)
        return mg_bf16_to_f32(((const uint16_t *)d->weight)[at]);
    double v = mg_fp8_e4m3_to_f32(((const uint8_t *)d->weight)[at]);
    if (d->c.kind == MG_MOE_GEMM_FP8_ROWWISE)
        return v * d->scale[(size_t)e * d->n_w + j];
    uint32_t kb = (d->c.k + 127) / 128, rb = (d->n_w + 127) / 128;
    return v * d->scale[((size_t)e * rb + j / 128) * kb + i / 128];
}

/* The expected output in float64: out [rows, ldc] as doubles (NAN where not computed). */
static double *expected(const moe_data *d) {
    const moe_case *c = &d->c;
    double *want = malloc(sizeof(double) * c->rows * d->ldc);
    double *a = malloc(sizeof(double) * c->k), *prod = malloc(sizeof(double) * d->n_w);
    for (size_t i = 0; i < (size_t)c->rows * d->ldc; i++)
        want[i] = NAN;
    for (uint32_t e = 0; e < c->experts; e++)
        for (int32_t r = d->offsets[e]; r < d->offsets[e + 1]; r++) {
            const uint16_t *x = d->act + (size_t)(d->ids ? d->ids[r] : r) * d->pitch;
            if (c->kind == MG_MOE_GEMM_BF16)
                for (uint32_t i = 0; i < c->k; i++)
                    a[i] = mg_bf16_to_f32(x[i]);
            else if (c->kind == MG_MOE_GEMM_FP8_ROWWISE)
                quantize_group(x, c->k, a);
            else
                for (uint32_t i = 0; i < c->k; i += 128)
                    quantize_group(x + i, c->k - i < 128 ? c->k - i : 128, a + i);
            for (uint32_t j = 0; j < d->n_w; j++) {
                double sum = 0;
                for (uint32_t i = 0; i < c->k; i++)
                    sum += a[i] * weight_value(d, e, j, i);
                prod[j] = sum;
            }
            for (uint32_t j = 0; j < c->n; j++) {
                double v = prod[j];
                if (c->gate_up) { /* the products are BF16 before silu·mul */
                    double g = mg_bf16_to_f32(mg_f32_to_bf16((float)prod[j]));
                    double u = mg_bf16_to_f32(mg_f32_to_bf16((float)prod[c->n + j]));
                    v = g / (1.0 + exp(-g)) * u;
                }
                want[(size_t)r * d->ldc + j] = v;
            }
        }
    free(a);
    free(prod);
    return want;
}

static void run_case(mg_backend *b, const moe_case *c) {
    moe_data d;
    moe_test_make(c, &d);
    moe_device m;
    CHECK_OK(moe_test_upload(b, &d, &m));
    CHECK(m.workspace_bytes == 0); /* the reference needs none */
    uint16_t *out = malloc(d.out_bytes);
    CHECK_OK(moe_test_run(b, NULL, &d, &m, out));
    double *want = expected(&d);
    double largest = 0;
    for (size_t i = 0; i < (size_t)c->rows * d.ldc; i++)
        if (!isnan(want[i]) && fabs(want[i]) > largest)
            largest = fabs(want[i]);
    size_t wrong = 0, untouched_bad = 0;
    for (uint32_t r = 0; r < c->rows; r++)
        for (uint32_t j = 0; j < c->n; j++) {
            size_t at = (size_t)r * d.ldc + j;
            if (!moe_test_row_routed(&d, r)) {
                untouched_bad += out[at] != 0xffff; /* the plain reference leaves them */
                continue;
            }
            double got = mg_bf16_to_f32(out[at]);
            if (!(fabs(got - want[at]) <= 0.016 * fabs(want[at]) + 2e-3 * largest + 1e-6)) {
                if (wrong < 3)
                    fprintf(stderr, "  kind %d gate_up %d: out[%u, %u] = %g, want %g\n", c->kind,
                            c->gate_up, r, j, got, want[at]);
                wrong++;
            }
        }
    /* the padding columns of out rows are never written */
    for (uint32_t r = 0; r + 1 < c->rows; r++)
        for (uint32_t j = c->n; j < d.ldc; j++)
            untouched_bad += out[(size_t)r * d.ldc + j] != 0xffff;
    CHECK(wrong == 0);
    CHECK(untouched_bad == 0);
    free(want);
    free(out);
    moe_test_release(b, &m);
    moe_test_free(&d);
}

static void test_results(mg_backend *b) {
    static const moe_case cases[] = {
        {MG_MOE_GEMM_BF16, false, true, 5, 37, 19, 24, 37, 40, 27, 0, 0},
        {MG_MOE_GEMM_BF16, true, true, 4, 29, 11, 13, 40, 0, 0, 3, 1},
        {MG_MOE_GEMM_BF16, false, false, 6, 21, 25, 9, 16, 24, 0, 2, 2},
        {MG_MOE_GEMM_FP8_ROWWISE, false, true, 3, 23, 9, 32, 160, 168, 40, 0, 0},
        {MG_MOE_GEMM_FP8_ROWWISE, true, true, 5, 31, 13, 24, 48, 0, 0, 4, 2},
        {MG_MOE_GEMM_FP8_BLOCKSCALED, false, true, 4, 33, 17, 144, 272, 0, 150, 0, 1},
        {MG_MOE_GEMM_FP8_BLOCKSCALED, true, false, 3, 19, 19, 72, 144, 0, 0, 1, 0},
        {MG_MOE_GEMM_BF16, false, true, 1, 1, 1, 1, 1, 8, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(b, &cases[i]);
}

/* One bad call: the expected status and a needle of its message, nothing written. */
#define EXPECT_BAD(setup, status, needle)                                                          \
    do {                                                                                           \
        mg_moe_gemm_desc dd = good_d;                                                              \
        mg_moe_gemm_tensors tt = good_t;                                                           \
        setup;                                                                                     \
        CHECK_STATUS(mg_moe_gemm(b, NULL, &dd, &tt), status);                                      \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

static void test_bad_arguments(mg_backend *b) {
    moe_case c = {MG_MOE_GEMM_FP8_BLOCKSCALED, false, true, 4, 16, 8, 32, 128, 0, 0, 0, 0};
    moe_data d;
    moe_test_make(&c, &d);
    moe_device m;
    CHECK_OK(moe_test_upload(b, &d, &m));
    const mg_moe_gemm_desc good_d = moe_test_desc(&d);
    const mg_moe_gemm_tensors good_t = moe_test_tensors(&m);
    uint16_t *poison = malloc(d.out_bytes), *after = malloc(d.out_bytes);
    memset(poison, 0xff, d.out_bytes);
    CHECK_OK(mg_copy_h2d(b, m.out, poison, d.out_bytes));

    CHECK_STATUS(mg_moe_gemm(b, NULL, NULL, &good_t), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL descriptor");
    CHECK_STATUS(mg_moe_gemm(b, NULL, &good_d, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_moe_gemm(NULL, NULL, &good_d, &good_t), MG_ERR_INVALID_ARGUMENT);
    EXPECT_BAD(dd.kind = (mg_moe_gemm_kind)7, MG_ERR_INVALID_ARGUMENT, "unknown kind 7");
    EXPECT_BAD(dd.experts = 0, MG_ERR_INVALID_ARGUMENT, "experts=0");
    EXPECT_BAD(dd.experts = 257, MG_ERR_INVALID_ARGUMENT, "experts=257");
    EXPECT_BAD(dd.rows = 0, MG_ERR_INVALID_ARGUMENT, "must all be >= 1");
    EXPECT_BAD(dd.k = 120, MG_ERR_INVALID_ARGUMENT, "multiples of 16");
    EXPECT_BAD(dd.n = 36, MG_ERR_INVALID_ARGUMENT, "multiples of 16");
    EXPECT_BAD(dd.act_pitch = 132, MG_ERR_INVALID_ARGUMENT, "act_pitch=132");
    EXPECT_BAD(dd.ldc = 31, MG_ERR_INVALID_ARGUMENT, "ldc=31");
    EXPECT_BAD(dd.kind = MG_MOE_GEMM_BF16, MG_ERR_INVALID_ARGUMENT, "weight_scale must be 0");
    EXPECT_BAD(tt.weight_scale = 0, MG_ERR_INVALID_ARGUMENT, "weight_scale");
    EXPECT_BAD(tt.sorted_token_ids = 0, MG_ERR_INVALID_ARGUMENT, "act_rows=8 must be >= rows=16");
    EXPECT_BAD(tt.out = m.act, MG_ERR_INVALID_ARGUMENT, "out");
    EXPECT_BAD(tt.weight = m.weight + 8, MG_ERR_INVALID_ARGUMENT, "weight");
    EXPECT_BAD(dd.act_rows = 9, MG_ERR_INVALID_ARGUMENT, "act");
    EXPECT_BAD(tt.expert_offsets = 0, MG_ERR_INVALID_ARGUMENT, "expert_offsets");
    /* a gate_up call reads twice the weight rows: this weight is too small */
    EXPECT_BAD(dd.gate_up = true, MG_ERR_INVALID_ARGUMENT, "weight");
    CHECK_OK(mg_copy_d2h(b, after, m.out, d.out_bytes));
    CHECK(memcmp(after, poison, d.out_bytes) == 0);

    /* bad routing: the reference names the entry */
    int32_t offsets[5];
    memcpy(offsets, d.offsets, sizeof offsets);
    int32_t bad[5] = {0, 9, 4, 12, 16};
    CHECK_OK(mg_copy_h2d(b, m.offsets, bad, sizeof bad));
    EXPECT_BAD((void)0, MG_ERR_INVALID_ARGUMENT, "decrease at expert 1");
    int32_t past[5] = {0, 4, 8, 12, 17};
    CHECK_OK(mg_copy_h2d(b, m.offsets, past, sizeof past));
    EXPECT_BAD((void)0, MG_ERR_INVALID_ARGUMENT, "at most rows = 16");
    CHECK_OK(mg_copy_h2d(b, m.offsets, offsets, sizeof offsets));
    int32_t id = 8;
    CHECK_OK(mg_copy_h2d(b, m.ids + 4 * 5, &id, 4));
    EXPECT_BAD((void)0, MG_ERR_INVALID_ARGUMENT, "sorted_token_ids[5] = 8");

    size_t bytes = 1;
    CHECK_STATUS(mg_moe_gemm_workspace_bytes(b, NULL, &bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_moe_gemm_workspace_bytes(b, &good_d, &bytes));
    CHECK(bytes == 0);
    free(poison);
    free(after);
    moe_test_release(b, &m);
    moe_test_free(&d);
}

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    if (mg_backend_open(MG_BACKEND_CPU, 0, &b) != MG_OK) {
        fprintf(stderr, "FAIL: cpu backend: %s\n", mg_last_error());
        return 1;
    }
    test_results(b);
    test_bad_arguments(b);
    mg_backend_close(b);
    return test_finish();
}
