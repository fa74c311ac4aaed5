/*
 * metrale/timing.h - device timing spans: event pairs around each serve lane on every step,
 * and around eager kernel launches on the steps that are armed for it, with summaries and a
 * Chrome trace-event export (opens in Perfetto and chrome://tracing).
 *
 *   mg_timing *t;
 *   mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .kernel_span_every = 100};
 *   mg_timing_create(backend, &o, &t);
 *   uint32_t decode;  mg_timing_lane(t, "decode", &decode);
 *   for each step:
 *       mg_timing_step_begin(t, step);               // harvests finished spans, never blocks
 *       mg_timing_span span;
 *       mg_timing_lane_begin(t, decode, stream, &span);
 *         mg_timing_span k;                          // only does something on armed steps
 *         mg_timing_kernel_begin(t, mg_kernel_name(kernel), stream, &k);
 *         mg_launch_run(backend, kernel, stream, &launch);
 *         mg_timing_span_end(t, k, stream);
 *       mg_timing_span_end(t, span, stream);
 *   mg_timing_harvest(t, NULL);                      // e.g. after the last synchronize
 *   mg_timing_print_summary(t, stderr);
 *   mg_timing_export_chrome_trace(t, "trace.json");
 *   mg_timing_destroy(t);
 *
 * What a caller may rely on:
 *  - Levels: OFF records nothing; BASIC records lane spans on every step; KERNEL also records
 *    kernel spans on armed steps: steps whose number is a multiple of kernel_span_every.
 *  - Nothing is ever recorded into a stream that is being captured (an event recorded into a
 *    capture would become part of the graph): begin on a capturing stream returns no span,
 *    counted in skipped_capturing; a span whose end finds its stream capturing is abandoned.
 *  - Spans use a fixed pool of event pairs, created up front and reused round-robin. A pair
 *    is reused only after its span was harvested, so a live span is never overwritten; when
 *    no pair is free the span is not recorded and dropped_pool_full counts it. Nothing blocks.
 *  - Harvest only queries events (mg_event_query) and reads completed pairs; spans whose
 *    work has not finished stay for a later harvest.
 *  - Begin/end return MG_OK and a "no span" value (0) whenever a span is not recorded, so the
 *    hot path needs no branches; ending span 0 is a no-op. A failure to record an event on
 *    the device is returned (and the pair recycled).
 *  - Only the public event API is used, so this works on every backend with
 *    MG_CAP_EVENT_TIMING. All calls are thread-safe (one lock per timing object).
 *  - Timeline: span start times are placed relative to an epoch event recorded at creation;
 *    the epoch is re-anchored every ~10 s of host time (epoch_interval_ms; the new epoch's
 *    offset is measured between two events, so float precision is kept over long runs).
 *    Durations are measured between the span's own two events.
 *  - Summaries: count, total, min, max exactly; p50 and p99 from a log-linear histogram
 *    (64 sub-buckets per power of two of nanoseconds: within 1.6% of the exact value).
 */
#ifndef METRALE_TIMING_H
#define METRALE_TIMING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mg_telemetry_level {
    MG_TELEMETRY_OFF = 0,
    MG_TELEMETRY_BASIC = 1,  /* lane spans on every step */
    MG_TELEMETRY_KERNEL = 2, /* plus kernel spans on armed steps */
} mg_telemetry_level;

#define MG_TIMING_DEFAULT_POOL_PAIRS 4096
#define MG_TIMING_DEFAULT_KERNEL_SPAN_EVERY 100
#define MG_TIMING_DEFAULT_TRACE_CAPACITY 65536
#define MG_TIMING_MAX_LANES 64
#define MG_TIMING_MAX_SERIES                                                                       \
    1024 /* lanes + distinct kernel names; later kernel names are                                  \
            summarised together as "(other kernels)" */
#define MG_TIMING_NAME_BYTES 96

typedef struct mg_timing_options {
    mg_telemetry_level level;
    uint32_t pool_pairs;        /* event pairs; 0 = MG_TIMING_DEFAULT_POOL_PAIRS */
    uint32_t kernel_span_every; /* arm one step in this many; 0 = the default */
    uint32_t trace_capacity;    /* finished spans kept for export (oldest are overwritten);
                                   0 = MG_TIMING_DEFAULT_TRACE_CAPACITY */
    uint32_t epoch_interval_ms; /* host time between epoch re-anchors; 0 = 10000 */
} mg_timing_options;

typedef struct mg_timing mg_timing;

/* A recorded span, or 0 when none was recorded. */
typedef uint64_t mg_timing_span;

