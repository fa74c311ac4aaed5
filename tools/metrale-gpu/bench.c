/* bench.c - `metrale-gpu bench`: the sub-benchmark registry, timing helpers and output
 * (bench.h). */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrale/dtype.h"

#define MAX_BENCHES 32
#define DEFAULT_WARMUP 3
#define DEFAULT_ITERS 20

typedef struct bench_entry {
    const char *name;
    const char *summary;
    mg_bench_fn fn;
} bench_entry;

static bench_entry registry[MAX_BENCHES];
static size_t registry_count;

void mg_bench_register(const char *name, const char *summary, mg_bench_fn fn) {
    if (registry_count < MAX_BENCHES)
        registry[registry_count++] = (bench_entry){name, summary, fn};
    else
        fprintf(stderr, "metrale-gpu: too many benchmarks, \"%s\" not registered\n", name);
}

static int compare_entries(const void *a, const void *b) {
    return strcmp(((const bench_entry *)a)->name, ((const bench_entry *)b)->name);
}

bool mg_bench_selected(const mg_bench *b, const char *name) {
    return !b->only || strstr(name, b->only) != NULL;
}

/* ------------------------------------------------------------------ timing */

double mg_bench_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void mg_bench_stats_from(double *samples_us, int n, mg_bench_stats *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0)
        return;
    qsort(samples_us, (size_t)n, sizeof *samples_us, compare_doubles);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += samples_us[i];
    out->samples = n;
    out->min_us = samples_us[0];
    out->max_us = samples_us[n - 1];
    out->mean_us = sum / n;
    out->median_us = n % 2 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
}

static mg_status warm_up(mg_bench *b, mg_bench_body body, void *arg, int warmup, int *iteration) {
    for (int i = 0; i < warmup; i++) {
        mg_status st = body(b, arg, (*iteration)++);
        if (st)
            return st;
    }
    return mg_stream_synchronize(b->stream);
}

mg_status mg_bench_time_events(mg_bench *b, mg_bench_body body, void *arg, int warmup, int iters,
                               mg_bench_stats *out) {
    double *samples = calloc((size_t)(iters > 0 ? iters : 1), sizeof *samples);
    mg_event *start = NULL, *end = NULL;
    int iteration = 0;
    mg_status st = samples ? MG_OK : MG_ERR_OUT_OF_MEMORY;
    if (!st)
        st = mg_event_create(b->backend, &start);
    if (!st)
        st = mg_event_create(b->backend, &end);
    if (!st)
        st = warm_up(b, body, arg, warmup, &iteration);
    for (int i = 0; !st && i < iters; i++) {
        float ms = 0;
        if (!(st = mg_event_record(start, b->stream)) && !(st = body(b, arg, iteration++)) &&
            !(st = mg_event_record(end, b->stream)) && !(st = mg_event_synchronize(end)) &&
            !(st = mg_event_elapsed_ms(start, end, &ms)))
            samples[i] = (double)ms * 1e3;
    }
    if (!st)
        mg_bench_stats_from(samples, iters, out);
    mg_event_destroy(start);
    mg_event_destroy(end);
    free(samples);
    return st;
}

mg_status mg_bench_time_host(mg_bench *b, mg_bench_body body, void *arg, int warmup, int iters,
                             bool include_sync, mg_bench_stats *out) {
    double *samples = calloc((size_t)(iters > 0 ? iters : 1), sizeof *samples);
    if (!samples)
        return MG_ERR_OUT_OF_MEMORY;
    int iteration = 0;
    mg_status st = warm_up(b, body, arg, warmup, &iteration);
    for (int i = 0; !st && i < iters; i++) {
        double t0 = mg_bench_now_us();
        st = body(b, arg, iteration++);
        if (!st && include_sync)
            st = mg_stream_synchronize(b->stream);
        double t1 = mg_bench_now_us();
        if (!st && !include_sync)
            st = mg_stream_synchronize(b->stream);
        samples[i] = t1 - t0;
    }
    if (!st)
        mg_bench_stats_from(samples, iters, out);
    free(samples);
    return st;
}

static mg_status launch_graph_body(mg_bench *b, void *graph, int iteration) {
    (void)iteration;
    return mg_graph_launch(graph, b->stream);
}

