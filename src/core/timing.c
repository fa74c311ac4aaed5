/*
 * timing.c - device timing spans over a fixed pool of event pairs (metrale/timing.h).
 *
 * Slot life: FREE -> OPEN (start event recorded) -> PENDING (end event recorded) -> FREE
 * (harvested, or abandoned). A slot is taken only when FREE, so a pair is never re-recorded
 * while its span can still be read. The span handle carries the slot and a generation that
 * changes each time the slot is taken, so a stale handle is caught instead of ending a
 * stranger's span.
 */
#include "metrale/timing.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_internal.h"
#include "error.h"
#include "trace_json.h"

/* ------------------------------------------------------------------ histogram */

/* Log-linear buckets over nanoseconds: values below 64 exactly, then 64 sub-buckets per
 * power of two up to 2^HIST_MAX_EXP ns (about 4.9 hours); larger values share the last. */
#define HIST_SUB_BITS 6
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_MAX_EXP 44
#define HIST_BUCKETS (HIST_SUB + (HIST_MAX_EXP - HIST_SUB_BITS + 1) * HIST_SUB)

static size_t hist_index(uint64_t ns) {
    if (ns < HIST_SUB)
        return (size_t)ns;
    int e = 63 - __builtin_clzll(ns);
    if (e > HIST_MAX_EXP)
        return HIST_BUCKETS - 1;
    uint64_t m = (ns >> (e - HIST_SUB_BITS)) & (HIST_SUB - 1);
    return HIST_SUB + (size_t)(e - HIST_SUB_BITS) * HIST_SUB + (size_t)m;
}

/* Middle of bucket `i` in nanoseconds. */
static double hist_value(size_t i) {
    if (i < HIST_SUB)
        return (double)i;
    size_t k = i - HIST_SUB;
    int shift = (int)(k / HIST_SUB);
    uint64_t low = (uint64_t)(HIST_SUB + k % HIST_SUB) << shift;
    uint64_t width = 1ull << shift;
    return (double)low + (double)(width - 1) / 2.0;
}

/* ------------------------------------------------------------------ state */

typedef enum slot_state { SLOT_FREE = 0, SLOT_OPEN, SLOT_PENDING } slot_state;

typedef struct span_slot {
    mg_event *start, *end;
    slot_state state;
    uint32_t generation;
    uint32_t series;
    uint32_t stream_id;
    uint64_t step;
} span_slot;

typedef struct series {
    char name[MG_TIMING_NAME_BYTES];
    mg_timing_kind kind;
    uint32_t lane; /* lanes: their index (the trace thread) */
    uint64_t count, total_ns, min_ns, max_ns;
    uint32_t *hist; /* HIST_BUCKETS counts, allocated with the first sample */
} series;

typedef struct trace_record {
    uint32_t series;
    uint32_t stream_id;
    uint64_t step;
    double start_us; /* from the first epoch */
    double dur_us;
} trace_record;

#define MAX_STREAM_IDS 64 /* kernel-span threads in the trace; later streams share the last */

struct mg_timing {
    mg_backend *backend;
    pthread_mutex_t lock;
    mg_telemetry_level level;
    uint32_t kernel_span_every;
    uint64_t step;
    bool armed;

    span_slot *slots;
    uint32_t pool_pairs, cursor, free_count;

    series *series;
    uint32_t series_count;
    uint32_t lane_series[MG_TIMING_MAX_LANES];
    uint32_t lane_count;
    uint32_t overflow_series; /* "(other kernels)"; UINT32_MAX until needed */

    mg_stream *streams[MAX_STREAM_IDS];
    uint32_t stream_count;

    trace_record *trace;
    uint32_t trace_capacity;
    uint64_t trace_written;

    /* Timeline: epoch_abs_ms is the epoch event's time from the first epoch. A re-anchor
     * records next_epoch; once both are complete the offset between them moves the epoch. */
    mg_event *epoch, *next_epoch;
    double epoch_abs_ms;
    bool next_epoch_recorded;
    uint64_t epoch_host_ns, next_epoch_host_ns, epoch_interval_ns;