/* Creates the pool (2 x pool_pairs events) and records the epoch event on the default
 * stream. `opts` NULL means level BASIC with every default. MG_ERR_UNSUPPORTED when the
 * backend lacks MG_CAP_EVENT_TIMING. A failure part-way destroys what was created. */
MG_API mg_status mg_timing_create(mg_backend *b, const mg_timing_options *opts, mg_timing **out);
/* Destroys the events; spans not harvested yet are lost. NULL is a no-op. */
MG_API mg_status mg_timing_destroy(mg_timing *t);

MG_API void mg_timing_set_level(mg_timing *t, mg_telemetry_level level);
MG_API mg_telemetry_level mg_timing_level(const mg_timing *t);

/* The lane named `name` (created on first use; the same name gives the same lane). At most
 * MG_TIMING_MAX_LANES lanes; names are 1..95 characters. */
MG_API mg_status mg_timing_lane(mg_timing *t, const char *name, uint32_t *lane_out);

/* Starts step `step`: harvests finished spans (never blocks) and decides whether kernel
 * spans are armed for this step (level KERNEL and step % kernel_span_every == 0). */
MG_API mg_status mg_timing_step_begin(mg_timing *t, uint64_t step);
/* Whether kernel spans are recorded in the current step. */
MG_API bool mg_timing_kernel_spans_armed(mg_timing *t);

/* Records the start of a lane span on `s` (NULL: the default stream). */
MG_API mg_status mg_timing_lane_begin(mg_timing *t, uint32_t lane, mg_stream *s,
                                      mg_timing_span *out);
/* Records the start of a kernel span on `s`, on armed steps only. */
MG_API mg_status mg_timing_kernel_begin(mg_timing *t, const char *kernel_name, mg_stream *s,
                                        mg_timing_span *out);
/* Records the end of `span` on `s` (normally the stream it began on). 0 is a no-op; a span
 * that is not open (ended twice, or stale) is MG_ERR_INVALID_ARGUMENT. */
MG_API mg_status mg_timing_span_end(mg_timing *t, mg_timing_span span, mg_stream *s);

/* Wraps every mg_launch_run on this timing's backend in a kernel span (recorded only on
 * armed steps, like mg_timing_kernel_begin), so eager launches are timed without changing
 * the call sites. One timing object per backend at a time; `on = false` or
 * mg_timing_destroy detaches it. Attach and detach while no other thread is launching. */
MG_API mg_status mg_timing_trace_launches(mg_timing *t, bool on);

/* Reads every finished span without blocking; *harvested (may be NULL) receives how many. */
MG_API mg_status mg_timing_harvest(mg_timing *t, size_t *harvested);

typedef struct mg_timing_counters {
    uint64_t recorded;          /* spans begun (a pair taken) */
    uint64_t harvested;         /* spans read and summarised */
    uint64_t dropped_pool_full; /* spans not recorded: no free pair */
    uint64_t skipped_capturing; /* spans not recorded: the stream was capturing */
    uint64_t abandoned;         /* spans given up: end on a capturing stream, or a device error */
    uint64_t open;              /* begun, not ended yet */
    uint64_t pending;           /* ended, not harvested yet */
    uint64_t trace_overwritten; /* finished spans pushed out of the trace buffer */
} mg_timing_counters;

MG_API mg_status mg_timing_get_counters(mg_timing *t, mg_timing_counters *out);

typedef enum mg_timing_kind { MG_TIMING_LANE = 0, MG_TIMING_KERNEL = 1 } mg_timing_kind;

typedef struct mg_timing_summary {
    char name[MG_TIMING_NAME_BYTES];
    mg_timing_kind kind;
    uint64_t count;
    double total_us, min_us, max_us;
    double p50_us, p99_us; /* nearest rank, from the histogram */
} mg_timing_summary;

/* Number of series (lanes first, in creation order, then kernels in order of first span). */
MG_API size_t mg_timing_summary_count(mg_timing *t);
MG_API mg_status mg_timing_summary_get(mg_timing *t, size_t index, mg_timing_summary *out);
/* One line per series with at least one span: kind, name, count, p50, p99, total. */
MG_API mg_status mg_timing_print_summary(mg_timing *t, FILE *f);

/* Writes the kept spans as Chrome trace-event JSON: {"traceEvents": [...]} with one complete
 * event ("ph": "X", ts/dur in microseconds) per span, a thread per lane and one per stream
 * for kernel spans, named by metadata events. Harvest first to include the latest spans.
 * Fails only when the file cannot be written (MG_ERR_INVALID_ARGUMENT naming the path and
 * the system's reason). */
MG_API mg_status mg_timing_export_chrome_trace(mg_timing *t, const char *path);
/* Same, to an open stream. */
MG_API mg_status mg_timing_write_chrome_trace(mg_timing *t, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
