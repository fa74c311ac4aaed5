/* test_op_cache.c - kernel memo, grow-only scratch that frees what it outgrows, stream-private
 * scratch freed with its stream, module-hold rules and the diagnostic gates, on the CPU
 * backend. */
#include "metrale/cpu.h"
#include "metrale/gpu.h"
#include "op_cache.h"
#include "test_util.h"

static void test_kernel_memo(mg_backend *b) {
    mg_cpu_counters before, after;
    CHECK_OK(mg_cpu_get_counters(b, &before));
    mg_kernel *k1 = NULL, *k2 = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &k1));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &k2));
    CHECK(k1 && k1 == k2);
    CHECK_OK(mg_cpu_get_counters(b, &after));
    CHECK(after.kernel_lookup - before.kernel_lookup <= 1); /* second lookup: no backend call */
    CHECK(strcmp(mg_kernel_name(k1), "metrale:vector_add") == 0);
    CHECK_OK(mg_kernel_release(k1));
    CHECK_OK(mg_kernel_release(k2));
    CHECK_STATUS(mg_kernel_release(k1), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no outstanding lookup");

    mg_kernel *missing = (mg_kernel *)1;
    CHECK_STATUS(mg_kernel_lookup(b, "metrale", "no_such_kernel", &missing), MG_ERR_NOT_FOUND);
    CHECK(missing == NULL);
    CHECK_MESSAGE("no_such_kernel");
    /* Failed lookups are not memoised as handles. */
    size_t before_count = mg_op_cache_kernel_count(mg_backend_op_cache(b));
    CHECK_STATUS(mg_kernel_lookup(b, "metrale", "no_such_kernel", &missing), MG_ERR_NOT_FOUND);
    CHECK(mg_op_cache_kernel_count(mg_backend_op_cache(b)) == before_count);
}

static void test_scratch(mg_backend *b) {
    mg_op_cache *c = mg_backend_op_cache(b);
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    uint64_t live_bytes0 = 0, live_count0 = 0, live_bytes = 0, live_count = 0;
    CHECK_OK(mg_ledger_live(b, &live_bytes0, &live_count0));

    mg_devptr a = 0, a2 = 0, big = 0, other = 0;
    CHECK_OK(mg_op_cache_scratch(c, "gemm.workspace", 1000, s, &a));
    CHECK_OK(mg_op_cache_scratch(c, "gemm.workspace", 999, s, &a2));
    CHECK(a && a == a2); /* smaller request reuses */
    CHECK_OK(mg_op_cache_scratch(c, "attention.plan", 64, s, &other));
    CHECK(other && other != a);
    CHECK_OK(mg_ledger_live(b, &live_bytes, &live_count));
    CHECK(live_count == live_count0 + 2 && live_bytes == live_bytes0 + 1064);

    /* Growth retires the old buffer; once the stream's work is done it is freed, so the
     * ledger holds exactly one buffer per tag. */
    CHECK_OK(mg_op_cache_scratch(c, "gemm.workspace", 50000, s, &big));
    CHECK(big && big != a);
    CHECK_OK(mg_stream_synchronize(s));
    size_t live_slots = 0, retired = 0;
    mg_op_cache_scratch_counts(c, &live_slots, &retired);
    CHECK(live_slots == 2 && retired == 0);
    CHECK_OK(mg_ledger_live(b, &live_bytes, &live_count));
    CHECK(live_count == live_count0 + 2 && live_bytes == live_bytes0 + 50064);

    /* Growth is refused while the stream captures; reuse is fine. */
    if (mg_backend_supports(b, MG_CAP_GRAPHS)) {
        CHECK_OK(mg_graph_begin_capture(s));
        mg_devptr again = 0;
        CHECK_OK(mg_op_cache_scratch(c, "gemm.workspace", 100, s, &again));
        CHECK(again == big);
        CHECK_STATUS(mg_op_cache_scratch(c, "gemm.workspace", 1 << 20, s, &again),
                     MG_ERR_CAPTURING);
        CHECK_OK(mg_graph_abort_capture(s));
    }
    /* A sweep frees what the caller allocated and leaves the cache's own buffers live. */
    mg_devptr user = 0;
    CHECK_OK(mg_alloc(b, 777, &user));
    uint64_t swept_bytes = 0, swept_count = 0;
    CHECK_OK(mg_ledger_sweep(b, &swept_bytes, &swept_count));
    CHECK(swept_count == live_count0 + 1 && swept_bytes == live_bytes0 + 777);
    CHECK_OK(mg_ledger_live(b, &live_bytes, &live_count));
    CHECK(live_count == 2 && live_bytes == 50064);
    CHECK_OK(mg_op_cache_scratch(c, "gemm.workspace", 100, s, &a2));
    CHECK(a2 == big); /* still the cache's, still usable */
    CHECK_STATUS(mg_op_cache_scratch(c, "", 10, s, &a), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_op_cache_scratch(c, "x", 0, s, &a), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_stream_destroy(s));
}

