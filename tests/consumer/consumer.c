/* consumer.c - a program built against an installed metrale-gpu (tests/install_consumer.sh):
 * checks the library's API version against its headers', opens the CPU backend, uploads two BF16
 * matrices, runs mg_gemm_bf16 and compares the result with a naive host GEMM. Prints "ok" and exits
 * 0, or says what differs and exits 1. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/ops_gemm.h"
#include "metrale/status.h"

enum { M = 5, N = 7, K = 37 };

#define CHECK(call)                                                                                \
    do {                                                                                           \
        mg_status st_ = (call);                                                                    \
        if (st_ != MG_OK) {                                                                        \
            fprintf(stderr, "consumer: %s failed: %s: %s\n", #call, mg_status_name(st_),           \
                    mg_last_error());                                                              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Values in [-2, 2) on a 1/64 grid: exact in BF16. */
static float next_value(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)((int)(*state >> 24) - 128) / 64.0f;
}

static int run(mg_backend *b) {
    uint16_t act[M * K], weight[N * K];
    float expected[M * N], got[M * N];
    uint32_t state = 12345u;
    for (int i = 0; i < M * K; i++)
        act[i] = mg_f32_to_bf16(next_value(&state));
    for (int i = 0; i < N * K; i++)
        weight[i] = mg_f32_to_bf16(next_value(&state));
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            double sum = 0.0;
            for (int i = 0; i < K; i++)
                sum += (double)mg_bf16_to_f32(act[r * K + i]) *
                       (double)mg_bf16_to_f32(weight[c * K + i]);
            expected[r * N + c] = (float)sum;
        }

    mg_devptr d_act = 0, d_weight = 0, d_out = 0;
    CHECK(mg_alloc(b, sizeof act, &d_act));
    CHECK(mg_alloc(b, sizeof weight, &d_weight));
    CHECK(mg_alloc(b, sizeof got, &d_out));
    CHECK(mg_copy_h2d(b, d_act, act, sizeof act));
    CHECK(mg_copy_h2d(b, d_weight, weight, sizeof weight));
    CHECK(mg_gemm_bf16(b, NULL, M, N, K, d_act, d_weight, d_out, MG_DTYPE_F32, N));
    CHECK(mg_stream_synchronize(mg_stream_default(b)));
    CHECK(mg_copy_d2h(b, got, d_out, sizeof got));
    CHECK(mg_free(b, d_act));
    CHECK(mg_free(b, d_weight));
    CHECK(mg_free(b, d_out));

    /* Products of two 1/64-grid values and their sums up to K * 4 are exact in FP32, so any
     * accumulation order gives the exact result; allow a little anyway. */
    int bad = 0;
    for (int i = 0; i < M * N; i++)
        if (!(fabsf(got[i] - expected[i]) <= 1e-4f * (1.0f + fabsf(expected[i])))) {
            if (bad++ < 5)
                fprintf(stderr, "consumer: out[%d][%d] = %g, expected %g\n", i / N, i % N,
                        (double)got[i], (double)expected[i]);
        }
    if (bad) {
        fprintf(stderr, "consumer: %d of %d outputs differ\n", bad, M * N);
        return 1;
    }
    return 0;
}

int main(void) {
    if (mg_api_version() != MG_API_VERSION) { /* headers and library from different releases */
        fprintf(stderr, "consumer: the library's API version is %u, its headers say %u\n",
                (unsigned)mg_api_version(), (unsigned)MG_API_VERSION);
        return 1;
    }
    mg_backend *b = NULL;
    CHECK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    int rc = run(b);
    mg_status st = mg_backend_close(b);
    if (st != MG_OK) {
        fprintf(stderr, "consumer: mg_backend_close failed: %s\n", mg_last_error());
        rc = 1;
    }
    if (rc == 0)
        printf("ok: mg_gemm_bf16 %dx%dx%d on the CPU backend matches the host reference\n", M, N,
               K);
    return rc;
}
