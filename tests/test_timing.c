/*
 * test_timing.c - timing spans (metrale/timing.h) on the CPU backend: lanes, span order and
 * nesting, the armed-step rule, nothing recorded into a capturing stream, the pool's
 * round-robin reuse and drop counting, harvest without blocking, summaries checked against
 * the exact percentiles of the exported durations, and the Chrome trace parsed back by a
 * small strict JSON parser written here.
 */
#include <inttypes.h>
#include <math.h>
#include <time.h>

#include "metrale/cpu.h"
#include "metrale/launch.h"
#include "metrale/timing.h"
#include "utils_test_support.h"

/* ------------------------------------------------------------------ a strict JSON parser */

typedef enum json_type { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT } json_type;

typedef struct json {
    json_type type;
    double number;
    char *string;       /* J_STRING */
    size_t count;       /* J_ARRAY / J_OBJECT */
    struct json *items; /* values */
    char **keys;        /* J_OBJECT */
} json;

typedef struct json_parser {
    const char *p, *end;
    const char *error;
} json_parser;

static void json_free(json *v) {
    free(v->string);
    for (size_t i = 0; i < v->count; i++) {
        json_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
}

static void skip_ws(json_parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t'))
        ps->p++;
}

static bool fail(json_parser *ps, const char *why) {
    if (!ps->error)
        ps->error = why;
    return false;
}

static bool parse_value(json_parser *ps, json *out, int depth);

static bool parse_string(json_parser *ps, char **out) {
    if (ps->p >= ps->end || *ps->p != '"')
        return fail(ps, "expected a string");
    ps->p++;
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    while (s && ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20) {
            free(s);
            return fail(ps, "control character in a string");
        }
        if (c == '\\') {
            if (ps->p >= ps->end)
                break;
            char e = *ps->p++;
            switch (e) {
            case '"':
                c = '"';
                break;
            case '\\':
                c = '\\';
                break;
            case '/':
                c = '/';
                break;
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'n':
                c = '\n';
                break;
            case 'r':
                c = '\r';
                break;
            case 't':
                c = '\t';
                break;
            case 'u': {
                unsigned code = 0;
                for (int k = 0; k < 4; k++) {
                    char h = ps->p < ps->end ? *ps->p++ : 0;
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0) {
                        free(s);
                        return fail(ps, "bad \\u escape");
                    }
                    code = code * 16 + (unsigned)d;
                }
                c = code < 0x80 ? (unsigned char)code : '?';
                break;
            }
            default:
                free(s);
                return fail(ps, "bad escape");
            }
        }
        if (n + 2 > cap) {
            char *g = realloc(s, cap *= 2);
            if (!g)
                free(s);
            s = g;
            if (!s)
                break;
        }
        s[n++] = (char)c;
    }
    if (!s || ps->p >= ps->end) {
        free(s);
        return fail(ps, "unterminated string");
    }
    ps->p++;
    s[n] = '\0';
    *out = s;
    return true;
}

