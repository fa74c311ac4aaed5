/* runner.c - runs the registered checks on one backend and prints the table
 * (mg_check_run_all, check.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "metrale/ops.h"

/* METRALE_CHECK_SEED (decimal or 0x hex) repeats a run; otherwise a fresh seed each run. */
static uint64_t run_seed(void) {
    const char *env = getenv("METRALE_CHECK_SEED");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 0);
        if (*end == '\0')
            return v;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
}

/* Every op of the reference backend runs its reference: the provider named "reference" where
 * an op has one (the GEMMs and attention, whose kernel-by-name providers come after it), else
 * the last of its CPU providers (an op lists them fast first, the one that defines the result
 * last), so the checks compare the fast CPU providers with the reference when the backend
 * under test is a CPU backend. */
static void force_references(mg_backend *ref) {
    for (int op = 0; op < MG_OP_COUNT; op++) {
        const char *names[16];
        size_t count = mg_op_providers((mg_op)op, MG_BACKEND_CPU, names, 16);
        if (count <= 1 || count > 16)
            continue;
        const char *reference = names[count - 1];
        for (size_t i = 0; i < count; i++)
            if (!strcmp(names[i], "reference"))
                reference = names[i];
        mg_op_force_provider(ref, (mg_op)op, reference);
    }
}

/* The CPU backend the op checks compare against: a CPU device of its own, even when `b` is
 * a CPU backend too (then any other free CPU device), so every op check compares results of
 * two backends. NULL when none can be opened. */
static mg_backend *open_reference(int *device_out) {
    *device_out = -1;
    mg_backend_probe probe;
    if (mg_backend_probe_kind(MG_BACKEND_CPU, &probe) != MG_OK || !probe.usable)
        return NULL;
    for (int device = 0; device < probe.device_count; device++) {
        mg_backend *ref;
        if (mg_backend_open(MG_BACKEND_CPU, device, &ref) == MG_OK) {
            force_references(ref);
            *device_out = device;
            return ref;
        }
    }
    return NULL;
}

bool mg_check_tag_parse(const char *name, unsigned *tag_out) {
    if (name && !strcmp(name, "slow")) {
        *tag_out = MG_CHECK_SLOW;
        return true;
    }
    return false;
}

static bool selected(const mg_check_case *c, const char *filter, unsigned skip_tags) {
    if (c->tags & skip_tags)
        return false;
    if (!filter || !*filter)
        return true;
    char full[256];
    snprintf(full, sizeof full, "%s/%s", c->group, c->name);
    return strstr(full, filter) != NULL;
}

/* Whether `b` runs every op the table (check.h) names for check `c`; the first it lacks is
 * written into `r` as the reason the check is skipped. */
static bool needs_met(mg_backend *b, const mg_check_case *c, mg_check_result *r) {
    char full[256];
    snprintf(full, sizeof full, "%s/%s", c->group, c->name);
    for (const mg_check_needs *n = mg_check_needs_table; n->prefix; n++) {
        if (strncmp(full, n->prefix, strlen(n->prefix)) != 0)
            continue;
        for (int i = 0; i < n->count; i++)
            if (!mg_op_supported(b, n->ops[i])) {
                r->skipped = true;
                snprintf(r->detail, sizeof r->detail,
                         "the %s backend cannot run op %s (no kernel or provider for it)",
                         mg_backend_kind_name(mg_backend_get_kind(b)), mg_op_name(n->ops[i]));
                return false;
            }
    }
    return true;
}

/* Details are printed on one line. */
static void print_one_line(FILE *out, const char *text) {
    for (const char *p = text; *p; p++)
        fputc(*p == '\n' || *p == '\r' ? ' ' : *p, out);
}

int mg_check_run_all(mg_backend *b, const char *filter, FILE *out, int *passed_out,
                     int *skipped_out) {
    return mg_check_run_selected(b, filter, 0, out, passed_out, skipped_out);
}

int mg_check_run_selected(mg_backend *b, const char *filter, unsigned skip_tags, FILE *out,
                          int *passed_out, int *skipped_out) {
    int passed = 0, failed = 0, skipped = 0;
    int width = 5;
    for (size_t g = 0; mg_check_groups[g]; g++)
        for (const mg_check_case *c = mg_check_groups[g]; c->name; c++)
            if (selected(c, filter, skip_tags)) {
                int len = (int)(strlen(c->group) + 1 + strlen(c->name));
                width = len > width ? len : width;
            }

    int reference_device;
    mg_check_ctx ctx = {.backend = b, .seed = run_seed()};
    ctx.reference = open_reference(&reference_device);
    if (out) {
        mg_device_info info;
        if (mg_device_get_info(b, &info) != MG_OK)
            snprintf(info.name, sizeof info.name, "device info unavailable");
        fprintf(out, "backend %s: %s; seed 0x%016" PRIx64 " (METRALE_CHECK_SEED repeats it)\n",
                mg_backend_kind_name(mg_backend_get_kind(b)), info.name, ctx.seed);
        if (ctx.reference)
            fprintf(out, "reference: cpu device %d\n", reference_device);
        else
            fprintf(out, "no CPU reference backend could be opened: op checks will fail\n");
        fprintf(out, "%-*s  %-6s  %s\n", width, "check", "result", "error / detail");
    }

    for (size_t g = 0; mg_check_groups[g]; g++) {
        for (const mg_check_case *c = mg_check_groups[g]; c->name; c++) {
            if (!selected(c, filter, skip_tags))
                continue;
            mg_check_result result = {0};
            mg_clear_error();
            if (needs_met(b, c, &result))
                c->fn(&ctx, &result);
            const char *verdict;
            if (result.skipped) {
                skipped++;
                verdict = "skip";
            } else if (result.passed) {
                passed++;
                verdict = "ok";
            } else {
                failed++;
                verdict = "FAIL";
            }
            if (!out)
                continue;
            fprintf(out, "%s/%-*s  %-6s  ", c->group, width - (int)strlen(c->group) - 1, c->name,
                    verdict);
            if (result.error != 0.0)
                fprintf(out, "err %.2e  ", result.error);
            print_one_line(out, result.detail);
            fputc('\n', out);
            fflush(out);
        }
    }
    if (out) {
        fprintf(out, "%d passed, %d failed", passed, failed);
        if (skipped)
            fprintf(out, ", %d skipped", skipped);
        fputc('\n', out);
    }
    if (ctx.reference)
        mg_backend_close(ctx.reference);
    if (passed_out)
        *passed_out = passed;
    if (skipped_out)
        *skipped_out = skipped;
    return failed;
}
