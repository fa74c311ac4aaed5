/* tokenizer_json.c - mg_tok_from_json: a Hugging Face tokenizer.json into the tokenizer of
 * tokenizer_internal.h. Every field that changes the ids is read; a value this reader does
 * not implement is refused with MG_ERR_UNSUPPORTED naming it (tokenizer.h lists what is
 * accepted). */
#include "tokenizer_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* A tokenizer.json larger than this is refused before it is read (Llama-3's is 9 MB). */
#define MAX_JSON_BYTES (512u << 20)

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static bool hex4(const char *p, const char *end, uint32_t *v) {
    if (end - p < 4)
        return false;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p[k]);
        if (h < 0)
            return false;
        *v = *v * 16 + (uint32_t)h;
    }
    return true;
}

/* The unescaped string at i into buf (grown as needed); false when not a string or malformed
 * (a bad escape, a lone surrogate, invalid UTF-8). */
static bool jstr(const mg_jdoc *d, int i, char **buf, size_t *cap, size_t *len) {
    if (!mg_jdoc_is(d, i, JSMN_STRING))
        return false;
    const char *p = d->s + d->tk[i].start, *end = d->s + d->tk[i].end;
    size_t need = (size_t)(end - p) + 1;
    if (need > *cap) {
        char *q = realloc(*buf, need);
        if (!q)
            return false;
        *buf = q;
        *cap = need;
    }
    char *o = *buf;
    while (p < end) {
        if (*p != '\\') {
            *o++ = *p++;
            continue;
        }
        if (++p >= end)
            return false;
        char c = *p++;
        switch (c) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '/':
            *o++ = '/';
            break;
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u': {
            uint32_t v, lo;
            if (!hex4(p, end, &v))
                return false;
            p += 4;
            if (v >= 0xDC00 && v <= 0xDFFF)
                return false;
            if (v >= 0xD800 && v <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, end, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return false;
                p += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* \uXXXX never needs more bytes than its six characters. */
            o += mg_tok_utf8_encode(v, o);
            break;
        }
        default:
            return false;
        }
    }
    *len = (size_t)(o - *buf);
    *o = 0;
    return mg_tok_utf8_check((const uint8_t *)*buf, *len) == *len;
}

typedef struct reader {
    mg_jdoc d;
    mg_tok *t;
    char *buf, *buf2;
    size_t cap, cap2;
} reader;

static mg_status bad(const char *what) {
    return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "tokenizer.json: %s", what);
}

static mg_status unsupported(const reader *r, int i, const char *what) {
    char name[64] = "?";
    int ty = mg_jdoc_get(&r->d, i, "type");
    if (mg_jdoc_is(&r->d, ty, JSMN_STRING)) {
        int n = r->d.tk[ty].end - r->d.tk[ty].start;
        snprintf(name, sizeof name, "%.*s", n < 60 ? n : 60, r->d.s + r->d.tk[ty].start);
    }
    return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: %s \"%s\" is not supported", what,
                       name);
}

/* The "type" of the object at i is `lit`. */
static bool jtype(const mg_jdoc *d, int i, const char *lit) {
    return mg_jdoc_eq(d, mg_jdoc_get(d, i, "type"), lit);
}

/* The string value of a field, unescaped into r->buf2. */
static bool jfield_str(reader *r, int obj, const char *key, size_t *len) {
    return jstr(&r->d, mg_jdoc_get(&r->d, obj, key), &r->buf2, &r->cap2, len);
}

/* ------------------------------------------------------------------ model */

