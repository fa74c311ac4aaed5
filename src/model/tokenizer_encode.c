/* tokenizer_encode.c - text to ids (tokenizer.h): added tokens, pre-tokenizers, BPE by rank
 * or by score. */
#include "tokenizer_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ BPE */

typedef struct sym {
    int32_t id;
    int32_t prev, next;
    uint32_t off, len; /* bytes of the word; len 0: merged away */
} sym;

typedef struct cand {
    double pri; /* lower first */
    uint32_t pos;
    uint32_t right; /* score path: the right symbol; rank path: unused */
    int32_t merged; /* rank path: the merged id; score path: the merged byte length */
} cand;

typedef struct heap {
    cand *p;
    size_t n, cap;
    bool failed;
} heap;

static bool cand_less(const cand *a, const cand *b) {
    return a->pri < b->pri || (a->pri == b->pri && a->pos < b->pos);
}

static void heap_push(heap *h, cand c) {
    if (h->failed)
        return;
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        cand *q = realloc(h->p, cap * sizeof *q);
        if (!q) {
            h->failed = true;
            return;
        }
        h->p = q;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && cand_less(&c, &h->p[(i - 1) / 2])) {
        h->p[i] = h->p[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->p[i] = c;
}

static cand heap_pop(heap *h) {
    cand top = h->p[0], last = h->p[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < h->n && cand_less(&h->p[l], best)) {
            m = l;
            best = &h->p[l];
        }
        if (r < h->n && cand_less(&h->p[r], best))
            m = r;
        if (m == i)
            break;
        h->p[i] = h->p[m];
        i = m;
    }
    if (h->n)
        h->p[i] = last;
    return top;
}

typedef struct work {
    sym *s;
    size_t n, cap;
    heap h;
    bool failed;
} work;

static void sym_add(work *w, int32_t id, uint32_t off, uint32_t len) {
    if (w->failed)
        return;
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        sym *q = realloc(w->s, cap * sizeof *q);
        if (!q) {
            w->failed = true;
            return;
        }
        w->s = q;
        w->cap = cap;
    }
    w->s[w->n] = (sym){id, (int32_t)w->n - 1, (int32_t)w->n + 1, off, len};
    w->n++;
}

/* Each byte of a character as its <0xNN> token; false when one is missing. */
static bool byte_tokens(const mg_tok *t, const char *s, size_t n, int32_t out[4]) {
    for (size_t i = 0; i < n; i++) {
        char name[7];
        snprintf(name, sizeof name, "<0x%02X>", (uint8_t)s[i]);
        out[i] = mg_tok_vocab_find(t, name, 6);
        if (out[i] < 0)
            return false;
    }
    return true;
}

static void push_rank(const mg_tok *t, work *w, int32_t left) {
    if (left < 0 || w->s[left].next < 0)
        return;
    uint32_t rank;
    int32_t merged;
    if (mmap_find(&t->merges, w->s[left].id, w->s[w->s[left].next].id, &rank, &merged))
        heap_push(&w->h, (cand){(double)rank, (uint32_t)left, 0, merged});
}

/* The `tokenizers` BPE model on one word: characters to ids (byte fallback, unknown), then
 * the lowest-ranked adjacent pair merged first, leftmost on ties. */
static void bpe_rank(const mg_tok *t, work *w, const char *word, size_t n, idvec *out) {
    int32_t unk_pending = -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = mg_tok_utf8_decode((const uint8_t *)word + i, n - i, &cp);
        if (!k)
            k = 1;
        int32_t id = mg_tok_vocab_find(t, word + i, k);
        if (id >= 0) {
            if (unk_pending >= 0) {
                sym_add(w, t->unk, 0, (uint32_t)unk_pending);
                unk_pending = -1;
            }
            sym_add(w, id, (uint32_t)i, (uint32_t)k);
        } else {
            int32_t bt[4];
            if (t->byte_fallback && byte_tokens(t, word + i, k, bt)) {
                /* As `tokenizers` does, a pending unknown is not flushed here. */
                for (size_t j = 0; j < k; j++)
                    sym_add(w, bt[j], (uint32_t)(i + j), 1);
            } else if (t->unk >= 0) {
                if (unk_pending >= 0 && t->fuse_unk)
                    unk_pending += (int32_t)k;
                else {
                    if (unk_pending >= 0)
                        sym_add(w, t->unk, 0, (uint32_t)unk_pending);
                    unk_pending = (int32_t)k;
                }
            }
        }
        i += k;
    }
    if (unk_pending >= 0)
        sym_add(w, t->unk, 0, (uint32_t)unk_pending);
    if (w->failed)
        return;
    if (w->n)
        w->s[w->n - 1].next = -1;
    for (size_t i = 0; i + 1 < w->n; i++)
        push_rank(t, w, (int32_t)i);
    while (w->h.n && !w->h.failed) {
        cand c = heap_pop(&w->h);
        sym *l = &w->s[c.pos];
        if (l->len == 0 || l->next < 0)
            continue;
        sym *r = &w->s[l->next];
        uint32_t rank;
        int32_t merged;
        if (!mmap_find(&t->merges, l->id, r->id, &rank, &merged) || merged != c.merged)
            continue;
        l->id = merged;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->s[r->next].prev = (int32_t)c.pos;
        push_rank(t, w, l->prev);
        push_rank(t, w, (int32_t)c.pos);
    }
    if (w->h.failed)
        w->failed = true;
    for (size_t i = 0; i < w->n; i++)
        if (w->s[i].len)
            ids_put(out, w->s[i].id);
}

