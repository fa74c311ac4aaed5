/*
 * test_cuda_gemm_cutlass.c - the CUTLASS provider of the BF16 GEMM op, forced by name
 * (skipped without a CUDA device on which it is available: the plugin built with its Hopper
 * units and an sm_90 device):
 *  - every kernel configuration (pinned through METRALE_CUTLASS_GEMM_CONFIG) and the default
 *    choice, on awkward shapes, against a float64 reference: small integer inputs make every
 *    product and sum exact in FP32, so the BF16 output must equal the reference rounded to
 *    BF16 bit for bit; outputs and the padding between N and ldc are poisoned first, and the
 *    padding must stay poisoned;
 *  - shapes the kernels cannot take (N, K or ldc not a multiple of 8, F32 output, pointers
 *    not 16-byte aligned) still computed, by cuBLASLt (the provider's fallback count grows,
 *    its kernel count does not); with a pinned configuration they fail instead, nothing
 *    written;
 *  - a forced CUTLASS GEMM captured into a graph and replayed computes the same.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/ops.h"
#include "metrale/ops_gemm.h"
#include "test_cuda_util.h"

#ifndef METRALE_HAVE_CUDA
int main(void) {
    printf("test_cuda_gemm_cutlass: skipped: built without the CUDA backend\n");
    return TEST_SKIP_EXIT;
}
#else
#include "gemm_cutlass.h"

#define POISON_BF16 0xFFFFu /* a NaN: never a result of these inputs */

typedef struct gemm_shape {
    uint32_t m, n, k, ldc;
    mg_dtype out_type;
    uint32_t offset; /* bytes added to the act pointer (misalignment) */
} gemm_shape;

typedef struct gemm_buffers {
    gemm_shape sh;
    uint16_t *act, *weight;
    double *ref;
    mg_devptr d_act, d_weight, d_out;
} gemm_buffers;

static void buffers_make(mg_backend *b, gemm_buffers *g, gemm_shape sh) {
    memset(g, 0, sizeof *g);
    g->sh = sh;
    size_t act_n = (size_t)sh.m * sh.k, weight_n = (size_t)sh.n * sh.k;
    g->act = malloc(act_n * 2);
    g->weight = malloc(weight_n * 2);
    g->ref = malloc((size_t)sh.m * sh.n * sizeof *g->ref);
    CHECK(g->act && g->weight && g->ref);
    if (!g->act || !g->weight || !g->ref)
        return;
    for (size_t i = 0; i < act_n; i++)
        g->act[i] = mg_f32_to_bf16((float)((int)test_rand_range(0, 14) - 7));
    for (size_t i = 0; i < weight_n; i++)
        g->weight[i] = mg_f32_to_bf16((float)((int)test_rand_range(0, 14) - 7));
    for (uint32_t i = 0; i < sh.m; i++)
        for (uint32_t j = 0; j < sh.n; j++) {
            double r = 0;
            for (uint32_t x = 0; x < sh.k; x++)
                r += (double)mg_bf16_to_f32(g->act[(size_t)i * sh.k + x]) *
                     mg_bf16_to_f32(g->weight[(size_t)j * sh.k + x]);
            g->ref[(size_t)i * sh.n + j] = r;
        }
    CHECK_OK(mg_alloc(b, act_n * 2 + 16, &g->d_act));
    CHECK_OK(mg_alloc(b, weight_n * 2, &g->d_weight));
    CHECK_OK(mg_alloc(b, (size_t)sh.m * sh.ldc * mg_dtype_bytes(sh.out_type), &g->d_out));
    CHECK_OK(mg_copy_h2d(b, g->d_act + sh.offset, g->act, act_n * 2));
    CHECK_OK(mg_copy_h2d(b, g->d_weight, g->weight, weight_n * 2));
}

static void buffers_free(mg_backend *b, gemm_buffers *g) {
    mg_free(b, g->d_act);
    mg_free(b, g->d_weight);
    mg_free(b, g->d_out);
    free(g->act);
    free(g->weight);
    free(g->ref);
}

static mg_status poison(mg_backend *b, const gemm_buffers *g) {
    return mg_memset(b, g->d_out, 0xFF,
                     (size_t)g->sh.m * g->sh.ldc * mg_dtype_bytes(g->sh.out_type));
}