static bool parse_number(json_parser *ps, json *out) {
    const char *start = ps->p;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9'))
        return fail(ps, "bad number");
    if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
        return fail(ps, "leading zero");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
        ps->p++;
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9'))
            return fail(ps, "bad fraction");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9'))
            return fail(ps, "bad exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    char buf[64];
    size_t len = (size_t)(ps->p - start);
    if (len >= sizeof buf)
        return fail(ps, "number too long");
    memcpy(buf, start, len);
    buf[len] = '\0';
    out->type = J_NUMBER;
    out->number = strtod(buf, NULL);
    return true;
}

static bool parse_container(json_parser *ps, json *out, int depth, bool object) {
    char close = object ? '}' : ']';
    ps->p++;
    out->type = object ? J_OBJECT : J_ARRAY;
    size_t cap = 0;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    for (;;) {
        if (out->count == cap) {
            cap = cap ? cap * 2 : 8;
            json *items = realloc(out->items, cap * sizeof *items);
            if (!items)
                return fail(ps, "out of memory");
            out->items = items;
            if (object) {
                char **keys = realloc(out->keys, cap * sizeof *keys);
                if (!keys)
                    return fail(ps, "out of memory");
                out->keys = keys;
            }
        }
        skip_ws(ps);
        if (object) {
            char *key = NULL;
            if (!parse_string(ps, &key))
                return false;
            out->keys[out->count] = key;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                memset(&out->items[out->count], 0, sizeof out->items[0]);
                out->count++;
                return fail(ps, "expected ':'");
            }
            ps->p++;
        }
        memset(&out->items[out->count], 0, sizeof out->items[0]);
        out->count++;
        if (!parse_value(ps, &out->items[out->count - 1], depth + 1))
            return false;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return true;
        }
        return fail(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool parse_literal(json_parser *ps, const char *word, json_type type, double value,
                          json *out) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return fail(ps, "unexpected character");
    ps->p += n;
    out->type = type;
    out->number = value;
    return true;
}

static bool parse_value(json_parser *ps, json *out, int depth) {
    if (depth > 64)
        return fail(ps, "nested too deeply");
    skip_ws(ps);
    if (ps->p >= ps->end)
        return fail(ps, "unexpected end");
    switch (*ps->p) {
    case '{':
        return parse_container(ps, out, depth, true);
    case '[':
        return parse_container(ps, out, depth, false);
    case '"':
        out->type = J_STRING;
        return parse_string(ps, &out->string);
    case 't':
        return parse_literal(ps, "true", J_BOOL, 1, out);
    case 'f':
        return parse_literal(ps, "false", J_BOOL, 0, out);
    case 'n':
        return parse_literal(ps, "null", J_NULL, 0, out);
    default:
        return parse_number(ps, out);
    }
}

/* Parses a whole document; trailing garbage is an error. */
static bool json_parse(const char *text, size_t len, json *out, const char **error) {
    json_parser ps = {text, text + len, NULL};
    memset(out, 0, sizeof *out);
    bool ok = parse_value(&ps, out, 0);
    skip_ws(&ps);
    if (ok && ps.p != ps.end)
        ok = fail(&ps, "trailing characters");
    *error = ps.error;
    return ok;
}

static const json *json_get(const json *obj, const char *key) {
    if (!obj || obj->type != J_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

static void test_json_parser_itself(void) {
    const char *good[] = {"{}", "[]", "{\"a\": [1, -2.5e3, true, false, null, \"x\\\"\\u0041\"]}",
                          " 0 ", "\"\\n\""};
    const char *bad[] = {"{",        "[1,]", "{\"a\" 1}", "01",   "[1 2]",
                         "\"\x01\"", "{} x", "nan",       "[1.]", "\"abc"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        json v;
        const char *err;
        CHECKF(json_parse(good[i], strlen(good[i]), &v, &err), "'%s' rejected: %s", good[i], err);
        json_free(&v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json v;
        const char *err;
        CHECKF(!json_parse(bad[i], strlen(bad[i]), &v, &err), "'%s' accepted", bad[i]);
        json_free(&v);
    }
}

/* ------------------------------------------------------------------ trace reading */

typedef struct span_event {
    char name[96];
    char cat[16];
    double ts, dur;
    int tid;
    uint64_t step;
} span_event;

typedef struct trace_doc {
    span_event *spans;
    size_t span_count;
    size_t thread_names; /* "thread_name" metadata events */
    bool has_process_name;
} trace_doc;

/* Exports `t` to a temporary file, parses it strictly and collects the complete events. */
static bool read_trace(mg_timing *t, trace_doc *doc) {
    memset(doc, 0, sizeof *doc);
    char path[] = "/tmp/metrale_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return false;
    close(fd);
    CHECK_OK(mg_timing_export_chrome_trace(t, path));
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long len = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        text = malloc((size_t)len + 1);
        if (text && fread(text, 1, (size_t)len, f) != (size_t)len) {
            free(text);
            text = NULL;
        }
    }
    if (f)
        fclose(f);
    unlink(path);
    CHECK(text != NULL);
    if (!text)
        return false;
    json root;
    const char *err = NULL;
    bool ok = json_parse(text, (size_t)len, &root, &err);
    CHECKF(ok, "trace is not valid JSON: %s", err ? err : "?");
    const json *events = ok ? json_get(&root, "traceEvents") : NULL;
    CHECK(!ok || (events && events->type == J_ARRAY));
    const json *unit = ok ? json_get(&root, "displayTimeUnit") : NULL;
    CHECK(!ok || (unit && unit->type == J_STRING));
    if (events && events->type == J_ARRAY) {
        doc->spans = calloc(events->count ? events->count : 1, sizeof *doc->spans);
        for (size_t i = 0; doc->spans && i < events->count; i++) {
            const json *e = &events->items[i];
            const json *ph = json_get(e, "ph"), *name = json_get(e, "name");
            const json *pid = json_get(e, "pid"), *tid = json_get(e, "tid");
            CHECK(ph && ph->type == J_STRING && name && name->type == J_STRING);
            CHECK(pid && pid->type == J_NUMBER && tid && tid->type == J_NUMBER);
            if (!ph || ph->type != J_STRING || !name || name->type != J_STRING || !tid)
                continue;
            if (strcmp(ph->string, "M") == 0) {
                const json *args = json_get(e, "args");
                const json *label = json_get(args, "name");
                CHECK(label && label->type == J_STRING);
                if (strcmp(name->string, "thread_name") == 0)
                    doc->thread_names++;
                else if (strcmp(name->string, "process_name") == 0)
                    doc->has_process_name = true;
                continue;
            }
            CHECKF(strcmp(ph->string, "X") == 0, "unexpected phase '%s'", ph->string);
            const json *ts = json_get(e, "ts"), *dur = json_get(e, "dur"),
                       *cat = json_get(e, "cat");
            const json *step = json_get(json_get(e, "args"), "step");
            CHECK(ts && ts->type == J_NUMBER && dur && dur->type == J_NUMBER);
            CHECK(cat && cat->type == J_STRING && step && step->type == J_NUMBER);
            if (!ts || !dur || !cat || !step || cat->type != J_STRING)
                continue;
            span_event *s = &doc->spans[doc->span_count++];
            snprintf(s->name, sizeof s->name, "%s", name->string);
            snprintf(s->cat, sizeof s->cat, "%s", cat->string);
            s->ts = ts->number;
            s->dur = dur->number;
            s->tid = (int)tid->number;
            s->step = (uint64_t)step->number;
        }
    }
    if (ok)
        json_free(&root);
    free(text);
    return ok;
}

/* ------------------------------------------------------------------ helpers */

/* Busy-waits about `us` microseconds of host time: on the CPU backend work between two
 * event records takes host time, so spans get a known lower bound. */
static void spin_us(unsigned us) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do {
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < (long)us);
}

static mg_timing_counters timing_counters(mg_timing *t) {
    mg_timing_counters c;
    memset(&c, 0xA5, sizeof c);
    CHECK_OK(mg_timing_get_counters(t, &c));
    return c;
}

static const mg_timing_summary *find_summary(mg_timing *t, const char *name,
                                             mg_timing_summary *buf) {
    for (size_t i = 0; i < mg_timing_summary_count(t); i++) {
        CHECK_OK(mg_timing_summary_get(t, i, buf));
        if (strcmp(buf->name, name) == 0)
            return buf;
    }
    return NULL;
}

/* A timing object with options `o` and one lane named `lane_name`; NULL on failure. */
static mg_timing *timing_with_lane(mg_backend *b, mg_timing_options o, const char *lane_name,
                                   uint32_t *lane) {
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    if (t && mg_timing_lane(t, lane_name, lane) != MG_OK) {
        CHECK(false);
        mg_timing_destroy(t);
        t = NULL;
    }
    return t;
}

/* ------------------------------------------------------------------ tests */

static void test_create_and_lanes(mg_backend *b) {
    CHECK(mg_backend_supports(b, MG_CAP_EVENT_TIMING));
    mg_cpu_counters c0 = test_cpu_counters(b);
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, NULL, &t));
    mg_cpu_counters c1 = test_cpu_counters(b);
    /* the whole pool up front: two events per pair plus the two epoch events */
    CHECK(c1.event_create - c0.event_create == 2 * MG_TIMING_DEFAULT_POOL_PAIRS + 2);
    CHECK(mg_timing_level(t) == MG_TELEMETRY_BASIC);

    uint32_t decode = 99, prefill = 99, again = 99;
    CHECK_OK(mg_timing_lane(t, "decode", &decode));
    CHECK_OK(mg_timing_lane(t, "prefill", &prefill));
    CHECK_OK(mg_timing_lane(t, "decode", &again));
    CHECK(decode == 0 && prefill == 1 && again == 0);
    CHECK_STATUS(mg_timing_lane(t, "", &again), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("0 characters");
    char long_name[200];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    CHECK_STATUS(mg_timing_lane(t, long_name, &again), MG_ERR_INVALID_ARGUMENT);
    for (int i = 2; i < MG_TIMING_MAX_LANES; i++) {
        char name[16];
        snprintf(name, sizeof name, "lane%d", i);
        CHECK_OK(mg_timing_lane(t, name, &again));
        CHECK(again == (uint32_t)i);
    }
    CHECK_STATUS(mg_timing_lane(t, "one_too_many", &again), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("at most 64");

    mg_timing_span span = 7;
    CHECK_STATUS(mg_timing_lane_begin(t, MG_TIMING_MAX_LANES, NULL, &span),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK(span == 0);
    CHECK_STATUS(mg_timing_kernel_begin(t, NULL, NULL, &span), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_timing_destroy(t));
    CHECK_OK(mg_timing_destroy(NULL));
    mg_cpu_counters c2 = test_cpu_counters(b);
    CHECK(c2.event_destroy - c1.event_destroy == 2 * MG_TIMING_DEFAULT_POOL_PAIRS + 2);

    mg_timing_options bad = {.level = (mg_telemetry_level)7};
    t = (mg_timing *)1;
    CHECK_STATUS(mg_timing_create(b, &bad, &t), MG_ERR_INVALID_ARGUMENT);
    CHECK(t == NULL);
    CHECK_STATUS(mg_timing_create(NULL, NULL, &t), MG_ERR_INVALID_ARGUMENT);
    /* A closed backend is a bad argument, not a backend without event timing. */
    mg_backend *closed = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 1, &closed));
    CHECK_OK(mg_backend_close(closed));
    t = (mg_timing *)1;
    CHECK_STATUS(mg_timing_create(closed, NULL, &t), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("invalid or closed backend");
    CHECK(t == NULL);
}

/* Steps with a lane span around kernel spans: order, nesting, the armed-step rule. */
static void test_steps_and_trace(mg_backend *b) {
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .pool_pairs = 64, .kernel_span_every = 3};
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    if (!t)
        return;
    uint32_t decode, sample;
    CHECK_OK(mg_timing_lane(t, "decode", &decode));
    CHECK_OK(mg_timing_lane(t, "sample \"quoted\"\\path", &sample)); /* escaping in the trace */
    const int steps = 10;
    int armed_steps = 0;
    for (int step = 0; step < steps; step++) {
        CHECK_OK(mg_timing_step_begin(t, (uint64_t)step));
        bool armed = mg_timing_kernel_spans_armed(t);
        CHECKF(armed == (step % 3 == 0), "step %d armed=%d", step, (int)armed);
        armed_steps += armed;
        mg_timing_span lane = 0, k1 = 0, k2 = 0, smp = 0;
        CHECK_OK(mg_timing_lane_begin(t, decode, s, &lane));
        CHECK(lane != 0);
        CHECK_OK(mg_timing_kernel_begin(t, "metrale:rms_norm", s, &k1));
        CHECK((k1 != 0) == armed);
        spin_us(200);
        CHECK_OK(mg_timing_span_end(t, k1, s));
        CHECK_OK(mg_timing_kernel_begin(t, "metrale:gemm_bf16", s, &k2));
        spin_us(400);
        CHECK_OK(mg_timing_span_end(t, k2, s));
        CHECK_OK(mg_timing_span_end(t, lane, s));
        CHECK_OK(mg_timing_lane_begin(t, sample, NULL, &smp)); /* default stream */
        spin_us(50);
        CHECK_OK(mg_timing_span_end(t, smp, NULL));
    }
    CHECK(armed_steps == 4);
    size_t harvested = 0;
    CHECK_OK(mg_timing_harvest(t, &harvested));
    mg_timing_counters c = timing_counters(t);
    CHECK(c.recorded == (uint64_t)(2 * steps + 2 * 4) && c.harvested == c.recorded);
    CHECK(c.open == 0 && c.pending == 0 && c.dropped_pool_full == 0 && c.abandoned == 0);

    mg_timing_summary decode_buf, gemm_buf;
    const mg_timing_summary *sd = find_summary(t, "decode", &decode_buf);
    CHECK(sd && sd->kind == MG_TIMING_LANE && sd->count == (uint64_t)steps);
    CHECK(sd && sd->min_us >= 600 && sd->p50_us >= sd->min_us && sd->p99_us >= sd->p50_us);
    CHECK(sd && sd->max_us >= sd->p99_us && sd->total_us >= steps * 600);
    const mg_timing_summary *sg = find_summary(t, "metrale:gemm_bf16", &gemm_buf);
    CHECK(sg && sg->kind == MG_TIMING_KERNEL && sg->count == 4 && sg->min_us >= 400);

    trace_doc doc;
    if (read_trace(t, &doc)) {
        CHECK(doc.has_process_name && doc.thread_names == 2 + 2); /* 2 lanes, 2 streams */
        CHECK(doc.span_count == c.harvested);
        /* lane spans of one lane are in step order and do not overlap; kernel spans sit
         * inside the decode span of their step; every span has the right category */
        double last_end = -1;
        uint64_t last_step = 0;
        for (size_t i = 0; i < doc.span_count; i++) {
            const span_event *e = &doc.spans[i];
            CHECK(e->dur >= 0 && e->ts >= 0);
            bool is_kernel = strncmp(e->name, "metrale:", 8) == 0;
            CHECK(strcmp(e->cat, is_kernel ? "kernel" : "lane") == 0);
            if (is_kernel) {
                CHECK(e->step % 3 == 0 && e->tid >= 1000);
                bool inside = false;
                for (size_t j = 0; j < doc.span_count; j++) {
                    const span_event *l = &doc.spans[j];
                    if (strcmp(l->name, "decode") == 0 && l->step == e->step)
                        inside = e->ts >= l->ts - 0.002 && e->ts + e->dur <= l->ts + l->dur + 0.002;
                }
                CHECKF(inside, "kernel span %s of step %" PRIu64 " outside its lane span", e->name,
                       e->step);
            } else if (strcmp(e->name, "decode") == 0) {
                CHECK(e->tid == 1);
                CHECKF(e->ts >= last_end - 0.002,
                       "decode step %" PRIu64 " starts before %" PRIu64 " ended", e->step,
                       last_step);
                CHECK(i == 0 || e->step >= last_step);
                last_end = e->ts + e->dur;
                last_step = e->step;
            } else {
                CHECKF(strcmp(e->name, "sample \"quoted\"\\path") == 0, "name '%s'", e->name);
                CHECK(e->tid == 2);
            }
        }
        /* summary totals and percentiles against the exported durations */
        double exact[16];
        size_t n = 0;
        double total = 0;
        for (size_t i = 0; i < doc.span_count && n < 16; i++)
            if (strcmp(doc.spans[i].name, "decode") == 0) {
                exact[n++] = doc.spans[i].dur;
                total += doc.spans[i].dur;
            }
        for (size_t i = 1; i < n; i++) /* insertion sort */
            for (size_t j = i; j > 0 && exact[j - 1] > exact[j]; j--) {
                double tmp = exact[j];
                exact[j] = exact[j - 1];
                exact[j - 1] = tmp;
            }
        if (sd && n == (size_t)steps) {
            double p50 = exact[(size_t)ceil(0.5 * n) - 1], p99 = exact[(size_t)ceil(0.99 * n) - 1];
            CHECKF(fabs(sd->p50_us - p50) <= p50 * 0.016 + 0.002, "p50 %.3f exact %.3f", sd->p50_us,
                   p50);
            CHECKF(fabs(sd->p99_us - p99) <= p99 * 0.016 + 0.002, "p99 %.3f exact %.3f", sd->p99_us,
                   p99);
            CHECKF(fabs(sd->total_us - total) <= 0.01 * steps, "total %.3f exact %.3f",
                   sd->total_us, total);
            CHECK(fabs(sd->min_us - exact[0]) <= 0.002 && fabs(sd->max_us - exact[n - 1]) <= 0.002);
        }
        free(doc.spans);
    }
    CHECK_OK(mg_timing_print_summary(t, stdout));
    CHECK_OK(mg_timing_destroy(t));
    CHECK_OK(mg_stream_destroy(s));
}

/* Levels: OFF records nothing, BASIC never arms kernel spans. */
static void test_levels(mg_backend *b) {
    mg_timing_options o = {.level = MG_TELEMETRY_OFF, .pool_pairs = 8, .kernel_span_every = 1};
    uint32_t lane;
    mg_timing *t = timing_with_lane(b, o, "decode", &lane);
    if (!t)
        return;
    mg_cpu_counters c0 = test_cpu_counters(b);
    mg_timing_span span = 5;
    CHECK_OK(mg_timing_step_begin(t, 0));
    CHECK(!mg_timing_kernel_spans_armed(t));
    CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &span));
    CHECK(span == 0);
    CHECK_OK(mg_timing_kernel_begin(t, "k", NULL, &span));
    CHECK(span == 0);
    CHECK(test_cpu_counters(b).event_record == c0.event_record); /* nothing touched the device */

    mg_timing_set_level(t, MG_TELEMETRY_BASIC);
    CHECK_OK(mg_timing_step_begin(t, 0));
    CHECK(!mg_timing_kernel_spans_armed(t));
    CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &span));
    CHECK(span != 0);
    CHECK_OK(mg_timing_span_end(t, span, NULL));
    CHECK_OK(mg_timing_kernel_begin(t, "k", NULL, &span));
    CHECK(span == 0);

    mg_timing_set_level(t, MG_TELEMETRY_KERNEL);
    CHECK(!mg_timing_kernel_spans_armed(t)); /* arming happens at the next step */
    CHECK_OK(mg_timing_step_begin(t, 1));
    CHECK(mg_timing_kernel_spans_armed(t)); /* every = 1 */
    CHECK_OK(mg_timing_kernel_begin(t, "k", NULL, &span));
    CHECK(span != 0);
    CHECK_OK(mg_timing_span_end(t, span, NULL));
    mg_timing_set_level(t, MG_TELEMETRY_BASIC); /* disarms at once */
    CHECK(!mg_timing_kernel_spans_armed(t));
    mg_timing_set_level(t, (mg_telemetry_level)9); /* ignored */
    CHECK(mg_timing_level(t) == MG_TELEMETRY_BASIC);
    CHECK_OK(mg_timing_harvest(t, NULL));
    mg_timing_counters c = timing_counters(t);
    CHECK(c.recorded == 2 && c.harvested == 2);
    CHECK_OK(mg_timing_destroy(t));
}