/* The largest id of the vocabulary and of the added tokens. */
static mg_status max_id(reader *r, int model, int added, long long *mx) {
    const mg_jdoc *d = &r->d;
    int vocab = mg_jdoc_get(d, model, "vocab");
    if (!mg_jdoc_is(d, vocab, JSMN_OBJECT))
        return bad("model.vocab is not an object");
    *mx = -1;
    int i = vocab + 1;
    for (int k = 0; k < d->tk[vocab].size; k++) {
        long long v;
        if (!mg_jdoc_int(d, i + 1, &v) || v < 0 || v > INT32_MAX - 1)
            return bad("a model.vocab id is not an integer in 0..2^31-2");
        if (v > *mx)
            *mx = v;
        i = mg_jdoc_skip(d, i + 1);
    }
    if (mg_jdoc_is(d, added, JSMN_ARRAY)) {
        i = added + 1;
        for (int k = 0; k < d->tk[added].size; k++) {
            long long v;
            if (!mg_jdoc_int(d, mg_jdoc_get(d, i, "id"), &v) || v < 0 || v > INT32_MAX - 1)
                return bad("an added token's id is not an integer in 0..2^31-2");
            if (v > *mx)
                *mx = v;
            i = mg_jdoc_skip(d, i);
        }
    }
    if (*mx < 0)
        return bad("the vocabulary is empty");
    /* The tables are indexed by id, so an id far past the number of tokens would make a few
     * bytes of JSON allocate gigabytes. Real vocabularies are dense (ids 0..n-1); this allows
     * gaps up to as many ids again, plus 256. */
    const long long entries =
        (long long)d->tk[vocab].size + (mg_jdoc_is(d, added, JSMN_ARRAY) ? d->tk[added].size : 0);
    if (*mx >= 2 * entries + 256)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "tokenizer.json: token id %lld is far past the %lld tokens listed "
                           "(ids must be nearly dense)",
                           *mx, entries);
    return MG_OK;
}

static mg_status read_model(reader *r, int model) {
    const mg_jdoc *d = &r->d;
    mg_tok *t = r->t;
    int ty = mg_jdoc_get(d, model, "type");
    if (ty >= 0 && !mg_jdoc_eq(d, ty, "BPE"))
        return unsupported(r, model, "model");
    bool b = false;
    if (!mg_jdoc_null(d, mg_jdoc_get(d, model, "dropout")))
        return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    size_t len;
    int csp = mg_jdoc_get(d, model, "continuing_subword_prefix"),
        eow = mg_jdoc_get(d, model, "end_of_word_suffix");
    if ((!mg_jdoc_null(d, csp) && !(jstr(d, csp, &r->buf2, &r->cap2, &len) && len == 0)) ||
        (!mg_jdoc_null(d, eow) && !(jstr(d, eow, &r->buf2, &r->cap2, &len) && len == 0)))
        return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: BPE continuing_subword_prefix "
                                               "and end_of_word_suffix are not supported");
    t->fuse_unk = mg_jdoc_bool(d, model, "fuse_unk", false, &b);
    t->byte_fallback = mg_jdoc_bool(d, model, "byte_fallback", false, &b);
    t->ignore_merges = mg_jdoc_bool(d, model, "ignore_merges", false, &b);
    if (b)
        return bad("a boolean field of model is not a boolean");

    int vocab = mg_jdoc_get(d, model, "vocab");
    int i = vocab + 1;
    for (int k = 0; k < d->tk[vocab].size; k++) {
        long long v;
        if (!jstr(d, i, &r->buf, &r->cap, &len) || !mg_jdoc_int(d, i + 1, &v))
            return bad("a model.vocab entry is malformed");
        mg_status st = mg_tok_set_token(t, (int32_t)v, r->buf, len);
        if (st)
            return st;
        i = mg_jdoc_skip(d, i + 1);
    }
    int unk = mg_jdoc_get(d, model, "unk_token");
    if (!mg_jdoc_null(d, unk)) {
        if (!jstr(d, unk, &r->buf, &r->cap, &len))
            return bad("model.unk_token is not a string");
        t->unk = mg_tok_vocab_find(t, r->buf, len);
        if (t->unk < 0)
            return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                               "tokenizer.json: model.unk_token \"%s\" is not in the vocabulary",
                               r->buf);
    }
    int merges = mg_jdoc_get(d, model, "merges");
    if (mg_jdoc_null(d, merges))
        return MG_OK;
    if (!mg_jdoc_is(d, merges, JSMN_ARRAY))
        return bad("model.merges is not an array");
    i = merges + 1;
    for (int k = 0; k < d->tk[merges].size; k++) {
        mg_status st;
        if (mg_jdoc_is(d, i, JSMN_ARRAY)) {
            size_t l2;
            if (d->tk[i].size != 2 || !jstr(d, i + 1, &r->buf, &r->cap, &len) ||
                !jstr(d, i + 2, &r->buf2, &r->cap2, &l2))
                return bad("a model.merges entry is not a pair of strings");
            st = mg_tok_add_merge(t, r->buf, len, r->buf2, l2, (uint32_t)k);
        } else {
            if (!jstr(d, i, &r->buf, &r->cap, &len))
                return bad("a model.merges entry is not a string");
            const char *sp = len ? memchr(r->buf + 1, ' ', len - 1) : NULL;
            if (!sp)
                return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                                   "tokenizer.json: merge %d \"%s\" is not two tokens separated "
                                   "by a space",
                                   k, r->buf);
            size_t l = (size_t)(sp - r->buf);
            st = mg_tok_add_merge(t, r->buf, l, sp + 1, len - l - 1, (uint32_t)k);
        }
        if (st)
            return st;
        i = mg_jdoc_skip(d, i);
    }
    return MG_OK;
}