static mg_status gemm(mg_backend *b, mg_stream *s, const gemm_buffers *g) {
    return mg_gemm_bf16(b, s, g->sh.m, g->sh.n, g->sh.k, g->d_act + g->sh.offset, g->d_weight,
                        g->d_out, g->sh.out_type, g->sh.ldc);
}

/* Outputs equal to the reference (BF16: rounded to BF16), the padding untouched (written:
 * true) or the whole output untouched (written: false). */
static void check_output(mg_backend *b, const gemm_buffers *g, bool written, const char *what) {
    const gemm_shape *sh = &g->sh;
    size_t elem = mg_dtype_bytes(sh->out_type), count = (size_t)sh->m * sh->ldc;
    void *host = malloc(count * elem);
    CHECK(host != NULL);
    if (!host)
        return;
    CHECK_OK(mg_copy_d2h(b, host, g->d_out, count * elem));
    size_t wrong = 0, padding_touched = 0;
    for (uint32_t i = 0; i < sh->m; i++)
        for (uint32_t j = 0; j < sh->ldc; j++) {
            size_t at = (size_t)i * sh->ldc + j;
            bool poisoned = sh->out_type == MG_DTYPE_BF16 ? ((uint16_t *)host)[at] == POISON_BF16
                                                          : ((uint32_t *)host)[at] == 0xFFFFFFFFu;
            if (j >= sh->n || !written) {
                padding_touched += !poisoned;
                continue;
            }
            float want = (float)g->ref[(size_t)i * sh->n + j];
            if (sh->out_type == MG_DTYPE_BF16)
                wrong += ((uint16_t *)host)[at] != mg_f32_to_bf16(want);
            else
                wrong += ((float *)host)[at] != want;
        }
    if (wrong || padding_touched)
        fprintf(stderr, "  %s: M=%u N=%u K=%u ldc=%u %s: %zu wrong, %zu untouchable written\n",
                what, sh->m, sh->n, sh->k, sh->ldc, mg_dtype_name(sh->out_type), wrong,
                padding_touched);
    CHECK(wrong == 0 && padding_touched == 0);
    free(host);
}

static void counts(uint64_t *kernels, uint64_t *fallbacks) {
    mg_gemm_cutlass_counts(kernels, fallbacks);
}

