/* test_quantize_cpu.c - the CPU reference of the device FP8 quantizer (an internal test: it
 * calls src/ops/quantize/fp8_quantize_reference.h directly): the reference against the host
 * quantizers of metrale/ops_gemm.h on random shapes with row gaps; the special-value rule in
 * the host quantizers themselves; the scale and output sizes; the CPU kernels refusing launches
 * whose buffers are too small; spans that overflow. The "quantize" check group (cli_check_cpu)
 * covers the public op on the CPU backend. Runs without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_quantize_reference.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_quantize.h"
#include "metrale/status.h"
#include "utils_test_support.h" /* CHECKF; test_util.h */

#define POISON 0xa5

static uint32_t rng_below(uint32_t n) {
    return (uint32_t)(test_rand() % n);
}

/* [rows, pitch] BF16, random with a per-row magnitude; the gap columns hold a huge value that
 * would show if they were read. */
static uint16_t *random_input(uint32_t rows, uint32_t cols, uint32_t pitch) {
    uint16_t *in = malloc((size_t)rows * pitch * sizeof *in);
    for (uint32_t r = 0; r < rows; r++) {
        float magnitude = ldexpf(1.0f, (int)rng_below(40) - 20);
        for (uint32_t c = 0; c < pitch; c++) {
            float unit = (float)(test_rand() >> 40) * 0x1p-23f - 1.0f;
            in[(size_t)r * pitch + c] = c < cols ? mg_f32_to_bf16(unit * magnitude) : 0x7f00;
        }
    }
    return in;
}

static void *poisoned(size_t bytes) {
    void *p = malloc(bytes);
    memset(p, POISON, bytes);
    return p;
}

/* ------------------------------------------------------------------ reference vs host */

static void test_reference_matches_host_quantizers(void) {
    for (int trial = 0; trial < 40; trial++) {
        mg_fp8_quant_desc d = {.mode = (mg_fp8_quant_mode)(trial % 4),
                               .rows = 1 + rng_below(70),
                               .cols = 8 * (1 + rng_below(80))};
        d.in_pitch = trial % 3 ? d.cols + 8 * rng_below(4) : 0;
        if (d.mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT)
            d.rows_pad = mg_fp8_rows_padded(d.rows) + 4 * rng_below(2);
        uint32_t pitch = d.in_pitch ? d.in_pitch : d.cols, blocks = mg_fp8_k_blocks(d.cols);
        uint16_t *in = random_input(d.rows, d.cols, pitch);
        uint16_t *dense = malloc((size_t)d.rows * d.cols * sizeof *dense);
        for (uint32_t r = 0; r < d.rows; r++)
            memcpy(dense + (size_t)r * d.cols, in + (size_t)r * pitch, d.cols * sizeof *dense);
        size_t code_bytes = mg_fp8_quant_output_bytes(&d),
               scale_count = mg_fp8_quant_scale_count(&d);
        uint8_t *codes = poisoned(code_bytes), *want_codes = calloc(code_bytes, 1);
        float *scales = poisoned(scale_count * 4), *want_scales = calloc(scale_count, 4);
        float *natural = malloc((size_t)d.rows * blocks * 4);
        mg_fp8_quantize_reference(&d, in, codes, scales);
        mg_status st = MG_OK;
        switch (d.mode) {
        case MG_FP8_QUANT_TENSOR:
            st = mg_fp8_quantize_tensorwise(dense, d.rows, d.cols, want_codes, want_scales);
            break;
        case MG_FP8_QUANT_ROW:
            st = mg_fp8_quantize_rowwise(dense, d.rows, d.cols, want_codes, want_scales);
            break;
        case MG_FP8_QUANT_1X128:
            st = mg_fp8_quantize_1x128(dense, d.rows, d.cols, want_codes, want_scales);
            break;
        case MG_FP8_QUANT_1X128_GEMM_LAYOUT: /* the transposed layout, padding left zero */
            st = mg_fp8_quantize_1x128(dense, d.rows, d.cols, want_codes, natural);
            for (uint32_t r = 0; r < d.rows; r++)
                for (uint32_t g = 0; g < blocks; g++)
                    want_scales[mg_fp8_block_scale_index(MG_FP8_BLOCK_1X128, d.rows_pad, d.cols, r,
                                                         g)] = natural[(size_t)r * blocks + g];
            break;
        }
        CHECKF(st == MG_OK, "host quantizer: %s", mg_last_error());
        CHECKF(memcmp(codes, want_codes, code_bytes) == 0,
               "mode %d rows %u cols %u pitch %u: codes differ from the host quantizer", d.mode,
               d.rows, d.cols, pitch);
        CHECKF(memcmp(scales, want_scales, scale_count * 4) == 0,
               "mode %d rows %u cols %u pitch %u: scales differ from the host quantizer", d.mode,
               d.rows, d.cols, pitch);
        free(in), free(dense), free(codes), free(want_codes), free(scales), free(want_scales);
        free(natural);
    }
}

/* ------------------------------------------------------------------ special values */

/* The rule every quantizer shares (fp8_quantize_host.h), seen through the public host
 * quantizer: infinities are clipped and left out of the amax, NaN keeps its sign, a group
 * without finite non-zero values has scale 1. */
