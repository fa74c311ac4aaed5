/* test_metal_unavailable.c - the Metal backend where Metal is missing. Mode "nolib" (env
 * METRALE_METAL_OBJC_LIBRARY naming a file that does not exist): the probe says compiled in,
 * not usable, and why; mg_backend_open(MG_BACKEND_METAL) returns MG_ERR_UNAVAILABLE with that
 * reason; AUTO still opens a backend. Mode "nodevice" (the test double with
 * METRALE_METAL_DOUBLE_NO_DEVICE set): the runtime loads but there is no device. */
#include <stdio.h>
#include <string.h>

#include "metrale/gpu.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "nolib";
    const char *expected = strcmp(mode, "nodevice") == 0 ? "no Metal device" : "not found";
    int failures = 0;
    mg_backend_probe p;
    if (mg_backend_probe_kind(MG_BACKEND_METAL, &p) != MG_OK) {
        printf("FAIL: probe: %s\n", mg_last_error());
        return 1;
    }
    printf("probe: compiled_in=%d usable=%d devices=%d reason=%s\n", p.compiled_in, p.usable,
           p.device_count, p.reason);
    /* Every reason the backend gives says what has and has not been verified. */
    const char *marker = "UNVERIFIED ON HARDWARE";
    if (!p.compiled_in || p.usable || p.device_count != 0 || !strstr(p.reason, expected) ||
        !strstr(p.reason, marker)) {
        printf("FAIL: the probe should say compiled in, unusable, \"%s\", %s\n", expected, marker);
        failures++;
    }
    mg_backend *b = NULL;
    mg_status st = mg_backend_open(MG_BACKEND_METAL, 0, &b);
    printf("open: %s: %s\n", mg_status_name(st), mg_last_error());
    if (st != MG_ERR_UNAVAILABLE || b || !strstr(mg_last_error(), expected) ||
        !strstr(mg_last_error(), marker)) {
        printf("FAIL: open should be MG_ERR_UNAVAILABLE naming \"%s\", %s\n", expected, marker);
        failures++;
    }
    st = mg_backend_open(MG_BACKEND_AUTO, 0, &b);
    if (st != MG_OK || mg_backend_get_kind(b) == MG_BACKEND_METAL) {
        printf("FAIL: AUTO: %s (%s)\n", mg_status_name(st), mg_last_error());
        failures++;
    }
    if (b)
        mg_backend_close(b);
    return failures ? 1 : 0;
}
