/* tokenizer_decode.c - ids to text (tokenizer.h): the batch and the streaming decoders, which
 * share one state machine, and the token accessors. */
#include "tokenizer_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ decode */

struct mg_tok_stream {
    const mg_tok *t;
    bool skip_special;
    bytes pend;      /* byte level: an incomplete UTF-8 tail; pieces: a <0xNN> run */
    size_t n_tokens; /* tokens taken, special ones left out by skip_special not counted */
    uint32_t strip;  /* leading spaces still to strip */
    bool strip_done;
    bytes out; /* what the call emits */
};

static const char FFFD[] = "\xEF\xBF\xBD";

/* Emits through the leading-space strip. */
static void emit(mg_tok_stream *s, const char *p, size_t n) {
    while (!s->strip_done && n) {
        if (s->strip && p[0] == ' ') {
            s->strip--;
            p++;
            n--;
        } else
            s->strip_done = true;
        if (!s->strip)
            s->strip_done = true;
    }
    bytes_put(&s->out, p, n);
}

/* Length of the well-formed character at p (>0), -k for an ill-formed maximal subpart of k
 * bytes, 0 for a well-formed but incomplete prefix running to the end. */
static int utf8_step(const uint8_t *p, size_t n) {
    uint8_t b = p[0];
    if (b < 0x80)
        return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        lo = b == 0xE0 ? 0xA0 : 0x80;
        hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        lo = b == 0xF0 ? 0x90 : 0x80;
        hi = b == 0xF4 ? 0x8F : 0xBF;
    } else
        return -1;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n)
            return 0;
        uint8_t x = p[k];
        if (k == 1 ? (x < lo || x > hi) : (x & 0xC0) != 0x80)
            return -k;
    }
    return need;
}

/* Byte-level: emits the complete part of pend (+ more), keeps an incomplete tail. */
static void lossy_emit(mg_tok_stream *s, bool final) {
    const uint8_t *p = (const uint8_t *)s->pend.p;
    size_t n = s->pend.n, i = 0;
    while (i < n) {
        int k = utf8_step(p + i, n - i);
        if (k > 0) {
            emit(s, (const char *)p + i, (size_t)k);
            i += (size_t)k;
        } else if (k < 0) {
            emit(s, FFFD, 3);
            i += (size_t)-k;
        } else if (final) {
            emit(s, FFFD, 3);
            i = n;
        } else
            break;
    }
    if (i < n)
        memmove(s->pend.p, s->pend.p + i, n - i);
    s->pend.n = n - i;
}

/* A finished run of <0xNN> tokens: its bytes when valid UTF-8 as a whole, else U+FFFD each. */
static void flush_run(mg_tok_stream *s) {
    if (!s->pend.n)
        return;
    if (mg_tok_utf8_check((const uint8_t *)s->pend.p, s->pend.n) == s->pend.n)
        emit(s, s->pend.p, s->pend.n);
    else
        for (size_t i = 0; i < s->pend.n; i++)
            emit(s, FFFD, 3);
    s->pend.n = 0;
}

static void stream_take(mg_tok_stream *s, int32_t id) {
    const mg_tok *t = s->t;
    if (s->skip_special && (t->flags[id] & TF_SPECIAL))
        return;
    const char *piece = t->arena + t->piece_off[id];
    size_t plen = t->piece_len[id];
    switch (t->dec) {
    case DEC_BYTELEVEL:
        bytes_put(&s->pend, piece, plen);
        lossy_emit(s, false);
        break;
    case DEC_PIECES:
        if (t->dec_byte_fallback && (t->flags[id] & TF_BYTE))
            bytes_put(&s->pend, piece, plen);
        else {
            flush_run(s);
            emit(s, piece, plen);
        }
        break;
    case DEC_METASPACE:
        if (s->n_tokens == 0 && t->dec_meta_first) {
            const char *raw = t->arena + t->str_off[id];
            size_t n = t->str_len[id];
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(raw + i, META, 3) == 0)
                    i += 3;
                else
                    emit(s, raw + i++, 1);
            }
        } else
            emit(s, piece, plen);
        break;
    case DEC_JOIN:
        if (s->n_tokens)
            emit(s, " ", 1);
        emit(s, piece, plen);
        break;
    }
    s->n_tokens++;
}

static void stream_end(mg_tok_stream *s) {
    if (s->t->dec == DEC_BYTELEVEL)
        lossy_emit(s, true);
    else
        flush_run(s);
    s->pend.n = 0;
    s->n_tokens = 0;
    s->strip = s->t->dec == DEC_PIECES ? s->t->dec_strip_start : 0;
    s->strip_done = s->strip == 0;
}

static void stream_init(mg_tok_stream *s, const mg_tok *t, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    s->strip = t->dec == DEC_PIECES ? t->dec_strip_start : 0;
    s->strip_done = s->strip == 0;
}

static mg_status check_id(const mg_tok *t, int32_t id, const char *fn) {
    if (id < 0 || (uint32_t)id >= t->n_vocab || !(t->flags[id] & TF_PRESENT))
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "%s: id %d is not a token (vocabulary of "
                           "%u)",
                           fn, id, t->n_vocab);
    return MG_OK;
}

