/* bench_copy.c - `metrale-gpu bench copy`: device-to-device bandwidth, host-to-device from
 * pinned and pageable memory (through the staging ring), device-to-host into pinned and
 * pageable memory, and the host cost of small pageable uploads. The same cases run through
 * PyTorch in bench/peers/peers_copy_launch.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct copy_case {
    mg_devptr device_a, device_b;
    void *host; /* pinned or pageable, by case */
    size_t bytes;
    int repeats; /* copies per iteration (small-copy case) */
} copy_case;

static mg_status body_d2d(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    copy_case *c = arg;
    return mg_copy_d2d_async(b->backend, c->device_b, c->device_a, c->bytes, b->stream);
}

static mg_status body_h2d_retained(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    copy_case *c = arg;
    return mg_copy_h2d_async_retained(b->backend, c->device_a, c->host, c->bytes, b->stream);
}

static mg_status body_h2d(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    copy_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->repeats; i++)
        st = mg_copy_h2d_async(b->backend, c->device_a + (mg_devptr)i * c->bytes, c->host, c->bytes,
                               b->stream);
    return st;
}

static mg_status body_d2h(mg_bench *b, void *arg, int iteration) {
    (void)iteration;
    copy_case *c = arg;
    return mg_copy_d2h_async(b->backend, c->host, c->device_a, c->bytes, b->stream);
}

static void size_text(size_t bytes, char *buf, size_t buf_bytes) {
    if (bytes >= ((size_t)1 << 30) && bytes % ((size_t)1 << 30) == 0)
        snprintf(buf, buf_bytes, "%zu GiB", bytes >> 30);
    else if (bytes >= ((size_t)1 << 20))
        snprintf(buf, buf_bytes, "%zu MiB", bytes >> 20);
    else
        snprintf(buf, buf_bytes, "%zu KiB", bytes >> 10);
}

/* Adds a row timed by `how` ("events": device time; "host": wall clock with the stream
 * synchronized inside; "issue": wall clock of issuing only). */
static int run_case(mg_bench *b, const char *name, const char *how, mg_bench_body body,
                    copy_case *c, int iters, double bytes, double items, const char *item_unit,
                    const char *note) {
    char shape[48];
    size_text(c->bytes, shape, sizeof shape);
    mg_bench_row row = mg_bench_row_make("copy", name, shape);
    mg_status st;
    if (strcmp(how, "events") == 0)
        st = mg_bench_time_events(b, body, c, b->warmup, iters, &row.stats);
    else
        st = mg_bench_time_host(b, body, c, b->warmup, iters, strcmp(how, "host") == 0, &row.stats);
    if (st)
        return mg_bench_fail(b, name);
    snprintf(row.timing, sizeof row.timing, "%s", how);
    row.bytes = bytes;
    row.items = items;
    if (item_unit)
        snprintf(row.item_unit, sizeof row.item_unit, "%s", item_unit);
    if (note)
        snprintf(row.note, sizeof row.note, "%s", note);
    mg_bench_add(b, &row);
    return 0;
}

static size_t mib_option(int argc, char **argv, const char *flag, size_t fallback) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], flag) == 0) {
            long v = strtol(argv[i + 1], NULL, 10);
            if (v > 0)
                return (size_t)v << 20;
        }
    return fallback;
}

static int bench_copy(mg_bench *b, int argc, char **argv) {
    size_t device_bytes =
        mib_option(argc, argv, "--d2d-mib", b->quick ? 256 << 20 : (size_t)4 << 30);
    size_t host_bytes = mib_option(argc, argv, "--host-mib", b->quick ? 64 << 20 : (size_t)1 << 30);
    int host_iters = b->iters < 10 ? b->iters : 10;
    int failures = 0;
    const char *threads = getenv("METRALE_STAGING_THREADS");
    char staging_note[64];
    snprintf(staging_note, sizeof staging_note, "staged, METRALE_STAGING_THREADS=%s",
             threads ? threads : "default");

    if (mg_bench_selected(b, "d2d")) {
        copy_case c = {.bytes = device_bytes};
        if (mg_alloc(b->backend, device_bytes, &c.device_a) ||
            mg_alloc(b->backend, device_bytes, &c.device_b) ||
            mg_bench_fill_random_device(b, c.device_a, device_bytes, 1))
            failures += mg_bench_fail(b, "d2d setup");
        else
            failures += run_case(b, "d2d", "events", body_d2d, &c, b->iters, 2.0 * device_bytes, 0,
                                 NULL, "bytes read + written");
        mg_free(b->backend, c.device_a);
        mg_free(b->backend, c.device_b);
    }

    copy_case c = {.bytes = host_bytes, .repeats = 1};
    if (mg_alloc(b->backend, host_bytes, &c.device_a) ||
        mg_bench_fill_random_device(b, c.device_a, host_bytes, 2)) {
        mg_free(b->backend, c.device_a);
        return failures + mg_bench_fail(b, "host copy setup");
    }
    void *pinned = NULL;
    if (mg_host_alloc(b->backend, host_bytes, &pinned)) {
        failures += mg_bench_fail(b, "pinned host buffer");
    } else {
        mg_bench_fill_random(pinned, host_bytes, 3);
        c.host = pinned;
        if (mg_bench_selected(b, "h2d_pinned"))
            failures += run_case(b, "h2d_pinned", "events", body_h2d_retained, &c, host_iters,
                                 (double)host_bytes, 0, NULL, "retained, direct DMA");
        if (mg_bench_selected(b, "d2h_pinned"))
            failures += run_case(b, "d2h_pinned", "events", body_d2h, &c, host_iters,
                                 (double)host_bytes, 0, NULL, "direct DMA");
        mg_host_free(b->backend, pinned);
    }
    void *pageable = malloc(host_bytes);
    if (!pageable) {
        failures += mg_bench_fail(b, "pageable host buffer");
    } else {
        mg_bench_fill_random(pageable, host_bytes, 4); /* touches every page */
        c.host = pageable;
        if (mg_bench_selected(b, "h2d_pageable"))
            failures += run_case(b, "h2d_pageable", "host", body_h2d, &c, host_iters,
                                 (double)host_bytes, 0, NULL, staging_note);
        if (mg_bench_selected(b, "d2h_pageable"))
            failures += run_case(b, "d2h_pageable", "host", body_d2h, &c, host_iters,
                                 (double)host_bytes, 0, NULL, staging_note);
        /* Many small uploads, as an engine issues per step: host cost of each call. */
        if (mg_bench_selected(b, "h2d_pageable_4k")) {
            copy_case small = {
                .device_a = c.device_a, .host = pageable, .bytes = 4096, .repeats = 256};
            failures += run_case(b, "h2d_pageable_4k", "issue", body_h2d, &small, b->iters,
                                 4096.0 * small.repeats, small.repeats, "copy",
                                 "256 async copies of 4 KiB, host time to issue");
        }
        free(pageable);
    }
    mg_free(b->backend, c.device_a);
    return failures;
}

MG_BENCH_REGISTER(copy, "copy",
                  "d2d bandwidth; h2d pinned / pageable (staged); d2h pinned / pageable; small "
                  "uploads [--d2d-mib N] [--host-mib N]",
                  bench_copy)