static void push_score(const mg_tok *t, work *w, const char *word, int32_t left) {
    if (left < 0 || w->s[left].next < 0)
        return;
    const sym *l = &w->s[left], *r = &w->s[l->next];
    int32_t id = mg_tok_vocab_find(t, word + l->off, l->len + r->len);
    if (id >= 0)
        heap_push(&w->h, (cand){-(double)t->scores[id], (uint32_t)left, (uint32_t)l->next,
                                (int32_t)(l->len + r->len)});
}

/* llama.cpp's SentencePiece BPE on one word: characters as symbols, the adjacent pair whose
 * concatenation is the highest-scoring token merged first, leftmost on ties; a symbol that is
 * not a token becomes its <0xNN> byte tokens, or the unknown token. */
static void bpe_score(const mg_tok *t, work *w, const char *word, size_t n, idvec *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = mg_tok_utf8_decode((const uint8_t *)word + i, n - i, &cp);
        if (!k)
            k = 1;
        sym_add(w, -1, (uint32_t)i, (uint32_t)k);
        i += k;
    }
    if (w->failed)
        return;
    if (w->n)
        w->s[w->n - 1].next = -1;
    for (size_t i = 0; i + 1 < w->n; i++)
        push_score(t, w, word, (int32_t)i);
    while (w->h.n && !w->h.failed) {
        cand c = heap_pop(&w->h);
        sym *l = &w->s[c.pos], *r = &w->s[c.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != (uint32_t)c.merged)
            continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->s[r->next].prev = (int32_t)c.pos;
        push_score(t, w, word, l->prev);
        push_score(t, w, word, (int32_t)c.pos);
    }
    if (w->h.failed)
        w->failed = true;
    for (int32_t i = w->n ? 0 : -1; i >= 0; i = w->s[i].next) {
        const sym *s = &w->s[i];
        int32_t id = mg_tok_vocab_find(t, word + s->off, s->len);
        int32_t bt[4];
        if (id >= 0)
            ids_put(out, id);
        else if (s->len <= 4 && byte_tokens(t, word + s->off, s->len, bt))
            for (uint32_t j = 0; j < s->len; j++)
                ids_put(out, bt[j]);
        else if (t->unk >= 0)
            ids_put(out, t->unk);
    }
}

static void bpe_word(const mg_tok *t, work *w, const char *word, size_t n, idvec *out) {
    if (n == 0)
        return;
    if (t->ignore_merges) {
        int32_t id = mg_tok_vocab_find(t, word, n);
        if (id >= 0) {
            ids_put(out, id);
            return;
        }
    }
    w->n = 0;
    w->h.n = 0;
    if (t->by_score)
        bpe_score(t, w, word, n, out);
    else
        bpe_rank(t, w, word, n, out);
}

/* ------------------------------------------------------------------ pre-tokenizers */

/* A list of pieces: spans of one buffer. */
typedef struct span {
    size_t off, len;
    bool first; /* starts at offset 0 of the original text (Metaspace "first") */
} span;

typedef struct pieces {
    bytes buf;
    span *s;
    size_t n, cap;
    bool failed;
} pieces;

static void piece_add(pieces *p, const char *s, size_t n, bool first) {
    if (p->failed || n == 0)
        return;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        span *q = realloc(p->s, cap * sizeof *q);
        if (!q) {
            p->failed = true;
            return;
        }
        p->s = q;
        p->cap = cap;
    }
    size_t off = p->buf.n;
    bytes_put(&p->buf, s, n);
    p->s[p->n++] = (span){off, n, first};
}

/* Code points of s[0..n) with their byte offsets (cps[n_cp] = end). */
typedef struct cpbuf {
    uint32_t *cp;
    size_t *at;
    size_t n, cap;
} cpbuf;

