/* test_kv_cache_cuda.c - the paged KV cache on CUDA (metrale/ops_kv_cache.h): the append kernel,
 * and both paged attention providers (FlashInfer's kernels, chosen where built, and the split-KV
 * decode kernels, chosen for the other shapes and forced by name for FlashInfer's) against
 * float64 over shuffled pages (decode tokens, prefill chunks, empty requests, partial last pages,
 * a 32k-token request, a decode plan updated to a mixed batch), and a captured graph of append
 * + attention replayed across decode steps while contexts grow. Skips (77) without a usable
 * CUDA device. */
#include "kv_cache_scenario.h"
#include "metrale/ops.h"
#include "test_cuda_util.h"

int main(void) {
    mg_backend *be = cuda_test_open_or_skip("test_kv_cache_cuda");
    test_seed();
    /* Every paged kernel built: BF16 at head_dim 64, 128 and 256 (soft-cap at 128 and 256),
     * FP8 at 128; GQA groups 1, 2, 4 and 8; page sizes 16, 1, 7, 128, 32, 3; sliding windows. */
    const kv_shape shapes[] = {
        {.hq = 32, .hkv = 8, .d = 128, .page_size = 16, .window_left = -1, .rope = true},
        {.hq = 4, .hkv = 4, .d = 128, .page_size = 1, .window_left = -1},
        {.hq = 8, .hkv = 1, .d = 128, .page_size = 7, .window_left = 100, .soft_cap = 30.0f,
         .rope = true, .positions = true},
        {.hq = 16, .hkv = 4, .d = 128, .page_size = 128, .window_left = -1, .soft_cap = 5.0f,
         .rope = true},
        /* head_dim 64 (Llama 3.2 1B's heads; no soft-cap kernels) and 256 (Gemma 2's: soft-cap
         * 50, window). */
        {.hq = 32, .hkv = 8, .d = 64, .page_size = 32, .window_left = -1, .rope = true},
        {.hq = 12, .hkv = 3, .d = 64, .page_size = 3, .window_left = 200, .rope = true,
         .positions = true},
        {.hq = 8, .hkv = 4, .d = 256, .page_size = 16, .window_left = 1000, .soft_cap = 50.0f,
         .rope = true},
        {.hq = 16, .hkv = 16, .d = 256, .page_size = 7, .window_left = -1, .rope = true},
        /* FP8 E4M3 pools (head_dim 128 without soft-cap): per-head scales, saturating keys. */
        {.hq = 32, .hkv = 8, .d = 128, .page_size = 16, .window_left = -1, .rope = true,
         .fp8 = true},
        {.hq = 8, .hkv = 4, .d = 128, .page_size = 7, .window_left = 100, .rope = true,
         .positions = true, .fp8 = true},
        {.hq = 4, .hkv = 4, .d = 128, .page_size = 1, .window_left = -1, .fp8 = true},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "cuda shape %zu (hq %u hkv %u d %u page %u%s)", i,
                 shapes[i].hq, shapes[i].hkv, shapes[i].d, shapes[i].page_size,
                 shapes[i].fp8 ? " fp8" : "");
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
        {.hq = 16, .hkv = 8, .d = 64, .page_size = 16, .window_left = -1, .soft_cap = 20.0f,
         .rope = true},
        {.hq = 8, .hkv = 2, .d = 64, .page_size = 5, .window_left = 50, .fp8 = true},
        {.hq = 16, .hkv = 4, .d = 256, .page_size = 16, .window_left = -1, .fp8 = true,
         .rope = true},
        {.hq = 8, .hkv = 8, .d = 256, .page_size = 2, .window_left = 300, .soft_cap = 30.0f,
         .fp8 = true},
        {.hq = 8, .hkv = 2, .d = 128, .page_size = 16, .window_left = -1, .soft_cap = 10.0f,
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
    /* A head_dim neither provider has kernels for is refused at plan creation. */
    kv_shape other = shapes[0];
    other.d = 96;
    mg_paged_attention_desc d = kv_attention_desc(&other);
    int32_t qo[2] = {0, 1}, kv[2] = {0, 1}, idx[1] = {0}, last[1] = {1};
    mg_kv_page_table table = {1, qo, kv, idx, last};
    mg_attention_plan *p = NULL;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("head_dim 96");
    mg_backend_close(be);
    return test_finish();
}
