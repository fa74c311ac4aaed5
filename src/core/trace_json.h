/*
 * trace_json.h - private: a writer for the Chrome trace-event JSON format (the "JSON Object
 * Format" of the Trace Event Format document: {"traceEvents": [...], ...}), as read by
 * Perfetto and chrome://tracing. Streams events to a FILE; remembers write errors.
 */
#ifndef METRALE_TRACE_JSON_H
#define METRALE_TRACE_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/status.h"

typedef struct mg_trace_writer {
    FILE *f;
    uint64_t events; /* written so far: decides the separating comma */
} mg_trace_writer;

/* Writes the opening of the object and of the traceEvents array. */
void mg_trace_begin(mg_trace_writer *w, FILE *f);

/* Metadata events naming the process and a thread (a row in the viewer). */
void mg_trace_process_name(mg_trace_writer *w, int pid, const char *name);
void mg_trace_thread_name(mg_trace_writer *w, int pid, int tid, const char *name);

/* A complete event ("ph": "X"): `ts_us` and `dur_us` in microseconds, with an integer
 * argument `step` shown in the viewer's details. */
void mg_trace_complete(mg_trace_writer *w, const char *name, const char *category, int pid, int tid,
                       double ts_us, double dur_us, uint64_t step);

/* Closes the array and the object (with "displayTimeUnit"); MG_ERR_INVALID_ARGUMENT naming
 * `what` when any write failed. */
mg_status mg_trace_end(mg_trace_writer *w, const char *what);

/* Writes `text` as a JSON string literal, quotes included (", \ and control characters
 * escaped; other bytes copied as they are). */
void mg_json_write_string(FILE *f, const char *text);

#endif
