/*
 * json.h - private to src/model: the model layer's JSON reading (tokenizer.json, config.json)
 * over jsmn (Debian libjsmn-dev): one parse into a token array, then lookups by index.
 *
 * A document is its text and tokens; index 0 is the top-level value. Lookups take an index and
 * return -1 (or false) for a missing value or a value of another type, so chains need no
 * checks in between. Strings compare raw (the keys and names looked up have no escapes).
 * jsmn is built strict (no unquoted keys or bare words) and with parent links (linear parse
 * time: without them each member of a large object scans back to the object's start).
 * (The ops layer's safetensors and MLX config readers have their own, src/ops/mlx/mlx_json.h:
 * the layers do not share private headers.)
 */
#ifndef METRALE_MODEL_JSON_H
#define METRALE_MODEL_JSON_H

#include <stdbool.h>
#include <stddef.h>

#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#define JSMN_HEADER
#include <jsmn.h>
#undef JSMN_HEADER

typedef struct mg_jdoc {
    const char *s;
    jsmntok_t *tk;
    int n;
} mg_jdoc;

/* Parses `len` bytes of `text` (which must outlive the document). Returns 0, or 1 for
 * truncated text, 2 for malformed text (*error_pos the byte), 3 for empty text, 4 when out of
 * host memory. */
int mg_jdoc_parse(const char *text, size_t len, mg_jdoc *doc, unsigned *error_pos);
void mg_jdoc_free(mg_jdoc *doc);

/* The index just past the value at i (its whole subtree). */
int mg_jdoc_skip(const mg_jdoc *d, int i);
bool mg_jdoc_is(const mg_jdoc *d, int i, jsmntype_t type);
/* The string at i equals `lit` (raw bytes). */
bool mg_jdoc_eq(const mg_jdoc *d, int i, const char *lit);
/* The value of `key` in the object at obj; -1 when absent or obj is not an object. */
int mg_jdoc_get(const mg_jdoc *d, int obj, const char *key);
/* Absent (i < 0) or null. */
bool mg_jdoc_null(const mg_jdoc *d, int i);
/* A boolean member; `def` when absent or null; def with *bad set when not a boolean. */
bool mg_jdoc_bool(const mg_jdoc *d, int obj, const char *key, bool def, bool *bad);
/* An integer value (decimal, no fraction or exponent). */
bool mg_jdoc_int(const mg_jdoc *d, int i, long long *v);
/* A number value. */
bool mg_jdoc_num(const mg_jdoc *d, int i, double *v);
/* A string value without escapes into buf (NUL-terminated); false when it is no string, has
 * an escape or does not fit. */
bool mg_jdoc_plain_string(const mg_jdoc *d, int i, char *buf, size_t size);

#endif
