/*
 * test_dead_backend_handle.c - what a caller may rely on about backend handles across the
 * layers: a NULL, stale or closed backend gets one message in the core, the backends and the
 * ops ("`fn`: ..., invalid or closed backend handle ..."), and a freshly opened CPU backend
 * ships every op's CPU kernels by name before any op has been called on it.
 */
#include <stdio.h>
#include <string.h>

#include "metrale/cpu.h"
#include "metrale/gpu.h"
#include "metrale/ops.h"
#include "metrale/ops_activation.h"
#include "metrale/timing.h"
#include "test_util.h"

/* The message must start with exactly `expected` (a location may follow). */
#define CHECK_DEAD(expr, expected)                                                                 \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, MG_ERR_INVALID_ARGUMENT);                                               \
        test_checks++;                                                                             \
        if (strncmp(mg_last_error(), (expected), strlen(expected))) {                              \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: message \"%s\" does not start with \"%s\"\n", __FILE__,   \
                    __LINE__, mg_last_error(), (expected));                                        \
        }                                                                                          \
    } while (0)

static char expected[256];

static const char *dead(const void *b, const char *fn) {
    if (!b)
        snprintf(expected, sizeof expected,
                 "%s: NULL, invalid or closed backend handle (NULL backend)", fn);
    else
        snprintf(expected, sizeof expected,
                 "%s: invalid or closed backend handle %p (invalid backend: never opened, or "
                 "closed)",
                 fn, b);
    return expected;
}

/* Kernels looked up by name, with no op front called first, find the ops' CPU kernels. */
static void test_kernels_at_open(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    static const char *const names[] = {"silu_mul_bf16", "rmsnorm_bf16", "vector_add"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        mg_kernel *k = NULL;
        CHECK_OK(mg_kernel_lookup(b, "metrale", names[i], &k));
        if (k)
            CHECK_OK(mg_kernel_release(k));
    }
    CHECK(mg_op_supported(b, MG_OP_SILU_MUL));
    CHECK_OK(mg_backend_close(b));
}

static void test_one_message(mg_backend *b) {
    mg_devptr p = 0;
    mg_timing *t = NULL;
    mg_cpu_counters counters;
    CHECK_DEAD(mg_alloc(b, 64, &p), dead(b, "mg_alloc"));
    CHECK_DEAD(mg_device_get_info(b, &(mg_device_info){0}), dead(b, "mg_device_get_info"));
    CHECK_DEAD(mg_timing_create(b, NULL, &t), dead(b, "mg_timing_create"));
    CHECK_DEAD(mg_silu_mul_bf16(b, NULL, 1, 8, 0, 16, 0, 8), dead(b, "mg_silu_mul_bf16"));
    CHECK_DEAD(mg_op_force_provider(b, MG_OP_SILU_MUL, "kernels"), dead(b, "mg_op_force_provider"));
    CHECK_DEAD(mg_free(b, 0x1000), dead(b, "mg_free"));
    CHECK_DEAD(mg_ledger_live(b, NULL, NULL), dead(b, "mg_ledger_live"));
    if (b) { /* NULL: closing is a no-op, and the CPU test hooks say "NULL backend" */
        CHECK_DEAD(mg_cpu_get_counters(b, &counters), dead(b, "mg_cpu_get_counters"));
        CHECK_DEAD(mg_backend_close(b), dead(b, "mg_backend_close"));
    }

    /* a query reports the same text as its reason, leaving the last error alone */
    char reason[256] = "";
    mg_clear_error();
    CHECK(!mg_op_provider_available(b, MG_OP_SILU_MUL, "kernels", reason, sizeof reason));
    CHECK(!strcmp(reason, dead(b, "mg_op_provider_available")));
    CHECK(!strcmp(mg_last_error(), ""));
    CHECK(!mg_op_supported(b, MG_OP_SILU_MUL));
}

int main(void) {
    test_kernels_at_open();
    test_one_message(NULL);
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 1, &b));
    CHECK_OK(mg_backend_close(b));
    test_one_message(b); /* closed: a stale handle, never dereferenced */
    return test_finish();
}