/* Shapes the kernels take: every configuration and the default choice. */
static void test_kernels(mg_backend *b) {
    const gemm_shape shapes[] = {
        {1, 8, 8, 8, MG_DTYPE_BF16, 0},
        {3, 136, 72, 136, MG_DTYPE_BF16, 0},
        {17, 1000, 520, 1008, MG_DTYPE_BF16, 0},
        {127, 264, 4104, 264, MG_DTYPE_BF16, 0},
        {129, 392, 200, 400, MG_DTYPE_BF16, 0},
        {300, 520, 64, 520, MG_DTYPE_BF16, 0},
        {(uint32_t)test_rand_range(1, 700), (uint32_t)test_rand_range(1, 90) * 8,
         (uint32_t)test_rand_range(1, 200) * 8, 0, MG_DTYPE_BF16, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        gemm_shape sh = shapes[i];
        if (!sh.ldc)
            sh.ldc = sh.n + 8 * (uint32_t)test_rand_range(0, 3);
        gemm_buffers g;
        buffers_make(b, &g, sh);
        for (int config = -1; config < mg_gemm_cutlass_config_count(); config++) {
            const char *name = config < 0 ? "default" : mg_gemm_cutlass_config_name(config);
            if (config < 0)
                unsetenv(MG_GEMM_CUTLASS_CONFIG_ENV);
            else
                setenv(MG_GEMM_CUTLASS_CONFIG_ENV, name, 1);
            uint64_t k0, f0, k1, f1;
            counts(&k0, &f0);
            CHECK_OK(poison(b, &g));
            CHECK_OK(gemm(b, NULL, &g));
            CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
            counts(&k1, &f1);
            CHECK(k1 == k0 + 1 && f1 == f0); /* run by CUTLASS, not cuBLASLt */
            check_output(b, &g, true, name);
        }
        unsetenv(MG_GEMM_CUTLASS_CONFIG_ENV);
        buffers_free(b, &g);
    }
}

/* Shapes the kernels cannot take: cuBLASLt computes them; pinned, they fail. */
static void test_fallback(mg_backend *b) {
    const gemm_shape shapes[] = {
        {5, 7, 64, 7, MG_DTYPE_BF16, 0},     /* N % 8 */
        {33, 64, 12, 64, MG_DTYPE_BF16, 0},  /* K % 8 */
        {9, 64, 64, 67, MG_DTYPE_BF16, 0},   /* ldc % 8 */
        {20, 128, 96, 128, MG_DTYPE_F32, 0}, /* F32 output */
        {12, 128, 96, 128, MG_DTYPE_BF16, 2} /* act 2-byte aligned */,
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        gemm_buffers g;
        buffers_make(b, &g, shapes[i]);
        uint64_t k0, f0, k1, f1;
        counts(&k0, &f0);
        CHECK_OK(poison(b, &g));
        CHECK_OK(gemm(b, NULL, &g));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
        counts(&k1, &f1);
        CHECK(k1 == k0 && f1 == f0 + 1);
        check_output(b, &g, true, "fallback");

        setenv(MG_GEMM_CUTLASS_CONFIG_ENV, "coop_128x128", 1);
        CHECK_OK(poison(b, &g));
        CHECK_STATUS(gemm(b, NULL, &g), MG_ERR_UNSUPPORTED);
        CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
        check_output(b, &g, false, "pinned refusal");
        unsetenv(MG_GEMM_CUTLASS_CONFIG_ENV);
        buffers_free(b, &g);
    }
    setenv(MG_GEMM_CUTLASS_CONFIG_ENV, "no_such_config", 1);
    gemm_buffers g;
    buffers_make(b, &g, (gemm_shape){8, 64, 64, 64, MG_DTYPE_BF16, 0});
    CHECK_STATUS(gemm(b, NULL, &g), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no_such_config");
    unsetenv(MG_GEMM_CUTLASS_CONFIG_ENV);
    buffers_free(b, &g);
}

/* Captured and replayed: the call allocates nothing and reads nothing back. */
static void test_graph(mg_backend *b) {
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    if (!s)
        return;
    gemm_buffers g;
    buffers_make(b, &g, (gemm_shape){45, 392, 328, 400, MG_DTYPE_BF16, 0});
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = 45, .n = 392, .k = 328, .ldc = 400, .out_type = MG_DTYPE_BF16};
    CHECK_OK(mg_gemm_prewarm(b, s, &plan, 1));
    CHECK_OK(gemm(b, s, &g)); /* loads the kernel outside the capture */
    CHECK_OK(mg_stream_synchronize(s));
    mg_graph *graph = NULL;
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(gemm(b, s, &g));
    CHECK_OK(mg_graph_end_capture(s, &graph));
    if (graph) {
        uint64_t k0, k1;
        counts(&k0, NULL);
        CHECK_OK(poison(b, &g));
        CHECK_OK(mg_graph_launch(graph, s));
        CHECK_OK(mg_stream_synchronize(s));
        counts(&k1, NULL);
        CHECK(k1 == k0); /* replay enqueues no call */
        check_output(b, &g, true, "graph replay");
        CHECK_OK(mg_graph_destroy(graph));
    }
    buffers_free(b, &g);
    CHECK_OK(mg_stream_destroy(s));
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_gemm_cutlass");
    char reason[512];
    if (!mg_op_provider_available(b, MG_OP_GEMM_BF16, "cutlass", reason, sizeof reason)) {
        printf("test_cuda_gemm_cutlass: skipped: the CUTLASS provider is not available: %s\n",
               reason);
        mg_backend_close(b);
        return TEST_SKIP_EXIT;
    }
    unsetenv(MG_GEMM_CUTLASS_CONFIG_ENV);
    CHECK_OK(mg_op_force_provider(b, MG_OP_GEMM_BF16, "cutlass"));
    test_kernels(b);
    test_fallback(b);
    test_graph(b);
    mg_op_stats stats;
    CHECK_OK(mg_op_stats_get(b, MG_OP_GEMM_BF16, &stats));
    CHECK(!strcmp(stats.provider, "cutlass"));
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
#endif
