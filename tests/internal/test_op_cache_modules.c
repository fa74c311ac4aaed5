/*
 * test_op_cache_modules.c - the op cache (private "op_cache.h") beyond test_op_cache:
 * forgetting the kernels of unloaded modules (refused while any is held, the others kept
 * with their handles), names at the cache's length limits, more scratch tags and gate keys
 * than the first table sizes, and the argument checks of the scratch calls.
 */
#include "metrale/cpu.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "op_cache.h"
#include "test_util.h"

#define CHECK_ERROR(expr, status, needle)                                                          \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

static int calls_a, calls_b;

static mg_status kernel_a(const mg_launch *l) {
    (void)l;
    calls_a++;
    return MG_OK;
}

static mg_status kernel_b(const mg_launch *l) {
    (void)l;
    calls_b++;
    return MG_OK;
}

static mg_status run(mg_backend *b, mg_kernel *k) {
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    return mg_launch_run(b, k, NULL, &l);
}

static void test_forget_modules(mg_backend *b) {
    mg_op_cache *c = mg_backend_op_cache(b);
    CHECK_OK(mg_cpu_kernel_register("mod_a", "one", kernel_a));
    CHECK_OK(mg_cpu_kernel_register("mod_a", "two", kernel_a));
    CHECK_OK(mg_cpu_kernel_register("mod_b", "one", kernel_b));
    mg_kernel *a1 = NULL, *a2 = NULL, *b1 = NULL;
    size_t count0 = mg_op_cache_kernel_count(c);
    CHECK_OK(mg_kernel_lookup(b, "mod_a", "one", &a1));
    CHECK_OK(mg_kernel_lookup(b, "mod_a", "two", &a2));
    CHECK_OK(mg_kernel_lookup(b, "mod_b", "one", &b1));
    CHECK(mg_op_cache_kernel_count(c) == count0 + 3);

    const char *const forget_a[] = {"mod_a"};
    CHECK_ERROR(mg_op_cache_forget_modules(c, forget_a, 1), MG_ERR_BUSY,
                "is still held (1 lookups not released");
    CHECK(mg_op_cache_kernel_count(c) == count0 + 3); /* nothing forgotten */
    CHECK_OK(mg_kernel_release(a1));
    CHECK_ERROR(mg_op_cache_forget_modules(c, forget_a, 1), MG_ERR_BUSY, "mod_a:two");
    CHECK_OK(mg_kernel_release(a2));
    CHECK_OK(mg_op_cache_forget_modules(c, NULL, 0)); /* nothing named: nothing forgotten */
    CHECK(mg_op_cache_kernel_count(c) == count0 + 3);
    CHECK_OK(mg_op_cache_forget_modules(c, forget_a, 1));
    CHECK(mg_op_cache_kernel_count(c) == count0 + 1);

    /* the forgotten handles are stale; the kept one is the same handle and still runs */
    CHECK(!strcmp(mg_kernel_name(a1), ""));
    CHECK(!strcmp(mg_kernel_name(b1), "mod_b:one"));
    CHECK_OK(run(b, b1));
    CHECK(calls_b == 1);
    mg_kernel *again = NULL;
    CHECK_OK(mg_kernel_lookup(b, "mod_b", "one", &again));
    CHECK(again == b1);
    /* a forgotten kernel is looked up from the backend anew */
    mg_cpu_counters before = test_cpu_counters(b);
    CHECK_OK(mg_kernel_lookup(b, "mod_a", "one", &a1));
    mg_cpu_counters after = test_cpu_counters(b);
    CHECK(after.kernel_lookup == before.kernel_lookup + 1);
    CHECK_OK(run(b, a1));
    CHECK(calls_a == 1);
    CHECK_OK(mg_kernel_release(a1));
    CHECK_OK(mg_kernel_release(b1));
    CHECK_OK(mg_kernel_release(again));
}

static void test_name_limits(mg_backend *b) {
    mg_op_cache *c = mg_backend_op_cache(b);
    char module[200], function[200];
    memset(module, 'm', sizeof module);
    memset(function, 'f', sizeof function);
    module[96] = '\0';
    function[10] = '\0';
    mg_kernel *k = NULL;
    CHECK_ERROR(mg_op_cache_kernel(c, module, function, false, &k), MG_ERR_INVALID_ARGUMENT,
                "name too long (module 96, function 10 bytes)");
    module[95] = '\0';
    function[10] = 'f';
    function[128] = '\0';
    CHECK_ERROR(mg_op_cache_kernel(c, module, function, false, &k), MG_ERR_INVALID_ARGUMENT,
                "name too long (module 95, function 128 bytes)");
    /* the longest names that fit are registered, found and named in full */
    function[127] = '\0';
    CHECK_OK(mg_cpu_kernel_register(module, function, kernel_a));
    CHECK_OK(mg_op_cache_kernel(c, module, function, false, &k));
    CHECK(k != NULL && strlen(mg_kernel_name(k)) == 95 + 1 + 127);
}

static void test_scratch_tables(mg_backend *b) {
    mg_op_cache *c = mg_backend_op_cache(b);
    mg_devptr p = 0;
    char long_tag[80];
    memset(long_tag, 't', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = '\0';
    CHECK_ERROR(mg_op_cache_scratch(c, NULL, 16, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "bad tag or size 16");
    CHECK_ERROR(mg_op_cache_scratch(c, long_tag, 16, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "bad tag or size");
    CHECK_ERROR(mg_op_cache_scratch(c, "tag", 16, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "bad tag or size");
    long_tag[63] = '\0';
    CHECK_OK(mg_op_cache_scratch(c, long_tag, 16, NULL, &p)); /* 63 characters fit */

    /* more tags than the first table holds: every buffer distinct and live */
    size_t live0 = 0, retired = 0;
    mg_op_cache_scratch_counts(c, &live0, NULL);
    mg_op_cache_scratch_counts(c, NULL, &retired);
    CHECK(retired == 0);
    mg_devptr buffers[20];
    uint64_t bytes0 = 0, count0 = 0, bytes = 0, count = 0;
    CHECK_OK(mg_ledger_live(b, &bytes0, &count0));
    for (int i = 0; i < 20; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "tag%d", i);
        CHECK_OK(mg_op_cache_scratch(c, tag, 100 + (size_t)i, NULL, &buffers[i]));
        for (int j = 0; j < i; j++)
            CHECK(buffers[j] != buffers[i]);
    }
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(count == count0 + 20 && bytes == bytes0 + 20 * 100 + 190);
    size_t live = 0;
    mg_op_cache_scratch_counts(c, &live, NULL);
    CHECK(live == live0 + 20);

    /* no-ops */
    mg_op_cache_stream_destroyed(NULL, mg_stream_default(b));
    mg_op_cache_stream_destroyed(c, NULL);
    mg_op_cache_release(NULL);
    mg_op_cache_scratch_counts(c, &live, NULL);
    CHECK(live == live0 + 20);
}

static void test_many_gate_keys(void) {
    int passed = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 100; i++) {
            char key[32];
            snprintf(key, sizeof key, "modules.gate.%d", i);
            passed += mg_gate_once(key);
        }
    CHECK(passed == 100); /* each of 100 keys once, across table growth */
}

int main(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 6, &b));
    if (!b)
        return test_finish();
    test_forget_modules(b);
    test_name_limits(b);
    test_scratch_tables(b);
    test_many_gate_keys();
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