/* Nothing is recorded into a capture: begin on a capturing stream gives no span, and a span
 * whose end finds its stream capturing is abandoned without recording. */
static void test_capture(mg_backend *b) {
    if (!mg_backend_supports(b, MG_CAP_GRAPHS))
        return;
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .pool_pairs = 8, .kernel_span_every = 1};
    uint32_t lane;
    mg_timing *t = timing_with_lane(b, o, "decode", &lane);
    if (!t)
        return;
    CHECK_OK(mg_timing_step_begin(t, 0));
    mg_timing_span before = 0, span = 9, kspan = 9;
    CHECK_OK(mg_timing_lane_begin(t, lane, s, &before));
    CHECK(before != 0);

    CHECK_OK(mg_graph_begin_capture(s));
    mg_cpu_counters c0 = test_cpu_counters(b);
    CHECK_OK(mg_timing_lane_begin(t, lane, s, &span));
    CHECK(span == 0);
    CHECK_OK(mg_timing_kernel_begin(t, "k", s, &kspan));
    CHECK(kspan == 0);
    CHECK_OK(mg_timing_span_end(t, before, s)); /* would land in the graph: abandoned */
    CHECK_OK(mg_timing_span_end(t, span, s));   /* no span: no-op */
    CHECK_OK(mg_timing_step_begin(t, 1));       /* harvest + re-anchor check while capturing */
    mg_cpu_counters c1 = test_cpu_counters(b);
    CHECK(c1.event_record == c0.event_record);
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_graph_destroy(g));

    mg_timing_counters c = timing_counters(t);
    CHECK(c.skipped_capturing == 2 && c.abandoned == 1 && c.open == 0 && c.pending == 0);
    CHECK_STATUS(mg_timing_span_end(t, before, s), MG_ERR_INVALID_ARGUMENT); /* already gone */
    CHECK_MESSAGE("not open");
    /* recording works again once the capture ended */
    CHECK_OK(mg_timing_lane_begin(t, lane, s, &span));
    CHECK(span != 0);
    CHECK_OK(mg_timing_span_end(t, span, s));
    CHECK_OK(mg_timing_harvest(t, NULL));
    CHECK(timing_counters(t).harvested == 1);
    CHECK_OK(mg_timing_destroy(t));
    CHECK_OK(mg_stream_destroy(s));
}