mg_status mg_bench_time_graph(mg_bench *b, mg_bench_body body, void *arg, int warmup, int iters,
                              mg_bench_stats *out) {
    mg_graph *g = NULL;
    mg_status st = mg_graph_begin_capture(b->stream);
    if (st)
        return st;
    st = body(b, arg, 0);
    if (st) {
        mg_graph_abort_capture(b->stream);
        return st;
    }
    if ((st = mg_graph_end_capture(b->stream, &g)))
        return st;
    /* Each replay is timed as one event-timed iteration. */
    st = mg_bench_time_events(b, launch_graph_body, g, warmup, iters, out);
    mg_graph_destroy(g);
    return st;
}

/* ------------------------------------------------------------------ inputs */

void mg_bench_fill_random(void *host, size_t bytes, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    unsigned char *p = host;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545F4914F6CDD1Dull;
        memcpy(p + i, &v, 8);
    }
    for (; i < bytes; i++)
        p[i] = (unsigned char)(0x5Au ^ i);
}

#define FILL_TILE_ELEMS ((size_t)8 << 20)
mg_status mg_bench_fill_unit(mg_bench *b, mg_devptr dst, size_t elems, bool fp8, uint64_t seed) {
    if (!elems)
        return MG_OK;
    const size_t tile = elems < FILL_TILE_ELEMS ? elems : FILL_TILE_ELEMS, size = fp8 ? 1 : 2;
    uint8_t *host = calloc(tile, size);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    uint64_t x = seed | 1;
    for (size_t i = 0; i < tile; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        const float value = (float)((double)((x * 0x2545f4914f6cdd1dull) >> 11) / 0x1p52 - 1.0);
        if (fp8)
            host[i] = mg_f32_to_fp8_e4m3(100.0f * value);
        else
            ((uint16_t *)host)[i] = mg_f32_to_bf16(value);
    }
    mg_status st = mg_copy_h2d(b->backend, dst, host, size * tile);
    free(host);
    for (size_t done = tile; !st && done < elems;) {
        const size_t n = done < elems - done ? done : elems - done;
        st = mg_copy_d2d(b->backend, dst + size * done, dst, size * n);
        done += n;
    }
    return st;
}

mg_status mg_bench_fill_random_device(mg_bench *b, mg_devptr dst, size_t bytes, uint64_t seed) {
    const size_t chunk = (size_t)64 << 20;
    void *host = malloc(bytes < chunk ? bytes : chunk);
    if (!host)
        return MG_ERR_OUT_OF_MEMORY;
    mg_status st = MG_OK;
    for (size_t off = 0; !st && off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        mg_bench_fill_random(host, n, seed + off);
        st = mg_copy_h2d(b->backend, dst + off, host, n);
    }
    free(host);
    return st;
}

/* ------------------------------------------------------------------ paged KV cache */

bool mg_bench_page_table_make(mg_bench_page_table *t, uint32_t batch, uint32_t new_tokens,
                              uint32_t tokens, uint32_t page_size, uint64_t seed) {
    const uint32_t per = (tokens + page_size - 1) / page_size;
    *t = (mg_bench_page_table){.batch = batch, .pages = per * batch};
    t->qo = malloc(4 * (batch + 1ull));
    t->kv = malloc(4 * (batch + 1ull));
    t->last = malloc(4ull * batch);
    t->idx = malloc(4ull * (t->pages ? t->pages : 1));
    if (!t->qo || !t->kv || !t->last || !t->idx)
        return false;
    for (uint32_t i = 0; i < t->pages; i++)
        t->idx[i] = (int32_t)i;
    uint64_t x = seed | 1;
    for (uint32_t i = t->pages ? t->pages - 1 : 0; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t j = (uint32_t)((x >> 33) % (i + 1));
        const int32_t swap = t->idx[i];
        t->idx[i] = t->idx[j], t->idx[j] = swap;
    }
    for (uint32_t i = 0; i <= batch; i++) {
        t->qo[i] = (int32_t)(i * new_tokens);
        t->kv[i] = (int32_t)(i * per);
    }
    for (uint32_t i = 0; i < batch; i++)
        t->last[i] = (int32_t)(tokens - (per - 1) * page_size);
    return true;
}

void mg_bench_page_table_free(mg_bench_page_table *t) {
    free(t->qo), free(t->kv), free(t->idx), free(t->last);
    t->qo = t->kv = t->idx = t->last = NULL;
}

