/*
 * bench.h - the harness behind `metrale-gpu bench <name>`: registry of sub-benchmarks,
 * timing (device events, host clock, CUDA-graph replay), warm-up and median of N, inputs
 * rotated past the L2 cache, and the result table / JSON.
 *
 * A sub-benchmark lives in its own file and registers itself; nothing else needs editing:
 *
 *   static mg_status copy_body(mg_bench *b, void *arg, int iteration) {
 *       copy_case *c = arg;
 *       return mg_copy_d2d_async(b->backend, c->dst, mg_bench_rotation_get(&c->src, iteration),
 *                                c->bytes, b->stream);
 *   }
 *   static int bench_mine(mg_bench *b, int argc, char **argv) {
 *       mg_bench_row row = mg_bench_row_make("mine", "d2d", "1.0 GiB");
 *       if (mg_bench_time_events(b, copy_body, &c, b->warmup, b->iters, &row.stats))
 *           return mg_bench_fail(b, "d2d");
 *       row.bytes = 2.0 * bytes;            // read + written
 *       mg_bench_add(b, &row);
 *       return 0;
 *   }
 *   MG_BENCH_REGISTER(mine, "mine", "what it measures", bench_mine)
 *
 * Every timing helper runs `warmup` untimed iterations first (module loads, lazy staging
 * buffers, clocks ramping), then `iters` timed ones, and reports median, min, max and mean
 * in microseconds. Speed is measured here only, never in tests.
 */
#ifndef METRALE_CLI_BENCH_H
#define METRALE_CLI_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "commands.h"
#include "metrale/gpu.h"

typedef struct mg_bench_stats {
    double median_us, min_us, max_us, mean_us;
    int samples;
} mg_bench_stats;

/* One line of the result table. Throughput columns are derived from the median time:
 * GB/s = bytes / median, TFLOP/s = flops / median, per-item time = median / items. */
typedef struct mg_bench_row {
    char bench[32]; /* sub-benchmark, e.g. "copy" */
    char name[48];  /* case, e.g. "h2d_pageable" */
    char shape[64]; /* size or shape, e.g. "1.0 GiB", "4096x4096x4096" */
    mg_bench_stats stats;
    double bytes;       /* bytes moved per timed iteration; 0: no GB/s column */
    double flops;       /* floating-point operations per iteration; 0: no TFLOP/s */
    double items;       /* things done per iteration (launches, graph nodes); 0: none */
    char item_unit[16]; /* "launch", "node" */
    char timing[16];    /* "events", "host", "graph" */
    char note[96];
} mg_bench_row;

typedef struct mg_bench {
    mg_backend *backend;
    mg_stream *stream; /* a stream created for the run (not the default stream) */
    const mg_cli_options *opts;
    mg_device_info info;
    int warmup, iters;  /* --warmup / --iters; a sub-benchmark may scale them per case */
    const char *only;   /* --only: substring a case name must contain; NULL: all cases */
    bool quick;         /* --quick: smaller sizes and fewer iterations, for smoke tests */
    const char *suffix; /* --suffix: appended to every case name */
    /* rows collected so far */
    mg_bench_row *rows;
    size_t row_count, row_capacity;
    int failures;
} mg_bench;

/* A sub-benchmark: parses its own options from argv (argv[0] is its name), adds rows, and
 * returns 0, or the number of cases that failed. */
typedef int (*mg_bench_fn)(mg_bench *b, int argc, char **argv);

/* Registers a sub-benchmark under `name` (called from MG_BENCH_REGISTER before main). */
void mg_bench_register(const char *name, const char *summary, mg_bench_fn fn);
#define MG_BENCH_REGISTER(id, name, summary, fn)                                                   \
    __attribute__((constructor)) static void mg_bench_register_##id(void) {                        \
        mg_bench_register((name), (summary), (fn));                                                \
    }

/* Whether case `name` passes the --only filter. */
bool mg_bench_selected(const mg_bench *b, const char *name);

/* ------------------------------------------------------------------ timing */

/* One iteration of the measured work; `iteration` counts from 0 over warm-up and timed
 * runs alike (use it to rotate inputs). Issue the work on b->stream. */
typedef mg_status (*mg_bench_body)(mg_bench *b, void *arg, int iteration);

/* Device time of each iteration between two events recorded on b->stream around it. For
 * stream-ordered work. */
mg_status mg_bench_time_events(mg_bench *b, mg_bench_body body, void *arg, int warmup, int iters,
                               mg_bench_stats *out);

/* Host wall-clock time of each iteration. With `include_sync` the stream is synchronized
 * inside the timed region (blocking or partly host-side work: staged copies); without, it
 * is synchronized after the clock stops (host cost of issuing work: launch latency). */
