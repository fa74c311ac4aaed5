/* cmd_check.c - `metrale-gpu check [FILTER]`: every registered check (the conformance suite,
 * then each op against the CPU reference) on the chosen backend, as a table closed by
 * "N passed, N failed[, N skipped]". Exit status 1 when any check fails. */
#include <stdio.h>

#include "check.h"
#include "commands.h"

int mg_cmd_check(int argc, char **argv, const mg_cli_options *opts) {
    if (argc > 2) {
        fprintf(stderr, "metrale-gpu check: at most one FILTER argument\n");
        return 2;
    }
    const char *filter = argc == 2 ? argv[1] : NULL;
    if (opts->json)
        fprintf(stderr, "metrale-gpu check: --json is not supported here; printing the table\n");
    mg_backend *b = NULL;
    mg_status st = mg_cli_backend_open(opts, &b);
    if (st) {
        fprintf(stderr, "metrale-gpu check: cannot open %s device %d: %s: %s\n",
                mg_backend_kind_name(opts->backend), opts->device, mg_status_name(st),
                mg_last_error());
        return 1;
    }
    int passed = 0, skipped = 0;
    int failed = mg_check_run_all(b, filter, stdout, &passed, &skipped);
    st = mg_backend_close(b);
    if (st) {
        fprintf(stderr, "metrale-gpu check: mg_backend_close: %s: %s\n", mg_status_name(st),
                mg_last_error());
        failed++;
    }
    if (passed + failed + skipped == 0) {
        fprintf(stderr, "metrale-gpu check: no check matches \"%s\"\n", filter ? filter : "");
        return 1;
    }
    return failed ? 1 : 0;
}
