/*
 * test_generate_long.c - the decode loop's reliability over a long run (the issue: 10,000
 * decode steps with the ledger and the resident memory flat). mg_generate on the CPU backend
 * with the micro preset's random weights, one request sampling with top-k, top-p and all three
 * penalties, graph replays after the second step; 10 generations of 1,000 decode steps each
 * (10,000 steps of the loop; one 10,000-token sequence takes about 80 s on a 2-core machine,
 * as the CPU attention's cost grows with the context: METRALE_LONG_RUNS and
 * METRALE_LONG_STEPS choose another split, e.g. 1 and 10000). The callback reads the ledger
 * (mg_ledger_live), the host heap (mallinfo2) and the resident set (/proc/self/statm):
 *  - inside a generation, the ledger's live bytes and count and the heap's bytes in use are the
 *    same at every checkpoint from step 100 on: nothing is allocated per step, on the device
 *    or the host;
 *  - after each generation the ledger is empty (the model freed everything); the heap in use
 *    at a generation's step 100 is the second generation's within 1 MiB, and the resident set
 *    at the last generation's step 100 the middle one's within 1 MiB (the allocator keeps
 *    freed pages for a few generations before the resident set settles; a leak would not
 *    settle);
 *  - every token is in the vocabulary, a generation is reproducible (all of them give the same
 *    tokens, as they have the same seed), and the sampler did sample (> 100 distinct ids).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "generate.h"
#include "test_util.h"

/* AddressSanitizer keeps freed memory in its quarantine, so the resident set grows from one
 * generation to the next by design there: it is reported, not checked. */
#if defined(__SANITIZE_ADDRESS__)
static const bool rss_unreliable = true;
#else
static const bool rss_unreliable = false;
#endif

typedef struct probe {
    mg_backend *b;
    uint64_t live_bytes, live_count;
    size_t heap;
    long rss;
    uint32_t vocab, bad, changes;
    int32_t *tokens;
} probe;

static long rss_bytes(void) {
    long total = 0, resident = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &total, &resident) != 2)
        resident = -1;
    if (f)
        fclose(f);
    return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}

static size_t heap_in_use(void) {
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static bool on_token(void *user, uint32_t r, uint32_t index, int32_t token) {
    probe *p = user;
    (void)r;
    p->bad += token < 0 || (uint32_t)token >= p->vocab;
    p->tokens[index] = token;
    if (index == 100 || (index > 100 && index % 250 == 0)) {
        uint64_t bytes = 0, count = 0;
        CHECK_OK(mg_ledger_live(p->b, &bytes, &count));
        const size_t heap = heap_in_use();
        if (index == 100) {
            p->live_bytes = bytes;
            p->live_count = count;
            p->heap = heap;
            p->rss = rss_bytes();
        } else if (bytes != p->live_bytes || count != p->live_count || heap != p->heap) {
            if (p->changes++ < 3)
                fprintf(stderr,
                        "step %u: ledger %llu bytes / %llu, heap %zu (step 100: %llu / "
                        "%llu, %zu)\n",
                        index, (unsigned long long)bytes, (unsigned long long)count, heap,
                        (unsigned long long)p->live_bytes, (unsigned long long)p->live_count,
                        p->heap);
        }
    }
    return true;
}

int main(void) {
    test_seed();
    const uint32_t runs = test_env_u32("METRALE_LONG_RUNS", 10);
    const uint32_t steps = test_env_u32("METRALE_LONG_STEPS", 1000);
    const mg_fwd_preset *micro = mg_fwd_preset_find("micro");
    mg_backend *b = NULL;
    CHECK(micro != NULL && runs >= 1 && steps >= 200);
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!micro || !b || runs < 1 || steps < 200)
        return test_finish();
    int32_t prompt[9];
    for (int i = 0; i < 9; i++)
        prompt[i] = (int32_t)(test_rand() % micro->shape.vocab);
    mg_gen_request q = {.prompt = prompt,
                        .prompt_len = 9,
                        .max_tokens = steps + 1,
                        .sampling = mg_sample_params_greedy()};
    q.sampling.temperature = 1.0f;
    q.sampling.top_k = 100;
    q.sampling.top_p = 0.95f;
    q.sampling.repetition_penalty = 1.1f;
    q.sampling.presence_penalty = 0.2f;
    q.sampling.frequency_penalty = 0.05f;
    q.sampling.seed = test_rand();
    mg_gen_options o = {
        .preset = micro, .weight_seed = 3, .use_graphs = true, .penalty_last_n = 64};
    int32_t *first = calloc(steps + 1, 4);
    char *used = calloc(micro->shape.vocab, 1);
    size_t heap2 = 0;
    long rss_half = 0;
    double decode_s = 0;
    uint32_t total_steps = 0;
    int distinct = 0;
    for (uint32_t run = 0; run < runs; run++) {
        probe p = {.b = b, .vocab = micro->shape.vocab, .tokens = calloc(steps + 1, 4)};
        mg_gen_result res;
        mg_gen_stats st;
        CHECK_OK(mg_generate(b, &o, &q, 1, on_token, &p, &res, &st));
        CHECK(res.count == steps + 1 && res.finish == MG_GEN_MAX_TOKENS);
        CHECK(st.decode_steps == steps && st.graph_steps + 1 >= steps);
        CHECK(p.bad == 0);
        CHECK(p.changes == 0);
        uint64_t bytes = 1, count = 1;
        CHECK_OK(mg_ledger_live(b, &bytes, &count));
        CHECK(bytes == 0 && count == 0);
        if (run == 0) {
            memcpy(first, p.tokens, (steps + 1) * 4);
            for (uint32_t i = 0; i <= steps; i++)
                distinct += !used[p.tokens[i]]++;
        } else {
            CHECK(!memcmp(first, p.tokens, (steps + 1) * 4));
        }
        if (run == 1)
            heap2 = p.heap;
        else if (run > 1)
            CHECK(p.heap <= heap2 + (1u << 20));
        if (run == runs / 2)
            rss_half = p.rss;
        else if (run + 1 == runs && runs >= 4 && !rss_unreliable)
            CHECK(p.rss > 0 && p.rss <= rss_half + (1l << 20));
        decode_s += st.decode_s;
        total_steps += st.decode_steps;
        printf("generation %u: %u decode steps, %.3f ms/step; at step 100 ledger %llu bytes in "
               "%llu allocations, heap %.2f MiB, resident %.2f MiB\n",
               run, st.decode_steps, st.decode_s * 1e3 / st.decode_steps,
               (unsigned long long)p.live_bytes, (unsigned long long)p.live_count,
               p.heap / 1048576.0, p.rss / 1048576.0);
        mg_gen_results_free(&res, 1);
        free(p.tokens);
    }
    CHECK(distinct > 100);
    printf("%u decode steps in %.1f s, %d distinct ids in a generation\n", total_steps, decode_s,
           distinct);
    free(first);
    free(used);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