mg_status mg_bench_time_host(mg_bench *b, mg_bench_body body, void *arg, int warmup, int iters,
                             bool include_sync, mg_bench_stats *out);

/* Captures one call of `body` into a graph on b->stream, then times graph replays with
 * device events (launch gaps removed). `body` is called once, with iteration 0. */
mg_status mg_bench_time_graph(mg_bench *b, mg_bench_body body, void *arg, int warmup, int iters,
                              mg_bench_stats *out);

/* Median, min, max and mean of `n` samples in microseconds (sorts `samples_us`). */
void mg_bench_stats_from(double *samples_us, int n, mg_bench_stats *out);

/* Monotonic host clock in microseconds. */
double mg_bench_now_us(void);

/* ------------------------------------------------------------------ inputs */

/* `count` device buffers of `bytes` each, enough of them that cycling through them does
 * not hit the L2 cache: at least `min_count`, and together at least 4x the device's L2
 * (when it is known). Contents are filled with random bytes. */
typedef struct mg_bench_rotation {
    mg_devptr *buffers;
    int count;
    size_t bytes;
} mg_bench_rotation;

mg_status mg_bench_rotation_create(mg_bench *b, size_t bytes, int min_count,
                                   mg_bench_rotation *out);
mg_devptr mg_bench_rotation_get(const mg_bench_rotation *r, int iteration);
void mg_bench_rotation_destroy(mg_bench *b, mg_bench_rotation *r);

/* Fills host memory with pseudo-random bytes (never zeros: zeros can run faster). */
void mg_bench_fill_random(void *host, size_t bytes, uint64_t seed);
/* Fills device memory with pseudo-random bytes through a pageable host buffer. */
mg_status mg_bench_fill_random_device(mg_bench *b, mg_devptr dst, size_t bytes, uint64_t seed);

/* Fills `elems` device elements with values uniform in [-1, 1) (never raw random bits: NaNs
 * and huge values would change a softmax's path): BF16, or (fp8) FP8 E4M3 codes of 100 times
 * the value, for per-head scales of about 0.01. One random tile of at most 8 Mi elements is
 * made on the host and repeated on the device, so multi-GiB pools fill in a moment. */
mg_status mg_bench_fill_unit(mg_bench *b, mg_devptr dst, size_t elems, bool fp8, uint64_t seed);

/* ------------------------------------------------------------------ paged KV cache */

/* A host page table (metrale/ops_kv_cache.h) of `batch` requests, each holding `tokens` tokens
 * of which the last `new_tokens` are new (qo_indptr), on pages of `page_size` tokens: exactly
 * the pages needed, numbered 0..pages-1 and dealt in a seeded shuffled order. */
typedef struct mg_bench_page_table {
    uint32_t batch, pages;
    int32_t *qo, *kv, *idx, *last;
} mg_bench_page_table;

bool mg_bench_page_table_make(mg_bench_page_table *t, uint32_t batch, uint32_t new_tokens,
                              uint32_t tokens, uint32_t page_size, uint64_t seed);
void mg_bench_page_table_free(mg_bench_page_table *t);

/* ------------------------------------------------------------------ yardsticks */

/* Device-to-device copy bandwidth in GB/s (bytes read + written per second): event-timed
 * copies between two buffers of `bytes`, median, as `bench copy`'s d2d case measures it. The
 * figure memory-bound kernels are reported against. */
mg_status mg_bench_copy_bandwidth(mg_bench *b, size_t bytes, double *gbps);

/* ------------------------------------------------------------------ results */

/* A row with bench, name and shape set and everything else zero. */
mg_bench_row mg_bench_row_make(const char *bench, const char *name, const char *shape);
/* Appends a copy of `row` to the results (its name gets --suffix). */
void mg_bench_add(mg_bench *b, const mg_bench_row *row);
/* Prints "bench <case>: <status>: <message>" to stderr, counts the failure, returns 1. */
int mg_bench_fail(mg_bench *b, const char *what);

/* A timed row of a weight-streaming op: its note "weights F of copy bw<suffix>", F the row's
 * bytes per second over `copy_gbps` (0 when unknown). */
void mg_bench_note_weights(mg_bench_row *row, double copy_gbps, const char *suffix);

/* ------------------------------------------------------------------ options */

/* The positive numbers of `option`'s comma-separated value ("--m 1,16,4096"), at most `max`
 * into `out`; how many (0 when the option is absent). */
size_t mg_bench_option_u32_list(int argc, char **argv, const char *option, uint32_t *out,
                                size_t max);

#endif