static void test_special_values_in_host_quantizer(void) {
    /* -3.5 / (7 / 448) = -224 is code 0xf6; 7 is the amax and becomes 448. */
    const uint16_t in[2][8] = {
        {0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x8000, 0, mg_f32_to_bf16(-3.5f), mg_f32_to_bf16(7.0f)},
        {0x7f80, 0xff80, 0x7f80, 0x7fc0, 0, 0x8000, 0xff80, 0xffc0},
    };
    uint8_t codes[16];
    float scales[2];
    CHECK_OK(mg_fp8_quantize_rowwise(&in[0][0], 2, 8, codes, scales));
    CHECKF(scales[0] == 7.0f / 448.0f, "row 0 scale %a: the amax must be 7, not inf", scales[0]);
    CHECKF(scales[1] == 1.0f, "row 1 (infinities, NaN, zeros) scale %g, expected 1", scales[1]);
    static const uint8_t want[16] = {0x7e, 0xfe, 0x7f, 0xff, 0x80, 0x00, 0xf6, 0x7e,
                                     0x7e, 0xfe, 0x7e, 0x7f, 0x00, 0x80, 0xfe, 0xff};
    for (int i = 0; i < 16; i++)
        CHECKF(codes[i] == want[i], "element %d: code 0x%02x, expected 0x%02x", i, codes[i],
               want[i]);
    float tensor_scale;
    CHECK_OK(mg_fp8_quantize_tensorwise(&in[0][0], 2, 8, codes, &tensor_scale));
    CHECKF(tensor_scale == 7.0f / 448.0f, "tensor scale %a", tensor_scale);
}

/* ------------------------------------------------------------------ sizes */

static void test_sizes(void) {
    mg_fp8_quant_desc d = {.mode = MG_FP8_QUANT_TENSOR, .rows = 5, .cols = 264};
    CHECK(mg_fp8_quant_scale_count(&d) == 1 && mg_fp8_quant_output_bytes(&d) == 5 * 264);
    d.mode = MG_FP8_QUANT_ROW;
    CHECK(mg_fp8_quant_scale_count(&d) == 5);
    d.mode = MG_FP8_QUANT_1X128; /* L = 3 */
    CHECK(mg_fp8_quant_scale_count(&d) == 15 && mg_fp8_quant_output_bytes(&d) == 5 * 264);
    d.mode = MG_FP8_QUANT_1X128_GEMM_LAYOUT;
    d.rows_pad = 8;
    CHECK(mg_fp8_quant_scale_count(&d) == 24 && mg_fp8_quant_output_bytes(&d) == 8 * 264);
    d.mode = (mg_fp8_quant_mode)9;
    CHECK(mg_fp8_quant_scale_count(&d) == 0 && mg_fp8_quant_output_bytes(&d) == 0);
    CHECK(mg_fp8_quant_scale_count(NULL) == 0 && mg_fp8_quant_output_bytes(NULL) == 0);
    d = (mg_fp8_quant_desc){
        .mode = MG_FP8_QUANT_1X128_GEMM_LAYOUT, .rows = 9, .cols = 264, .rows_pad = 12};
    mg_fp8_quant_1x128_layout layout = mg_fp8_quant_1x128_layout_of(&d);
    CHECK(layout.rows_out == 12 && layout.row_stride == 1 && layout.block_stride == 12);
    d.mode = MG_FP8_QUANT_1X128;
    layout = mg_fp8_quant_1x128_layout_of(&d);
    CHECK(layout.rows_out == 9 && layout.row_stride == 3 && layout.block_stride == 1);
}

/* ------------------------------------------------------------------ CPU kernels and spans */

/* A launch of the CPU kernel whose buffers are too small, or whose argument list is wrong, is
 * an error naming the kernel; nothing is written. */
static void test_cpu_kernels_check_launches(void) {
    mg_backend *b = NULL;
    if (mg_backend_open(MG_BACKEND_CPU, 6, &b) != MG_OK) {
        CHECK(0);
        return;
    }
    mg_fp8_quantize_cpu_kernels_register();
    const uint32_t rows = 4, cols = 256;
    mg_devptr in = 0, out = 0, scales = 0;
    CHECK_OK(mg_alloc(b, (size_t)rows * cols * 2, &in));
    CHECK_OK(mg_alloc(b, (size_t)rows * cols, &out));
    CHECK_OK(mg_alloc(b, 64, &scales));
    CHECK_OK(mg_memset(b, out, POISON, (size_t)rows * cols));
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", MG_FP8_QUANTIZE_KERNEL_1X128, &k));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){32, 1, 1}, 0);
    mg_launch_arg_ptr(&l, in);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_ptr(&l, scales);
    const uint32_t args[] = {rows, rows + 4, cols, cols, 1, rows + 4}; /* rows_out overruns out */
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++)
        mg_launch_arg_u32(&l, args[i]);
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("fp8_quantize_1x128");
    mg_launch_clear_args(&l);
    mg_launch_arg_ptr(&l, in);
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("arguments");
    /* Strides that reach far past the scales are refused. */
    mg_launch_clear_args(&l);
    mg_launch_arg_ptr(&l, in);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_ptr(&l, scales);
    const uint32_t huge[] = {rows, rows, cols, cols, 0xffffffffu, 0xffffffffu};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++)
        mg_launch_arg_u32(&l, huge[i]);
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    unsigned char host[4 * 256];
    CHECK_OK(mg_copy_d2h(b, host, out, sizeof host));
    for (size_t i = 0; i < sizeof host; i++)
        if (host[i] != POISON) {
            CHECKF(0, "a refused launch wrote out[%zu]", i);
            break;
        }
    /* The op refuses shapes whose input span does not fit the address space. */
    mg_fp8_quant_desc d = {
        .mode = MG_FP8_QUANT_ROW, .rows = 0xffffffffu, .cols = 8, .in_pitch = 0xfffffff8u};
    CHECK_STATUS(mg_fp8_quantize(b, NULL, &d, in, out, scales), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_backend_close(b));
}

int main(void) {
    test_seed();
    test_reference_matches_host_quantizers();
    test_special_values_in_host_quantizer();
    test_sizes();
    test_cpu_kernels_check_launches();
    return test_finish();
}