static mg_status read_added(reader *r, int added) {
    const mg_jdoc *d = &r->d;
    if (mg_jdoc_null(d, added))
        return MG_OK;
    if (!mg_jdoc_is(d, added, JSMN_ARRAY))
        return bad("added_tokens is not an array");
    int i = added + 1;
    for (int k = 0; k < d->tk[added].size; k++) {
        long long id;
        size_t len;
        bool b = false;
        if (!mg_jdoc_int(d, mg_jdoc_get(d, i, "id"), &id) || !jfield_str(r, i, "content", &len))
            return bad("an added token lacks its id or content");
        bool special = mg_jdoc_bool(d, i, "special", false, &b);
        bool lstrip = mg_jdoc_bool(d, i, "lstrip", false, &b);
        bool rstrip = mg_jdoc_bool(d, i, "rstrip", false, &b);
        bool normalized = mg_jdoc_bool(d, i, "normalized", !special, &b);
        if (mg_jdoc_bool(d, i, "single_word", false, &b))
            return mg_tok_fail(MG_ERR_UNSUPPORTED,
                               "tokenizer.json: added token \"%s\": single_word is not "
                               "supported",
                               r->buf2);
        if (b)
            return bad("a boolean field of an added token is not a boolean");
        /* Without a normalizer both kinds match the same text. With one, `tokenizers`
         * matches the normalized form of the token in the normalized text and decodes it in
         * that form: not implemented. */
        if (normalized && r->t->n_norms)
            return mg_tok_fail(MG_ERR_UNSUPPORTED,
                               "tokenizer.json: added token \"%s\": normalized added tokens "
                               "with a normalizer are not supported",
                               r->buf2);
        mg_status st = mg_tok_add_added(r->t, (int32_t)id, r->buf2, len, special, lstrip, rstrip);
        if (st)
            return st;
        i = mg_jdoc_skip(d, i);
    }
    return MG_OK;
}

/* ------------------------------------------------------------------ pipeline */

static mg_status read_normalizer(reader *r, int n) {
    const mg_jdoc *d = &r->d;
    if (mg_jdoc_null(d, n))
        return MG_OK;
    if (jtype(d, n, "Sequence")) {
        int list = mg_jdoc_get(d, n, "normalizers");
        if (!mg_jdoc_is(d, list, JSMN_ARRAY))
            return bad("normalizer.normalizers is not an array");
        int i = list + 1;
        for (int k = 0; k < d->tk[list].size; k++) {
            if (jtype(d, i, "Sequence"))
                return unsupported(r, i, "nested normalizer");
            mg_status st = read_normalizer(r, i);
            if (st)
                return st;
            i = mg_jdoc_skip(d, i);
        }
        return MG_OK;
    }
    size_t len, l2;
    if (jtype(d, n, "Prepend")) {
        if (!jfield_str(r, n, "prepend", &len))
            return bad("normalizer Prepend lacks its string");
        return mg_tok_add_norm(r->t, NORM_PREPEND, r->buf2, len, NULL, 0);
    }
    if (jtype(d, n, "Replace")) {
        int pat = mg_jdoc_get(d, n, "pattern");
        if (!jstr(d, mg_jdoc_get(d, pat, "String"), &r->buf, &r->cap, &len) || len == 0)
            return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: normalizer Replace with a "
                                                   "pattern other than a non-empty String is "
                                                   "not supported");
        if (!jfield_str(r, n, "content", &l2))
            return bad("normalizer Replace lacks its content");
        return mg_tok_add_norm(r->t, NORM_REPLACE, r->buf, len, r->buf2, l2);
    }
    return unsupported(r, n, "normalizer");
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                "\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                               "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                               "\\s+(?!\\S)|\\s+";

