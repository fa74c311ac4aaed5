/* json.c - the model layer's JSON reading (json.h) and its one copy of jsmn. */
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>

#include "json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mg_jdoc_parse(const char *text, size_t len, mg_jdoc *doc, unsigned *error_pos) {
    memset(doc, 0, sizeof *doc);
    doc->s = text;
    *error_pos = 0;
    jsmn_parser p;
    jsmn_init(&p);
    int count = jsmn_parse(&p, text, len, NULL, 0);
    if (count == JSMN_ERROR_PART)
        return 1;
    if (count < 0) {
        *error_pos = p.pos;
        return 2;
    }
    if (count == 0)
        return 3;
    if (!(doc->tk = malloc((size_t)count * sizeof *doc->tk)))
        return 4;
    jsmn_init(&p);
    doc->n = jsmn_parse(&p, text, len, doc->tk, (unsigned)count);
    if (doc->n >= 0)
        return 0;
    const int r = doc->n == JSMN_ERROR_PART ? 1 : 2;
    *error_pos = p.pos;
    mg_jdoc_free(doc);
    return r;
}

void mg_jdoc_free(mg_jdoc *doc) {
    free(doc->tk);
    doc->tk = NULL;
    doc->n = 0;
}

int mg_jdoc_skip(const mg_jdoc *d, int i) {
    int pending = 1;
    while (pending > 0 && i < d->n) {
        pending += d->tk[i].size - 1;
        i++;
    }
    return i;
}

bool mg_jdoc_is(const mg_jdoc *d, int i, jsmntype_t type) {
    return i >= 0 && i < d->n && d->tk[i].type == type;
}

bool mg_jdoc_eq(const mg_jdoc *d, int i, const char *lit) {
    if (!mg_jdoc_is(d, i, JSMN_STRING))
        return false;
    size_t n = (size_t)(d->tk[i].end - d->tk[i].start);
    return strlen(lit) == n && memcmp(d->s + d->tk[i].start, lit, n) == 0;
}

int mg_jdoc_get(const mg_jdoc *d, int obj, const char *key) {
    if (!mg_jdoc_is(d, obj, JSMN_OBJECT))
        return -1;
    int i = obj + 1;
    for (int k = 0; k < d->tk[obj].size; k++) {
        if (mg_jdoc_eq(d, i, key))
            return i + 1;
        i = mg_jdoc_skip(d, i + 1);
    }
    return -1;
}

bool mg_jdoc_null(const mg_jdoc *d, int i) {
    return i < 0 || (mg_jdoc_is(d, i, JSMN_PRIMITIVE) && d->s[d->tk[i].start] == 'n');
}

bool mg_jdoc_bool(const mg_jdoc *d, int obj, const char *key, bool def, bool *bad) {
    int i = mg_jdoc_get(d, obj, key);
    if (mg_jdoc_null(d, i))
        return def;
    if (!mg_jdoc_is(d, i, JSMN_PRIMITIVE) ||
        (d->s[d->tk[i].start] != 't' && d->s[d->tk[i].start] != 'f')) {
        *bad = true;
        return def;
    }
    return d->s[d->tk[i].start] == 't';
}

/* The primitive at i as a NUL-terminated copy; false when it is not one or is too long. */
static bool primitive(const mg_jdoc *d, int i, char *buf, size_t size) {
    if (!mg_jdoc_is(d, i, JSMN_PRIMITIVE))
        return false;
    int n = d->tk[i].end - d->tk[i].start;
    if (n <= 0 || (size_t)n >= size)
        return false;
    memcpy(buf, d->s + d->tk[i].start, (size_t)n);
    buf[n] = 0;
    return true;
}

bool mg_jdoc_int(const mg_jdoc *d, int i, long long *v) {
    char buf[32], *end;
    if (!primitive(d, i, buf, sizeof buf))
        return false;
    errno = 0;
    *v = strtoll(buf, &end, 10);
    return *end == 0 && errno == 0;
}

bool mg_jdoc_num(const mg_jdoc *d, int i, double *v) {
    char buf[64], *end;
    if (!primitive(d, i, buf, sizeof buf) || buf[0] == 't' || buf[0] == 'f' || buf[0] == 'n')
        return false;
    errno = 0;
    *v = strtod(buf, &end);
    return *end == 0 && errno == 0;
}

bool mg_jdoc_plain_string(const mg_jdoc *d, int i, char *buf, size_t size) {
    if (!mg_jdoc_is(d, i, JSMN_STRING))
        return false;
    size_t n = (size_t)(d->tk[i].end - d->tk[i].start);
    if (n + 1 > size || memchr(d->s + d->tk[i].start, '\\', n))
        return false;
    memcpy(buf, d->s + d->tk[i].start, n);
    buf[n] = 0;
    return true;
}
