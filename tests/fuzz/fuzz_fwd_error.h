/* fuzz_fwd_error.h - the model layer's error channel (mg_fwd_fail, mg_fwd_error: model.c in the
 * library) for the fuzz targets, which compile the readers alone and do not link model.c.
 * Include once per target. */
#ifndef METRALE_FUZZ_FWD_ERROR_H
#define METRALE_FUZZ_FWD_ERROR_H

#include <stdarg.h>
#include <stdio.h>

#include "metrale/status.h"

static char error_text[512];
const char *mg_fwd_error(void) {
    return error_text;
}
mg_status mg_fwd_fail(mg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return st ? st : MG_ERR_INTERNAL;
}

#endif