mg_status mg_bench_rotation_create(mg_bench *b, size_t bytes, int min_count,
                                   mg_bench_rotation *out) {
    memset(out, 0, sizeof *out);
    int count = min_count > 0 ? min_count : 1;
    if (b->info.l2_bytes && bytes > 0) {
        uint64_t need = (4 * b->info.l2_bytes + bytes - 1) / bytes;
        if (need > (uint64_t)count)
            count = need > 64 ? 64 : (int)need;
    }
    out->buffers = calloc((size_t)count, sizeof *out->buffers);
    if (!out->buffers)
        return MG_ERR_OUT_OF_MEMORY;
    out->bytes = bytes;
    for (int i = 0; i < count; i++) {
        mg_status st = mg_alloc(b->backend, bytes, &out->buffers[i]);
        if (!st)
            st = mg_bench_fill_random_device(b, out->buffers[i], bytes, 1000u + (uint64_t)i);
        if (st) {
            out->count = i + 1;
            mg_bench_rotation_destroy(b, out);
            return st;
        }
        out->count = i + 1;
    }
    return MG_OK;
}

mg_devptr mg_bench_rotation_get(const mg_bench_rotation *r, int iteration) {
    return r->buffers[(unsigned)iteration % (unsigned)r->count];
}

void mg_bench_rotation_destroy(mg_bench *b, mg_bench_rotation *r) {
    for (int i = 0; r->buffers && i < r->count; i++)
        mg_free(b->backend, r->buffers[i]);
    free(r->buffers);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------ yardsticks */

typedef struct copy_pair {
    mg_devptr src, dst;
    size_t bytes;
} copy_pair;

static mg_status body_copy_pair(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    copy_pair *c = arg;
    return mg_copy_d2d_async(b->backend, c->dst, c->src, c->bytes, b->stream);
}

mg_status mg_bench_copy_bandwidth(mg_bench *b, size_t bytes, double *gbps) {
    copy_pair c = {.bytes = bytes};
    mg_bench_stats stats;
    mg_status st;
    if (!(st = mg_alloc(b->backend, bytes, &c.src)) &&
        !(st = mg_alloc(b->backend, bytes, &c.dst)) &&
        !(st = mg_bench_fill_random_device(b, c.src, bytes, 11)) &&
        !(st = mg_bench_time_events(b, body_copy_pair, &c, b->warmup, b->iters, &stats)))
        *gbps = stats.median_us > 0 ? 2.0 * (double)bytes / (stats.median_us * 1e3) : 0;
    mg_free(b->backend, c.src);
    mg_free(b->backend, c.dst);
    return st;
}

/* ------------------------------------------------------------------ results */

mg_bench_row mg_bench_row_make(const char *bench, const char *name, const char *shape) {
    mg_bench_row row;
    memset(&row, 0, sizeof row);
    snprintf(row.bench, sizeof row.bench, "%s", bench);
    snprintf(row.name, sizeof row.name, "%s", name);
    snprintf(row.shape, sizeof row.shape, "%s", shape ? shape : "");
    return row;
}

void mg_bench_add(mg_bench *b, const mg_bench_row *row_in) {
    mg_bench_row row_copy = *row_in, *row = &row_copy;
    if (b->suffix) {
        size_t used = strlen(row->name);
        snprintf(row->name + used, sizeof row->name - used, "%s", b->suffix);
    }
    if (b->row_count == b->row_capacity) {
        size_t cap = b->row_capacity ? b->row_capacity * 2 : 32;
        mg_bench_row *grown = realloc(b->rows, cap * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "metrale-gpu bench: out of memory for results\n");
            return;
        }
        b->rows = grown;
        b->row_capacity = cap;
    }
    b->rows[b->row_count++] = *row;
}

int mg_bench_fail(mg_bench *b, const char *what) {
    fprintf(stderr, "bench %s: failed: %s\n", what, mg_last_error());
    b->failures++;
    return 1;
}

void mg_bench_note_weights(mg_bench_row *row, double copy_gbps, const char *suffix) {
    double gbps = row->bytes / (row->stats.median_us * 1e3);
    snprintf(row->note, sizeof row->note, "weights %.2f of copy bw%s",
             copy_gbps > 0 ? gbps / copy_gbps : 0, suffix);
}

size_t mg_bench_option_u32_list(int argc, char **argv, const char *option, uint32_t *out,
                                size_t max) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], option) == 0) {
            size_t count = 0;
            for (char *p = argv[i + 1], *end; *p && count < max; p = *end ? end + 1 : end) {
                unsigned long v = strtoul(p, &end, 10);
                if (end == p)
                    break;
                if (v > 0)
                    out[count++] = (uint32_t)v;
            }
            return count;
        }
    return 0;
}

