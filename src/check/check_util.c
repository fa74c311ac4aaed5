/* check_util.c - what the check groups share (check_util.h). */
#include "check_util.h"

#include <stdarg.h>
#include <stdio.h>

void mg_check_fail_at(mg_check_result *result, int line, const char *fmt, ...) {
    if (!result->passed && result->detail[0])
        return;
    result->passed = false;
    int n = snprintf(result->detail, sizeof result->detail, "line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(result->detail + n, sizeof result->detail - (size_t)n, fmt, ap);
    va_end(ap);
}

static uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t mg_check_rng_seed(const mg_check_ctx *ctx, const char *check_name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the name */
    for (const char *p = check_name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return splitmix64_mix(ctx->seed ^ h);
}

uint64_t mg_check_rng_next(uint64_t *state) {
    return splitmix64_mix(*state += 0x9e3779b97f4a7c15ull);
}

mg_status mg_check_upload(mg_backend *b, const void *host, size_t bytes, mg_devptr *out) {
    mg_status st = mg_alloc(b, bytes, out);
    if (st == MG_OK)
        st = mg_copy_h2d(b, *out, host, bytes);
    return st;
}

mg_status mg_check_alloc_poisoned(mg_backend *b, size_t bytes, mg_devptr *out) {
    mg_status st = mg_alloc(b, bytes, out);
    if (st == MG_OK)
        st = mg_memset(b, *out, MG_CHECK_POISON, bytes);
    return st;
}