/* Copies text out under the buffer rule of tokenizer.h. */
static mg_status copy_out(const char *fn, const bytes *b, char *out, size_t cap, size_t *len) {
    *len = b->n;
    if (b->n + 1 > cap)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "%s: the text needs %zu bytes and a NUL, the buffer holds %zu", fn, b->n,
                           cap);
    if (b->n)
        memcpy(out, b->p, b->n);
    out[b->n] = 0;
    return MG_OK;
}

mg_status mg_tok_decode(const mg_tok *t, const int32_t *ids, size_t n, bool skip_special, char *out,
                        size_t cap, size_t *len) {
    if (len)
        *len = 0;
    if (!t || !len || (!ids && n) || (!out && cap))
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_decode: %s is NULL",
                           !t            ? "the tokenizer"
                           : !len        ? "len"
                           : !out && cap ? "out"
                                         : "ids");
    for (size_t i = 0; i < n; i++)
        if (check_id(t, ids[i], "mg_tok_decode"))
            return MG_ERR_INVALID_ARGUMENT;
    mg_tok_stream s;
    stream_init(&s, t, skip_special);
    for (size_t i = 0; i < n; i++)
        stream_take(&s, ids[i]);
    stream_end(&s);
    mg_status st = s.out.failed || s.pend.failed ? oom("decoding")
                                                 : copy_out("mg_tok_decode", &s.out, out, cap, len);
    free(s.pend.p);
    free(s.out.p);
    return st;
}

mg_status mg_tok_stream_create(const mg_tok *t, bool skip_special, mg_tok_stream **out) {
    if (!t || !out)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_stream_create: %s is NULL",
                           !t ? "the tokenizer" : "out");
    mg_tok_stream *s = malloc(sizeof *s);
    if (!s)
        return oom("a stream decoder");
    stream_init(s, t, skip_special);
    *out = s;
    return MG_OK;
}

/* Runs one step on a copy of the state, keeping it only when the text fits `cap`. */
static mg_status stream_call(mg_tok_stream *s, int32_t id, bool finish, char *out, size_t cap,
                             size_t *len, const char *fn) {
    if (len)
        *len = 0;
    if (!s || !len || (!out && cap))
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                           !s     ? "the stream"
                           : !len ? "len"
                                  : "out");
    if (!finish && check_id(s->t, id, fn))
        return MG_ERR_INVALID_ARGUMENT;
    mg_tok_stream c = *s;
    c.pend = (bytes){0};
    c.out = (bytes){0};
    bytes_put(&c.pend, s->pend.p, s->pend.n);
    if (finish)
        stream_end(&c);
    else
        stream_take(&c, id);
    mg_status st =
        c.out.failed || c.pend.failed ? oom("decoding") : copy_out(fn, &c.out, out, cap, len);
    free(c.out.p);
    if (st) {
        free(c.pend.p);
        return st;
    }
    free(s->pend.p);
    *s = c;
    s->out = (bytes){0};
    return MG_OK;
}

mg_status mg_tok_stream_put(mg_tok_stream *s, int32_t id, char *out, size_t cap, size_t *len) {
    return stream_call(s, id, false, out, cap, len, "mg_tok_stream_put");
}

mg_status mg_tok_stream_finish(mg_tok_stream *s, char *out, size_t cap, size_t *len) {
    return stream_call(s, 0, true, out, cap, len, "mg_tok_stream_finish");
}

void mg_tok_stream_destroy(mg_tok_stream *s) {
    if (!s)
        return;
    free(s->pend.p);
    free(s->out.p);
    free(s);
}

/* ------------------------------------------------------------------ accessors */

mg_status mg_tok_token_to_piece(const mg_tok *t, int32_t id, const char **piece, size_t *len) {
    if (!t || !piece || !len)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_token_to_piece: %s is NULL",
                           !t       ? "the tokenizer"
                           : !piece ? "piece"
                                    : "len");
    if (check_id(t, id, "mg_tok_token_to_piece"))
        return MG_ERR_INVALID_ARGUMENT;
    *piece = t->arena + t->piece_off[id];
    *len = t->piece_len[id];
    return MG_OK;
}

const char *mg_tok_token_text(const mg_tok *t, int32_t id) {
    if (!t || id < 0 || (uint32_t)id >= t->n_vocab || !(t->flags[id] & TF_PRESENT))
        return NULL;
    return t->arena + t->str_off[id];
}

int32_t mg_tok_token_id(const mg_tok *t, const char *text) {
    if (!t || !text)
        return -1;
    size_t n = strlen(text);
    int32_t id = smap_find(t, &t->added_map, text, n);
    return id >= 0 ? id : smap_find(t, &t->vocab, text, n);
}

uint32_t mg_tok_vocab_size(const mg_tok *t) {
    return t ? t->n_vocab : 0;
}

int32_t mg_tok_bos(const mg_tok *t) {
    return t ? t->bos : -1;
}

int32_t mg_tok_eos(const mg_tok *t) {
    return t ? t->eos : -1;
}

bool mg_tok_is_special(const mg_tok *t, int32_t id) {
    return t && id >= 0 && (uint32_t)id < t->n_vocab && (t->flags[id] & TF_SPECIAL);
}