    mg_timing_counters counters;
};

static uint64_t host_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static mg_timing_span make_span(uint32_t slot, uint32_t generation) {
    return ((uint64_t)generation << 32) | (uint64_t)(slot + 1);
}

/* ------------------------------------------------------------------ lifetime */

static void timing_free(mg_timing *t) {
    mg_backend_detach_launch_timing(t->backend, t);
    for (uint32_t i = 0; t->slots && i < t->pool_pairs; i++) {
        mg_event_destroy(t->slots[i].start);
        mg_event_destroy(t->slots[i].end);
    }
    mg_event_destroy(t->epoch);
    mg_event_destroy(t->next_epoch);
    for (uint32_t i = 0; t->series && i < t->series_count; i++)
        free(t->series[i].hist);
    free(t->slots);
    free(t->series);
    free(t->trace);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

mg_status mg_timing_create(mg_backend *b, const mg_timing_options *opts, mg_timing **out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_create: NULL output pointer");
    *out = NULL;
    mg_status live = mg_backend_check_live(b, "mg_timing_create");
    if (live)
        return live;
    if (!mg_backend_supports(b, MG_CAP_EVENT_TIMING))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "mg_timing_create: the %s backend cannot time events",
                        mg_backend_kind_name(mg_backend_get_kind(b)));
    mg_timing_options o = opts ? *opts : (mg_timing_options){.level = MG_TELEMETRY_BASIC};
    if ((unsigned)o.level > MG_TELEMETRY_KERNEL)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_create: unknown level %d",
                        (int)o.level);
    if (!o.pool_pairs)
        o.pool_pairs = MG_TIMING_DEFAULT_POOL_PAIRS;
    if (!o.kernel_span_every)
        o.kernel_span_every = MG_TIMING_DEFAULT_KERNEL_SPAN_EVERY;
    if (!o.trace_capacity)
        o.trace_capacity = MG_TIMING_DEFAULT_TRACE_CAPACITY;
    if (!o.epoch_interval_ms)
        o.epoch_interval_ms = 10000;

    mg_timing *t = calloc(1, sizeof *t);
    if (!t)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_timing_create: out of host memory");
    pthread_mutex_init(&t->lock, NULL);
    t->backend = b;
    t->level = o.level;
    t->kernel_span_every = o.kernel_span_every;
    t->pool_pairs = o.pool_pairs;
    t->free_count = o.pool_pairs;
    t->trace_capacity = o.trace_capacity;
    t->epoch_interval_ns = (uint64_t)o.epoch_interval_ms * 1000000ull;
    t->overflow_series = UINT32_MAX;
    t->slots = calloc(o.pool_pairs, sizeof *t->slots);
    t->series = calloc(MG_TIMING_MAX_SERIES + 1, sizeof *t->series);
    t->trace = calloc(o.trace_capacity, sizeof *t->trace);
    mg_status st = MG_OK;
    if (!t->slots || !t->series || !t->trace)
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                      "mg_timing_create: host memory for %u event pairs and %u trace records",
                      o.pool_pairs, o.trace_capacity);
    for (uint32_t i = 0; st == MG_OK && i < o.pool_pairs; i++) {
        st = mg_event_create(b, &t->slots[i].start);
        if (st == MG_OK)
            st = mg_event_create(b, &t->slots[i].end);
    }
    if (st == MG_OK)
        st = mg_event_create(b, &t->epoch);
    if (st == MG_OK)
        st = mg_event_create(b, &t->next_epoch);
    if (st == MG_OK) {
        st = mg_event_record(t->epoch, mg_stream_default(b));
        t->epoch_host_ns = host_now_ns();
    }
    if (st != MG_OK) {
        /* name the call first: the clean-up's successful destroys leave the message alone */
        st = mg_error_set(st, NULL, 0, "mg_timing_create: %s", mg_last_error());
        timing_free(t);
        return st;
    }
    *out = t;
    return MG_OK;
}

