/* cmd_info.c - `metrale-gpu info`: what this build contains, what is usable on this machine
 * (and why not), and each usable device. Opens backends but runs no work. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const mg_backend_kind all_kinds[] = {MG_BACKEND_CPU, MG_BACKEND_CUDA, MG_BACKEND_METAL};
#define KIND_COUNT (sizeof all_kinds / sizeof all_kinds[0])

/* Writes `text` as a JSON string literal. */
static void json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void format_gib(uint64_t bytes, char *buf, size_t buf_bytes) {
    snprintf(buf, buf_bytes, "%.1f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

/* Devices listed for a usable kind: every CUDA/Metal device; for the CPU only the one asked
 * for, because its devices are independent backends on the same host. */
static int listed_device_count(mg_backend_kind kind, const mg_backend_probe *p) {
    return kind == MG_BACKEND_CPU ? 1 : p->device_count;
}

typedef struct device_report {
    mg_backend_kind kind;
    int device;
    mg_status status; /* of opening and querying */
    char error[512];
    mg_device_info info;
    uint64_t free_bytes, total_bytes;
} device_report;

static void query_device(mg_backend_kind kind, int device, device_report *r) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->device = device;
    mg_backend *b = NULL;
    r->status = mg_backend_open(kind, device, &b);
    if (!r->status)
        r->status = mg_device_get_info(b, &r->info);
    if (!r->status)
        r->status = mg_memory_free_bytes(b, &r->free_bytes, &r->total_bytes);
    if (r->status)
        snprintf(r->error, sizeof r->error, "%s: %s", mg_status_name(r->status), mg_last_error());
    mg_backend_close(b);
}

static void print_device_text(const device_report *r) {
    const char *kind = mg_backend_kind_name(r->kind);
    if (r->status) {
        printf("  %s:%d  cannot be opened: %s\n", kind, r->device, r->error);
        return;
    }
    const mg_device_info *i = &r->info;
    char total[32], free_text[32], cc[16];
    format_gib(r->total_bytes, total, sizeof total);
    format_gib(r->free_bytes, free_text, sizeof free_text);
    if (i->cc_major || i->cc_minor)
        snprintf(cc, sizeof cc, "%d.%d", i->cc_major, i->cc_minor);
    else
        snprintf(cc, sizeof cc, "n/a");
    printf("  %s:%d  %s\n", kind, r->device, i->name);
    printf("         memory %s (%s free), %s\n", total, free_text,
           i->integrated ? "shared with the host" : "discrete");
    printf("         multiprocessors %d, compute capability %s", i->multiprocessors, cc);
    if (i->l2_bytes)
        printf(", L2 %.1f MiB", (double)i->l2_bytes / (1024.0 * 1024.0));
    printf(", shared memory per block up to %u KiB\n", i->max_shared_per_block_optin / 1024);
    printf("         driver %s\n", i->driver);
}

static void print_device_json(FILE *f, const device_report *r) {
    fprintf(f, "{\"backend\": ");
    json_string(f, mg_backend_kind_name(r->kind));
    fprintf(f, ", \"device\": %d, ", r->device);
    if (r->status) {
        fprintf(f, "\"error\": ");
        json_string(f, r->error);
        fprintf(f, "}");
        return;
    }
    const mg_device_info *i = &r->info;
    fprintf(f, "\"name\": ");
    json_string(f, i->name);
    fprintf(f,
            ", \"total_bytes\": %llu, \"free_bytes\": %llu, \"multiprocessors\": %d, "
            "\"cc_major\": %d, \"cc_minor\": %d, \"integrated\": %s, \"l2_bytes\": %llu, "
            "\"max_shared_per_block_optin\": %u, \"driver\": ",
            (unsigned long long)r->total_bytes, (unsigned long long)r->free_bytes,
            i->multiprocessors, i->cc_major, i->cc_minor, i->integrated ? "true" : "false",
            (unsigned long long)i->l2_bytes, i->max_shared_per_block_optin);
    json_string(f, i->driver);
    fprintf(f, "}");
}

int mg_cmd_info(int argc, char **argv, const mg_cli_options *opts) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "metrale-gpu info: takes no arguments\n");
        return 2;
    }
    mg_backend_probe probes[KIND_COUNT];
    for (size_t k = 0; k < KIND_COUNT; k++)
        if (mg_backend_probe_kind(all_kinds[k], &probes[k]) != MG_OK) {
            memset(&probes[k], 0, sizeof probes[k]);
            snprintf(probes[k].reason, sizeof probes[k].reason, "probe failed: %s",
                     mg_last_error());
        }

    /* The Metal backend has only run against tests/metal's test double: its entry says so in
     * both forms (its library reasons and its device's driver string carry the marker too). */
    const char *const unverified = "UNVERIFIED ON HARDWARE";
    if (opts->json) {
        printf("{\"api_version\": %d, \"backends\": [", MG_API_VERSION);
        for (size_t k = 0; k < KIND_COUNT; k++) {
            printf("%s{\"name\": ", k ? ", " : "");
            json_string(stdout, mg_backend_kind_name(all_kinds[k]));
            printf(", \"compiled_in\": %s, \"usable\": %s, \"device_count\": %d, \"reason\": ",
                   probes[k].compiled_in ? "true" : "false", probes[k].usable ? "true" : "false",
                   probes[k].device_count);
            json_string(stdout, probes[k].usable ? "" : probes[k].reason);
            printf(", \"note\": ");
            json_string(stdout, all_kinds[k] == MG_BACKEND_METAL ? unverified : "");
            printf("}");
        }
        printf("], \"devices\": [");
    } else {
        printf("metrale-gpu, backend API %d\n\nbackends (compiled in:", MG_API_VERSION);
        for (size_t k = 0; k < KIND_COUNT; k++)
            if (probes[k].compiled_in)
                printf(" %s", mg_backend_kind_name(all_kinds[k]));
        printf(")\n");
        for (size_t k = 0; k < KIND_COUNT; k++) {
            const char *name = mg_backend_kind_name(all_kinds[k]);
            const bool metal = all_kinds[k] == MG_BACKEND_METAL;
            if (probes[k].usable)
                printf("  %s: usable, %d device%s%s%s%s\n", name, probes[k].device_count,
                       probes[k].device_count == 1 ? "" : "s", metal ? " (" : "",
                       metal ? unverified : "", metal ? ")" : "");
            else
                printf("  %s: %s\n", name, probes[k].reason[0] ? probes[k].reason : "not usable");
        }
        printf("\ndevices\n");
    }

    int listed = 0, failed = 0;
    for (size_t k = 0; k < KIND_COUNT; k++) {
        mg_backend_kind kind = all_kinds[k];
        if (!probes[k].usable || (opts->backend != MG_BACKEND_AUTO && opts->backend != kind))
            continue;
        int first = kind == MG_BACKEND_CPU ? opts->device : 0;
        int count = listed_device_count(kind, &probes[k]);
        for (int d = first; d < first + count; d++) {
            device_report r;
            query_device(kind, d, &r);
            failed += r.status != MG_OK;
            if (opts->json) {
                printf("%s", listed ? ", " : "");
                print_device_json(stdout, &r);
            } else {
                print_device_text(&r);
            }
            listed++;
        }
        if (kind == MG_BACKEND_CPU && !opts->json && probes[k].device_count > 1)
            printf("         (cpu devices 0..%d are independent backends on this host)\n",
                   probes[k].device_count - 1);
    }
    if (opts->json)
        printf("]}\n");
    else if (listed == 0)
        printf("  none usable%s%s\n", opts->backend == MG_BACKEND_AUTO ? "" : " for --backend ",
               opts->backend == MG_BACKEND_AUTO ? "" : mg_backend_kind_name(opts->backend));
    return failed ? 1 : 0;
}