static double row_gbps(const mg_bench_row *r) {
    return r->bytes > 0 && r->stats.median_us > 0 ? r->bytes / (r->stats.median_us * 1e3) : 0;
}
static double row_tflops(const mg_bench_row *r) {
    return r->flops > 0 && r->stats.median_us > 0 ? r->flops / (r->stats.median_us * 1e6) : 0;
}
static double row_per_item_us(const mg_bench_row *r) {
    return r->items > 0 ? r->stats.median_us / r->items : 0;
}

static void print_table(const mg_bench *b, FILE *f) {
    fprintf(f, "%s, %d SMs, driver %s\n", b->info.name, b->info.multiprocessors, b->info.driver);
    fprintf(f, "%-8s %-22s %-24s %-6s %12s %12s %10s %9s %14s\n", "bench", "case", "shape",
            "timing", "median_us", "min_us", "GB/s", "TFLOP/s", "us/item");
    for (size_t i = 0; i < b->row_count; i++) {
        const mg_bench_row *r = &b->rows[i];
        char gbps[32] = "-", tflops[32] = "-", per_item[48] = "-";
        if (row_gbps(r) > 0)
            snprintf(gbps, sizeof gbps, "%.1f", row_gbps(r));
        if (row_tflops(r) > 0)
            snprintf(tflops, sizeof tflops, "%.1f", row_tflops(r));
        if (r->items > 0)
            snprintf(per_item, sizeof per_item, "%.3f/%s", row_per_item_us(r), r->item_unit);
        fprintf(f, "%-8s %-22s %-24s %-6s %12.2f %12.2f %10s %9s %14s%s%s\n", r->bench, r->name,
                r->shape, r->timing, r->stats.median_us, r->stats.min_us, gbps, tflops, per_item,
                r->note[0] ? "  " : "", r->note);
    }
}

/* Writes `s` as a JSON string literal. */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_number(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

static void print_json(const mg_bench *b, const char *command, FILE *f) {
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fputs("{\n  \"date\": ", f);
    json_string(f, date);
    fputs(",\n  \"command\": ", f);
    json_string(f, command);
    fputs(",\n  \"backend\": ", f);
    json_string(f, mg_backend_kind_name(mg_backend_get_kind(b->backend)));
    fputs(",\n  \"device\": ", f);
    json_string(f, b->info.name);
    fputs(",\n  \"driver\": ", f);
    json_string(f, b->info.driver);
    fprintf(f, ",\n  \"multiprocessors\": %d,\n  \"compute_capability\": \"%d.%d\",\n",
            b->info.multiprocessors, b->info.cc_major, b->info.cc_minor);
    fprintf(f, "  \"failures\": %d,\n  \"rows\": [", b->failures);
    for (size_t i = 0; i < b->row_count; i++) {
        const mg_bench_row *r = &b->rows[i];
        fputs(i ? ",\n    {" : "\n    {", f);
        fputs("\"bench\": ", f);
        json_string(f, r->bench);
        fputs(", \"name\": ", f);
        json_string(f, r->name);
        fputs(", \"shape\": ", f);
        json_string(f, r->shape);
        fputs(", \"timing\": ", f);
        json_string(f, r->timing);
        const struct {
            const char *key;
            double v;
        } numbers[] = {
            {"median_us", r->stats.median_us},
            {"min_us", r->stats.min_us},
            {"max_us", r->stats.max_us},
            {"mean_us", r->stats.mean_us},
            {"samples", r->stats.samples},
            {"bytes", r->bytes},
            {"flops", r->flops},
            {"items", r->items},
            {"gbps", row_gbps(r)},
            {"tflops", row_tflops(r)},
            {"per_item_us", row_per_item_us(r)},
        };
        for (size_t k = 0; k < sizeof numbers / sizeof numbers[0]; k++) {
            fprintf(f, ", \"%s\": ", numbers[k].key);
            json_number(f, numbers[k].v);
        }
        fputs(", \"item_unit\": ", f);
        json_string(f, r->item_unit);
        fputs(", \"note\": ", f);
        json_string(f, r->note);
        fputc('}', f);
    }
    fputs("\n  ]\n}\n", f);
}

/* ------------------------------------------------------------------ the command */

static void print_usage(FILE *f) {
    qsort(registry, registry_count, sizeof registry[0], compare_entries);
    fprintf(f, "usage: metrale-gpu [--backend B] [--device N] [--json] bench <name>|all|list\n"
               "           [--iters N] [--warmup N] [--only SUBSTRING] [--quick]\n"
               "           [--suffix TEXT] [--json-out FILE] [options of the benchmark]\n"
               "Times with device events after warm-up and reports the median; --json prints\n"
               "JSON instead of the table, --json-out writes it to FILE as well; --suffix appends\n"
               "TEXT to every case name (runs of the same case under different settings).\n"
               "Benchmarks:\n");
    for (size_t i = 0; i < registry_count; i++)
        fprintf(f, "  %-12s %s\n", registry[i].name, registry[i].summary);
}

static bool parse_positive(const char *text, int *out) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (!text[0] || *end || v < 0 || v > 1000000)
        return false;
    *out = (int)v;
    return true;
}