static mg_status read_pre(reader *r, int p, bool last) {
    const mg_jdoc *d = &r->d;
    if (mg_jdoc_null(d, p))
        return MG_OK;
    bool b = false;
    tok_pre x = {0};
    if (jtype(d, p, "Sequence")) {
        int list = mg_jdoc_get(d, p, "pretokenizers");
        if (!mg_jdoc_is(d, list, JSMN_ARRAY))
            return bad("pre_tokenizer.pretokenizers is not an array");
        int i = list + 1;
        for (int k = 0; k < d->tk[list].size; k++) {
            if (jtype(d, i, "Sequence"))
                return unsupported(r, i, "nested pre_tokenizer");
            mg_status st = read_pre(r, i, last && k == d->tk[list].size - 1);
            if (st)
                return st;
            i = mg_jdoc_skip(d, i);
        }
        return MG_OK;
    }
    if (jtype(d, p, "ByteLevel")) {
        if (!last)
            return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: a ByteLevel pre-tokenizer "
                                                   "followed by others is not supported");
        x.type = PRE_BYTELEVEL;
        x.add_prefix_space = mg_jdoc_bool(d, p, "add_prefix_space", true, &b);
        x.use_regex = mg_jdoc_bool(d, p, "use_regex", true, &b);
        r->t->map_bytes = true;
    } else if (jtype(d, p, "Digits")) {
        x.type = PRE_DIGITS;
        x.individual = mg_jdoc_bool(d, p, "individual_digits", false, &b);
    } else if (jtype(d, p, "Split")) {
        size_t len;
        x.type = PRE_SPLIT;
        if (!mg_jdoc_eq(d, mg_jdoc_get(d, p, "behavior"), "Isolated") ||
            mg_jdoc_bool(d, p, "invert", false, &b))
            return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: Split pre-tokenizer: only "
                                                   "behavior Isolated, not inverted, is "
                                                   "supported");
        if (!jstr(d, mg_jdoc_get(d, mg_jdoc_get(d, p, "pattern"), "Regex"), &r->buf, &r->cap, &len))
            return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: Split pre-tokenizer: only "
                                                   "a Regex pattern is supported");
        if (!strcmp(r->buf, GPT2_RE))
            x.regex = RE_GPT2;
        else if (!strcmp(r->buf, LLAMA3_RE))
            x.regex = RE_LLAMA3;
        else if (!strcmp(r->buf, QWEN2_RE))
            x.regex = RE_QWEN2;
        else
            return mg_tok_fail(MG_ERR_UNSUPPORTED,
                               "tokenizer.json: Split regex %.200s is not one of the GPT-2, "
                               "Llama-3 and Qwen2 patterns",
                               r->buf);
    } else if (jtype(d, p, "Metaspace")) {
        size_t len;
        x.type = PRE_METASPACE;
        uint32_t cp;
        if (!jfield_str(r, p, "replacement", &len) ||
            mg_tok_utf8_decode((const uint8_t *)r->buf2, len, &cp) != len || cp == ' ')
            return bad("Metaspace replacement is not one character");
        x.replacement = cp;
        int scheme = mg_jdoc_get(d, p, "prepend_scheme");
        if (mg_jdoc_null(d, scheme))
            x.prepend =
                mg_jdoc_bool(d, p, "add_prefix_space", true, &b) ? PREPEND_ALWAYS : PREPEND_NEVER;
        else if (mg_jdoc_eq(d, scheme, "always"))
            x.prepend = PREPEND_ALWAYS;
        else if (mg_jdoc_eq(d, scheme, "first"))
            x.prepend = PREPEND_FIRST;
        else if (mg_jdoc_eq(d, scheme, "never"))
            x.prepend = PREPEND_NEVER;
        else
            return bad("Metaspace prepend_scheme is not always, first or never");
        x.split = mg_jdoc_bool(d, p, "split", true, &b);
    } else
        return unsupported(r, p, "pre_tokenizer");
    if (b)
        return bad("a boolean field of a pre_tokenizer is not a boolean");
    return mg_tok_add_pre(r->t, &x);
}