/* A full pool drops instead of blocking or reusing a live pair; pairs go round-robin; open
 * spans wait for a later harvest; harvest only queries. */
static void test_pool(mg_backend *b) {
    const uint32_t pairs = 4;
    mg_timing_options o = {.level = MG_TELEMETRY_BASIC, .pool_pairs = pairs};
    uint32_t lane;
    mg_timing *t = timing_with_lane(b, o, "decode", &lane);
    if (!t)
        return;

    /* round-robin: sequential spans take slots 1, 2, 3, 4, 1, 2, ... (low half of the token) */
    for (uint32_t i = 0; i < 3 * pairs; i++) {
        mg_timing_span span = 0;
        CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &span));
        CHECKF((span & 0xffffffffu) == i % pairs + 1, "span %u took slot %" PRIu64, i,
               span & 0xffffffffu);
        CHECK_OK(mg_timing_span_end(t, span, NULL));
        CHECK_OK(mg_timing_harvest(t, NULL));
    }

    /* fill the pool with open spans: the next is dropped, not blocked, not reused */
    mg_timing_span open[4];
    for (uint32_t i = 0; i < pairs; i++) {
        CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &open[i]));
        CHECK(open[i] != 0);
    }
    mg_timing_span extra = 1;
    CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &extra));
    CHECK(extra == 0);
    CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &extra));
    CHECK(timing_counters(t).dropped_pool_full == 2);

    /* open spans are not harvested; ended ones are, and only with event queries */
    mg_cpu_counters c0 = test_cpu_counters(b);
    size_t harvested = 9;
    CHECK_OK(mg_timing_harvest(t, &harvested));
    CHECK(harvested == 0 && timing_counters(t).open == pairs);
    CHECK_OK(mg_timing_span_end(t, open[1], NULL));
    CHECK_OK(mg_timing_span_end(t, open[3], NULL));
    CHECK_OK(mg_timing_step_begin(t, 1)); /* harvests */
    mg_timing_counters c = timing_counters(t);
    CHECK(c.open == 2 && c.pending == 0 && c.harvested == 3 * pairs + 2);
    mg_cpu_counters c1 = test_cpu_counters(b);
    CHECK(c1.event_synchronize == c0.event_synchronize);
    CHECK(c1.stream_synchronize == c0.stream_synchronize);
    CHECK(c1.event_query > c0.event_query);

    /* the freed pairs are used again; the still-open ones are left alone */
    mg_timing_span again = 0;
    CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &again));
    uint64_t slot = again & 0xffffffffu;
    CHECK(slot == (open[1] & 0xffffffffu) || slot == (open[3] & 0xffffffffu));
    CHECK_OK(mg_timing_span_end(t, again, NULL));
    CHECK_OK(mg_timing_span_end(t, open[0], NULL));
    CHECK_OK(mg_timing_span_end(t, open[2], NULL));
    CHECK_STATUS(mg_timing_span_end(t, open[2], NULL), MG_ERR_INVALID_ARGUMENT); /* twice */
    CHECK_STATUS(mg_timing_span_end(t, open[1], NULL), MG_ERR_INVALID_ARGUMENT); /* stale */
    CHECK_STATUS(mg_timing_span_end(t, ((uint64_t)1 << 32) | 99, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_timing_span_end(t, 0, NULL));
    CHECK_OK(mg_timing_harvest(t, &harvested));
    CHECK(harvested == 3);
    c = timing_counters(t);
    CHECK(c.open == 0 && c.pending == 0 && c.recorded == c.harvested);
    CHECK_OK(mg_timing_destroy(t));
}

