/*
 * test_timing_edges.c - metrale/timing.h at its edges, beyond test_timing: NULL arguments of
 * every call, levels out of range, spans ended on a capturing stream, more streams than the
 * trace has kernel threads, lanes that were never used in the summary, JSON escaping of
 * every control character in the exported trace, and traces that cannot be written.
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/timing.h"
#include "test_util.h"

#define CHECK_ERROR(expr, status, needle)                                                          \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

/* The whole trace of `t` as text (NULL with a failed check when it cannot be written). */
static char *trace_text(mg_timing *t) {
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return NULL;
    CHECK_OK(mg_timing_write_chrome_trace(t, f));
    long bytes = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)bytes + 1);
    if (text && fread(text, 1, (size_t)bytes, f) != (size_t)bytes) {
        free(text);
        text = NULL;
    }
    fclose(f);
    CHECK(text != NULL);
    return text;
}

static size_t count_of(const char *text, const char *needle) {
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void test_null_arguments(mg_backend *b) {
    mg_timing *t = NULL;
    uint32_t lane = 0;
    mg_timing_span span = 5;
    mg_timing_counters counters;
    mg_timing_summary summary;
    CHECK_ERROR(mg_timing_create(b, NULL, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output pointer");
    CHECK_OK(mg_timing_create(b, NULL, &t));
    CHECK_ERROR(mg_timing_lane(NULL, "x", &lane), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_lane(t, NULL, &lane), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_lane(t, "x", NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_lane_begin(NULL, 0, NULL, &span), MG_ERR_INVALID_ARGUMENT,
                "mg_timing_lane_begin: NULL argument");
    CHECK_ERROR(mg_timing_lane_begin(t, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "mg_timing_lane_begin: NULL argument");
    CHECK_ERROR(mg_timing_kernel_begin(NULL, "k", NULL, &span), MG_ERR_INVALID_ARGUMENT,
                "mg_timing_kernel_begin: NULL argument");
    CHECK_ERROR(mg_timing_kernel_begin(t, "k", NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "mg_timing_kernel_begin: NULL argument");
    CHECK_ERROR(mg_timing_span_end(NULL, 1, NULL), MG_ERR_INVALID_ARGUMENT, "NULL timing");
    CHECK_ERROR(mg_timing_harvest(NULL, NULL), MG_ERR_INVALID_ARGUMENT, "NULL timing");
    size_t harvested = 9;
    CHECK_ERROR(mg_timing_harvest(NULL, &harvested), MG_ERR_INVALID_ARGUMENT, "NULL timing");
    CHECK(harvested == 0);
    CHECK_ERROR(mg_timing_step_begin(NULL, 0), MG_ERR_INVALID_ARGUMENT, "NULL timing");
    CHECK_ERROR(mg_timing_get_counters(NULL, &counters), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_get_counters(t, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_summary_get(NULL, 0, &summary), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_summary_get(t, 0, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_print_summary(NULL, stderr), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_print_summary(t, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_write_chrome_trace(NULL, stderr), MG_ERR_INVALID_ARGUMENT,
                "NULL argument");
    CHECK_ERROR(mg_timing_write_chrome_trace(t, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_export_chrome_trace(NULL, "x.json"), MG_ERR_INVALID_ARGUMENT,
                "NULL argument");
    CHECK_ERROR(mg_timing_export_chrome_trace(t, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_timing_trace_launches(NULL, true), MG_ERR_INVALID_ARGUMENT, "NULL timing");
    CHECK(mg_timing_summary_count(NULL) == 0);
    CHECK(!mg_timing_kernel_spans_armed(NULL));
    CHECK(mg_timing_level(NULL) == MG_TELEMETRY_OFF);
    mg_timing_set_level(NULL, MG_TELEMETRY_KERNEL); /* a no-op */

    /* an unknown level leaves the level alone */
    mg_timing_set_level(t, MG_TELEMETRY_KERNEL);
    mg_timing_set_level(t, (mg_telemetry_level)9);
    CHECK(mg_timing_level(t) == MG_TELEMETRY_KERNEL);
    CHECK_OK(mg_timing_destroy(t));
}

/* A span whose end finds its stream capturing is abandoned, not recorded into the graph. */
static void test_end_while_capturing(mg_backend *b) {
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .pool_pairs = 4, .kernel_span_every = 2};
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    uint32_t lane = 0;
    CHECK_OK(mg_timing_lane(t, "decode", &lane));
    mg_timing_span span = 0, kernel_span = 0;
    CHECK_OK(mg_timing_step_begin(t, 1)); /* not armed: kernel spans are not recorded */
    CHECK_OK(mg_timing_kernel_begin(t, "metrale:k", s, &kernel_span));
    CHECK(kernel_span == 0);
    CHECK_OK(mg_timing_lane_begin(t, lane, s, &span));
    CHECK(span != 0);
    mg_cpu_counters before = test_cpu_counters(b);
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_timing_span_end(t, span, s));
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_end_capture(s, &g));
    mg_cpu_counters after = test_cpu_counters(b);
    CHECK(after.event_record == before.event_record); /* nothing went into the graph */
    mg_timing_counters c;
    CHECK_OK(mg_timing_get_counters(t, &c));
    CHECK(c.recorded == 1 && c.abandoned == 1 && c.open == 0 && c.pending == 0);
    /* ended twice: the span is no longer open */
    CHECK_ERROR(mg_timing_span_end(t, span, s), MG_ERR_INVALID_ARGUMENT, "is not open");
    /* a span number that never existed */
    CHECK_ERROR(mg_timing_span_end(t, (uint64_t)1000 << 32 | 77, s), MG_ERR_INVALID_ARGUMENT,
                "is not open");
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_timing_destroy(t));
    CHECK_OK(mg_stream_destroy(s));
}

/* Kernel spans on more streams than the trace has kernel threads share the last thread;
 * lanes without spans are left out of the summary. */
static void test_many_streams(mg_backend *b) {
    enum { STREAMS = 70, KERNEL_THREADS = 64 };
    mg_stream *streams[STREAMS];
    for (int i = 0; i < STREAMS; i++)
        CHECK_OK(mg_stream_create(b, &streams[i]));
    mg_timing_options o = {
        .level = MG_TELEMETRY_KERNEL, .pool_pairs = 2 * STREAMS, .kernel_span_every = 1};
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    uint32_t unused = 0;
    CHECK_OK(mg_timing_lane(t, "never used", &unused));
    CHECK_OK(mg_timing_step_begin(t, 0));
    CHECK(mg_timing_kernel_spans_armed(t));
    for (int i = 0; i < STREAMS; i++) {
        mg_timing_span span = 0;
        CHECK_OK(mg_timing_kernel_begin(t, "metrale:k", streams[i], &span));
        CHECK(span != 0);
        CHECK_OK(mg_timing_span_end(t, span, streams[i]));
    }
    size_t harvested = 0;
    CHECK_OK(mg_timing_harvest(t, &harvested));
    CHECK(harvested == STREAMS);

    char *text = trace_text(t);
    if (text) {
        CHECK(count_of(text, "\"name\": \"kernels, stream ") == KERNEL_THREADS);
        CHECK(count_of(text, "\"tid\": 1063, \"args\": {\"step\"") == STREAMS - KERNEL_THREADS + 1);
        CHECK(count_of(text, "\"tid\": 1000, \"args\": {\"step\"") == 1);
        CHECK(strstr(text, "lane never used") != NULL); /* its thread is named */
        free(text);
    }
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        CHECK_OK(mg_timing_print_summary(t, f));
        rewind(f);
        char summary[2048] = "";
        size_t n = fread(summary, 1, sizeof summary - 1, f);
        summary[n] = '\0';
        CHECK(strstr(summary, "never used") == NULL);
        CHECK(strstr(summary, "kernel  metrale:k") != NULL);
        CHECK(strstr(summary, " 70 ") != NULL);
        fclose(f);
    }
    CHECK_OK(mg_timing_destroy(t));
    for (int i = 0; i < STREAMS; i++)
        CHECK_OK(mg_stream_destroy(streams[i]));
}

/* Every character JSON needs escaped, in a lane name, as the exported thread name. */
static void test_json_escapes(mg_backend *b) {
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, NULL, &t));
    uint32_t lane = 0;
    CHECK_OK(mg_timing_lane(t, "q\"b\\s\nn\rr\tt\x01u\x1f.", &lane));
    mg_timing_span span = 0;
    CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &span));
    CHECK_OK(mg_timing_span_end(t, span, NULL));
    CHECK_OK(mg_timing_harvest(t, NULL));
    char *text = trace_text(t);
    if (text) {
        const char *escaped = "q\\\"b\\\\s\\nn\\rr\\tt\\u0001u\\u001f.";
        CHECK(count_of(text, escaped) == 2); /* the thread name and the span */
        for (const char *p = text; *p; p++)
            CHECK(*p == '\n' || (unsigned char)*p >= 0x20); /* no raw control characters */
        free(text);
    }
    CHECK_OK(mg_timing_destroy(t));
}

/* Writing to a stream that fails is reported with the system's reason. */
static void test_unwritable_traces(mg_backend *b) {
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, NULL, &t));
    FILE *read_only = fopen("/dev/null", "r");
    CHECK(read_only != NULL);
    if (read_only) {
        CHECK_ERROR(mg_timing_write_chrome_trace(t, read_only), MG_ERR_INVALID_ARGUMENT,
                    "writing the trace to a stream failed");
        fclose(read_only);
    }
    if (access("/dev/full", W_OK) == 0) {
        CHECK_ERROR(mg_timing_export_chrome_trace(t, "/dev/full"), MG_ERR_INVALID_ARGUMENT,
                    "No space left on device");
        CHECK_MESSAGE("(/dev/full)");
    }
    CHECK_ERROR(mg_timing_export_chrome_trace(t, "/nonexistent-dir/trace.json"),
                MG_ERR_INVALID_ARGUMENT, "fopen /nonexistent-dir/trace.json");
    CHECK_OK(mg_timing_destroy(t));
}