mg_status mg_timing_destroy(mg_timing *t) {
    if (!t)
        return MG_OK;
    timing_free(t);
    return MG_OK;
}

void mg_timing_set_level(mg_timing *t, mg_telemetry_level level) {
    if (!t || (unsigned)level > MG_TELEMETRY_KERNEL)
        return;
    pthread_mutex_lock(&t->lock);
    t->level = level;
    if (level != MG_TELEMETRY_KERNEL)
        t->armed = false;
    pthread_mutex_unlock(&t->lock);
}

mg_telemetry_level mg_timing_level(const mg_timing *t) {
    if (!t)
        return MG_TELEMETRY_OFF;
    pthread_mutex_lock((pthread_mutex_t *)&t->lock);
    mg_telemetry_level level = t->level;
    pthread_mutex_unlock((pthread_mutex_t *)&t->lock);
    return level;
}

/* ------------------------------------------------------------------ series and lanes */

/* Index of a new series, or UINT32_MAX when `limit` series exist. Caller holds the lock.
 * The table has MG_TIMING_MAX_SERIES + 1 entries: kernels leave room for every lane not yet
 * created, and the last entry is the shared "(other kernels)" series. */
static uint32_t series_add(mg_timing *t, const char *name, mg_timing_kind kind, uint32_t limit) {
    if (t->series_count >= limit)
        return UINT32_MAX;
    series *s = &t->series[t->series_count];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->kind = kind;
    return t->series_count++;
}

/* Names are kept truncated to MG_TIMING_NAME_BYTES - 1 characters; lookups truncate too. */
static uint32_t series_find(const mg_timing *t, const char *name, mg_timing_kind kind) {
    char key[MG_TIMING_NAME_BYTES];
    snprintf(key, sizeof key, "%s", name);
    for (uint32_t i = 0; i < t->series_count; i++)
        if (t->series[i].kind == kind && strcmp(t->series[i].name, key) == 0)
            return i;
    return UINT32_MAX;
}

mg_status mg_timing_lane(mg_timing *t, const char *name, uint32_t *lane_out) {
    if (!t || !name || !lane_out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_lane: NULL argument");
    size_t len = strlen(name);
    if (len == 0 || len >= MG_TIMING_NAME_BYTES)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_timing_lane: lane name of %zu characters (1..%d allowed)", len,
                        MG_TIMING_NAME_BYTES - 1);
    mg_status st = MG_OK;
    pthread_mutex_lock(&t->lock);
    uint32_t found = series_find(t, name, MG_TIMING_LANE);
    if (found != UINT32_MAX) {
        *lane_out = t->series[found].lane;
    } else if (t->lane_count >= MG_TIMING_MAX_LANES) {
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_lane: '%s' would be lane %d; at most %d",
                      name, MG_TIMING_MAX_LANES + 1, MG_TIMING_MAX_LANES);
    } else {
        uint32_t s = series_add(t, name, MG_TIMING_LANE, MG_TIMING_MAX_SERIES + 1);
        t->series[s].lane = t->lane_count; /* room is reserved: see series_add */
        t->lane_series[t->lane_count] = s;
        *lane_out = t->lane_count++;
    }
    pthread_mutex_unlock(&t->lock);
    return st;
}

/* Series of a kernel name, created on first use; beyond the table, "(other kernels)". */
static uint32_t kernel_series(mg_timing *t, const char *name) {
    uint32_t s = series_find(t, name, MG_TIMING_KERNEL);
    if (s != UINT32_MAX)
        return s;
    s = series_add(t, name, MG_TIMING_KERNEL,
                   MG_TIMING_MAX_SERIES - (MG_TIMING_MAX_LANES - t->lane_count));
    if (s != UINT32_MAX)
        return s;
    if (t->overflow_series == UINT32_MAX)
        t->overflow_series =
            series_add(t, "(other kernels)", MG_TIMING_KERNEL, MG_TIMING_MAX_SERIES + 1);
    return t->overflow_series;
}