static bool to_cps(cpbuf *c, const char *s, size_t n) {
    if (n + 1 > c->cap) {
        uint32_t *cp = realloc(c->cp, (n + 1) * sizeof *cp);
        if (!cp)
            return false;
        c->cp = cp;
        size_t *at = realloc(c->at, (n + 1) * sizeof *at);
        if (!at)
            return false;
        c->at = at;
        c->cap = n + 1;
    }
    c->n = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = mg_tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (!k) { /* cannot happen on checked input; keep going byte by byte */
            cp = 0xFFFD;
            k = 1;
        }
        c->cp[c->n] = cp;
        c->at[c->n++] = i;
        i += k;
    }
    c->at[c->n] = n;
    return true;
}

/* One pre-tokenizer over every piece of `in`, into `out`. */
static bool pre_step(const tok_pre *p, const pieces *in, pieces *out, cpbuf *c) {
    for (size_t k = 0; k < in->n; k++) {
        const char *s = in->buf.p + in->s[k].off;
        size_t n = in->s[k].len;
        bool first = in->s[k].first;
        if (p->type == PRE_METASPACE) {
            /* spaces to the replacement; prepend it; split before each one. */
            char rep[4];
            size_t rl = mg_tok_utf8_encode(p->replacement, rep);
            bytes tmp = {0};
            bool starts = n >= rl && memcmp(s, rep, rl) == 0;
            bool pre =
                !starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first));
            if (n && s[0] == ' ')
                pre = false;
            if (pre)
                bytes_put(&tmp, rep, rl);
            for (size_t i = 0; i < n; i++) {
                if (s[i] == ' ')
                    bytes_put(&tmp, rep, rl);
                else
                    bytes_put(&tmp, s + i, 1);
            }
            if (tmp.failed)
                return false;
            if (!p->split)
                piece_add(out, tmp.p, tmp.n, first);
            else {
                size_t start = 0;
                for (size_t i = 1; i + rl <= tmp.n; i++)
                    if (memcmp(tmp.p + i, rep, rl) == 0) {
                        piece_add(out, tmp.p + start, i - start, first && start == 0);
                        start = i;
                    }
                piece_add(out, tmp.p + start, tmp.n - start, first && start == 0);
            }
            free(tmp.p);
            continue;
        }
        bytes tmp = {0};
        if (p->type == PRE_BYTELEVEL && p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            bytes_put(&tmp, " ", 1);
            bytes_put(&tmp, s, n);
            if (tmp.failed)
                return false;
            s = tmp.p;
            n = tmp.n;
        }
        if (p->type == PRE_BYTELEVEL && !p->use_regex) {
            piece_add(out, s, n, first);
            free(tmp.p);
            continue;
        }
        if (!to_cps(c, s, n)) {
            free(tmp.p);
            return false;
        }
        size_t i = 0;
        while (i < c->n) {
            size_t m;
            if (p->type == PRE_DIGITS) {
                bool dig = mg_tok_uclass(c->cp[i]) == UC_N;
                m = 1;
                if (!dig || !p->individual)
                    while (i + m < c->n && (mg_tok_uclass(c->cp[i + m]) == UC_N) == dig)
                        m++;
            } else if (p->type == PRE_BYTELEVEL || p->regex == RE_GPT2)
                m = mg_tok_match_gpt2(c->cp, c->n, i);
            else
                m = mg_tok_match_llama3(c->cp, c->n, i, p->regex == RE_QWEN2 ? 1 : 3);
            piece_add(out, s + c->at[i], c->at[i + m] - c->at[i], first && i == 0);
            i += m;
        }
        free(tmp.p);
    }
    return !out->failed;
}

/* ------------------------------------------------------------------ encode */

typedef struct enc {
    const mg_tok *t;
    idvec ids;
    work w;
    cpbuf c;
    pieces a, b;
    bytes mapped;
    bool failed;
} enc;

static bool is_ws_cp(const char *s, size_t n, size_t *k) {
    uint32_t cp;
    *k = mg_tok_utf8_decode((const uint8_t *)s, n, &cp);
    return *k && mg_tok_uclass(cp) == UC_S;
}

/* Pre-tokenizers and the model on text (already normalized). */
static void encode_plain(enc *e, const char *s, size_t n, bool first) {
    const mg_tok *t = e->t;
    if (n == 0)
        return;
    e->a.n = e->a.buf.n = 0;
    piece_add(&e->a, s, n, first);
    for (uint32_t k = 0; k < t->n_pres; k++) {
        e->b.n = e->b.buf.n = 0;
        if (!pre_step(&t->pres[k], &e->a, &e->b, &e->c)) {
            e->failed = true;
            return;
        }
        pieces tmp = e->a;
        e->a = e->b;
        e->b = tmp;
    }
    for (size_t k = 0; k < e->a.n; k++) {
        const char *p = e->a.buf.p + e->a.s[k].off;
        size_t len = e->a.s[k].len;
        if (t->map_bytes) {
            e->mapped.n = 0;
            for (size_t i = 0; i < len; i++) {
                char u[4];
                bytes_put(&e->mapped, u, mg_tok_utf8_encode(t->byte_cp[(uint8_t)p[i]], u));
            }
            if (e->mapped.failed) {
                e->failed = true;
                return;
            }
            p = e->mapped.p;
            len = e->mapped.n;
        }
        bpe_word(t, &e->w, p, len, &e->ids);
        if (e->w.failed) {
            e->failed = true;
            return;
        }
    }
}