static bool is_string_field(reader *r, int obj, const char *key, const char *want) {
    size_t len;
    return jfield_str(r, obj, key, &len) && len == strlen(want) && !memcmp(r->buf2, want, len);
}

static mg_status read_decoder(reader *r, int dec) {
    const mg_jdoc *d = &r->d;
    mg_tok *t = r->t;
    bool b = false;
    if (mg_jdoc_null(d, dec)) {
        t->dec = DEC_JOIN;
        return MG_OK;
    }
    if (jtype(d, dec, "ByteLevel")) {
        t->dec = DEC_BYTELEVEL;
        return MG_OK;
    }
    if (jtype(d, dec, "Metaspace")) {
        int scheme = mg_jdoc_get(d, dec, "prepend_scheme");
        if (!is_string_field(r, dec, "replacement", "\xE2\x96\x81"))
            return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: a Metaspace decoder with a "
                                                   "replacement other than U+2581 is not "
                                                   "supported");
        t->dec = DEC_METASPACE;
        t->dec_meta_first = mg_jdoc_null(d, scheme)
                                ? mg_jdoc_bool(d, dec, "add_prefix_space", true, &b)
                                : !mg_jdoc_eq(d, scheme, "never");
        return b ? bad("Metaspace add_prefix_space is not a boolean") : MG_OK;
    }
    if (!jtype(d, dec, "Sequence"))
        return unsupported(r, dec, "decoder");
    /* Replace("▁", " ")?, ByteFallback?, Fuse?, Strip(" ", n, 0)?, in this order: pieces
     * joined, so Fuse changes nothing and Strip acts on the whole text. */
    int list = mg_jdoc_get(d, dec, "decoders");
    if (!mg_jdoc_is(d, list, JSMN_ARRAY))
        return bad("decoder.decoders is not an array");
    t->dec = DEC_PIECES;
    int stage = 0, i = list + 1;
    if (d->tk[list].size == 1 && jtype(d, i, "ByteLevel")) {
        t->dec = DEC_BYTELEVEL;
        return MG_OK;
    }
    for (int k = 0; k < d->tk[list].size; k++, i = mg_jdoc_skip(d, i)) {
        if (jtype(d, i, "Replace") && stage < 1) {
            int pat = mg_jdoc_get(d, i, "pattern");
            if (!is_string_field(r, pat, "String", "\xE2\x96\x81") ||
                !is_string_field(r, i, "content", " "))
                return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: a Replace decoder other "
                                                       "than U+2581 -> \" \" is not supported");
            t->dec_replace_meta = true;
            stage = 1;
        } else if (jtype(d, i, "ByteFallback") && stage < 2) {
            t->dec_byte_fallback = true;
            stage = 2;
        } else if (jtype(d, i, "Fuse") && stage < 3) {
            stage = 3;
        } else if (jtype(d, i, "Strip") && stage == 3) {
            long long start, stop;
            if (!is_string_field(r, i, "content", " ") ||
                !mg_jdoc_int(d, mg_jdoc_get(d, i, "start"), &start) ||
                !mg_jdoc_int(d, mg_jdoc_get(d, i, "stop"), &stop) || stop != 0 || start < 0 ||
                start > 1000)
                return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: only a Strip decoder of "
                                                       "leading spaces is supported");
            t->dec_strip_start = (uint32_t)start;
            stage = 4;
        } else
            return mg_tok_fail(MG_ERR_UNSUPPORTED,
                               "tokenizer.json: decoder Sequence: only Replace(U+2581, \" \"), "
                               "ByteFallback, Fuse, Strip in this order are supported");
    }
    return MG_OK;
}