/* Small id of a stream for the trace's kernel threads. */
static uint32_t stream_id_of(mg_timing *t, mg_stream *s) {
    for (uint32_t i = 0; i < t->stream_count; i++)
        if (t->streams[i] == s)
            return i;
    if (t->stream_count < MAX_STREAM_IDS) {
        t->streams[t->stream_count] = s;
        return t->stream_count++;
    }
    return MAX_STREAM_IDS - 1;
}

/* ------------------------------------------------------------------ recording */

/* Takes a free pair round-robin and records its start on `s`. Caller holds the lock. */
static mg_status span_begin(mg_timing *t, uint32_t series_index, mg_stream *s,
                            mg_timing_span *out) {
    if (!s)
        s = mg_stream_default(t->backend);
    bool capturing = true;
    mg_status st = mg_stream_is_capturing(s, &capturing);
    if (st != MG_OK)
        return st;
    if (capturing) {
        t->counters.skipped_capturing++;
        return MG_OK;
    }
    if (t->free_count == 0) {
        t->counters.dropped_pool_full++;
        return MG_OK;
    }
    uint32_t i = t->cursor;
    while (t->slots[i].state != SLOT_FREE)
        i = (i + 1) % t->pool_pairs;
    span_slot *slot = &t->slots[i];
    st = mg_event_record(slot->start, s);
    if (st != MG_OK)
        return st;
    t->cursor = (i + 1) % t->pool_pairs;
    t->free_count--;
    slot->state = SLOT_OPEN;
    slot->generation++;
    slot->series = series_index;
    slot->stream_id = stream_id_of(t, s);
    slot->step = t->step;
    t->counters.recorded++;
    t->counters.open++;
    *out = make_span(i, slot->generation);
    return MG_OK;
}

mg_status mg_timing_lane_begin(mg_timing *t, uint32_t lane, mg_stream *s, mg_timing_span *out) {
    if (!t || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_lane_begin: NULL argument");
    *out = 0;
    mg_status st = MG_OK;
    pthread_mutex_lock(&t->lock);
    if (lane >= t->lane_count)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_lane_begin: no lane %u (%u lanes)", lane,
                      t->lane_count);
    else if (t->level >= MG_TELEMETRY_BASIC)
        st = span_begin(t, t->lane_series[lane], s, out);
    pthread_mutex_unlock(&t->lock);
    return st;
}

