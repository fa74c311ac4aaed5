/* test_core_ledger.c - the allocation ledger through the public API on the CPU backend:
 * live totals, call sites, the report, the sweep, and the free rules. */
#include "metrale/gpu.h"
#include "test_util.h"

int main(void) {
    test_seed();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!b)
        return test_finish();

    uint64_t bytes = 1, count = 1;
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(bytes == 0 && count == 0);

    /* Awkward sizes from two call sites; totals must add up exactly. */
    enum { N = 37 };
    mg_devptr p[N];
    uint64_t expect_bytes = 0, site_a_bytes = 0;
    int site_a_line = 0;
    for (int i = 0; i < N; i++) {
        size_t sz = (size_t)test_rand_range(1, 100000);
        if (i % 3 == 0) {
            site_a_line = __LINE__ + 1;
            CHECK_OK(mg_alloc(b, sz, &p[i]));
            site_a_bytes += sz;
        } else {
            CHECK_OK(mg_alloc(b, sz, &p[i]));
        }
        expect_bytes += sz;
        CHECK(p[i] % 256 == 0);
    }
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(bytes == expect_bytes && count == N);

    mg_ledger_site sites[8];
    size_t written = 0;
    CHECK_OK(mg_ledger_top_sites(b, 0, sites, 8, &written));
    CHECK(written == 2);
    int found_a = 0;
    for (size_t i = 0; i < written; i++) {
        CHECK(strstr(sites[i].file, "test_core_ledger.c") != NULL);
        if (sites[i].line == site_a_line) {
            found_a = 1;
            CHECK(sites[i].bytes == site_a_bytes && sites[i].count == (N + 2) / 3);
        }
        if (i > 0)
            CHECK(sites[i - 1].bytes >= sites[i].bytes);
    }
    CHECK(found_a);
    /* A threshold above both sites reports none. */
    CHECK_OK(mg_ledger_top_sites(b, expect_bytes + 1, sites, 8, &written));
    CHECK(written == 0);

    char report[4096] = {0};
    FILE *f = fmemopen(report, sizeof report - 1, "w");
    CHECK_OK(mg_ledger_report(b, f, 5, 0));
    fclose(f);
    char line_text[32];
    snprintf(line_text, sizeof line_text, ":%d", site_a_line);
    CHECK(strstr(report, "37 live allocations") != NULL);
    CHECK(strstr(report, line_text) != NULL);

    /* Free rules: null no-op, interior pointer and double free are errors that free nothing. */
    CHECK_OK(mg_free(b, 0));
    CHECK_STATUS(mg_free(b, p[0] + 1), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("interior pointer");
    CHECK_OK(mg_free(b, p[0]));
    CHECK_STATUS(mg_free(b, p[0]), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not a live allocation");
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(count == N - 1);

    /* Sweep frees the rest and says how much. */
    uint64_t swept_bytes = 0, swept_count = 0;
    CHECK_OK(mg_ledger_sweep(b, &swept_bytes, &swept_count));
    CHECK(swept_count == N - 1 && swept_bytes == bytes);
    CHECK_OK(mg_ledger_live(b, &bytes, &count));
    CHECK(bytes == 0 && count == 0);
    /* Memory freed by the sweep is no longer addressable. */
    uint32_t word = 7;
    CHECK_STATUS(mg_copy_h2d(b, p[1], &word, sizeof word), MG_ERR_INVALID_ARGUMENT);

    /* Zero-size and managed allocations. */
    mg_devptr z = 1;
    CHECK_STATUS(mg_alloc(b, 0, &z), MG_ERR_INVALID_ARGUMENT);
    CHECK(z == 0);
    CHECK_MESSAGE("test_core_ledger.c"); /* the caller's site is in the message */
    if (mg_backend_supports(b, MG_CAP_MANAGED_MEMORY)) {
        mg_devptr m = 0;
        CHECK_OK(mg_alloc_managed(b, 4097, &m));
        CHECK_OK(mg_ledger_live(b, &bytes, &count));
        CHECK(bytes == 4097 && count == 1);
        CHECK_OK(mg_free(b, m));
    }

    CHECK_OK(mg_backend_close(b));
    /* The handle is gone: calls on it are rejected, not crashes. */
    CHECK_STATUS(mg_ledger_live(b, &bytes, &count), MG_ERR_INVALID_ARGUMENT);
    return test_finish();
}
