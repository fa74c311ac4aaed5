/* test_kv_cache_cuda.c - the paged KV cache on CUDA (metrale/ops_kv_cache.h): the append kernel,
 * and both paged attention providers (FlashInfer's kernels, chosen where built, and the split-KV
 * decode kernels, chosen for the other shapes and forced by name for FlashInfer's) against
 * float64 over shuffled pages (decode tokens, prefill chunks, empty requests, partial last pages,
 * a 32k-token request, a decode plan updated to a mixed batch), and a captured graph of append
 * + attention replayed across decode steps while contexts grow; on Hopper the FA3 paged prefill
 * path the same way (forced and chosen by AUTO). Skips (77) without a usable CUDA device. */
#include "kv_cache_scenario.h"
#include "metrale/ops.h"
#include "test_cuda_util.h"

/* The Hopper (FA3) paged prefill path: built for BF16 pools at head_dim 128 without soft-cap,
 * any page size, with or without a sliding window; compute capability 9.0 only. Forced FA3
 * over decode tokens, prefill chunks over cached prefixes, long and empty requests, eager and
 * from captured fixed grids; AUTO takes it for prefill-heavy batches and leaves decode on FA2.
 * Elsewhere a forced FA3 plan is refused with MG_ERR_UNSUPPORTED. */
static void test_fa3_paths(mg_backend *be) {
    mg_device_info info;
    CHECK_OK(mg_device_get_info(be, &info));
    const bool hopper = info.cc_major == 9 && info.cc_minor == 0;
    const mg_attention_impl fa3 = MG_ATTENTION_IMPL_FA3, fa2 = MG_ATTENTION_IMPL_FA2;
    int32_t qo[2] = {0, 1}, kv[2] = {0, 1}, idx[1] = {0}, last[1] = {1};
    mg_kv_page_table table = {1, qo, kv, idx, last};
    mg_attention_plan *p = NULL;
    if (!hopper) {
        kv_shape sh = {
            .hq = 8, .hkv = 2, .d = 128, .page_size = 16, .window_left = -1, .impl = fa3};
        mg_paged_attention_desc d = kv_attention_desc(&sh);
        CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
        CHECK_MESSAGE("compute capability 9.0");
        printf("test_kv_cache_cuda: FA3 paged cases skipped: sm_%d%d is not Hopper\n",
               info.cc_major, info.cc_minor);
        return;
    }
    const kv_shape shapes[] = {
        /* Forced FA3: GQA 4 with RoPE; one query head per KV head, page size 1; GQA 8 with a
         * window over pages of 7 (partial last pages everywhere); 128-token pages. */
        {.hq = 32,
         .hkv = 8,
         .d = 128,
         .page_size = 16,
         .window_left = -1,
         .rope = true,
         .impl = fa3,
         .expect_impl = fa3},
        {.hq = 4,
         .hkv = 4,
         .d = 128,
         .page_size = 1,
         .window_left = -1,
         .impl = fa3,
         .expect_impl = fa3},
        {.hq = 8,
         .hkv = 1,
         .d = 128,
         .page_size = 7,
         .window_left = 100,
         .rope = true,
         .positions = true,
         .impl = fa3,
         .expect_impl = fa3},
        {.hq = 16,
         .hkv = 4,
         .d = 128,
         .page_size = 128,
         .window_left = 37,
         .impl = fa3,
         .expect_impl = fa3,
         .graph_chunk = 150},
        /* Forced FA3 on a fixed grid of chunks. */
        {.hq = 32,
         .hkv = 8,
         .d = 128,
         .page_size = 16,
         .window_left = -1,
         .rope = true,
         .impl = fa3,
         .expect_impl = fa3,
         .graph_chunk = 100},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "cuda fa3 shape %zu (hq %u hkv %u page %u window %d)", i,
                 shapes[i].hq, shapes[i].hkv, shapes[i].page_size, shapes[i].window_left);
        kv_scenario_one_step(be, shapes[i], i == 0 ? 32768 : 3000, what);
        kv_scenario_prefill_chunks(be, shapes[i], what);
        kv_scenario_graph_steps(be, shapes[i], what);
    }
    /* AUTO: FA3 for prefill-heavy batches (eager, and a fixed grid of 100-token chunks), FA2
     * for decode (a fixed grid of one row per request) and for the shapes FA3 lacks; forced FA2
     * still serves prefill. */
    kv_shape sh = {.hq = 32,
                   .hkv = 8,
                   .d = 128,
                   .page_size = 16,
                   .window_left = -1,
                   .rope = true,
                   .expect_impl = fa3};
    kv_scenario_prefill_chunks(be, sh, "cuda auto prefill chunks");
    sh.window_left = 250;
    kv_scenario_prefill_chunks(be, sh, "cuda auto prefill chunks, window");
    sh.window_left = 0; /* each query sees itself only */
    kv_scenario_prefill_chunks(be, sh, "cuda auto prefill chunks, window 0");
    sh.window_left = -1;
    sh.graph_chunk = 160;
    kv_scenario_graph_steps(be, sh, "cuda auto graph chunks");
    sh.graph_chunk = 0;
    sh.expect_impl = fa2;
    kv_scenario_graph_steps(be, sh, "cuda auto graph decode");
    sh.soft_cap = 30.0f;
    kv_scenario_prefill_chunks(be, sh, "cuda auto prefill chunks, soft-cap");
    sh.soft_cap = 0.0f;
    sh.d = 64;
    kv_scenario_prefill_chunks(be, sh, "cuda auto prefill chunks, head_dim 64");
    sh.d = 128;
    sh.impl = fa2;
    kv_scenario_prefill_chunks(be, sh, "cuda forced fa2 prefill chunks");
    /* Forced FA3 where it has no kernel: soft-cap, FP8 pools, head_dim 64 and 256. */
    const kv_shape refused[] = {
        {.hq = 8,
         .hkv = 2,
         .d = 128,
         .page_size = 16,
         .window_left = -1,
         .soft_cap = 30.0f,
         .impl = fa3},
        {.hq = 8, .hkv = 2, .d = 128, .page_size = 16, .window_left = -1, .fp8 = true, .impl = fa3},
        {.hq = 8, .hkv = 2, .d = 64, .page_size = 16, .window_left = -1, .impl = fa3},
        {.hq = 8, .hkv = 2, .d = 256, .page_size = 16, .window_left = -1, .impl = fa3},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        mg_paged_attention_desc d = kv_attention_desc(&refused[i]);
        CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
        CHECK_MESSAGE("Hopper paged kernel");
    }
}