/* The special tokens around $A of a TemplateProcessing "single" template. */
static mg_status read_template(reader *r, int p) {
    const mg_jdoc *d = &r->d;
    int single = mg_jdoc_get(d, p, "single"), specials = mg_jdoc_get(d, p, "special_tokens");
    if (!mg_jdoc_is(d, single, JSMN_ARRAY))
        return bad("TemplateProcessing.single is not an array");
    int32_t pre[64], post[64];
    uint32_t npre = 0, npost = 0;
    bool seen_a = false;
    int i = single + 1;
    for (int k = 0; k < d->tk[single].size; k++, i = mg_jdoc_skip(d, i)) {
        int seq = mg_jdoc_get(d, i, "Sequence"), sp = mg_jdoc_get(d, i, "SpecialToken");
        if (seq >= 0) {
            if (seen_a || !is_string_field(r, seq, "id", "A"))
                return mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: a TemplateProcessing "
                                                       "single template other than specials "
                                                       "around $A is not supported");
            seen_a = true;
            continue;
        }
        size_t len;
        if (sp < 0 || !jfield_str(r, sp, "id", &len))
            return bad("a TemplateProcessing item is neither Sequence nor SpecialToken");
        /* special_tokens[name].ids */
        int entry = -1;
        if (mg_jdoc_is(d, specials, JSMN_OBJECT)) {
            int j = specials + 1;
            for (int q = 0; q < d->tk[specials].size; q++, j = mg_jdoc_skip(d, j + 1)) {
                size_t kl;
                if (jstr(d, j, &r->buf, &r->cap, &kl) && kl == len && !memcmp(r->buf, r->buf2, len))
                    entry = j + 1;
            }
        }
        int ids = mg_jdoc_get(d, entry, "ids");
        if (!mg_jdoc_is(d, ids, JSMN_ARRAY))
            return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                               "tokenizer.json: TemplateProcessing token \"%s\" has no ids",
                               r->buf2);
        int j = ids + 1;
        for (int q = 0; q < d->tk[ids].size; q++, j++) {
            long long v;
            uint32_t *cnt = seen_a ? &npost : &npre;
            if (!mg_jdoc_int(d, j, &v) || v < 0 || v >= r->t->n_vocab || *cnt >= 64)
                return bad("a TemplateProcessing id is out of range");
            (seen_a ? post : pre)[(*cnt)++] = (int32_t)v;
        }
    }
    if (!seen_a)
        return bad("TemplateProcessing.single has no $A");
    mg_status st = mg_tok_set_ids(&r->t->prefix, &r->t->n_prefix, pre, npre);
    return st ? st : mg_tok_set_ids(&r->t->suffix, &r->t->n_suffix, post, npost);
}

static mg_status read_post(reader *r, int p) {
    const mg_jdoc *d = &r->d;
    if (mg_jdoc_null(d, p) || jtype(d, p, "ByteLevel"))
        return MG_OK;
    if (jtype(d, p, "TemplateProcessing"))
        return read_template(r, p);
    if (jtype(d, p, "Sequence")) {
        int list = mg_jdoc_get(d, p, "processors");
        if (!mg_jdoc_is(d, list, JSMN_ARRAY))
            return bad("post_processor.processors is not an array");
        int i = list + 1;
        for (int k = 0; k < d->tk[list].size; k++, i = mg_jdoc_skip(d, i)) {
            if (jtype(d, i, "Sequence"))
                return unsupported(r, i, "nested post_processor");
            mg_status st = read_post(r, i);
            if (st)
                return st;
        }
        return MG_OK;
    }
    return unsupported(r, p, "post_processor");
}

/* BOS / EOS for mg_tok_bos/eos: the template's first and last special, else common names. */
static void guess_bos_eos(mg_tok *t) {
    if (t->n_prefix)
        t->bos = t->prefix[0];
    if (t->n_suffix)
        t->eos = t->suffix[t->n_suffix - 1];
}

