/* test_tp_mlp_cpu.c - the tensor-parallel MLP block (column-parallel gate_up, SiLU-mul,
 * row-parallel down, all-reduce) on two CPU backends equals the block on one, within BF16
 * bounds; and the SiLU-mul op against plain arithmetic. */
#include "metrale/ops_activation.h"
#include "tp_mlp_test_util.h"

/* mg_silu_mul_bf16 with pitches, against the formula computed here, poisoned output. */
static void test_silu_mul(mg_backend *b) {
    const uint32_t rows = 5, cols = 37, in_pitch = 2 * 37 + 3, out_pitch = 41;
    uint16_t in[5 * 77], out[5 * 41];
    comm_fill(MG_DTYPE_BF16, in, sizeof in / 2);
    mg_devptr din, dout;
    CHECK_OK(mg_alloc(b, sizeof in, &din));
    CHECK_OK(mg_alloc(b, sizeof out, &dout));
    CHECK_OK(mg_copy_h2d(b, din, in, sizeof in));
    CHECK_OK(mg_memset(b, dout, 0xff, sizeof out));
    CHECK_OK(mg_silu_mul_bf16(b, NULL, rows, cols, din, in_pitch, dout, out_pitch));
    CHECK_OK(mg_copy_d2h(b, out, dout, sizeof out));
    int bad = 0;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < out_pitch; c++) {
            uint16_t got = out[r * out_pitch + c];
            if (c >= cols) {
                bad += got != 0xffff; /* the pitch padding is never written */
                continue;
            }
            double g = mg_bf16_to_f32(in[r * in_pitch + c]);
            double u = mg_bf16_to_f32(in[r * in_pitch + cols + c]);
            double want = g / (1 + exp(-g)) * u;
            bad += !(fabs(mg_bf16_to_f32(got) - want) <= comm_ulp(MG_DTYPE_BF16, want));
        }
    CHECK(bad == 0);
    CHECK_STATUS(mg_silu_mul_bf16(b, NULL, rows, cols, din, 2 * cols - 1, dout, out_pitch),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("in_pitch");
    CHECK_STATUS(mg_silu_mul_bf16(b, NULL, rows, cols, din, in_pitch, din, out_pitch),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlap");
    CHECK_STATUS(mg_silu_mul_bf16(b, NULL, rows + 1, cols, din, in_pitch, dout, out_pitch),
                 MG_ERR_INVALID_ARGUMENT); /* in overruns its buffer */
    CHECK_STATUS(mg_silu_mul_bf16(b, NULL, 0, cols, din, in_pitch, dout, out_pitch),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_free(b, din));
    CHECK_OK(mg_free(b, dout));
}

int main(void) {
    test_seed();
    mg_backend *b[3];
    for (int r = 0; r < 3; r++)
        if (mg_backend_open(MG_BACKEND_CPU, r, &b[r])) {
            fprintf(stderr, "cannot open CPU device %d: %s\n", r, mg_last_error());
            return 1;
        }
    test_silu_mul(b[0]);
    static const uint32_t tokens[] = {1, 7};
    tp_mlp_check(b, b[2], 72, 200, tokens, 2);
    for (int r = 0; r < 3; r++)
        CHECK_OK(mg_backend_close(b[r]));
    return test_finish();
}