int main(void) {
    mg_backend *be = cuda_test_open_or_skip("test_kv_cache_cuda");
    test_seed();
    /* Every paged kernel built: BF16 at head_dim 64, 128 and 256 (soft-cap at 128 and 256),
     * FP8 at 128; GQA groups 1, 2, 4 and 8; page sizes 16, 1, 7, 128, 32, 3; sliding windows. */
    const kv_shape shapes[] = {
        {.hq = 32, .hkv = 8, .d = 128, .page_size = 16, .window_left = -1, .rope = true},
        /* Llama 3.1's scaled RoPE through the frequency table, BF16 and FP8 pools */
        {.hq = 32,
         .hkv = 8,
         .d = 128,
         .page_size = 16,
         .window_left = -1,
         .rope = true,
         .positions = true,
         .llama3 = true},
        {.hq = 8,
         .hkv = 2,
         .d = 64,
         .page_size = 7,
         .window_left = -1,
         .rope = true,
         .llama3 = true,
         .fp8 = true},
        {.hq = 4, .hkv = 4, .d = 128, .page_size = 1, .window_left = -1},
        {.hq = 8,
         .hkv = 1,
         .d = 128,
         .page_size = 7,
         .window_left = 100,
         .soft_cap = 30.0f,
         .rope = true,
         .positions = true},
        {.hq = 16,
         .hkv = 4,
         .d = 128,
         .page_size = 128,
         .window_left = -1,
         .soft_cap = 5.0f,
         .rope = true},
        /* head_dim 64 (Llama 3.2 1B's heads; no soft-cap kernels) and 256 (Gemma 2's: soft-cap
         * 50, window). */
        {.hq = 32, .hkv = 8, .d = 64, .page_size = 32, .window_left = -1, .rope = true},
        {.hq = 12,
         .hkv = 3,
         .d = 64,
         .page_size = 3,
         .window_left = 200,
         .rope = true,
         .positions = true},
        {.hq = 8,
         .hkv = 4,
         .d = 256,
         .page_size = 16,
         .window_left = 1000,
         .soft_cap = 50.0f,
         .rope = true},
        {.hq = 16, .hkv = 16, .d = 256, .page_size = 7, .window_left = -1, .rope = true},
        /* FP8 E4M3 pools (head_dim 128 without soft-cap): per-head scales, saturating keys. */
        {.hq = 32,
         .hkv = 8,
         .d = 128,
         .page_size = 16,
         .window_left = -1,
         .rope = true,
         .fp8 = true},
        {.hq = 8,
         .hkv = 4,
         .d = 128,
         .page_size = 7,
         .window_left = 100,
         .rope = true,
         .positions = true,
         .fp8 = true},
        {.hq = 4, .hkv = 4, .d = 128, .page_size = 1, .window_left = -1, .fp8 = true},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "cuda shape %zu (hq %u hkv %u d %u page %u%s)", i, shapes[i].hq,
                 shapes[i].hkv, shapes[i].d, shapes[i].page_size, shapes[i].fp8 ? " fp8" : "");
        kv_scenario_one_step(be, shapes[i], i == 0 ? 32768 : 3000, what);
        kv_scenario_decode_then_mixed(be, shapes[i], i == 0 ? 32768 : 3000, what);
        kv_scenario_graph_steps(be, shapes[i], what);
        /* The same through the split-KV decode kernels. */
        char forced[128];
        snprintf(forced, sizeof forced, "%s split_kv_decode", what);
        CHECK_OK(mg_op_force_provider(be, MG_OP_ATTENTION_PAGED, "split_kv_decode"));
        kv_scenario_decode_then_mixed(be, shapes[i], i == 0 ? 32768 : 3000, forced);
        kv_scenario_graph_steps(be, shapes[i], forced);
        CHECK_OK(mg_op_force_provider(be, MG_OP_ATTENTION_PAGED, NULL));
    }
    /* Shapes only the split-KV kernels serve (the first five: FlashInfer's paged kernels are not
     * built for them, so the automatic choice must find these kernels), then GQA groups that
     * are not powers of two or exceed an FP8 row block (forced). */
    const kv_shape decode_shapes[] = {
        {.hq = 16,
         .hkv = 8,
         .d = 64,
         .page_size = 16,
         .window_left = -1,
         .soft_cap = 20.0f,
         .rope = true},
        {.hq = 8, .hkv = 2, .d = 64, .page_size = 5, .window_left = 50, .fp8 = true},
        {.hq = 16,
         .hkv = 4,
         .d = 256,
         .page_size = 16,
         .window_left = -1,
         .fp8 = true,
         .rope = true},
        {.hq = 8,
         .hkv = 8,
         .d = 256,
         .page_size = 2,
         .window_left = 300,
         .soft_cap = 30.0f,
         .fp8 = true},
        {.hq = 8,
         .hkv = 2,
         .d = 128,
         .page_size = 16,
         .window_left = -1,
         .soft_cap = 10.0f,
         .fp8 = true},
        {.hq = 32, .hkv = 2, .d = 128, .page_size = 16, .window_left = -1, .rope = true},
        {.hq = 12, .hkv = 4, .d = 128, .page_size = 9, .window_left = 400},
        {.hq = 24, .hkv = 4, .d = 64, .page_size = 128, .window_left = -1, .fp8 = true},
        {.hq = 10, .hkv = 2, .d = 256, .page_size = 1, .window_left = -1, .soft_cap = 40.0f},
    };
    for (size_t i = 0; i < sizeof decode_shapes / sizeof decode_shapes[0]; i++) {
        char what[112];
        const kv_shape *sh = &decode_shapes[i];
        snprintf(what, sizeof what, "cuda decode shape %zu (hq %u hkv %u d %u page %u%s%s)", i,
                 sh->hq, sh->hkv, sh->d, sh->page_size, sh->soft_cap > 0 ? " cap" : "",
                 sh->fp8 ? " fp8" : "");
        if (i >= 5)
            CHECK_OK(mg_op_force_provider(be, MG_OP_ATTENTION_PAGED, "split_kv_decode"));
        kv_scenario_one_step(be, *sh, 1000, what);
        kv_scenario_decode_then_mixed(be, *sh, i % 3 == 0 ? 20000 : 2500, what);
        kv_scenario_graph_steps(be, *sh, what);
        CHECK_OK(mg_op_force_provider(be, MG_OP_ATTENTION_PAGED, NULL));
    }
    test_fa3_paths(be);
    /* Head_dims neither FlashInfer nor the split-KV kernels are built for: the automatic choice
     * must find the by-row kernels ("kernels"), with FP8 pools, soft-cap, windows, GQA groups
     * of 3 and one-token pages among them; then a shape the faster kernels also serve, forced
     * onto the by-row kernels. */
    const kv_shape any_head_dim_shapes[] = {
        {.hq = 9, .hkv = 3, .d = 48, .page_size = 16, .window_left = -1, .rope = true},
        {.hq = 8, .hkv = 2, .d = 80, .page_size = 5, .window_left = 40, .fp8 = true},
        {.hq = 12, .hkv = 4, .d = 96, .page_size = 1, .window_left = -1, .soft_cap = 25.0f},
        {.hq = 4, .hkv = 1, .d = 16, .page_size = 16, .window_left = -1, .fp8 = true},
        {.hq = 4, .hkv = 4, .d = 512, .page_size = 3, .window_left = 200, .rope = true},
        {.hq = 16, .hkv = 4, .d = 128, .page_size = 16, .window_left = -1, .soft_cap = 30.0f},
    };
    const size_t any_count = sizeof any_head_dim_shapes / sizeof any_head_dim_shapes[0];
    for (size_t i = 0; i < any_count; i++) {
        char what[112];
        const kv_shape *sh = &any_head_dim_shapes[i];
        snprintf(what, sizeof what, "cuda by-row shape %zu (hq %u hkv %u d %u page %u%s%s)", i,
                 sh->hq, sh->hkv, sh->d, sh->page_size, sh->soft_cap > 0 ? " cap" : "",
                 sh->fp8 ? " fp8" : "");
        if (i + 1 == any_count)
            CHECK_OK(mg_op_force_provider(be, MG_OP_ATTENTION_PAGED, "kernels"));
        kv_scenario_one_step(be, *sh, 700, what);
        kv_scenario_decode_then_mixed(be, *sh, 1500, what);
        kv_scenario_graph_steps(be, *sh, what);
        CHECK_OK(mg_op_force_provider(be, MG_OP_ATTENTION_PAGED, NULL));
    }
    /* FA2 and FA3 name FlashInfer's kernels: at a head_dim FlashInfer lacks, asking for one is
     * refused at plan creation, never served by other kernels. */
    kv_shape other = shapes[0];
    other.d = 96;
    mg_paged_attention_desc d = kv_attention_desc(&other);
    d.impl = MG_ATTENTION_IMPL_FA2;
    int32_t qo[2] = {0, 1}, kv[2] = {0, 1}, idx[1] = {0}, last[1] = {1};
    mg_kv_page_table table = {1, qo, kv, idx, last};
    mg_attention_plan *p = NULL;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("asked for FlashInfer's");
    mg_backend_close(be);
    return test_finish();
}
