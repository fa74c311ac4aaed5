/*
 * check.h - private: the check framework shared by `metrale-gpu check` and the test
 * programs. A check runs one property on one backend and, for ops, compares the result with
 * the CPU reference on fresh random inputs of awkward sizes, outputs poisoned first.
 *
 * Each group is a NULL-terminated array of mg_check_case in its own file (conformance.c,
 * check_gemm.c, ...) and is listed once in registry.c.
 */
#ifndef METRALE_CHECK_H
#define METRALE_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/gpu.h"
#include "metrale/ops.h"

typedef struct mg_check_ctx {
    mg_backend *backend;   /* under test */
    mg_backend *reference; /* the CPU backend: the oracle for op results */
    uint64_t seed;         /* fresh per run unless METRALE_CHECK_SEED is set */
} mg_check_ctx;

typedef struct mg_check_result {
    bool passed;
    bool skipped;     /* not applicable to this backend (says why in detail) */
    double error;     /* relative error for numeric checks, else 0 */
    char detail[512]; /* what failed, or the measured figure */
} mg_check_result;

typedef void (*mg_check_fn)(mg_check_ctx *ctx, mg_check_result *result);

/* Tags of a check case (bits of mg_check_case.tags). A case without tags runs in every run,
 * the sanitizer and coverage builds included: a new check is instrumented by default. */
enum {
    /* More than about 10 s in an optimised build on two cores, minutes under the sanitizers
     * (long sequences of the attention reference, its variants and graph replays):
     * `check --skip-tag slow` leaves it out. */
    MG_CHECK_SLOW = 1u << 0,
};

/* Written {group, name, fn} or {group, name, fn, tags}: tags left out are none (the check
 * library is built without -Wmissing-field-initializers for this). */
typedef struct mg_check_case {
    const char *group; /* "conformance", "gemm", ... */
    const char *name;
    mg_check_fn fn;
    unsigned tags; /* MG_CHECK_* bits */
} mg_check_case;

/* The ops the checks whose "group/name" starts with `prefix` run (count of them in ops): where
 * the backend under test has no provider for one (mg_op_supported), the runner reports those
 * checks skipped, naming the op, instead of running them. One table (registry.c),
 * NULL-terminated; checks that choose among ops themselves (the GEMM group's BF16 and FP8
 * cases) are not in it. */
typedef struct mg_check_needs {
    const char *prefix;
    mg_op ops[3];
    int count;
} mg_check_needs;
extern const mg_check_needs mg_check_needs_table[];

/* The tag named `name` ("slow"); false for an unknown name. */
bool mg_check_tag_parse(const char *name, unsigned *tag_out);

/* Runs every registered check whose "group/name" contains `filter` (NULL: all) and that has
 * none of the tags in `skip_tags` on `b`, printing a table of check, result and error to
 * `out`. Returns the number of failures. */
int mg_check_run_selected(mg_backend *b, const char *filter, unsigned skip_tags, FILE *out,
                          int *passed_out, int *skipped_out);

/* mg_check_run_selected skipping no tag. */
int mg_check_run_all(mg_backend *b, const char *filter, FILE *out, int *passed_out,
                     int *skipped_out);

/* All groups, NULL-terminated; each group NULL-terminated (registry.c). */
extern const mg_check_case *const mg_check_groups[];

#endif