/* Scratch private to a created stream is freed when that stream is destroyed (with what it
 * outgrew); shared scratch and the default stream's private scratch stay until close. */
static void test_stream_scratch(mg_backend *b) {
    mg_op_cache *c = mg_backend_op_cache(b);
    uint64_t bytes0 = 0, count0 = 0, bytes = 0, count = 0;
    size_t slots0 = 0, slots = 0, retired = 0;
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    mg_op_cache_scratch_counts(c, &slots0, &retired);
    mg_devptr on_default = 0, shared = 0, small = 0, grown = 0, other = 0;
    CHECK_OK(
        mg_op_cache_stream_scratch(c, "private default", 300, mg_stream_default(b), &on_default));
    CHECK(on_default != 0);
    for (int round = 0; round < 3; round++) {
        mg_stream *s = NULL, *t = NULL;
        CHECK_OK(mg_stream_create(b, &s));
        CHECK_OK(mg_stream_create(b, &t));
        if (!s || !t)
            return;
        CHECK_OK(mg_op_cache_stream_scratch(c, "private s", 1000, s, &small));
        CHECK_OK(mg_op_cache_stream_scratch(c, "private s", 4000, s, &grown)); /* retires */
        CHECK(small && grown && grown != small);
        CHECK_OK(mg_op_cache_stream_scratch(c, "private t", 500, t, &other));
        if (round == 0)
            CHECK_OK(mg_op_cache_scratch(c, "shared on s", 200, s, &shared));
        CHECK_OK(mg_stream_destroy(s));
        CHECK_OK(mg_ledger_live(b, &bytes, &count));
        CHECK(count == count0 + 3 && bytes == bytes0 + 300 + 200 + 500);
        mg_op_cache_scratch_counts(c, &slots, &retired);
        CHECK(slots == slots0 + 3 && retired == 0);
        CHECK_OK(mg_stream_destroy(t));
        CHECK_OK(mg_ledger_live(b, &bytes, &count));
        CHECK(count == count0 + 2 && bytes == bytes0 + 300 + 200);
        mg_op_cache_scratch_counts(c, &slots, &retired);
        CHECK(slots == slots0 + 2);
    }
    mg_devptr again = 0;
    CHECK_OK(mg_op_cache_scratch(c, "shared on s", 100, NULL, &again));
    CHECK(again == shared);
    CHECK_OK(mg_op_cache_stream_scratch(c, "private default", 300, NULL, &again));
    CHECK(again == on_default);
}

static void test_gates(void) {
    int once = 0, first3 = 0, shapes = 0;
    for (int i = 0; i < 10; i++) {
        once += mg_gate_once("test.once");
        first3 += mg_gate_first_n("test.first3", 3);
        shapes += mg_gate_first_shape("gemm", 16, 4096, (uint64_t)(i % 4));
    }
    CHECK(once == 1);
    CHECK(first3 == 3);
    CHECK(shapes == 4); /* one per distinct (name, m, n, k) */
    CHECK(mg_gate_once("test.once.other"));
    CHECK(!mg_gate_once("test.once"));
    CHECK(mg_gate_first_shape("gemm_fp8", 16, 4096, 0)); /* names are part of the key */

    /* Diagnostic switches: exactly "1", read once and kept. */
    static atomic_int on = -1, off = -1, other = -1;
    setenv("METRALE_TEST_DIAG_ON", "1", 1);
    setenv("METRALE_TEST_DIAG_OFF", "true", 1);
    CHECK(mg_diag_env_enabled("METRALE_TEST_DIAG_ON", &on));
    CHECK(!mg_diag_env_enabled("METRALE_TEST_DIAG_OFF", &off));
    CHECK(!mg_diag_env_enabled("METRALE_TEST_DIAG_UNSET", &other));
    setenv("METRALE_TEST_DIAG_ON", "0", 1);
    setenv("METRALE_TEST_DIAG_UNSET", "1", 1);
    CHECK(mg_diag_env_enabled("METRALE_TEST_DIAG_ON", &on)); /* cached */
    CHECK(!mg_diag_env_enabled("METRALE_TEST_DIAG_UNSET", &other));
}

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 1, &b));
    if (!b)
        return test_finish();
    test_kernel_memo(b);
    test_scratch(b);
    test_stream_scratch(b);
    test_gates();
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
