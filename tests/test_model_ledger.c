/*
 * test_model_ledger.c - the forward model's device memory is its weights, its arena and its KV
 * pool, and nothing else: after mg_fwd_create the backend's allocation ledger holds exactly
 * those (the arena's chunks at one call site, the KV pool at another, every other live byte a
 * weight: mg_fwd_info.weight_bytes), and a prefill plus 1000 decode steps allocate nothing
 * (the CPU backend's allocation counter, the ledger's live count and bytes all unchanged; an
 * allocation cap at the bytes after create makes any attempt fail the pass). Every weight
 * format and both MLP kinds, eager and graph-replayed decode, prompts long enough for the
 * NVFP4 prefill's BF16 path, and two GGUF checkpoints (Q4_1 on the MLX kernels, F16 as BF16).
 */
#include <stdbool.h>
#include <stdlib.h>

#include "metrale/cpu.h"
#include "model.h"
#include "test_util.h"

/* The long runs' and the other cases' decode steps (the short ones cover their formats more
 * cheaply); METRALE_LEDGER_LONG_STEPS and METRALE_LEDGER_SHORT_STEPS shorten them in
 * instrumented builds (cmake/model_tests.cmake). */
#define DECODE_STEPS_DEFAULT 1000
#define SHORT_STEPS_DEFAULT 100
#define MAX_SITES 64

typedef struct ledger_view {
    uint64_t bytes, count, allocs;
} ledger_view;

static ledger_view ledger_now(mg_backend *be) {
    ledger_view v = {0};
    mg_cpu_counters c;
    CHECK_OK(mg_ledger_live(be, &v.bytes, &v.count));
    CHECK_OK(mg_cpu_get_counters(be, &c));
    v.allocs = c.alloc;
    return v;
}

/* The live call sites: one holds the arena's chunks, one the KV pool, the rest the weights. */
static void check_sites(mg_backend *be, const mg_fwd_info *info, const char *what) {
    mg_ledger_site sites[MAX_SITES];
    size_t n = 0;
    CHECK_OK(mg_ledger_top_sites(be, 0, sites, MAX_SITES, &n));
    CHECK(n < MAX_SITES);
    bool arena = false, kv = false;
    uint64_t other = 0;
    for (size_t i = 0; i < n; i++) {
        if (!arena && sites[i].bytes == info->arena.device_bytes &&
            sites[i].count == info->arena.chunk_count) {
            arena = true;
            continue;
        }
        if (!kv && sites[i].bytes == info->kv_pool_bytes && sites[i].count == 1) {
            kv = true;
            continue;
        }
        other += sites[i].bytes;
    }
    if (!arena || !kv || other != info->weight_bytes) {
        fprintf(stderr, "%s: arena %s, KV pool %s, %llu other bytes for %llu of weights\n", what,
                arena ? "found" : "MISSING", kv ? "found" : "MISSING", (unsigned long long)other,
                (unsigned long long)info->weight_bytes);
        mg_ledger_report(be, stderr, MAX_SITES, 0);
    }
    CHECK(arena);
    CHECK(kv);
    CHECK(other == info->weight_bytes);
}

/* Creates the model of `c`, checks its ledger, runs a prefill and c.steps decode steps. */
static void run_config(mg_backend *be, const mg_fwd_config c, const char *what) {
    printf("%s\n", what);
    const uint32_t steps = c.steps;
    const bool graphs = c.use_graphs;
    const ledger_view before = ledger_now(be);
    CHECK(before.count == 0 && before.bytes == 0);
    mg_fwd *m = NULL;
    CHECK_OK(mg_fwd_create(be, &c, &m));
    if (!m)
        return;
    mg_fwd_info info;
    mg_fwd_get_info(m, &info);
    const ledger_view created = ledger_now(be);
    CHECK(created.bytes == info.weight_bytes + info.arena.device_bytes + info.kv_pool_bytes);
    check_sites(be, &info, what);
    /* The plan printed before anything loads (mg_fwd_plan_for_config) is the one created
     * (a preset's: a checkpoint's architecture is known once it is open). */
    if (!c.model_path) {
        mg_arena_plan *plan = NULL;
        mg_arena_summary planned = {0};
        CHECK_OK(mg_fwd_plan_for_config(be, &c, &plan));
        if (plan)
            CHECK_OK(mg_arena_plan_summary(plan, &planned));
        mg_arena_plan_destroy(plan);
        CHECK(planned.device_bytes == info.arena.device_bytes);
        CHECK(planned.buffer_count == info.arena.buffer_count);
    }
    /* Any allocation from here on would fail (and fail the pass that made it). */
    CHECK_OK(mg_cpu_set_allocation_cap(be, created.bytes));
    mg_stream *s = mg_stream_default(be);
    CHECK_OK(mg_fwd_prefill(m, s));
    mg_status st = MG_OK;
    for (uint32_t i = 0; i < steps && !st; i++)
        st = mg_fwd_decode(m, s);
    CHECK_OK(st);
    const ledger_view after = ledger_now(be);
    CHECK(after.allocs == created.allocs);
    CHECK(after.count == created.count);
    CHECK(after.bytes == created.bytes);
    uint32_t count = 0;
    mg_fwd_tokens(m, 0, &count);
    CHECK(count == steps + 1);
    if (graphs) {
        mg_fwd_get_info(m, &info);
        CHECK(info.graph_steps == steps - 1);
    }
    CHECK_OK(mg_cpu_set_allocation_cap(be, 0));
    mg_fwd_destroy(m);
    const ledger_view freed = ledger_now(be);
    CHECK(freed.count == 0 && freed.bytes == 0);
}

