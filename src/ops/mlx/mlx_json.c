/* mlx_json.c - the JSON layer of the MLX checkpoint readers (mlx_json.h) on jsmn. */
#include "mlx_json.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

/* jsmn is header-only; this file holds its one (file-local) copy. Strict mode refuses
 * unquoted keys and bare words that are not JSON literals. */
#define JSMN_STATIC
#define JSMN_STRICT
#include <jsmn.h>

/* A header larger than this is refused before any allocation (safetensors' own limit is
 * 100 MB; real checkpoints stay far below). */
#define MAX_TOKENS (1 << 24)

/* A negative jsmn result as a status. */
static mg_status parse_error(int code, const jsmn_parser *p, const char *what) {
    if (code == JSMN_ERROR_PART)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: truncated JSON", what);
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: malformed JSON near byte %u", what,
                    (unsigned)p->pos);
}

mg_status mg_json_parse(const char *text, size_t length, const char *what, mg_json_doc *doc) {
    memset(doc, 0, sizeof *doc);
    jsmn_parser p;
    jsmn_init(&p);
    /* The counting pass finds malformed text; only the second, with tokens, finds unclosed
     * objects and arrays (JSMN_ERROR_PART). */
    int count = jsmn_parse(&p, text, length, NULL, 0);
    if (count < 0)
        return parse_error(count, &p, what);
    if (count == 0 || count > MAX_TOKENS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s", what,
                        count ? "too many JSON values" : "empty JSON");
    jsmntok_t *raw = malloc((size_t)count * sizeof *raw);
    doc->tokens = malloc((size_t)count * sizeof *doc->tokens);
    if (!raw || !doc->tokens) {
        free(raw);
        mg_json_free(doc);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for %d JSON tokens", what, count);
    }
    jsmn_init(&p);
    int parsed = jsmn_parse(&p, text, length, raw, (unsigned)count);
    for (int i = 0; i < parsed; i++)
        doc->tokens[i] =
            (mg_json_token){(mg_json_type)raw[i].type, raw[i].start, raw[i].end, raw[i].size};
    free(raw);
    doc->text = text;
    doc->length = length;
    doc->count = parsed;
    if (parsed < 0) {
        mg_json_free(doc);
        return parse_error(parsed, &p, what);
    }
    if (parsed != count) {
        mg_json_free(doc);
        return MG_ERROR(MG_ERR_INTERNAL, "%s: JSON token count changed between passes", what);
    }
    if (doc->tokens[0].type != MG_JSON_OBJECT || mg_json_skip(doc, 0) != count) {
        mg_json_free(doc);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the JSON is not one object", what);
    }
    for (size_t i = (size_t)doc->tokens[0].end; i < length; i++)
        if (!strchr(" \t\r\n", text[i])) {
            mg_json_free(doc);
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: text after the JSON object at byte %zu",
                            what, i);
        }
    return MG_OK;
}

void mg_json_free(mg_json_doc *doc) {
    free(doc->tokens);
    memset(doc, 0, sizeof *doc);
}

/* Iterative: a value's subtree is `pending` more tokens, each object member counting its key
 * and its value. Depth costs nothing, so hostile nesting cannot exhaust the stack. */
int mg_json_skip(const mg_json_doc *doc, int i) {
    long pending = 1;
    while (pending > 0 && i < doc->count) {
        const mg_json_token *t = &doc->tokens[i];
        pending--;
        if (t->type == MG_JSON_OBJECT)
            pending += 2L * t->size;
        else if (t->type == MG_JSON_ARRAY)
            pending += t->size;
        i++;
    }
    return i;
}

bool mg_json_equals(const mg_json_doc *doc, int i, const char *s) {
    const mg_json_token *t = &doc->tokens[i];
    size_t n = strlen(s);
    return t->type == MG_JSON_STRING && (size_t)(t->end - t->start) == n &&
           memcmp(doc->text + t->start, s, n) == 0;
}

bool mg_json_plain_string(const mg_json_doc *doc, int i) {
    const mg_json_token *t = &doc->tokens[i];
    return t->type == MG_JSON_STRING &&
           !memchr(doc->text + t->start, '\\', (size_t)(t->end - t->start));
}

int mg_json_member(const mg_json_doc *doc, int obj, const char *key) {
    if (obj < 0 || obj >= doc->count || doc->tokens[obj].type != MG_JSON_OBJECT)
        return -1;
    int i = obj + 1;
    for (int m = 0; m < doc->tokens[obj].size && i + 1 < doc->count; m++) {
        if (mg_json_equals(doc, i, key))
            return i + 1;
        i = mg_json_skip(doc, i + 1);
    }
    return -1;
}

bool mg_json_u64(const mg_json_doc *doc, int i, uint64_t *out) {
    if (i < 0 || i >= doc->count || doc->tokens[i].type != MG_JSON_PRIMITIVE)
        return false;
    const char *s = doc->text + doc->tokens[i].start;
    int n = doc->tokens[i].end - doc->tokens[i].start;
    if (n < 1 || n > 18) /* 18 digits < 2^63 */
        return false;
    uint64_t v = 0;
    for (int k = 0; k < n; k++) {
        if (s[k] < '0' || s[k] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[k] - '0');
    }
    *out = v;
    return true;
}

bool mg_json_bool(const mg_json_doc *doc, int i, bool *out) {
    if (i < 0 || i >= doc->count || doc->tokens[i].type != MG_JSON_PRIMITIVE)
        return false;
    const char *s = doc->text + doc->tokens[i].start;
    int n = doc->tokens[i].end - doc->tokens[i].start;
    if (n == 4 && !memcmp(s, "true", 4))
        return *out = true, true;
    if (n == 5 && !memcmp(s, "false", 5))
        return *out = false, true;
    return false;
}

bool mg_json_copy(const mg_json_doc *doc, int i, char *out, size_t out_bytes) {
    if (i < 0 || i >= doc->count || !mg_json_plain_string(doc, i))
        return false;
    size_t n = (size_t)(doc->tokens[i].end - doc->tokens[i].start);
    if (n + 1 > out_bytes)
        return false;
    memcpy(out, doc->text + doc->tokens[i].start, n);
    out[n] = '\0';
    return true;
}
