/*
 * test_util.h - the few helpers every test program shares: a CHECK that reports file:line
 * and the library's last error, a deterministic-but-fresh random source, and the closing
 * line. Tests count failures and keep going, so one run shows every broken property.
 */
#ifndef METRALE_TEST_UTIL_H
#define METRALE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrale/cpu.h"
#include "metrale/gpu.h"

static int test_failures;
static int test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,        \
                    mg_last_error());                                                              \
        }                                                                                          \
    } while (0)

/* Status equality, printing both names on mismatch. */
#define CHECK_STATUS(expr, expected)                                                               \
    do {                                                                                           \
        mg_status got_ = (expr);                                                                   \
        test_checks++;                                                                             \
        if (got_ != (expected)) {                                                                  \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s returned %s, expected %s (last error: %s)\n",          \
                    __FILE__, __LINE__, #expr, mg_status_name(got_), mg_status_name(expected),     \
                    mg_last_error());                                                              \
        }                                                                                          \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, MG_OK)

/* The last error message must mention `needle`. */
#define CHECK_MESSAGE(needle)                                                                      \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!strstr(mg_last_error(), (needle))) {                                                  \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: message \"%s\" does not mention \"%s\"\n", __FILE__,      \
                    __LINE__, mg_last_error(), (needle));                                          \
        }                                                                                          \
    } while (0)

/* xorshift64*: seeded from METRALE_TEST_SEED when set (to replay a failure), else the clock;
 * the seed is printed so any run can be repeated. */
static uint64_t test_rng_state;

static inline void test_seed(void) {
    const char *env = getenv("METRALE_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    test_rng_state =
        env ? strtoull(env, NULL, 0) : ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec;
    if (!test_rng_state)
        test_rng_state = 0x9e3779b97f4a7c15ull;
    printf("seed %llu (METRALE_TEST_SEED replays it)\n", (unsigned long long)test_rng_state);
}

static inline uint64_t test_rand(void) {
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    return test_rng_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [lo, hi]. */
static inline uint64_t test_rand_range(uint64_t lo, uint64_t hi) {
    return lo + test_rand() % (hi - lo + 1);
}

static inline void test_fill_random(void *p, size_t bytes) {
    unsigned char *c = p;
    for (size_t i = 0; i < bytes; i++)
        c[i] = (unsigned char)test_rand();
}

/* The CPU backend's call counters now (zeros, with a failed check, when they cannot be read). */
/* A test's size knob from the environment (a decimal number), or `fallback` when unset: how
 * instrumented builds run a long test shorter (cmake sets it; the claim stays the normal
 * build's). */
static inline uint32_t test_env_u32(const char *name, uint32_t fallback) {
    const char *v = getenv(name);
    return v && *v ? (uint32_t)strtoul(v, NULL, 10) : fallback;
}

static inline mg_cpu_counters test_cpu_counters(mg_backend *b) {
    mg_cpu_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(mg_cpu_get_counters(b, &c));
    return c;
}

/* Prints the closing line ("N passed, N failed") and returns the exit status. */
static inline int test_finish(void) {
    printf("%d passed, %d failed\n", test_checks - test_failures, test_failures);
    return test_failures ? 1 : 0;
}

#endif