static void run_case(mg_backend *be, const char *preset, mg_fwd_weights weights, bool graphs,
                     uint32_t batch, uint32_t prompt_len, uint32_t steps) {
    const mg_fwd_preset *p = mg_fwd_preset_find(preset);
    CHECK(p != NULL);
    if (!p)
        return;
    char what[96];
    snprintf(what, sizeof what, "%s %s, %s decode, batch %u, prompt_len %u, %u steps", preset,
             mg_fwd_weights_name(weights), graphs ? "graph" : "eager", batch, prompt_len, steps);
    mg_fwd_config c = mg_fwd_config_default(p);
    c.weights = weights;
    c.batch = batch;
    c.prompt_len = prompt_len;
    c.steps = steps;
    c.seed = test_rand();
    c.use_graphs = graphs;
    run_config(be, c, what);
}

/* A checkpoint of the committed GGUF corpus (tests/fuzz/corpus_gguf/): its loaders' staging
 * must be gone once the model is created. */
static void run_checkpoint(mg_backend *be, const char *file, bool graphs, uint32_t steps) {
    char path[1024], what[160];
    snprintf(path, sizeof path, "%s/%s", METRALE_GGUF_CORPUS, file);
    snprintf(what, sizeof what, "checkpoint %s, %s decode, %u steps", file,
             graphs ? "graph" : "eager", steps);
    int32_t prompt[37];
    const uint32_t n = (uint32_t)test_rand_range(5, 37);
    for (uint32_t i = 0; i < n; i++)
        prompt[i] = (int32_t)test_rand_range(0, 99);
    const mg_fwd_config c = {.batch = 1,
                             .steps = steps,
                             .seed = test_rand(),
                             .use_graphs = graphs,
                             .model_path = path,
                             .prompt_ids = prompt,
                             .prompt_ids_count = n};
    run_config(be, c, what);
}

int main(void) {
    test_seed();
    mg_backend *be = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &be));
    if (!be)
        return test_finish();
    /* Awkward batches; the NVFP4 prompts sum past MG_NVFP4_BF16_PATH_MIN_M tokens so the
     * prefill's BF16-expansion workspace is planned. */
    const uint32_t b = (uint32_t)test_rand_range(2, 4), len = (uint32_t)test_rand_range(45, 70);
    const uint32_t long_steps = test_env_u32("METRALE_LEDGER_LONG_STEPS", DECODE_STEPS_DEFAULT);
    const uint32_t short_steps = test_env_u32("METRALE_LEDGER_SHORT_STEPS", SHORT_STEPS_DEFAULT);
    CHECK(long_steps >= 1 && short_steps >= 1);
    run_case(be, "tiny", MG_FWD_WEIGHTS_BF16, false, b, len, short_steps);
    run_case(be, "tiny", MG_FWD_WEIGHTS_BF16, true, b + 1, len - 7, long_steps);
    run_case(be, "tiny", MG_FWD_WEIGHTS_FP8, true, b, len, short_steps);
    run_case(be, "tiny", MG_FWD_WEIGHTS_NVFP4, false, b + 1, len, short_steps);
    run_case(be, "micro", MG_FWD_WEIGHTS_MLX8, true, b, len - 5, short_steps);
    run_case(be, "micro", MG_FWD_WEIGHTS_MLX4, false, b, len + 3, long_steps);
    run_case(be, "tiny-moe", MG_FWD_WEIGHTS_BF16, true, b, len, short_steps);
    run_case(be, "tiny-moe", MG_FWD_WEIGHTS_FP8, false, b + 1, len - 3, short_steps);
    run_case(be, "tiny-moe", MG_FWD_WEIGHTS_NVFP4, true, b, len, long_steps);
    run_checkpoint(be, "tiny_q4_1.gguf", true, short_steps);
    run_checkpoint(be, "tiny_f16.gguf", false, short_steps);
    CHECK_OK(mg_backend_close(be));
    return test_finish();
}