mg_status mg_timing_kernel_begin(mg_timing *t, const char *kernel_name, mg_stream *s,
                                 mg_timing_span *out) {
    if (!t || !kernel_name || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_kernel_begin: NULL argument");
    *out = 0;
    mg_status st = MG_OK;
    pthread_mutex_lock(&t->lock);
    if (t->armed && t->level == MG_TELEMETRY_KERNEL)
        st = span_begin(t, kernel_series(t, kernel_name), s, out);
    pthread_mutex_unlock(&t->lock);
    return st;
}

/* Returns a slot to the pool without reading it. Caller holds the lock. */
static void slot_release(mg_timing *t, span_slot *slot) {
    if (slot->state == SLOT_OPEN)
        t->counters.open--;
    else if (slot->state == SLOT_PENDING)
        t->counters.pending--;
    slot->state = SLOT_FREE;
    t->free_count++;
}

mg_status mg_timing_span_end(mg_timing *t, mg_timing_span span, mg_stream *s) {
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_span_end: NULL timing");
    if (span == 0)
        return MG_OK;
    uint32_t index = (uint32_t)(span & 0xffffffffu) - 1;
    uint32_t generation = (uint32_t)(span >> 32);
    mg_status st = MG_OK;
    pthread_mutex_lock(&t->lock);
    span_slot *slot = index < t->pool_pairs ? &t->slots[index] : NULL;
    if (!slot || slot->generation != generation || slot->state != SLOT_OPEN) {
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "mg_timing_span_end: span %#" PRIx64 " is not open (ended twice, or stale)",
                      span);
    } else {
        if (!s)
            s = mg_stream_default(t->backend);
        bool capturing = true;
        st = mg_stream_is_capturing(s, &capturing);
        if (st == MG_OK && !capturing)
            st = mg_event_record(slot->end, s);
        if (st != MG_OK || capturing) {
            slot_release(t, slot);
            t->counters.abandoned++;
        } else {
            slot->state = SLOT_PENDING;
            t->counters.open--;
            t->counters.pending++;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return st;
}

/* ------------------------------------------------------------------ harvest */

static void series_add_sample(series *s, uint64_t ns) {
    if (!s->hist)
        s->hist = calloc(HIST_BUCKETS, sizeof *s->hist);
    if (s->hist)
        s->hist[hist_index(ns)]++;
    if (s->count == 0 || ns < s->min_ns)
        s->min_ns = ns;
    if (ns > s->max_ns)
        s->max_ns = ns;
    s->count++;
    s->total_ns += ns;
}

/* Moves the epoch forward once the re-anchor event has completed. Caller holds the lock. */
static mg_status advance_epoch(mg_timing *t) {
    if (!t->next_epoch_recorded)
        return MG_OK;
    mg_status st = mg_event_query(t->next_epoch);
    if (st == MG_ERR_NOT_READY)
        return MG_OK;
    float ms = 0;
    if (st == MG_OK)
        st = mg_event_query(t->epoch);
    if (st == MG_ERR_NOT_READY)
        return MG_OK;
    if (st == MG_OK)
        st = mg_event_elapsed_ms(t->epoch, t->next_epoch, &ms);
    t->next_epoch_recorded = false;
    if (st != MG_OK)
        return st; /* keep the old epoch; a later step records another */
    mg_event *old = t->epoch;
    t->epoch = t->next_epoch;
    t->next_epoch = old;
    t->epoch_abs_ms += ms;
    t->epoch_host_ns = t->next_epoch_host_ns;
    return MG_OK;
}

/* Reads one pending span if it has finished: MG_OK (done, slot freed), MG_ERR_NOT_READY
 * (later), or a device error (slot abandoned). Caller holds the lock. */
static mg_status harvest_slot(mg_timing *t, span_slot *slot) {
    mg_status st = mg_event_query(slot->end);
    if (st == MG_OK)
        st = mg_event_query(t->epoch);
    if (st == MG_ERR_NOT_READY)
        return st;
    float dur_ms = 0, start_ms = 0;
    if (st == MG_OK)
        st = mg_event_elapsed_ms(slot->start, slot->end, &dur_ms);
    if (st == MG_OK)
        st = mg_event_elapsed_ms(t->epoch, slot->start, &start_ms);
    if (st == MG_ERR_NOT_READY)
        return st;
    if (st != MG_OK) {
        slot_release(t, slot);
        t->counters.abandoned++;
        return st;
    }
    double dur_ns = dur_ms > 0 ? (double)dur_ms * 1e6 : 0.0;
    series_add_sample(&t->series[slot->series], (uint64_t)llround(dur_ns));
    trace_record *r = &t->trace[t->trace_written % t->trace_capacity];
    if (t->trace_written >= t->trace_capacity)
        t->counters.trace_overwritten++;
    *r = (trace_record){
        .series = slot->series,
        .stream_id = slot->stream_id,
        .step = slot->step,
        .start_us = (t->epoch_abs_ms + (double)start_ms) * 1000.0,
        .dur_us = dur_ns / 1000.0,
    };
    t->trace_written++;
    slot_release(t, slot);
    t->counters.harvested++;
    return MG_OK;
}

/* Caller holds the lock. Returns the first device error; processes every slot regardless. */
static mg_status harvest_locked(mg_timing *t, size_t *harvested) {
    mg_status first = advance_epoch(t);
    size_t done = 0;
    for (uint32_t i = 0; i < t->pool_pairs && t->counters.pending; i++) {
        if (t->slots[i].state != SLOT_PENDING)
            continue;
        mg_status st = harvest_slot(t, &t->slots[i]);
        if (st == MG_OK)
            done++;
        else if (st != MG_ERR_NOT_READY && first == MG_OK)
            first = st;
    }
    if (harvested)
        *harvested = done;
    return first;
}

mg_status mg_timing_harvest(mg_timing *t, size_t *harvested) {
    if (harvested)
        *harvested = 0;
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_harvest: NULL timing");
    pthread_mutex_lock(&t->lock);
    mg_status st = harvest_locked(t, harvested);
    pthread_mutex_unlock(&t->lock);
    return st;
}

mg_status mg_timing_step_begin(mg_timing *t, uint64_t step) {
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_step_begin: NULL timing");
    pthread_mutex_lock(&t->lock);
    mg_status st = harvest_locked(t, NULL);
    t->step = step;
    t->armed = t->level == MG_TELEMETRY_KERNEL && step % t->kernel_span_every == 0;
    /* Re-anchor the timeline now and then, on the default stream when it is not capturing. */
    uint64_t now = host_now_ns();
    if (t->level != MG_TELEMETRY_OFF && !t->next_epoch_recorded &&
        now - t->epoch_host_ns >= t->epoch_interval_ns) {
        mg_stream *d = mg_stream_default(t->backend);
        bool capturing = true;
        if (mg_stream_is_capturing(d, &capturing) == MG_OK && !capturing &&
            mg_event_record(t->next_epoch, d) == MG_OK) {
            t->next_epoch_recorded = true;
            t->next_epoch_host_ns = now;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return st;
}

bool mg_timing_kernel_spans_armed(mg_timing *t) {
    if (!t)
        return false;
    pthread_mutex_lock(&t->lock);
    bool armed = t->armed && t->level == MG_TELEMETRY_KERNEL;
    pthread_mutex_unlock(&t->lock);
    return armed;
}

mg_status mg_timing_get_counters(mg_timing *t, mg_timing_counters *out) {
    if (!t || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_get_counters: NULL argument");
    pthread_mutex_lock(&t->lock);
    *out = t->counters;
    pthread_mutex_unlock(&t->lock);
    return MG_OK;
}

/* ------------------------------------------------------------------ summaries */

/* Nearest-rank percentile `p` (0..1] from the histogram, clamped to the exact extremes. */
static double percentile_ns(const series *s, double p) {
    if (!s->count || !s->hist)
        return 0;
    uint64_t rank = (uint64_t)ceil(p * (double)s->count);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        seen += s->hist[i];
        if (seen >= rank) {
            double v = hist_value(i);
            if (v < (double)s->min_ns)
                v = (double)s->min_ns;
            if (v > (double)s->max_ns)
                v = (double)s->max_ns;
            return v;
        }
    }
    return (double)s->max_ns;
}

size_t mg_timing_summary_count(mg_timing *t) {
    if (!t)
        return 0;
    pthread_mutex_lock(&t->lock);
    size_t n = t->series_count;
    pthread_mutex_unlock(&t->lock);
    return n;
}

static void summary_of(const series *s, mg_timing_summary *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", s->name);
    out->kind = s->kind;
    out->count = s->count;
    out->total_us = (double)s->total_ns / 1000.0;
    out->min_us = (double)s->min_ns / 1000.0;
    out->max_us = (double)s->max_ns / 1000.0;
    out->p50_us = percentile_ns(s, 0.50) / 1000.0;
    out->p99_us = percentile_ns(s, 0.99) / 1000.0;
}

mg_status mg_timing_summary_get(mg_timing *t, size_t index, mg_timing_summary *out) {
    if (!t || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_summary_get: NULL argument");
    mg_status st = MG_OK;
    pthread_mutex_lock(&t->lock);
    if (index >= t->series_count)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "mg_timing_summary_get: index %zu out of range (%u series)", index,
                      t->series_count);
    else
        summary_of(&t->series[index], out);
    pthread_mutex_unlock(&t->lock);
    return st;
}

mg_status mg_timing_print_summary(mg_timing *t, FILE *f) {
    if (!t || !f)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_print_summary: NULL argument");
    pthread_mutex_lock(&t->lock);
    fprintf(f, "%-6s  %-40s %10s %12s %12s %14s\n", "kind", "name", "count", "p50 us", "p99 us",
            "total us");
    for (uint32_t i = 0; i < t->series_count; i++) {
        if (!t->series[i].count)
            continue;
        mg_timing_summary s;
        summary_of(&t->series[i], &s);
        fprintf(f, "%-6s  %-40.40s %10" PRIu64 " %12.2f %12.2f %14.1f\n",
                s.kind == MG_TIMING_LANE ? "lane" : "kernel", s.name, s.count, s.p50_us, s.p99_us,
                s.total_us);
    }
    const mg_timing_counters *c = &t->counters;
    fprintf(f,
            "spans recorded %" PRIu64 ", harvested %" PRIu64 ", dropped (pool full) %" PRIu64
            ", skipped (capturing) %" PRIu64 ", abandoned %" PRIu64 ", open %" PRIu64
            ", pending %" PRIu64 "\n",
            c->recorded, c->harvested, c->dropped_pool_full, c->skipped_capturing, c->abandoned,
            c->open, c->pending);
    pthread_mutex_unlock(&t->lock);
    return MG_OK;
}

/* ------------------------------------------------------------------ trace export */

#define TRACE_PID 1
#define TRACE_KERNEL_TID_BASE 1000

mg_status mg_timing_write_chrome_trace(mg_timing *t, FILE *f) {
    if (!t || !f)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_write_chrome_trace: NULL argument");
    pthread_mutex_lock(&t->lock);
    mg_trace_writer w;
    mg_trace_begin(&w, f);
    char label[MG_TIMING_NAME_BYTES + 32];
    snprintf(label, sizeof label, "metrale-gpu (%s)",
             mg_backend_kind_name(mg_backend_get_kind(t->backend)));
    mg_trace_process_name(&w, TRACE_PID, label);
    for (uint32_t lane = 0; lane < t->lane_count; lane++) {
        snprintf(label, sizeof label, "lane %s", t->series[t->lane_series[lane]].name);
        mg_trace_thread_name(&w, TRACE_PID, 1 + (int)lane, label);
    }
    for (uint32_t s = 0; s < t->stream_count; s++) {
        snprintf(label, sizeof label, "kernels, stream %u", s);
        mg_trace_thread_name(&w, TRACE_PID, TRACE_KERNEL_TID_BASE + (int)s, label);
    }
    uint64_t kept = t->trace_written < t->trace_capacity ? t->trace_written : t->trace_capacity;
    for (uint64_t k = t->trace_written - kept; k < t->trace_written; k++) {
        const trace_record *r = &t->trace[k % t->trace_capacity];
        const series *s = &t->series[r->series];
        bool lane = s->kind == MG_TIMING_LANE;
        int tid = lane ? 1 + (int)s->lane : TRACE_KERNEL_TID_BASE + (int)r->stream_id;
        mg_trace_complete(&w, s->name, lane ? "lane" : "kernel", TRACE_PID, tid, r->start_us,
                          r->dur_us, r->step);
    }
    mg_status st = mg_trace_end(&w, "a stream");
    pthread_mutex_unlock(&t->lock);
    return st;
}

mg_status mg_timing_export_chrome_trace(mg_timing *t, const char *path) {
    if (!t || !path)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_export_chrome_trace: NULL argument");
    FILE *f = fopen(path, "w");
    if (!f)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_export_chrome_trace: fopen %s: %s",
                        path, strerror(errno));
    mg_status st = mg_timing_write_chrome_trace(t, f);
    if (fclose(f) != 0 && st == MG_OK)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_export_chrome_trace: closing %s: %s",
                      path, strerror(errno));
    if (st != MG_OK)
        mg_error_append(" (%s)", path);
    return st;
}

mg_status mg_timing_trace_launches(mg_timing *t, bool on) {
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_timing_trace_launches: NULL timing");
    if (!on) {
        mg_backend_detach_launch_timing(t->backend, t);
        return MG_OK;
    }
    return mg_backend_attach_launch_timing(t->backend, t);
}