int mg_cmd_bench(int argc, char **argv, const mg_cli_options *opts) {
    if (argc < 2 || strcmp(argv[1], "list") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *which = argv[1];
    const bench_entry *selected[MAX_BENCHES];
    size_t selected_count = 0;
    for (size_t i = 0; i < registry_count; i++)
        if (strcmp(which, "all") == 0 || strcmp(which, registry[i].name) == 0)
            selected[selected_count++] = &registry[i];
    if (selected_count == 0) {
        fprintf(stderr, "metrale-gpu bench: no benchmark named \"%s\"\n", which);
        print_usage(stderr);
        return 2;
    }

    mg_bench b;
    memset(&b, 0, sizeof b);
    b.opts = opts;
    b.warmup = DEFAULT_WARMUP;
    b.iters = DEFAULT_ITERS;
    const char *json_out = NULL;
    /* Harness options are taken out; the rest goes to the benchmark (argv[0] = its name). */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 1;
    int rest_count = 0;
    rest[rest_count++] = argv[1];
    char command[512];
    int used =
        snprintf(command, sizeof command, "metrale-gpu --backend %s --device %d%s",
                 mg_backend_kind_name(opts->backend), opts->device, opts->json ? " --json" : "");
    for (int i = 0; i < argc && used > 0 && (size_t)used < sizeof command; i++)
        used += snprintf(command + used, sizeof command - (size_t)used, " %s", argv[i]);
    for (int i = 2; i < argc; i++) {
        bool has_value = i + 1 < argc;
        if (strcmp(argv[i], "--iters") == 0 && has_value) {
            if (!parse_positive(argv[++i], &b.iters) || b.iters == 0)
                goto bad_value;
        } else if (strcmp(argv[i], "--warmup") == 0 && has_value) {
            if (!parse_positive(argv[++i], &b.warmup))
                goto bad_value;
        } else if (strcmp(argv[i], "--only") == 0 && has_value) {
            b.only = argv[++i];
        } else if (strcmp(argv[i], "--json-out") == 0 && has_value) {
            json_out = argv[++i];
        } else if (strcmp(argv[i], "--suffix") == 0 && has_value) {
            b.suffix = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            b.quick = true;
        } else {
            rest[rest_count++] = argv[i];
        }
        continue;
    bad_value:
        fprintf(stderr, "metrale-gpu bench: %s needs a non-negative number, got \"%s\"\n",
                argv[i - 1], argv[i]);
        free(rest);
        return 2;
    }
    if (b.quick && b.iters == DEFAULT_ITERS)
        b.iters = 5;

    mg_status st = mg_cli_backend_open(opts, &b.backend);
    if (st) {
        fprintf(stderr, "metrale-gpu bench: cannot open the %s backend: %s: %s\n",
                mg_backend_kind_name(opts->backend), mg_status_name(st), mg_last_error());
        free(rest);
        return 1;
    }
    if ((st = mg_device_get_info(b.backend, &b.info)) ||
        (st = mg_stream_create(b.backend, &b.stream))) {
        fprintf(stderr, "metrale-gpu bench: %s: %s\n", mg_status_name(st), mg_last_error());
        mg_backend_close(b.backend);
        free(rest);
        return 1;
    }
    for (size_t i = 0; i < selected_count; i++) {
        rest[0] = (char *)selected[i]->name;
        int failed = selected[i]->fn(&b, rest_count, rest);
        if (failed && b.failures == 0)
            b.failures = failed;
    }

    if (opts->json)
        print_json(&b, command, stdout);
    else
        print_table(&b, stdout);
    if (json_out) {
        FILE *f = fopen(json_out, "w");
        if (f) {
            print_json(&b, command, f);
            fclose(f);
        } else {
            fprintf(stderr, "metrale-gpu bench: cannot write %s\n", json_out);
            b.failures++;
        }
    }
    mg_stream_destroy(b.stream);
    mg_backend_close(b.backend);
    free(b.rows);
    free(rest);
    return b.failures ? 1 : 0;
}
