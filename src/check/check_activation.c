/* check_activation.c - `metrale-gpu check activation`: mg_silu_mul_bf16 on the backend under
 * test against the CPU reference on the same random input of an awkward shape (row pitches
 * wider than the rows, output poisoned first): equal, or one BF16 spacing apart where the
 * device's expf differs from the host's (metrale/ops_activation.h); the pitch padding of the
 * output is never written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"
#include "metrale/dtype.h"
#include "metrale/ops_activation.h"

/* Runs the op on `b` from host `in`, output poisoned, and reads the whole output back. */
static mg_status run_on(mg_backend *b, const uint16_t *in, size_t in_bytes, uint32_t rows,
                        uint32_t cols, uint32_t in_pitch, uint32_t out_pitch, uint16_t *out,
                        size_t out_bytes) {
    mg_devptr din = 0, dout = 0;
    mg_status st = mg_check_upload(b, in, in_bytes, &din);
    if (!st)
        st = mg_check_alloc_poisoned(b, out_bytes, &dout);
    if (!st)
        st = mg_silu_mul_bf16(b, NULL, rows, cols, din, in_pitch, dout, out_pitch);
    if (!st)
        st = mg_stream_synchronize(mg_stream_default(b));
    if (!st)
        st = mg_copy_d2h(b, out, dout, out_bytes);
    mg_free(b, din);
    mg_free(b, dout);
    return st;
}

static void check_silu_mul(mg_check_ctx *ctx, mg_check_result *result) {
    uint64_t rng = mg_check_rng_seed(ctx, "silu_mul");
    const uint32_t rows = 37, cols = 1029, in_pitch = 2 * cols + 7, out_pitch = cols + 3;
    size_t in_bytes = (size_t)rows * in_pitch * 2, out_bytes = (size_t)rows * out_pitch * 2;
    uint16_t *in = malloc(in_bytes), *got = malloc(out_bytes), *want = malloc(out_bytes);
    size_t differ = 0;
    EXPECT(in && got && want, "out of host memory");
    for (size_t i = 0; i < in_bytes / 2; i++) /* |x| < 8: SiLU's whole interesting range */
        in[i] = mg_f32_to_bf16((float)(mg_check_rng_next(&rng) >> 40) * 0x1p-20f - 8.0f);
    OK(run_on(ctx->backend, in, in_bytes, rows, cols, in_pitch, out_pitch, got, out_bytes));
    OK(run_on(ctx->reference, in, in_bytes, rows, cols, in_pitch, out_pitch, want, out_bytes));
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < out_pitch; c++) {
            size_t i = (size_t)r * out_pitch + c;
            uint16_t poison = (uint16_t)(MG_CHECK_POISON * 0x101u);
            if (c >= cols) {
                EXPECT(got[i] == poison, "out[%u, %u] in the pitch padding was written", r, c);
                continue;
            }
            double a = mg_bf16_to_f32(got[i]), b = mg_bf16_to_f32(want[i]);
            int exponent;
            frexp(b, &exponent);
            double spacing = ldexp(1.0, (b == 0 || exponent < -125 ? -125 : exponent) - 8);
            EXPECT(fabs(a - b) <= spacing, "out[%u, %u] = %g, reference %g", r, c, a, b);
            differ += got[i] != want[i];
        }
    result->error = (double)differ / ((double)rows * cols);
    snprintf(result->detail, sizeof result->detail,
             "%ux%u, pitches %u/%u: %zu outputs one BF16 spacing from the reference", rows, cols,
             in_pitch, out_pitch, differ);
    PASS();
done:
    free(in);
    free(got);
    free(want);
}

const mg_check_case mg_checks_activation[] = {
    {"activation", "silu_mul", check_silu_mul},
    {NULL, NULL, NULL},
};
