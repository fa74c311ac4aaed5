/* trace_json.c - Chrome trace-event JSON writer (trace_json.h). */
#include "trace_json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "error.h"

void mg_json_write_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* JSON has no NaN or infinity: such values are written as 0. */
static double finite_or_zero(double v) {
    return isfinite(v) ? v : 0.0;
}

static void separate(mg_trace_writer *w) {
    fputs(w->events++ ? ",\n" : "\n", w->f);
}

void mg_trace_begin(mg_trace_writer *w, FILE *f) {
    w->f = f;
    w->events = 0;
    fputs("{\"traceEvents\": [", f);
}

void mg_trace_process_name(mg_trace_writer *w, int pid, const char *name) {
    separate(w);
    fprintf(w->f,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
            "\"args\": {\"name\": ",
            pid);
    mg_json_write_string(w->f, name);
    fputs("}}", w->f);
}

void mg_trace_thread_name(mg_trace_writer *w, int pid, int tid, const char *name) {
    separate(w);
    fprintf(w->f,
            "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"name\": ",
            pid, tid);
    mg_json_write_string(w->f, name);
    fputs("}}", w->f);
}

void mg_trace_complete(mg_trace_writer *w, const char *name, const char *category, int pid, int tid,
                       double ts_us, double dur_us, uint64_t step) {
    separate(w);
    fputs("{\"name\": ", w->f);
    mg_json_write_string(w->f, name);
    fputs(", \"cat\": ", w->f);
    mg_json_write_string(w->f, category);
    fprintf(w->f,
            ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"step\": %" PRIu64 "}}",
            finite_or_zero(ts_us), finite_or_zero(dur_us), pid, tid, step);
}

mg_status mg_trace_end(mg_trace_writer *w, const char *what) {
    fputs("\n], \"displayTimeUnit\": \"ms\"}\n", w->f);
    if (fflush(w->f) != 0 || ferror(w->f))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "writing the trace to %s failed: %s",
                        what ? what : "a stream", strerror(errno));
    return MG_OK;
}
