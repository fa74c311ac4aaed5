/*
 * tp_mlp_test_util.h - the tensor-parallel MLP block on two backends against the same block
 * on one backend (tp_mlp.h), shared by the CPU and the CUDA test.
 */
#ifndef METRALE_TP_MLP_TEST_UTIL_H
#define METRALE_TP_MLP_TEST_UTIL_H

#include <math.h>

#include "comm_test_util.h"
#include "tp_mlp.h"

/* Random BF16 weights scaled like a trained layer (|w| < 2 / sqrt(fan_in)). */
static inline void tp_fill_weights(uint16_t *w, size_t count, uint32_t fan_in) {
    float scale = 2.0f / sqrtf((float)fan_in);
    for (size_t i = 0; i < count; i++)
        w[i] = mg_f32_to_bf16(((float)(test_rand() >> 40) / 16777216.0f * 2.0f - 1.0f) * scale);
}

/* Runs the block for `tokens` random rows (each of `token_steps` shapes) on `tp[0..1]` (one
 * rank each) and on `one`, and checks every element of y on both ranks against the one-device
 * y: |tp - one| <= 2^-6 * (|one| + rms(one)), the BF16 roundings of the two partial sums and
 * of the sum (plus GEMM accumulation order) with room, while a wrong slice or a missing
 * all-reduce is off by the order of y itself. The output is poisoned first. */
static inline void tp_mlp_check(mg_backend *const *tp, mg_backend *one, uint32_t hidden,
                                uint32_t inter, const uint32_t *tokens, int token_steps) {
    uint32_t max_tokens = 0;
    for (int i = 0; i < token_steps; i++)
        max_tokens = tokens[i] > max_tokens ? tokens[i] : max_tokens;
    uint16_t *wg = malloc((size_t)inter * hidden * 2), *wu = malloc((size_t)inter * hidden * 2);
    uint16_t *wd = malloc((size_t)hidden * inter * 2);
    uint16_t *x = malloc((size_t)max_tokens * hidden * 2);
    uint16_t *y1 = malloc((size_t)max_tokens * hidden * 2);
    uint16_t *yt = malloc((size_t)max_tokens * hidden * 2);
    tp_fill_weights(wg, (size_t)inter * hidden, hidden);
    tp_fill_weights(wu, (size_t)inter * hidden, hidden);
    tp_fill_weights(wd, (size_t)hidden * inter, inter);
    mg_comm *comms[2] = {0};
    mg_tp_mlp ranks[2], single;
    CHECK_OK(mg_comm_create_local(tp, 2, NULL, comms));
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_tp_mlp_init(&ranks[r], tp[r], NULL, comms[r], hidden, inter, max_tokens, wg, wu,
                                wd));
    CHECK_OK(mg_tp_mlp_init(&single, one, NULL, NULL, hidden, inter, max_tokens, wg, wu, wd));
    mg_tp_mlp *tp_ranks[2] = {&ranks[0], &ranks[1]}, *one_rank[1] = {&single};
    for (int step = 0; step < token_steps && !test_failures; step++) {
        uint32_t t = tokens[step];
        size_t n = (size_t)t * hidden;
        comm_fill(MG_DTYPE_BF16, x, n);
        for (size_t i = 0; i < n; i++) /* inputs of an RMS-normed activation: |x| ~ 1 */
            x[i] = mg_f32_to_bf16(mg_bf16_to_f32(x[i]) / 8.0f);
        for (int r = 0; r < 2; r++) {
            CHECK_OK(mg_copy_h2d(tp[r], ranks[r].x, x, n * 2));
            CHECK_OK(mg_memset(tp[r], ranks[r].y, 0xff, n * 2));
        }
        CHECK_OK(mg_copy_h2d(one, single.x, x, n * 2));
        CHECK_OK(mg_memset(one, single.y, 0xff, n * 2));
        CHECK_OK(mg_tp_mlp_forward(one_rank, 1, t));
        CHECK_OK(mg_tp_mlp_forward(tp_ranks, 2, t));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(one)));
        CHECK_OK(mg_copy_d2h(one, y1, single.y, n * 2));
        double sq = 0;
        for (size_t i = 0; i < n; i++)
            sq += (double)mg_bf16_to_f32(y1[i]) * mg_bf16_to_f32(y1[i]);
        double rms = sqrt(sq / (double)n);
        CHECK(rms > 1e-3 && isfinite(rms)); /* a block that computes nothing cannot pass */
        for (int r = 0; r < 2; r++) {
            CHECK_OK(mg_comm_wait(comms[r], NULL));
            CHECK_OK(mg_copy_d2h(tp[r], yt, ranks[r].y, n * 2));
            int bad = 0;
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                double a = mg_bf16_to_f32(yt[i]), b = mg_bf16_to_f32(y1[i]);
                double err = fabs(a - b), bound = ldexp(fabs(b) + rms, -6);
                worst = err / (fabs(b) + rms) > worst ? err / (fabs(b) + rms) : worst;
                if (!(err <= bound) && bad++ < 3)
                    fprintf(stderr, "  tokens %u rank %d y[%zu]: tp %.6g one-device %.6g\n", t, r,
                            i, a, b);
            }
            printf("tp mlp hidden %u inter %u tokens %u rank %d: worst error %.3g of "
                   "(|y| + rms)\n",
                   hidden, inter, t, r, worst);
            CHECK(bad == 0);
        }
    }
    for (int r = 0; r < 2; r++) {
        mg_tp_mlp_release(&ranks[r]);
        CHECK_OK(mg_comm_destroy(comms[r]));
    }
    mg_tp_mlp_release(&single);
    free(wg);
    free(wu);
    free(wd);
    free(x);
    free(y1);
    free(yt);
}

#endif
