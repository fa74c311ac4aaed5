/* test_concurrency_forward_tp.c - mg_fwd_create_tp's driver (src/model/model_tp.c), a thread
 * per rank (also run under ThreadSanitizer: the ranks share nothing but their communicator and
 * the driver's failure order). Passes of the tiny preset over 2 CPU devices; then one rank's
 * communicator is aborted behind the driver's back (a peer that gave up mid-run, reached through
 * the model's internals): the next decode returns MG_ERR_DEVICE at once, naming a rank, instead
 * of waiting for the communicator's timeout; so does every later one. Then rank 1 alone
 * samples: the ranks' tokens disagree (MG_ERR_INTERNAL) and the model is stopped
 * (every later call MG_ERR_DEVICE). Destroy leaves every backend's ledger as it was. */
#include <time.h>

#include "model_internal.h"
#include "test_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    mg_backend *b[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++)
        if (mg_backend_open(MG_BACKEND_CPU, r, &b[r])) {
            fprintf(stderr, "cannot open CPU backend %d: %s\n", r, mg_last_error());
            return 1;
        }
    uint64_t bytes0[2], count0[2], bytes1[2], count1[2];
    for (int r = 0; r < 2; r++)
        CHECK_OK(mg_ledger_live(b[r], &bytes0[r], &count0[r]));
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny"));
    c.steps = 6;
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b[0], &s));
    CHECK_OK(mg_fwd_create_tp(b, 2, &c, &m));
    if (m) {
        CHECK_OK(mg_fwd_prefill(m, s));
        for (int i = 0; i < 3; i++)
            CHECK_OK(mg_fwd_decode(m, s));
        uint32_t peers = 0;
        mg_fwd *const *peer = mg_fwd_tp_peers(m, &peers);
        CHECK(peers == 1 && peer && peer[0]->tp_rank == 1);
        if (peers == 1) {
            CHECK_OK(mg_comm_abort(peer[0]->comm));
            const double t0 = now_s();
            CHECK_STATUS(mg_fwd_decode(m, s), MG_ERR_DEVICE);
            const double took = now_s() - t0;
            CHECK_MESSAGE("tensor-parallel rank");
            printf("a rank's communicator aborted: the decode failed in %.3f s: %s\n", took,
                   mg_last_error());
            CHECK(took < 5.0); /* the default timeout is 60 s: the abort is seen, not waited out */
            CHECK_STATUS(mg_fwd_decode(m, s), MG_ERR_DEVICE);
        }
    }
    mg_fwd_destroy(m);
    m = NULL;
    /* ranks out of step behind the driver's back: rank 1 alone samples (its own
     * mg_fwd_set_sampling: no group), rank 0 stays greedy; both pick from the same gathered
     * logits, so only the comparison of their tokens can tell. The driver finds them disagree
     * and stops the model: every later call fails with MG_ERR_DEVICE, never returning tokens */
    CHECK_OK(mg_fwd_create_tp(b, 2, &c, &m));
    if (m) {
        uint32_t peers = 0;
        mg_fwd *const *peer = mg_fwd_tp_peers(m, &peers);
        mg_sample_params params[8];
        for (uint32_t q = 0; q < c.batch; q++) {
            params[q] = mg_sample_params_greedy();
            params[q].seed = 11 + q;
            params[q].temperature = 20.0f; /* about uniform: unlike the argmax */
        }
        CHECK(peers == 1);
        if (peers == 1)
            CHECK_OK(mg_fwd_set_sampling(peer[0], params, 0));
        bool disagreed = false;
        for (uint32_t i = 0; peers == 1 && i <= c.steps && !disagreed; i++) {
            mg_status st = i ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s);
            if (st) {
                disagreed = true;
                printf("ranks out of step: %s\n", mg_last_error());
                CHECK_STATUS(st, MG_ERR_INTERNAL);
                CHECK_MESSAGE("disagree");
                CHECK_STATUS(mg_fwd_decode(m, s), MG_ERR_DEVICE);
                CHECK_MESSAGE("only good for mg_fwd_destroy");
                const int32_t ids[8] = {0};
                CHECK_STATUS(mg_fwd_force_tokens(m, ids), MG_ERR_DEVICE);
            }
        }
        CHECK(disagreed);
    }
    mg_fwd_destroy(m);
    mg_stream_destroy(s);
    for (int r = 0; r < 2; r++) {
        CHECK_OK(mg_ledger_live(b[r], &bytes1[r], &count1[r]));
        CHECK(bytes1[r] == bytes0[r] && count1[r] == count0[r]);
        mg_backend_close(b[r]);
    }
    return test_finish();
}
