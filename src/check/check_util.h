/*
 * check_util.h - private: what the check groups share: recording a failure, the assertion
 * macros of a check function, and the per-check random stream.
 */
#ifndef METRALE_CHECK_UTIL_H
#define METRALE_CHECK_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"

#if defined(__GNUC__)
#define MG_CHECK_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define MG_CHECK_PRINTF(fmt_index, first_arg)
#endif

/* Records why a check failed, prefixed with the source line; the first failure wins, so the
 * detail names the root cause rather than a consequence. */
void mg_check_fail_at(mg_check_result *result, int line, const char *fmt, ...)
    MG_CHECK_PRINTF(3, 4);
#define MG_CHECK_FAIL(result, ...) mg_check_fail_at((result), __LINE__, __VA_ARGS__)

/* For check functions with a `mg_check_result *result` and a `done:` cleanup label: FAIL
 * records and jumps to `done`. */
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        MG_CHECK_FAIL(result, __VA_ARGS__);                                                        \
        goto done;                                                                                 \
    } while (0)
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            FAIL(__VA_ARGS__);                                                                     \
    } while (0)
/* The call must return `want`; the detail names the call, both statuses and the message. */
#define EXPECT_STATUS(call, want)                                                                  \
    do {                                                                                           \
        mg_status got_ = (call);                                                                   \
        if (got_ != (want))                                                                        \
            FAIL("%s returned %s, expected %s: %s", #call, mg_status_name(got_),                   \
                 mg_status_name(want), mg_last_error());                                           \
    } while (0)
#define OK(call) EXPECT_STATUS(call, MG_OK)
#define PASS() (result->passed = true)

/* The byte op outputs are filled with before an op runs, so bytes it should not write, or
 * failed to write, show. */
#define MG_CHECK_POISON 0xa5

/* Allocates `bytes` on `b` and copies `host` there. */
mg_status mg_check_upload(mg_backend *b, const void *host, size_t bytes, mg_devptr *out);
/* Allocates `bytes` on `b`, every byte MG_CHECK_POISON. */
mg_status mg_check_alloc_poisoned(mg_backend *b, size_t bytes, mg_devptr *out);

/* The first state of a check's random stream, from the run's seed and the check's name, so one
 * failing check reproduces alone with the same METRALE_CHECK_SEED. */
uint64_t mg_check_rng_seed(const mg_check_ctx *ctx, const char *check_name);

/* The next value of the splitmix64 stream in `state` (any state is valid, zero included). */
uint64_t mg_check_rng_next(uint64_t *state);

#endif