/* The trace keeps the newest spans; the epoch re-anchors keep the timeline consistent. */
static void test_trace_capacity_and_epochs(mg_backend *b) {
    mg_timing_options o = {
        .level = MG_TELEMETRY_BASIC, .pool_pairs = 4, .trace_capacity = 5, .epoch_interval_ms = 1};
    uint32_t lane;
    mg_timing *t = timing_with_lane(b, o, "step", &lane);
    if (!t)
        return;
    for (int step = 0; step < 12; step++) {
        CHECK_OK(mg_timing_step_begin(t, (uint64_t)step));
        mg_timing_span span = 0;
        CHECK_OK(mg_timing_lane_begin(t, lane, NULL, &span));
        spin_us(1500); /* longer than the epoch interval: re-anchors happen */
        CHECK_OK(mg_timing_span_end(t, span, NULL));
    }
    CHECK_OK(mg_timing_harvest(t, NULL));
    mg_timing_counters c = timing_counters(t);
    CHECK(c.harvested == 12 && c.trace_overwritten == 7);
    trace_doc doc;
    if (read_trace(t, &doc)) {
        CHECK(doc.span_count == 5);
        for (size_t i = 0; i < doc.span_count; i++) {
            CHECK(doc.spans[i].step == 7 + i);
            CHECK(doc.spans[i].dur >= 1500);
            /* each step starts after the previous ended; with ~1.5 ms spans the gap between
             * starts is at least the duration and far below a second */
            if (i > 0) {
                double gap = doc.spans[i].ts - doc.spans[i - 1].ts;
                CHECKF(gap >= doc.spans[i - 1].dur - 0.002 && gap < 1e6, "gap %.3f us", gap);
            }
        }
        free(doc.spans);
    }
    /* exporting to a place that cannot be written names the path */
    CHECK_STATUS(mg_timing_export_chrome_trace(t, "/nonexistent-dir/trace.json"),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("/nonexistent-dir/trace.json");
    CHECK_OK(mg_timing_destroy(t));
}

/* More distinct kernel names than the table holds: the rest share "(other kernels)", and
 * every lane still fits. */
static void test_many_kernel_names(mg_backend *b) {
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .pool_pairs = 4, .kernel_span_every = 1};
    uint32_t lane;
    mg_timing *t = timing_with_lane(b, o, "lane0", &lane);
    if (!t)
        return;
    CHECK_OK(mg_timing_step_begin(t, 0));
    const int names = 1000;
    for (int i = 0; i < names; i++) {
        char name[32];
        snprintf(name, sizeof name, "metrale:kernel_%d", i);
        mg_timing_span span = 0;
        CHECK_OK(mg_timing_kernel_begin(t, name, NULL, &span));
        CHECK_OK(mg_timing_span_end(t, span, NULL));
        CHECK_OK(mg_timing_harvest(t, NULL));
    }
    /* one lane exists, so kernels may take 1024 - 64 + 1 - 1 = 960 entries */
    const int own = MG_TIMING_MAX_SERIES - MG_TIMING_MAX_LANES;
    CHECK(mg_timing_summary_count(t) == (size_t)own + 2);
    mg_timing_summary other;
    CHECK(find_summary(t, "(other kernels)", &other) != NULL);
    CHECK(other.kind == MG_TIMING_KERNEL && other.count == (uint64_t)(names - own));
    for (int i = 1; i < MG_TIMING_MAX_LANES; i++) {
        char name[16];
        snprintf(name, sizeof name, "lane%d", i);
        CHECK_OK(mg_timing_lane(t, name, &lane));
    }
    CHECK(mg_timing_summary_count(t) == MG_TIMING_MAX_SERIES + 1);
    CHECK_OK(mg_timing_destroy(t));
}

