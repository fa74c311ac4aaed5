/*
 * test_check_runner.c - the check runner's CPU reference is a backend of its own: with the
 * CPU backend under test, the numeric GEMM checks run against another CPU device (named in
 * the report) and pass; with every CPU device taken, the report says no reference could be
 * opened and the op checks fail rather than compare the backend with itself. The sanitizer
 * runs choose cases by tag: every group keeps untagged cases (so it runs instrumented), and a
 * case tagged slow is left out when that tag is skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"

/* Runs the checks matching `filter` on `b`; the report goes to `report` (NUL-terminated). */
static int run_checks(mg_backend *b, const char *filter, char *report, size_t report_bytes,
                      int *passed) {
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return -1;
    int skipped = 0;
    int failed = mg_check_run_all(b, filter, f, passed, &skipped);
    rewind(f);
    size_t n = fread(report, 1, report_bytes - 1, f);
    report[n] = '\0';
    fclose(f);
    return failed;
}

static void test_tags(mg_backend *b) {
    unsigned tag = 0;
    CHECK(mg_check_tag_parse("slow", &tag) && tag == MG_CHECK_SLOW);
    CHECK(!mg_check_tag_parse("fast", &tag) && !mg_check_tag_parse(NULL, &tag));
    size_t groups = 0;
    for (size_t g = 0; mg_check_groups[g]; g++, groups++) {
        size_t untagged = 0;
        for (const mg_check_case *c = mg_check_groups[g]; c->name; c++)
            untagged += c->tags == 0;
        CHECK(untagged > 0);
        if (!untagged)
            fprintf(stderr, "group %s never runs under the sanitizers\n",
                    mg_check_groups[g]->group);
    }
    CHECK(groups >= 12);
    int passed = -1, skipped = -1;
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    /* causal_long is tagged slow: skipped by tag, nothing runs */
    int failed =
        mg_check_run_selected(b, "attention/causal_long", MG_CHECK_SLOW, f, &passed, &skipped);
    CHECK(failed == 0 && passed == 0 && skipped == 0);
    fclose(f);
}

int main(void) {
    static char report[1 << 16];
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!b)
        return test_finish();
    test_tags(b);
    int passed = 0;
    int failed = run_checks(b, "gemm/bf16", report, sizeof report, &passed);
    CHECK(failed == 0 && passed >= 2);
    CHECK(strstr(report, "reference: cpu device 1\n") != NULL);
    if (failed || !strstr(report, "reference: cpu device 1\n"))
        fputs(report, stderr);

    /* Every other CPU device taken: no reference, and the op checks say so by failing. */
    mg_backend_probe probe;
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_CPU, &probe));
    mg_backend *others[64] = {0};
    int taken = 0;
    for (int d = 1; d < probe.device_count && taken < 64; d++)
        if (mg_backend_open(MG_BACKEND_CPU, d, &others[taken]) == MG_OK)
            taken++;
    CHECK(taken == probe.device_count - 1);
    failed = run_checks(b, "gemm/bf16", report, sizeof report, &passed);
    CHECK(failed >= 2 && passed == 0);
    CHECK(strstr(report, "no CPU reference backend could be opened") != NULL);
    for (int i = 0; i < taken; i++)
        CHECK_OK(mg_backend_close(others[i]));

    /* A reference device freed again is found again (not necessarily device 1). */
    failed = run_checks(b, "gemm/bf16", report, sizeof report, &passed);
    CHECK(failed == 0 && strstr(report, "reference: cpu device ") != NULL);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
