/* cmd_check.c - `metrale-gpu check [--skip-tag TAG]... [FILTER]`: every registered check (the
 * conformance suite, then each op against the CPU reference) on the chosen backend, as a table
 * closed by "N passed, N failed[, N skipped]"; cases tagged TAG (check.h: "slow") left out.
 * Exit status 1 when any check fails, 2 for bad arguments (one line, before any output). */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "commands.h"

int mg_cmd_check(int argc, char **argv, const mg_cli_options *opts) {
    const char *filter = NULL;
    unsigned skip_tags = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--skip-tag")) {
            unsigned tag;
            if (i + 1 == argc || !mg_check_tag_parse(argv[i + 1], &tag)) {
                fprintf(stderr, "metrale-gpu check: --skip-tag needs a tag (slow), got \"%s\"\n",
                        i + 1 < argc ? argv[i + 1] : "");
                return 2;
            }
            skip_tags |= tag;
            i++;
        } else if (!filter) {
            filter = argv[i];
        } else {
            fprintf(stderr, "metrale-gpu check: at most one FILTER argument\n");
            return 2;
        }
    }
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
    int failed = mg_check_run_selected(b, filter, skip_tags, stdout, &passed, &skipped);
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