/* Finds added tokens in s[0..n) (leftmost, longest; special ones only with parse_special),
 * calling back for the text between them. lstrip / rstrip tokens take the whitespace beside
 * them along. */
typedef void (*text_fn)(enc *e, const char *s, size_t n, bool first);

static void split_added(enc *e, const char *s, size_t n, bool first, bool parse_special,
                        text_fn fn) {
    const mg_tok *t = e->t;
    size_t last = 0, i = 0;
    while (i < n) {
        uint8_t c = (uint8_t)s[i];
        const tok_added *hit = NULL;
        for (uint32_t k = t->added_start[c]; k < t->added_start[c + 1]; k++) {
            const tok_added *a = &t->added[t->added_index[k]];
            if (a->special && !parse_special)
                continue;
            if (a->len <= n - i && memcmp(s + i, t->arena + a->off, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, end = i + hit->len, k;
        if (hit->lstrip)
            while (start > last) {
                size_t back = 1;
                while (back < start - last && back < 4 && ((uint8_t)s[start - back] & 0xC0) == 0x80)
                    back++;
                if (!is_ws_cp(s + start - back, back, &k) || k != back)
                    break;
                start -= back;
            }
        if (hit->rstrip)
            while (end < n && is_ws_cp(s + end, n - end, &k))
                end += k;
        fn(e, s + last, start - last, first && last == 0);
        ids_put(&e->ids, hit->id);
        last = i = end;
    }
    fn(e, s + last, n - last, first && last == 0);
}

/* A stretch of the input between added tokens: normalizer, then the pre-tokenizers and the
 * model. */
static void raw_text(enc *e, const char *s, size_t n, bool first) {
    const mg_tok *t = e->t;
    if (n == 0)
        return;
    bytes cur = {0}, nxt = {0};
    bytes_put(&cur, s, n);
    for (uint32_t k = 0; k < t->n_norms && !cur.failed; k++) {
        const tok_norm *m = &t->norms[k];
        nxt.n = 0;
        if (m->type == NORM_PREPEND) {
            if (cur.n) {
                bytes_put(&nxt, m->a, m->alen);
                bytes_put(&nxt, cur.p, cur.n);
            }
        } else {
            for (size_t i = 0; i < cur.n;) {
                if (m->alen && cur.n - i >= m->alen && memcmp(cur.p + i, m->a, m->alen) == 0) {
                    bytes_put(&nxt, m->b, m->blen);
                    i += m->alen;
                } else
                    bytes_put(&nxt, cur.p + i++, 1);
            }
        }
        bytes tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    if (cur.failed || nxt.failed)
        e->failed = true;
    else
        encode_plain(e, cur.p, cur.n, first);
    free(cur.p);
    free(nxt.p);
}

mg_status mg_tok_encode(const mg_tok *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *ids, size_t cap, size_t *n) {
    if (n)
        *n = 0;
    if (!t || !n || (!text && len) || (!ids && cap))
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_encode: %s is NULL",
                           !t            ? "the tokenizer"
                           : !n          ? "n"
                           : !ids && cap ? "ids"
                                         : "text");
    size_t bad = len ? mg_tok_utf8_check((const uint8_t *)text, len) : 0;
    if (bad < len)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "mg_tok_encode: the text is not valid UTF-8 at byte %zu", bad);
    enc e = {.t = t};
    if (add_special)
        for (uint32_t i = 0; i < t->n_prefix; i++)
            ids_put(&e.ids, t->prefix[i]);
    if (len)
        split_added(&e, text, len, true, parse_special, raw_text);
    if (add_special)
        for (uint32_t i = 0; i < t->n_suffix; i++)
            ids_put(&e.ids, t->suffix[i]);
    bool failed = e.failed || e.ids.failed || e.w.failed;
    free(e.w.s);
    free(e.w.h.p);
    free(e.c.cp);
    free(e.c.at);
    free(e.a.buf.p);
    free(e.a.s);
    free(e.b.buf.p);
    free(e.b.s);
    free(e.mapped.p);
    if (failed) {
        free(e.ids.p);
        return oom("encoding");
    }
    *n = e.ids.n;
    size_t k = e.ids.n < cap ? e.ids.n : cap;
    if (k)
        memcpy(ids, e.ids.p, k * sizeof *ids);
    free(e.ids.p);
    if (e.ids.n > cap)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "mg_tok_encode: the text needs %zu ids, the array holds %zu", e.ids.n,
                           cap);
    return MG_OK;
}
