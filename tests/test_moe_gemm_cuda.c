/* test_moe_gemm_cuda.c - the grouped MoE GEMM (metrale/ops_moe_gemm.h) on CUDA (CUTLASS's
 * Hopper grouped GEMMs) against the CPU backend's reference on the same random inputs: every
 * kind, plain and gate_up, skewed and empty experts, tail rows left out of the routing; then a
 * call captured once and replayed with a different routing and inputs, equal to the eager call
 * bit for bit. Outputs are poisoned before every call. Skips (77) without a usable CUDA device
 * or without a CUDA provider of the op (not a Hopper GPU, no plugin); with one, every kind must
 * run (a kind the plugin lacks fails). */
#include "metrale/ops.h"
#include "moe_gemm_test_util.h"
#include "test_cuda_util.h"

static const char *kind_label(mg_moe_gemm_kind kind) {
    return kind == MG_MOE_GEMM_BF16          ? "bf16"
           : kind == MG_MOE_GEMM_FP8_ROWWISE ? "fp8_rowwise"
                                             : "fp8_block";
}

/* Routed rows of `got` against `want` (the CPU's); rows past the routing must still hold the
 * poison in the plain form. */
static size_t compare(const moe_data *d, const uint16_t *got, const uint16_t *want) {
    double largest = 0;
    for (uint32_t r = 0; r < d->c.rows; r++)
        for (uint32_t j = 0; j < d->c.n && moe_test_row_routed(d, r); j++) {
            double w = fabs(mg_bf16_to_f32(want[(size_t)r * d->ldc + j]));
            largest = w > largest ? w : largest;
        }
    size_t wrong = 0;
    for (uint32_t r = 0; r < d->c.rows; r++)
        for (uint32_t j = 0; j < d->c.n; j++) {
            size_t at = (size_t)r * d->ldc + j;
            if (!moe_test_row_routed(d, r)) {
                wrong += !d->c.gate_up && got[at] != 0xffff;
                continue;
            }
            double g = mg_bf16_to_f32(got[at]), w = mg_bf16_to_f32(want[at]);
            if (!(fabs(g - w) <= 0.02 * fabs(w) + 4e-3 * largest)) {
                if (wrong < 3)
                    fprintf(stderr, "  %s gate_up %d: out[%u, %u] = %g, cpu %g\n",
                            kind_label(d->c.kind), d->c.gate_up, r, j, g, w);
                wrong++;
            }
        }
    return wrong;
}

/* Runs `c` on both backends; returns false (a failed check) when CUDA does not support it. */
static bool run_case(mg_backend *cuda, mg_backend *cpu, const moe_case *c) {
    moe_data d;
    moe_test_make(c, &d);
    mg_moe_gemm_desc desc = moe_test_desc(&d);
    size_t ws;
    mg_status st = mg_moe_gemm_workspace_bytes(cuda, &desc, &ws);
    if (st == MG_ERR_UNSUPPORTED || st == MG_ERR_UNAVAILABLE) {
        fprintf(stderr, "FAIL %s: no CUDA kernel: %s\n", kind_label(c->kind), mg_last_error());
        CHECK(false);
        moe_test_free(&d);
        return false;
    }
    moe_device mc, mh;
    CHECK_OK(moe_test_upload(cuda, &d, &mc));
    CHECK_OK(moe_test_upload(cpu, &d, &mh));
    uint16_t *got = malloc(d.out_bytes), *want = malloc(d.out_bytes);
    CHECK_OK(moe_test_run(cuda, NULL, &d, &mc, got));
    CHECK_OK(moe_test_run(cpu, NULL, &d, &mh, want));
    size_t wrong = compare(&d, got, want);
    printf("%s gate_up=%d E=%u rows=%u n=%u k=%u skew=%d: %zu wrong\n", kind_label(c->kind),
           c->gate_up, c->experts, c->rows, c->n, c->k, c->skew, wrong);
    CHECK(wrong == 0);
    free(got);
    free(want);
    moe_test_release(cuda, &mc);
    moe_test_release(cpu, &mh);
    moe_test_free(&d);
    return true;
}

/* Captured once with routing A, replayed after the inputs and routing were replaced by B (same
 * shapes): equal to an eager call on B. */
