/* test_conformance.c - the backend conformance suite (src/check/conformance.c) on every
 * backend kind usable on this machine: the CPU backend always, CUDA and Metal where present.
 * A kind that is not usable is reported with its reason; any failing check fails the test. */
#include <stdio.h>

#include "check.h"

int main(void) {
    static const mg_backend_kind kinds[] = {MG_BACKEND_CPU, MG_BACKEND_CUDA, MG_BACKEND_METAL};
    int failures = 0, suites_run = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const char *name = mg_backend_kind_name(kinds[i]);
        mg_backend_probe probe;
        if (mg_backend_probe_kind(kinds[i], &probe) != MG_OK) {
            printf("%s: probe failed: %s\n", name, mg_last_error());
            failures++;
            continue;
        }
        if (!probe.usable) {
            printf("%s: skipped: %s\n", name, probe.reason[0] ? probe.reason : "not usable");
            continue;
        }
        mg_backend *b = NULL;
        if (mg_backend_open(kinds[i], 0, &b) != MG_OK) {
            printf("%s: usable but device 0 does not open: %s\n", name, mg_last_error());
            failures++;
            continue;
        }
        int passed = 0, skipped = 0;
        int failed = mg_check_run_all(b, "conformance/", stdout, &passed, &skipped);
        if (passed == 0) {
            printf("%s: no conformance check passed\n", name);
            failed++;
        }
        failures += failed;
        suites_run++;
        mg_status closed = mg_backend_close(b);
        if (closed != MG_OK) {
            printf("%s: mg_backend_close: %s: %s\n", name, mg_status_name(closed), mg_last_error());
            failures++;
        }
    }
    if (suites_run == 0) {
        printf("no backend could run the suite\n");
        failures++;
    }
    printf("conformance: %d backend(s), %d failure(s)\n", suites_run, failures);
    return failures ? 1 : 0;
}