/* An empty timing object still exports a valid (empty) trace. */
static void test_empty_trace(mg_backend *b) {
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, NULL, &t));
    if (!t)
        return;
    trace_doc doc;
    if (read_trace(t, &doc)) {
        CHECK(doc.span_count == 0 && doc.has_process_name && doc.thread_names == 0);
        free(doc.spans);
    }
    CHECK(mg_timing_summary_count(t) == 0);
    mg_timing_summary s;
    CHECK_STATUS(mg_timing_summary_get(t, 0, &s), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_timing_destroy(t));
}

/* mg_timing_trace_launches wraps every mg_launch_run in a kernel span on armed steps only. */
static void test_traced_launches(mg_backend *b) {
    mg_timing_options o = {.level = MG_TELEMETRY_KERNEL, .pool_pairs = 16, .kernel_span_every = 2};
    mg_timing *t = NULL, *other = NULL;
    CHECK_OK(mg_timing_create(b, &o, &t));
    CHECK_OK(mg_timing_create(b, &o, &other));
    if (!t || !other)
        return;
    CHECK_OK(mg_timing_trace_launches(t, true));
    CHECK_STATUS(mg_timing_trace_launches(other, true), MG_ERR_BUSY);
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    for (uint64_t step = 0; step < 4; step++) { /* steps 0 and 2 are armed: 3 launches each */
        CHECK_OK(mg_timing_step_begin(t, step));
        for (int i = 0; i < 3; i++)
            CHECK_OK(mg_launch_run(b, k, NULL, &l));
    }
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    CHECK_OK(mg_timing_harvest(t, NULL));
    uint64_t kernel_spans = 0;
    for (size_t i = 0; i < mg_timing_summary_count(t); i++) {
        mg_timing_summary sum;
        CHECK_OK(mg_timing_summary_get(t, i, &sum));
        if (sum.kind == MG_TIMING_KERNEL && !strcmp(sum.name, "metrale:empty_kernel"))
            kernel_spans += sum.count;
    }
    CHECK(kernel_spans == 6);
    /* Detached: launches are no longer timed, and another object may attach. */
    CHECK_OK(mg_timing_trace_launches(t, false));
    CHECK_OK(mg_timing_trace_launches(other, true));
    CHECK_OK(mg_timing_destroy(other)); /* destroy detaches */
    CHECK_OK(mg_timing_trace_launches(t, true));
    CHECK_OK(mg_kernel_release(k));
    CHECK_OK(mg_timing_destroy(t));
}

int main(void) {
    test_json_parser_itself();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (b) {
        test_create_and_lanes(b);
        test_steps_and_trace(b);
        test_levels(b);
        test_capture(b);
        test_pool(b);
        test_trace_capacity_and_epochs(b);
        test_empty_trace(b);
        test_traced_launches(b);
        test_many_kernel_names(b);
        CHECK_OK(mg_backend_close(b));
    }
    return test_finish();
}
