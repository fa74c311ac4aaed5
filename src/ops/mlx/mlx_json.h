/*
 * mlx_json.h - private to src/ops/mlx: the small JSON layer the safetensors reader and the
 * config.json reader share, on top of jsmn (Debian's libjsmn-dev, strict mode).
 *
 * A document is tokenised once (mg_json_parse); tokens are then walked by index. Only what the
 * two readers need is here: members of an object, elements of an array, unsigned integers,
 * booleans and strings compared or copied without escapes (a string holding a backslash is
 * reported by mg_json_string so a caller can refuse it clearly).
 */
#ifndef METRALE_MLX_JSON_H
#define METRALE_MLX_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"

typedef enum mg_json_type {
    MG_JSON_OTHER = 0,
    MG_JSON_OBJECT = 1,
    MG_JSON_ARRAY = 2,
    MG_JSON_STRING = 3,
    MG_JSON_PRIMITIVE = 4, /* number, true, false, null */
} mg_json_type;

typedef struct mg_json_token {
    mg_json_type type;
    int start, end; /* byte range in the text (strings: without the quotes) */
    int size;       /* members of an object, elements of an array */
} mg_json_token;

typedef struct mg_json_doc {
    const char *text;
    size_t length;
    mg_json_token *tokens;
    int count;
} mg_json_doc;

/* Tokenises `text` [0, length). `what` names the document in messages ("safetensors header of
 * x"). MG_ERR_INVALID_ARGUMENT for malformed or truncated JSON or a top level that is not one
 * object spanning the text (trailing blanks allowed); MG_ERR_OUT_OF_MEMORY. */
mg_status mg_json_parse(const char *text, size_t length, const char *what, mg_json_doc *doc);
void mg_json_free(mg_json_doc *doc);

/* The index of the token after the whole value at `i` (its members included). */
int mg_json_skip(const mg_json_doc *doc, int i);
/* The value token of member `key` of the object at `obj`, or -1. */
int mg_json_member(const mg_json_doc *doc, int obj, const char *key);
/* Whether the string token `i` equals `s` exactly (no unescaping). */
bool mg_json_equals(const mg_json_doc *doc, int i, const char *s);
/* Whether token `i` is a string with no escape sequence. */
bool mg_json_plain_string(const mg_json_doc *doc, int i);
/* Token `i` as a non-negative integer below 2^63 (digits only). */
bool mg_json_u64(const mg_json_doc *doc, int i, uint64_t *out);
/* Token `i` as true or false. */
bool mg_json_bool(const mg_json_doc *doc, int i, bool *out);
/* Copies the string token `i` (no escapes) into out[out_bytes] with a terminator; false when it
 * is not a plain string or does not fit. */
bool mg_json_copy(const mg_json_doc *doc, int i, char *out, size_t out_bytes);

#endif