/* The timeline is re-anchored only on a default stream that is not capturing. */
static void test_reanchor_skips_capture(mg_backend *b) {
    mg_timing_options o = {.level = MG_TELEMETRY_BASIC, .epoch_interval_ms = 1};
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    usleep(3000);
    mg_cpu_counters c0 = test_cpu_counters(b);
    CHECK_OK(mg_graph_begin_capture(mg_stream_default(b)));
    CHECK_OK(mg_timing_step_begin(t, 1));
    mg_cpu_counters c1 = test_cpu_counters(b);
    CHECK(c1.event_record == c0.event_record);
    CHECK_OK(mg_graph_abort_capture(mg_stream_default(b)));
    CHECK_OK(mg_timing_step_begin(t, 2));
    mg_cpu_counters c2 = test_cpu_counters(b);
    CHECK(c2.event_record == c1.event_record + 1); /* the new epoch */
    mg_timing_set_level(t, MG_TELEMETRY_OFF);
    usleep(3000);
    CHECK_OK(mg_timing_step_begin(t, 3)); /* harvests the epoch; off: no new one */
    CHECK_OK(mg_timing_step_begin(t, 4));
    mg_cpu_counters c3 = test_cpu_counters(b);
    CHECK(c3.event_record == c2.event_record);
    CHECK(c3.event_elapsed > c2.event_elapsed); /* the epoch moved */
    CHECK_OK(mg_timing_destroy(t));
}

int main(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 2, &b));
    if (!b)
        return test_finish();
    test_null_arguments(b);
    test_end_while_capturing(b);
    test_many_streams(b);
    test_json_escapes(b);
    test_unwritable_traces(b);
    test_reanchor_skips_capture(b);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
