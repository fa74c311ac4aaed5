/*
 * nvfp4_moe_tests.h - the body shared by test_nvfp4_moe_cpu.c and test_nvfp4_moe_cuda.c: the
 * checkpoint importers against a float64 quantization of known weights, dequantized on the
 * backend under test; the size and global-scale helpers; then the "nvfp4_format/" and
 * "moe_routing/" check groups on that backend.
 */
#ifndef METRALE_NVFP4_MOE_TESTS_H
#define METRALE_NVFP4_MOE_TESTS_H

#include <math.h>

#include "check.h"
#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "metrale/ops_moe.h"
#include "test_util.h"

static const double e2m1_magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static double e4m3_value(uint8_t code) { /* codes 0 .. 0x7e */
    int e = (code >> 3) & 0xf, m = code & 7;
    return e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
}

/* Nearest (ties to even code) E4M3 code of s >= 0, saturating. */
static uint8_t e4m3_code(double s) {
    uint8_t best = 0;
    for (uint8_t c = 1; c <= 0x7e; c++) {
        double dc = fabs(e4m3_value(c) - s), db = fabs(e4m3_value(best) - s);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return best;
}

static uint8_t e2m1_code(double m) {
    uint8_t best = 0;
    for (uint8_t c = 1; c < 8; c++) {
        double dc = fabs(e2m1_magnitudes[c] - m), db = fabs(e2m1_magnitudes[best] - m);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return best;
}

/* Known weights W[n][k] = sin-based values of varied magnitude, quantized in float64 the way a
 * checkpoint exporter does (global = amax / (448 * 6), block scale = amax_b / 6 / global), then
 * stored in each convention, imported, dequantized on `b` and compared with the float64
 * dequantization of the same codes (and, loosely, with W itself). */
static void test_importers(mg_backend *b, uint32_t n, uint32_t k) {
    size_t count = (size_t)n * k, pb = count / 2, sb = count / 16;
    double *w = malloc(count * sizeof *w);
    uint8_t *packed = calloc(pb, 1), *scales = malloc(sb);
    uint8_t *imported_p = malloc(pb), *imported_s = malloc(sb);
    float *deq = malloc(count * sizeof *deq);
    CHECK(w && packed && scales && imported_p && imported_s && deq);
    if (!w || !packed || !scales || !imported_p || !imported_s || !deq)
        goto done;
    double amax = 0;
    for (size_t i = 0; i < count; i++) {
        w[i] = sin(0.37 * (double)i + 1.0) * ldexp(1.0, (int)(i / 16 % 9) - 4);
        amax = fmax(amax, fabs(w[i]));
    }
    double global = amax / (448.0 * 6.0);
    for (size_t blk = 0; blk < sb; blk++) {
        double bmax = 0;
        for (int i = 0; i < 16; i++)
            bmax = fmax(bmax, fabs(w[blk * 16 + i]));
        uint8_t s = e4m3_code(bmax / 6.0 / global);
        scales[blk] = s;
        double d = e4m3_value(s) * global;
        for (int i = 0; i < 16; i++) {
            size_t e = blk * 16 + i;
            uint8_t c = s ? e2m1_code(fabs(w[e]) / d) : 0;
            uint8_t nib = (uint8_t)(c | (c && w[e] < 0 ? 8 : 0));
            packed[e / 2] |= (uint8_t)(nib << (e % 2 * 4));
        }
    }
    float modelopt_global = (float)global, ct_global = (float)(1.0 / global);
    for (int convention = 0; convention < 2; convention++) {
        mg_nvfp4_tensor_view weight = {packed, MG_DTYPE_U8, 2, {n, k / 2}};
        mg_nvfp4_tensor_view scale = {scales, MG_DTYPE_FP8_E4M3, 2, {n, k / 16}};
        mg_nvfp4_tensor_view scalar = {
            convention ? &ct_global : &modelopt_global, MG_DTYPE_F32, convention ? 1 : 0, {1, 0}};
        mg_nvfp4_import_info info = {0};
        memset(imported_p, 0xee, pb);
        CHECK_OK(convention ? mg_nvfp4_import_compressed_tensors(
                                  &weight, &scale, &scalar, imported_p, pb, imported_s, sb, &info)
                            : mg_nvfp4_import_modelopt(&weight, &scale, &scalar, imported_p, pb,
                                                       imported_s, sb, &info));
        CHECK(info.n == n && info.k == k);
        CHECK(memcmp(imported_p, packed, pb) == 0 && memcmp(imported_s, scales, sb) == 0);
        /* The multiplier: ModelOpt's as stored, compressed-tensors' the reciprocal. */
        CHECK(fabs(info.global_scale - global) <= global * 0x1p-22);
        CHECK(convention ? info.global_scale == 1.0f / ct_global
                         : info.global_scale == modelopt_global);
        mg_devptr d[4] = {0};
        CHECK_OK(mg_alloc(b, pb, &d[0]));
        CHECK_OK(mg_alloc(b, sb, &d[1]));
        CHECK_OK(mg_alloc(b, 4, &d[2]));
        CHECK_OK(mg_alloc(b, count * 4, &d[3]));
        CHECK_OK(mg_memset(b, d[3], 0xff, count * 4));
        CHECK_OK(mg_copy_h2d(b, d[0], imported_p, pb));
        CHECK_OK(mg_copy_h2d(b, d[1], imported_s, sb));
        CHECK_OK(mg_copy_h2d(b, d[2], &info.global_scale, 4));
        CHECK_OK(mg_nvfp4_dequantize(b, NULL, n, k, d[0], d[1], d[2], MG_DTYPE_F32, d[3]));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
        CHECK_OK(mg_copy_d2h(b, deq, d[3], count * 4));
        int wrong = 0, far = 0;
        for (size_t e = 0; e < count; e++) {
            uint8_t nib = (packed[e / 2] >> (e % 2 * 4)) & 0xf;
            double scale_value = e4m3_value(scales[e / 16]);
            double want = (nib & 8 ? -1 : 1) * e2m1_magnitudes[nib & 7] * scale_value * global;
            if (!(fabs(deq[e] - want) <= fabs(want) * 0x1p-22))
                wrong++;
            if (!(fabs(deq[e] - w[e]) <= 0.26 * fmax(fabs(w[e]), scale_value * global)))
                far++;
        }
        CHECK(wrong == 0);
        CHECK(far == 0);
        if (wrong || far)
            fprintf(stderr,
                    "%s n=%u k=%u: %d values off the float64 dequantization, %d far "
                    "from the weights\n",
                    convention ? "compressed-tensors" : "modelopt", n, k, wrong, far);
        for (int i = 0; i < 4; i++)
            mg_free(b, d[i]);
    }
done:
    free(w), free(packed), free(scales), free(imported_p), free(imported_s), free(deq);
}

/* Importer argument errors: status, a message naming the tensor, nothing written. */
static void test_importer_errors(void) {
    uint8_t packed[64] = {0}, scales[8] = {0}, out[64], out_s[8];
    float g = 0.5f, zero = 0.0f;
    mg_nvfp4_tensor_view w = {packed, MG_DTYPE_U8, 2, {2, 32}};
    mg_nvfp4_tensor_view s = {scales, MG_DTYPE_FP8_E4M3, 2, {2, 4}};
    mg_nvfp4_tensor_view gv = {&g, MG_DTYPE_F32, 0, {0, 0}};
    mg_nvfp4_import_info info;
    memset(out, 0x77, sizeof out);
    CHECK_OK(mg_nvfp4_import_modelopt(&w, &s, &gv, NULL, 0, NULL, 0, &info));
    CHECK(info.n == 2 && info.k == 64 && info.global_scale == 0.5f);
    CHECK_OK(mg_nvfp4_import_compressed_tensors(&w, &s, &gv, NULL, 0, NULL, 0, &info));
    CHECK(info.global_scale == 2.0f);
    mg_nvfp4_tensor_view bad = w;
    bad.shape[1] = 12; /* K = 24 */
    CHECK_STATUS(mg_nvfp4_import_modelopt(&bad, &s, &gv, out, 64, out_s, 8, &info),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("multiple of 16");
    bad = s, bad.shape[1] = 3;
    CHECK_STATUS(mg_nvfp4_import_modelopt(&w, &bad, &gv, out, 64, out_s, 8, &info),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("weight_scale");
    bad = w, bad.dtype = MG_DTYPE_BF16;
    CHECK_STATUS(mg_nvfp4_import_compressed_tensors(&bad, &s, &gv, out, 64, out_s, 8, &info),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("weight_packed");
    bad = gv, bad.data = &zero;
    CHECK_STATUS(mg_nvfp4_import_compressed_tensors(&w, &s, &bad, out, 64, out_s, 8, &info),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("weight_global_scale");
    /* block scales the format never writes, found wherever they are: nothing copied */
    const uint8_t never[3] = {0x80, 0xb8, 0x7f}; /* -0, -1.0, NaN */
    for (int i = 0; i < 3; i++) {
        uint8_t poisoned[8] = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
        poisoned[1 + 3 * i % 7] = never[i];
        bad = s, bad.data = poisoned;
        CHECK_STATUS(mg_nvfp4_import_modelopt(&w, &bad, &gv, out, 64, out_s, 8, &info),
                     MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("weight_scale[");
        bad.dtype = MG_DTYPE_U8; /* the same bytes stored as U8 */
        CHECK_STATUS(mg_nvfp4_import_compressed_tensors(&w, &bad, &gv, out, 64, out_s, 8, &info),
                     MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("sign bit");
    }
    uint8_t largest[8] = {0x7e, 0, 0, 0, 0, 0, 0, 0}; /* 448 and 0 are scales it writes */
    bad = s, bad.data = largest;
    CHECK_OK(mg_nvfp4_import_modelopt(&w, &bad, &gv, NULL, 0, NULL, 0, &info));
    /* the scalar rule the globals and the activation scales share */
    float value = 0.0f, nan_value = NAN, two[2] = {1.0f, 2.0f};
    CHECK_OK(mg_nvfp4_import_scalar(&gv, "input_scale", &value));
    CHECK(value == 0.5f);
    mg_nvfp4_tensor_view one = {&g, MG_DTYPE_F32, 1, {1, 0}};
    CHECK_OK(mg_nvfp4_import_scalar(&one, "input_scale", NULL));
    const mg_nvfp4_tensor_view scalars[4] = {{&zero, MG_DTYPE_F32, 0, {0, 0}},
                                             {&nan_value, MG_DTYPE_F32, 0, {0, 0}},
                                             {two, MG_DTYPE_F32, 1, {2, 0}},
                                             {&g, MG_DTYPE_BF16, 0, {0, 0}}};
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(mg_nvfp4_import_scalar(&scalars[i], "input_scale", &value),
                     MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("input_scale");
    }
    CHECK_STATUS(mg_nvfp4_import_scalar(NULL, "input_scale", &value), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_import_modelopt(&w, &s, &gv, out, 63, out_s, 8, &info),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_nvfp4_import_modelopt(NULL, &s, &gv, out, 64, out_s, 8, &info),
                 MG_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(out[i] == 0x77);
}

/* The host helpers: sizes, the swizzled offset of the reference formula, global scales. */
static void test_helpers(void) {
    CHECK(mg_nvfp4_packed_bytes(3, 48) == 72 && mg_nvfp4_scale_bytes(3, 48) == 9);
    CHECK(mg_nvfp4_packed_bytes(3, 40) == 0 && mg_nvfp4_scale_bytes(3, 40) == 0);
    CHECK(mg_nvfp4_swizzled_scale_bytes(130, 4112) == 256 * 260);
    CHECK(mg_nvfp4_swizzled_scale_bytes(1, 16) == 512);
    CHECK(mg_nvfp4_swizzled_offset(0, 0, 3) == 0);
    CHECK(mg_nvfp4_swizzled_offset(1, 0, 3) == 16);
    CHECK(mg_nvfp4_swizzled_offset(32, 2, 3) == 6);
    CHECK(mg_nvfp4_swizzled_offset(127, 3, 8) == 31 * 16 + 3 * 4 + 3);
    CHECK(mg_nvfp4_swizzled_offset(0, 4, 8) == 512);
    CHECK(mg_nvfp4_swizzled_offset(128, 0, 8) == 1024);
    uint16_t x[2 * 24];
    for (int i = 0; i < 48; i++)
        x[i] = mg_f32_to_bf16(i == 30 ? -5376.0f : (float)i);
    x[5] = 0x7f80;  /* +inf: left out */
    x[20] = 0x9999; /* in the pitch gap of row 0: never read */
    x[18] = 0x7f00;
    x[19] = 0x7f00;
    CHECK(mg_nvfp4_global_scale(x, 2, 16, 24) == 2.0f);
    CHECK(mg_nvfp4_global_scale_from_amax(0.0f) == 1.0f);
    CHECK(mg_nvfp4_global_scale_from_amax(2688.0f) == 1.0f);
    CHECK(mg_nvfp4_e2m1_to_f32(0xf) == -6.0f && mg_nvfp4_e2m1_to_f32(3) == 1.5f);
}

/* Everything above plus both check groups on `b`. */
static int run_nvfp4_moe_tests(mg_backend *b) {
    test_helpers();
    test_importer_errors();
    static const uint32_t shapes[][2] = {{1, 16}, {3, 48}, {130, 4112}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_importers(b, shapes[i][0], shapes[i][1]);
    const char *groups[] = {"nvfp4_format/", "moe_routing/"};
    for (int g = 0; g < 2; g++) {
        int passed = 0, skipped = 0;
        int failed = mg_check_run_all(b, groups[g], stdout, &passed, &skipped);
        CHECK(failed == 0);
        CHECK(passed >= 5);
    }
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}

#endif
