/* test_kv_cache_cuda.c - the paged KV cache on CUDA (metrale/ops_kv_cache.h): the append kernel
 * and FlashInfer's paged kernels against float64 over shuffled pages (decode tokens, prefill
 * chunks, empty requests, partial last pages, a 32k-token request), and a captured graph of
 * append + attention replayed across decode steps while contexts grow. Skips (77) without a
 * usable CUDA device. */
#include "kv_cache_scenario.h"
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
        kv_scenario_graph_steps(be, shapes[i], what);
    }
    /* A head_dim without paged kernels is refused at plan creation. */
    kv_shape other = shapes[0];
    other.d = 96;
    mg_paged_attention_desc d = kv_attention_desc(&other);
    int32_t qo[2] = {0, 1}, kv[2] = {0, 1}, idx[1] = {0}, last[1] = {1};
    mg_kv_page_table table = {1, qo, kv, idx, last};
    mg_attention_plan *p = NULL;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("head_dim 96");
    /* Shapes whose kernels are not built (compile time): soft-cap at head_dim 64, FP8 pools
     * at head_dim 256 or with soft-cap. */
    other.d = 64;
    other.soft_cap = 10.0f;
    d = kv_attention_desc(&other);
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("head_dim 64 with soft-cap");
    other.d = 128;
    other.fp8 = true;
    d = kv_attention_desc(&other);
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("head_dim 128 with soft-cap on FP8 pools");
    other.d = 256;
    other.soft_cap = 0.0f;
    d = kv_attention_desc(&other);
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_UNSUPPORTED);
    CHECK_MESSAGE("head_dim 256 on FP8 pools");
    mg_backend_close(be);
    return test_finish();
}