static void test_capture_replay(mg_backend *cuda, const moe_case *c) {
    moe_data a, bb;
    moe_test_make(c, &a);
    moe_test_make(c, &bb);
    moe_device m;
    CHECK_OK(moe_test_upload(cuda, &a, &m));
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(cuda, &s));
    mg_moe_gemm_desc desc = moe_test_desc(&a);
    mg_moe_gemm_tensors t = moe_test_tensors(&m);
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_moe_gemm(cuda, s, &desc, &t));
    CHECK_OK(mg_graph_end_capture(s, &g));
    /* routing B and its inputs into the same buffers */
    CHECK_OK(mg_copy_h2d(cuda, m.act, bb.act, bb.act_bytes));
    CHECK_OK(mg_copy_h2d(cuda, m.offsets, bb.offsets, ((size_t)c->experts + 1) * 4));
    if (bb.ids)
        CHECK_OK(mg_copy_h2d(cuda, m.ids, bb.ids, (size_t)c->rows * 4));
    CHECK_OK(mg_copy_h2d(cuda, m.weight, bb.weight, bb.weight_bytes));
    if (bb.scale)
        CHECK_OK(mg_copy_h2d(cuda, m.scale, bb.scale, bb.scale_bytes));
    uint16_t *replayed = malloc(bb.out_bytes), *eager = malloc(bb.out_bytes);
    memset(replayed, 0xff, bb.out_bytes);
    CHECK_OK(mg_copy_h2d(cuda, m.out, replayed, bb.out_bytes));
    if (g) {
        CHECK_OK(mg_graph_launch(g, s));
        CHECK_OK(mg_stream_synchronize(s));
    }
    CHECK_OK(mg_copy_d2h(cuda, replayed, m.out, bb.out_bytes));
    CHECK_OK(moe_test_run(cuda, s, &bb, &m, eager));
    size_t differ = 0;
    for (uint32_t r = 0; r < c->rows; r++)
        for (uint32_t j = 0; j < c->n; j++)
            if (moe_test_row_routed(&bb, r) || !c->gate_up)
                differ += replayed[(size_t)r * bb.ldc + j] != eager[(size_t)r * bb.ldc + j];
    printf("%s replay with a new routing: %zu outputs differ from eager\n", kind_label(c->kind),
           differ);
    CHECK(differ == 0);
    if (g)
        CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_stream_destroy(s));
    free(replayed);
    free(eager);
    moe_test_release(cuda, &m);
    moe_test_free(&a);
    moe_test_free(&bb);
}

int main(void) {
    test_seed();
    mg_backend *cuda = cuda_test_open_or_skip("test_moe_gemm_cuda");
    mg_backend *cpu = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &cpu));
    if (!mg_op_supported(cuda, MG_OP_MOE_GEMM)) {
        printf("test_moe_gemm_cuda: skipped: no CUDA provider of moe_gemm here\n");
        return TEST_SKIP_EXIT;
    }
    static const mg_moe_gemm_kind kinds[] = {MG_MOE_GEMM_BF16, MG_MOE_GEMM_FP8_ROWWISE,
                                             MG_MOE_GEMM_FP8_BLOCKSCALED};
    /* {kind, gate_up, ids, experts, rows, act_rows, n, k, act_pitch, ldc, tail, skew} */
    static const moe_case shapes[] = {
        {0, false, true, 8, 301, 97, 272, 400, 408, 280, 0, 0},
        {0, true, true, 6, 263, 131, 136, 528, 0, 0, 5, 1},
        {0, false, false, 16, 150, 150, 208, 256, 0, 216, 3, 2},
        {0, true, true, 128, 700, 90, 96, 2048, 0, 0, 0, 0},
        {0, false, true, 3, 5, 2, 48, 144, 0, 0, 0, 1},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        bool supported = true;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && supported; i++) {
            moe_case c = shapes[i];
            c.kind = kinds[k];
            supported = run_case(cuda, cpu, &c);
        }
        if (supported) {
            moe_case c = shapes[1];
            c.kind = kinds[k];
            test_capture_replay(cuda, &c);
        }
    }
    mg_backend_close(cpu);
    mg_backend_close(cuda);
    return test_finish();
}
