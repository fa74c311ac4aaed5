/* test_kv_cache_cpu.c - the paged KV cache on the CPU backend (metrale/ops_kv_cache.h): the page
 * allocator, page-table checks, append + attention over shuffled pages against float64, graph
 * replay across decode steps, and bad tables refused before anything is written. */
#include "kv_cache_scenario.h"

static void test_allocator(void) {
    mg_kv_page_allocator *a = NULL;
    CHECK_OK(mg_kv_page_allocator_create(5, &a));
    int32_t pages[6];
    CHECK_OK(mg_kv_page_alloc(a, 3, pages));
    CHECK(pages[0] == 0 && pages[1] == 1 && pages[2] == 2);
    CHECK(mg_kv_page_free_count(a) == 2);
    CHECK_STATUS(mg_kv_page_alloc(a, 3, pages + 3), MG_ERR_OUT_OF_MEMORY);
    CHECK_MESSAGE("exhausted");
    CHECK(mg_kv_page_free_count(a) == 2); /* all or nothing */
    CHECK_STATUS(mg_kv_page_free(a, 2, (int32_t[]){1, 1}), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("listed twice");
    CHECK_STATUS(mg_kv_page_free(a, 2, (int32_t[]){1, 4}), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not allocated");
    CHECK_STATUS(mg_kv_page_free(a, 1, (int32_t[]){5}), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("outside");
    CHECK(mg_kv_page_free_count(a) == 2); /* a refused free frees nothing */
    CHECK_OK(mg_kv_page_free(a, 1, (int32_t[]){1}));
    CHECK_OK(mg_kv_page_alloc(a, 1, pages));
    CHECK(pages[0] == 1); /* last freed, first reused */
    CHECK_OK(mg_kv_page_alloc(a, 2, pages));
    CHECK(mg_kv_page_free_count(a) == 0);
    CHECK_STATUS(mg_kv_page_alloc(a, 1, pages), MG_ERR_OUT_OF_MEMORY);
    mg_kv_page_allocator_destroy(a);
    CHECK_STATUS(mg_kv_page_allocator_create(0, &a), MG_ERR_INVALID_ARGUMENT);

    size_t bytes = 0;
    mg_kv_cache_desc c = {8, 128, 0, 10, MG_KV_BF16};
    CHECK_OK(mg_kv_cache_bytes(&c, &bytes));
    CHECK(bytes == 2ull * 10 * 16 * 8 * 128 * 2); /* page size 0 means 16 */
    c.page_size = 129;
    CHECK_STATUS(mg_kv_cache_bytes(&c, &bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("page_size");
    c = (mg_kv_cache_desc){8, 100, 16, 10, MG_KV_BF16};
    CHECK_STATUS(mg_kv_cache_bytes(&c, &bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("head_dim");
}

static void test_table_checks(void) {
    const mg_kv_cache_desc c = {2, 64, 4, 6, MG_KV_BF16};
    int32_t qo[3] = {0, 1, 3}, kv[3] = {0, 2, 3}, idx[3] = {5, 0, 2}, last[2] = {3, 4};
    mg_kv_page_table t = {2, qo, kv, idx, last};
    CHECK_OK(mg_kv_page_table_check(&c, &t, NULL));
    idx[1] = 6;
    CHECK_STATUS(mg_kv_page_table_check(&c, &t, "x"), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_indices[1] = 6 is out of range");
    idx[1] = 0;
    kv[1] = 4;
    CHECK_STATUS(mg_kv_page_table_check(&c, &t, "x"), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not monotone");
    kv[1] = 2;
    last[0] = 0;
    CHECK_STATUS(mg_kv_page_table_check(&c, &t, "x"), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_last_page_len[0] = 0");
    last[0] = 5;
    CHECK_STATUS(mg_kv_page_table_check(&c, &t, "x"), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_last_page_len[0] = 5");
    last[0] = 3;
    last[1] = 1;
    CHECK_STATUS(mg_kv_page_table_check(&c, &t, "x"), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("2 new tokens but only 1 cached");
}

/* Bad tables in device memory: the CPU append refuses them before writing a single element;
 * plans refuse bad host tables; runs refuse out-of-range page ids on the CPU backend. */
static void test_bad_tables(mg_backend *be) {
    kv_shape sh = {.hq = 4, .hkv = 2, .d = 64, .page_size = 4, .window_left = -1, .rope = true};
    mg_kv_page_allocator *a = kv_shuffled_allocator(8);
    kv_requests r;
    kv_requests_init(&r, 2, 8);
    kv_step st;
    kv_step_build(&st, &sh, &r, a, (uint32_t[]){5, 3});
    sh.num_pages = 8;
    kv_device dv;
    kv_device_alloc(be, &sh, &dv, st.tokens, st.kv_stride, 2);
    CHECK_OK(mg_memset(be, dv.pool, 0xAB, kv_pool_bytes(&sh)));
    const mg_kv_cache_desc cache = {sh.hkv, sh.d, sh.page_size, sh.num_pages, MG_KV_BF16};
    struct {
        int32_t *slot;
        int32_t bad;
        const char *needle;
        bool plan_refuses; /* plans do not know the pool: page ids are checked at run time */
    } cases[] = {
        {&st.kv_indices[1], 8, "out of range", false},
        {&st.kv_indices[0], -1, "out of range", true},
        {&st.kv_indptr[1], 4, "not monotone", true},
        {&st.last[0], 0, "kv_last_page_len[0] = 0", true},
        {&st.last[1], 5, "kv_last_page_len[1] = 5", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int32_t good = *cases[i].slot;
        *cases[i].slot = cases[i].bad;
        kv_device_upload(be, &sh, &dv, &st);
        mg_kv_append_args args = kv_append_args_of(&sh, &dv, &st);
        CHECK_STATUS(mg_kv_append(be, NULL, &cache, &args), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE(cases[i].needle);
        mg_kv_page_table table = kv_table_of(&st);
        mg_paged_attention_desc d = kv_attention_desc(&sh);
        mg_attention_plan *p = NULL;
        if (cases[i].plan_refuses) {
            CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p),
                         MG_ERR_INVALID_ARGUMENT);
            CHECK_MESSAGE(cases[i].needle);
            CHECK(p == NULL);
        }
        *cases[i].slot = good;
    }
    /* New tokens read from the pool they are written to: refused, nothing written. */
    kv_device_upload(be, &sh, &dv, &st);
    CHECK_OK(mg_memset(be, dv.pool, 0xAB, kv_pool_bytes(&sh)));
    mg_kv_append_args aliased = kv_append_args_of(&sh, &dv, &st);
    aliased.v = aliased.v_pages + 64;
    CHECK_STATUS(mg_kv_append(be, NULL, &cache, &aliased), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("v and v_pages overlap");
    uint16_t *pool = malloc(kv_pool_bytes(&sh));
    CHECK_OK(mg_copy_d2h(be, pool, dv.pool, kv_pool_bytes(&sh)));
    size_t touched = 0;
    for (size_t i = 0; i < 2 * kv_pool_elems(&sh); i++)
        touched += pool[i] != 0xABAB;
    CHECK(touched == 0);
    free(pool);

    /* A valid plan, then a page id out of the pool in the caller's kv_indices at run time. */
    kv_device_upload(be, &sh, &dv, &st);
    mg_kv_page_table table = kv_table_of(&st);
    mg_paged_attention_desc d = kv_attention_desc(&sh);
    mg_attention_plan *p = NULL;
    CHECK_OK(mg_paged_attention_plan_create(be, &d, &table, NULL, &p));
    mg_paged_attention_tensors t = kv_attention_tensors(&sh, &dv, st.tokens);
    int32_t bad = 9;
    CHECK_OK(mg_copy_h2d(be, dv.kv_indices + 4, &bad, 4));
    CHECK_STATUS(mg_paged_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("out of range");
    t.qo_rows = st.tokens + 1;
    CHECK_STATUS(mg_paged_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("qo_rows");
    t.qo_rows = st.tokens;
    t.num_kv_indices = 1;
    CHECK_STATUS(mg_paged_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_indices has 1 entries");
    t = kv_attention_tensors(&sh, &dv, st.tokens);
    t.o = t.q; /* the output on the queries it reads */
    CHECK_STATUS(mg_paged_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("q and o overlap");
    t = kv_attention_tensors(&sh, &dv, st.tokens);
    /* Ragged entry points refuse a paged plan. */
    mg_attention_tensors rt = {0};
    CHECK_STATUS(mg_attention_run(p, &rt, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_attention_plan_update(p, st.qo_indptr, st.kv_indptr, 2, NULL),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("mg_paged_attention_plan_update");
    d.logits_soft_cap = -1.0f;
    mg_attention_plan *q = NULL;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &q), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("logits_soft_cap");
    mg_attention_plan_destroy(p);
    kv_device_free(be, &dv);
    kv_step_free(&st);
    kv_requests_free(&r);
    mg_kv_page_allocator_destroy(a);
}

/* FP8 pools: sizes, and the scale arguments refused before anything is written. */
static void test_fp8_arguments(mg_backend *be) {
    size_t bytes = 0;
    mg_kv_cache_desc c = {8, 128, 16, 10, MG_KV_FP8_E4M3};
    CHECK_OK(mg_kv_cache_bytes(&c, &bytes));
    CHECK(bytes == 2ull * 10 * 16 * 8 * 128); /* one byte per element */
    CHECK(mg_kv_dtype_bytes(MG_KV_FP8_E4M3) == 1 && mg_kv_dtype_bytes(MG_KV_BF16) == 2);
    c.kv_dtype = (mg_kv_dtype)7;
    CHECK_STATUS(mg_kv_cache_bytes(&c, &bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_dtype 7");

    kv_shape sh = {
        .hq = 4, .hkv = 2, .d = 32, .page_size = 4, .window_left = -1, .rope = true, .fp8 = true};
    mg_kv_page_allocator *a = kv_shuffled_allocator(8);
    kv_requests r;
    kv_requests_init(&r, 2, 8);
    kv_step st;
    kv_step_build(&st, &sh, &r, a, (uint32_t[]){5, 3});
    sh.num_pages = 8;
    kv_device dv;
    kv_device_alloc(be, &sh, &dv, st.tokens, st.kv_stride, 2);
    CHECK_OK(mg_memset(be, dv.pool, 0x5A, kv_pool_bytes(&sh)));
    kv_device_upload(be, &sh, &dv, &st);
    const mg_kv_cache_desc cache = {sh.hkv, sh.d, sh.page_size, sh.num_pages, MG_KV_FP8_E4M3};
    mg_kv_append_args args = kv_append_args_of(&sh, &dv, &st);
    args.v_scale = 0;
    CHECK_STATUS(mg_kv_append(be, NULL, &cache, &args), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("v_scale");
    args = kv_append_args_of(&sh, &dv, &st);
    const mg_kv_cache_desc bf16_cache = {sh.hkv, sh.d, sh.page_size, sh.num_pages, MG_KV_BF16};
    CHECK_STATUS(mg_kv_append(be, NULL, &bf16_cache, &args), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("for FP8 pools");
    /* A scale that is not finite and > 0: the CPU kernel refuses it before writing. */
    const float bad_scale = -1.0f;
    CHECK_OK(mg_copy_h2d(be, dv.k_scale + 4, &bad_scale, 4));
    CHECK_STATUS(mg_kv_append(be, NULL, &cache, &args), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("k_scale[1] = -1");
    uint8_t *pool = malloc(kv_pool_bytes(&sh));
    CHECK_OK(mg_copy_d2h(be, pool, dv.pool, kv_pool_bytes(&sh)));
    size_t touched = 0;
    for (size_t i = 0; i < kv_pool_bytes(&sh); i++)
        touched += pool[i] != 0x5A;
    CHECK(touched == 0);
    free(pool);
    /* Attention: scales required for FP8 plans, refused for BF16 ones. */
    mg_kv_page_table table = kv_table_of(&st);
    mg_paged_attention_desc d = kv_attention_desc(&sh);
    mg_attention_plan *p = NULL;
    CHECK_OK(mg_paged_attention_plan_create(be, &d, &table, NULL, &p));
    mg_paged_attention_tensors t = kv_attention_tensors(&sh, &dv, st.tokens);
    t.k_scale = 0;
    CHECK_STATUS(mg_paged_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("k_scale");
    mg_attention_plan_destroy(p);
    d.kv_dtype = (mg_kv_dtype)2;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("kv_dtype 2");
    kv_device_free(be, &dv);
    kv_step_free(&st);
    kv_requests_free(&r);
    mg_kv_page_allocator_destroy(a);
}

/* A caller's workspace for paged plans: sized by mg_paged_attention_workspace_bytes (the four
 * page-table arrays of the CPU reference), carved by create and update with no allocation of
 * the plan's own (CPU allocation counter and ledger unchanged), results checked against float64
 * and equal to a library-owned plan's; too small, misaligned or half-given workspaces refused. */
static void test_caller_workspace(mg_backend *be) {
    kv_shape sh = {.hq = 6, .hkv = 3, .d = 48, .page_size = 5, .window_left = -1, .rope = true};
    const uint32_t B = (uint32_t)test_rand_range(2, 6);
    uint32_t add[2][8];
    for (uint32_t i = 0; i < B; i++)
        add[0][i] = (uint32_t)test_rand_range(1, 13), add[1][i] = 1;
    sh.num_pages = 40;
    mg_kv_page_allocator *a = kv_shuffled_allocator(sh.num_pages);
    kv_requests r;
    kv_requests_init(&r, B, sh.num_pages);
    kv_step st;
    kv_step_build(&st, &sh, &r, a, add[0]);
    kv_device dv;
    kv_device_alloc(be, &sh, &dv, st.tokens, st.kv_stride, B);
    void *pool = kv_random_pool(&sh);
    mg_attention_plan *own = NULL;
    kv_check_eager_step(be, &sh, &dv, &st, pool, &own, "library-owned workspace");
    uint16_t *want = malloc(2ull * st.tokens * sh.hq * sh.d);
    CHECK_OK(mg_copy_d2h(be, want, dv.o, 2ull * st.tokens * sh.hq * sh.d));

    mg_paged_attention_desc d = kv_attention_desc(&sh);
    mg_kv_page_table table = kv_table_of(&st);
    size_t need = 0;
    CHECK_OK(mg_paged_attention_workspace_bytes(be, &d, &table, &need));
    CHECK(need == (4ull * 4 * (B + 1) + 15) / 16 * 16);
    mg_devptr ws = 0;
    CHECK_OK(mg_alloc(be, need + 64, &ws));
    CHECK_OK(mg_memset(be, ws, 0xC3, need + 64));
    d.workspace = ws;
    d.workspace_bytes = need - 1;
    mg_attention_plan *p = NULL;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("mg_paged_attention_workspace_bytes");
    CHECK(p == NULL);
    d.workspace = ws + 8;
    d.workspace_bytes = need;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("aligned");
    d.workspace = 0;
    CHECK_STATUS(mg_paged_attention_plan_create(be, &d, &table, NULL, &p), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("without a workspace");

    /* The same step again, now through the caller's workspace. */
    d.workspace = ws;
    d.workspace_bytes = need;
    CHECK_OK(mg_copy_h2d(be, dv.pool, pool, kv_pool_bytes(&sh))); /* the pool after the append */
    CHECK_OK(mg_memset(be, dv.o, 0xFF, 2ull * dv.token_capacity * sh.hq * sh.d));
    mg_cpu_counters before, after;
    uint64_t live_bytes[2], live_count[2];
    CHECK_OK(mg_cpu_get_counters(be, &before));
    CHECK_OK(mg_ledger_live(be, &live_bytes[0], &live_count[0]));
    CHECK_OK(mg_paged_attention_plan_create(be, &d, &table, NULL, &p));
    mg_paged_attention_tensors t = kv_attention_tensors(&sh, &dv, st.tokens);
    if (p)
        CHECK_OK(mg_paged_attention_run(p, &t, NULL));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(be)));
    uint16_t *got = malloc(2ull * st.tokens * sh.hq * sh.d);
    CHECK_OK(mg_copy_d2h(be, got, dv.o, 2ull * st.tokens * sh.hq * sh.d));
    CHECK(memcmp(got, want, 2ull * st.tokens * sh.hq * sh.d) == 0);
    mg_attention_plan_info info;
    if (p) {
        CHECK_OK(mg_attention_plan_get_info(p, &info));
        CHECK(info.workspace_bytes == need);
    }
    /* A decode step (one token each) updates the plan inside the same workspace, checked
     * against float64 by the scenario. */
    kv_step_free(&st);
    kv_step_build(&st, &sh, &r, a, add[1]);
    kv_check_eager_step(be, &sh, &dv, &st, pool, &p, "caller's workspace, decode update");
    CHECK_OK(mg_cpu_get_counters(be, &after));
    CHECK_OK(mg_ledger_live(be, &live_bytes[1], &live_count[1]));
    CHECK(after.alloc == before.alloc);
    CHECK(live_bytes[1] == live_bytes[0] && live_count[1] == live_count[0]);
    /* Past the bytes the plan carved, the workspace is untouched. */
    uint8_t tail[64];
    CHECK_OK(mg_copy_d2h(be, tail, ws + need, sizeof tail));
    size_t touched = 0;
    for (size_t i = 0; i < sizeof tail; i++)
        touched += tail[i] != 0xC3;
    CHECK(touched == 0);
    mg_attention_plan_destroy(p);
    mg_attention_plan_destroy(own);
    CHECK_OK(mg_free(be, ws)); /* the plan left it to its owner */
    free(got);
    free(want);
    free(pool);
    kv_step_free(&st);
    kv_device_free(be, &dv);
    kv_requests_free(&r);
    mg_kv_page_allocator_destroy(a);
}

int main(void) {
    test_seed();
    mg_backend *be = NULL;
    if (mg_backend_open(MG_BACKEND_CPU, 0, &be)) {
        fprintf(stderr, "FAIL: cannot open the CPU backend: %s\n", mg_last_error());
        return 1;
    }
    test_allocator();
    test_table_checks();
    test_bad_tables(be);
    test_fp8_arguments(be);
    test_caller_workspace(be);
    const kv_shape shapes[] = {
        {.hq = 8, .hkv = 2, .d = 64, .page_size = 16, .window_left = -1, .rope = true},
        {.hq = 4, .hkv = 4, .d = 32, .page_size = 1, .window_left = -1, .rope = false},
        {.hq = 8,
         .hkv = 1,
         .d = 128,
         .page_size = 5,
         .window_left = 23,
         .soft_cap = 30.0f,
         .rope = true,
         .positions = true},
        {.hq = 6,
         .hkv = 2,
         .d = 48,
         .page_size = 128,
         .window_left = -1,
         .soft_cap = 2.0f,
         .rope = true},
        /* The head_dims with CUDA paged kernels besides 128: 64 above, 256 here (Gemma 2's:
         * soft-cap and sliding window). */
        {.hq = 8,
         .hkv = 4,
         .d = 256,
         .page_size = 16,
         .window_left = 300,
         .soft_cap = 50.0f,
         .rope = true},
        /* FP8 E4M3 pools with per-head scales (head 3's keys saturate). */
        {.hq = 8, .hkv = 4, .d = 64, .page_size = 16, .window_left = -1, .rope = true, .fp8 = true},
        {.hq = 4,
         .hkv = 2,
         .d = 128,
         .page_size = 5,
         .window_left = 23,
         .soft_cap = 30.0f,
         .rope = true,
         .positions = true,
         .fp8 = true},
        {.hq = 6, .hkv = 6, .d = 32, .page_size = 1, .window_left = -1, .fp8 = true},
        /* Llama 3.1's scaled RoPE through the frequency table */
        {.hq = 6,
         .hkv = 2,
         .d = 64,
         .page_size = 7,
         .window_left = -1,
         .rope = true,
         .positions = true,
         .llama3 = true},
        {.hq = 4,
         .hkv = 2,
         .d = 32,
         .page_size = 16,
         .window_left = -1,
         .rope = true,
         .llama3 = true,
         .fp8 = true},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "cpu shape %zu (hq %u hkv %u d %u page %u%s)", i, shapes[i].hq,
                 shapes[i].hkv, shapes[i].d, shapes[i].page_size, shapes[i].fp8 ? " fp8" : "");
        kv_scenario_one_step(be, shapes[i], 700, what);
        kv_scenario_decode_then_mixed(be, shapes[i], 700, what);
        kv_scenario_graph_steps(be, shapes[i], what);
    }
    /* Prefill-heavy steps, eager and replayed from a fixed grid of chunks (what CUDA runs on
     * its FA3 path on Hopper); the CPU backend ignores impl and serves them with its reference. */
    const kv_shape chunked = {.hq = 8,
                              .hkv = 2,
                              .d = 64,
                              .page_size = 7,
                              .window_left = 40,
                              .rope = true,
                              .impl = MG_ATTENTION_IMPL_FA3,
                              .graph_chunk = 24};
    kv_scenario_prefill_chunks(be, chunked, "cpu prefill chunks (impl fa3)");
    kv_scenario_graph_steps(be, chunked, "cpu graph chunks (impl fa3)");
    mg_backend_close(be);
    return test_finish();
}