mg_status mg_tok_from_json_text(const char *json, size_t len, mg_tok **out) {
    if (!out)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_from_json_text: out is NULL");
    *out = NULL;
    if (!json)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_from_json_text: json is NULL");
    reader r = {0};
    unsigned pos = 0;
    const int parsed = mg_jdoc_parse(json, len, &r.d, &pos);
    mg_status st = MG_OK;
    if (parsed == 1 || parsed == 3)
        return bad(parsed == 1 ? "truncated JSON" : "empty JSON");
    if (parsed == 2)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "tokenizer.json: malformed JSON near byte %u",
                           pos);
    if (parsed == 4)
        return mg_tok_fail(MG_ERR_OUT_OF_MEMORY, "tokenizer.json: no host memory for the JSON");
    if (!mg_jdoc_is(&r.d, 0, JSMN_OBJECT))
        st = bad("the top level is not an object");
    int model = st ? -1 : mg_jdoc_get(&r.d, 0, "model");
    int added = st ? -1 : mg_jdoc_get(&r.d, 0, "added_tokens");
    long long mx = 0;
    if (!st && !mg_jdoc_is(&r.d, model, JSMN_OBJECT))
        st = bad("no model object");
    if (!st && (!mg_jdoc_null(&r.d, mg_jdoc_get(&r.d, 0, "truncation")) ||
                !mg_jdoc_null(&r.d, mg_jdoc_get(&r.d, 0, "padding"))))
        st = mg_tok_fail(MG_ERR_UNSUPPORTED, "tokenizer.json: truncation and padding are not "
                                             "supported (both must be null)");
    if (!st)
        st = max_id(&r, model, added, &mx);
    if (!st)
        st = mg_tok_alloc((uint32_t)mx + 1, &r.t);
    if (!st)
        st = read_normalizer(&r, mg_jdoc_get(&r.d, 0, "normalizer"));
    if (!st)
        st = read_pre(&r, mg_jdoc_get(&r.d, 0, "pre_tokenizer"), true);
    if (!st)
        st = read_model(&r, model);
    if (!st)
        st = read_added(&r, added);
    if (!st)
        st = read_decoder(&r, mg_jdoc_get(&r.d, 0, "decoder"));
    if (!st)
        st = read_post(&r, mg_jdoc_get(&r.d, 0, "post_processor"));
    if (!st) {
        guess_bos_eos(r.t);
        st = mg_tok_finish(r.t);
    }
    mg_jdoc_free(&r.d);
    free(r.buf);
    free(r.buf2);
    if (st) {
        mg_tok_destroy(r.t);
        return st;
    }
    *out = r.t;
    return MG_OK;
}

mg_status mg_tok_from_json(const char *path, mg_tok **out) {
    if (!out || !path)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_from_json: %s is NULL",
                           !path ? "the path" : "out");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return mg_tok_fail(MG_ERR_NOT_FOUND, "mg_tok_from_json: cannot open %s: %s", path,
                           strerror(errno));
    char *text = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    mg_status st = MG_OK;
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = mg_tok_fail(MG_ERR_NOT_FOUND, "mg_tok_from_json: cannot read %s", path);
    else if ((unsigned long)size > MAX_JSON_BYTES)
        st = mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                         "mg_tok_from_json: %s is %ld bytes, over the "
                         "%u limit",
                         path, size, MAX_JSON_BYTES);
    else if (!(text = malloc((size_t)size + 1)))
        st = mg_tok_fail(MG_ERR_OUT_OF_MEMORY, "mg_tok_from_json: no host memory for %ld bytes",
                         size);
    else if (fread(text, 1, (size_t)size, f) != (size_t)size)
        st = mg_tok_fail(MG_ERR_NOT_FOUND, "mg_tok_from_json: cannot read %s", path);
    fclose(f);
    if (!st) {
        st = mg_tok_from_json_text(text, (size_t)size, out);
        if (st) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", mg_tok_error());
            mg_tok_fail(st, "%s (%s)", msg, path);
        }
    }
    free(text);
    return st;
}
