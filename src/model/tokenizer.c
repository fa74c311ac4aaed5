/* tokenizer.c - the tokenizer of tokenizer.h: its builder, the description constructor,
 * encode (added tokens, normalizer, pre-tokenizers, BPE), decode and the stream decoder.
 * The steps mirror the Hugging Face `tokenizers` pipeline one for one, which is what makes
 * the ids equal; where a GGUF description is built, llama.cpp's choices for the same model
 * are taken (noted where they differ). */
#include "tokenizer_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_text[512];

const char *mg_tok_error(void) {
    return error_text;
}

mg_status mg_tok_fail(mg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return st ? st : MG_ERR_INTERNAL;
}

static mg_status oom(const char *what) {
    return mg_tok_fail(MG_ERR_OUT_OF_MEMORY, "tokenizer: no host memory for %s", what);
}

/* Grows *p (elements of `size`) to hold at least `need`; false when out of memory. */
static bool grow(void **p, uint32_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return true;
    if (need > UINT32_MAX / 2)
        return false;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return false;
    *p = q;
    *cap = (uint32_t)c;
    return true;
}

/* A growable byte buffer and id list used while encoding and decoding. */
typedef struct bytes {
    char *p;
    size_t n, cap;
    bool failed;
} bytes;

static void bytes_put(bytes *b, const void *s, size_t n) {
    if (b->failed || n == 0)
        return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n)
            c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->failed = true;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

typedef struct idvec {
    int32_t *p;
    size_t n, cap;
    bool failed;
} idvec;

static void ids_put(idvec *v, int32_t id) {
    if (v->failed)
        return;
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 64;
        int32_t *q = realloc(v->p, c * sizeof *q);
        if (!q) {
            v->failed = true;
            return;
        }
        v->p = q;
        v->cap = c;
    }
    v->p[v->n++] = id;
}

/* ------------------------------------------------------------------ hash tables */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static const char *arena_at(const mg_tok *t, uint32_t off) {
    return t->arena + off;
}

static int32_t smap_find(const mg_tok *t, const tok_smap *m, const char *s, size_t n) {
    if (!m->cap)
        return -1;
    uint32_t mask = m->cap - 1;
    for (uint32_t h = hash_bytes(s, n) & mask;; h = (h + 1) & mask) {
        uint32_t e = m->slots[h];
        if (!e)
            return -1;
        e--;
        if (m->key_len[e] == n && memcmp(arena_at(t, m->key_off[e]), s, n) == 0)
            return m->val[e];
    }
}

/* Inserts (the arena string at off, len) -> val; an existing key takes the new value. */
static bool smap_put(mg_tok *t, tok_smap *m, uint32_t off, uint32_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 1024;
        uint32_t *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return false;
        for (uint32_t e = 0; e < m->n; e++) {
            uint32_t h = hash_bytes(arena_at(t, m->key_off[e]), m->key_len[e]) & (cap - 1);
            while (slots[h])
                h = (h + 1) & (cap - 1);
            slots[h] = e + 1;
        }
        free(m->slots);
        m->slots = slots;
        m->cap = cap;
    }
    const char *s = arena_at(t, off);
    uint32_t mask = m->cap - 1;
    uint32_t h = hash_bytes(s, len) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t e = m->slots[h];
        if (!e)
            break;
        e--;
        if (m->key_len[e] == len && memcmp(arena_at(t, m->key_off[e]), s, len) == 0) {
            m->val[e] = val;
            return true;
        }
    }
    uint32_t cap = m->n_cap;
    if (!grow((void **)&m->key_off, &cap, m->n + 1, sizeof *m->key_off))
        return false;
    cap = m->n_cap;
    if (!grow((void **)&m->key_len, &cap, m->n + 1, sizeof *m->key_len))
        return false;
    cap = m->n_cap;
    if (!grow((void **)&m->val, &cap, m->n + 1, sizeof *m->val))
        return false;
    m->n_cap = cap;
    m->key_off[m->n] = off;
    m->key_len[m->n] = len;
    m->val[m->n] = val;
    m->slots[h] = ++m->n;
    return true;
}

static void smap_free(tok_smap *m) {
    free(m->slots);
    free(m->key_off);
    free(m->key_len);
    free(m->val);
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static uint32_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static bool mmap_find(const tok_mmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    if (!m->cap)
        return false;
    uint64_t k = pair_key(a, b);
    uint32_t mask = m->cap - 1;
    for (uint32_t h = hash_u64(k) & mask;; h = (h + 1) & mask) {
        if (m->keys[h] == UINT64_MAX)
            return false;
        if (m->keys[h] == k) {
            *rank = m->rank[h];
            *merged = m->merged[h];
            return true;
        }
    }
}

static bool mmap_put(tok_mmap *m, uint64_t k, uint32_t rank, int32_t merged, bool first_wins) {
    if ((m->n + 1) * 2 > m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 1024;
        uint64_t *keys = malloc(cap * sizeof *keys);
        uint32_t *ranks = malloc(cap * sizeof *ranks);
        int32_t *mer = malloc(cap * sizeof *mer);
        if (!keys || !ranks || !mer) {
            free(keys);
            free(ranks);
            free(mer);
            return false;
        }
        memset(keys, 0xFF, cap * sizeof *keys);
        for (uint32_t i = 0; i < m->cap; i++) {
            if (m->keys[i] == UINT64_MAX)
                continue;
            uint32_t h = hash_u64(m->keys[i]) & (cap - 1);
            while (keys[h] != UINT64_MAX)
                h = (h + 1) & (cap - 1);
            keys[h] = m->keys[i];
            ranks[h] = m->rank[i];
            mer[h] = m->merged[i];
        }
        free(m->keys);
        free(m->rank);
        free(m->merged);
        m->keys = keys;
        m->rank = ranks;
        m->merged = mer;
        m->cap = cap;
    }
    uint32_t mask = m->cap - 1;
    uint32_t h = hash_u64(k) & mask;
    while (m->keys[h] != UINT64_MAX && m->keys[h] != k)
        h = (h + 1) & mask;
    if (m->keys[h] == k) {
        if (!first_wins) {
            m->rank[h] = rank;
            m->merged[h] = merged;
        }
        return true;
    }
    m->keys[h] = k;
    m->rank[h] = rank;
    m->merged[h] = merged;
    m->n++;
    return true;
}

/* ------------------------------------------------------------------ builder */

/* GPT-2's byte alphabet: printable bytes stand for themselves, the other 68 for U+0100.. in
 * byte order. */
static void byte_alphabet(uint16_t to_cp[256], int16_t to_byte[324]) {
    uint32_t k = 0;
    for (int i = 0; i < 324; i++)
        to_byte[i] = -1;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        to_cp[b] = (uint16_t)(printable ? b : 256 + k++);
        to_byte[to_cp[b]] = (int16_t)b;
    }
}

/* Copies s into the arena (NUL-terminated); returns its offset or UINT32_MAX. */
static uint32_t arena_add(mg_tok *t, const char *s, size_t len) {
    if (t->arena_len + len + 1 > UINT32_MAX)
        return UINT32_MAX;
    if (t->arena_len + len + 1 > t->arena_cap) {
        size_t c = t->arena_cap ? t->arena_cap : 4096;
        while (c < t->arena_len + len + 1)
            c *= 2;
        char *q = realloc(t->arena, c);
        if (!q)
            return UINT32_MAX;
        t->arena = q;
        t->arena_cap = c;
    }
    uint32_t off = (uint32_t)t->arena_len;
    if (len)
        memcpy(t->arena + off, s, len);
    t->arena[off + len] = 0;
    t->arena_len += len + 1;
    return off;
}

mg_status mg_tok_alloc(uint32_t n_vocab, mg_tok **out) {
    mg_tok *t = calloc(1, sizeof *t);
    if (!t)
        return oom("the tokenizer");
    t->n_vocab = n_vocab;
    t->unk = -1;
    t->bos = -1;
    t->eos = -1;
    int16_t to_byte[324];
    byte_alphabet(t->byte_cp, to_byte);
    t->str_off = calloc(n_vocab ? n_vocab : 1, sizeof *t->str_off);
    t->str_len = calloc(n_vocab ? n_vocab : 1, sizeof *t->str_len);
    t->piece_off = calloc(n_vocab ? n_vocab : 1, sizeof *t->piece_off);
    t->piece_len = calloc(n_vocab ? n_vocab : 1, sizeof *t->piece_len);
    t->flags = calloc(n_vocab ? n_vocab : 1, 1);
    t->byte_val = calloc(n_vocab ? n_vocab : 1, 1);
    if (!t->str_off || !t->str_len || !t->piece_off || !t->piece_len || !t->flags || !t->byte_val) {
        mg_tok_destroy(t);
        return oom("the vocabulary");
    }
    *out = t;
    return MG_OK;
}

mg_status mg_tok_set_token(mg_tok *t, int32_t id, const char *s, size_t len) {
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "tokenizer: token id %d out of range", id);
    uint32_t off = arena_add(t, s, len);
    if (off == UINT32_MAX || !smap_put(t, &t->vocab, off, (uint32_t)len, id))
        return oom("the vocabulary");
    t->str_off[id] = off;
    t->str_len[id] = (uint32_t)len;
    t->flags[id] |= TF_PRESENT;
    return MG_OK;
}

int32_t mg_tok_vocab_find(const mg_tok *t, const char *s, size_t len) {
    return smap_find(t, &t->vocab, s, len);
}

mg_status mg_tok_add_merge(mg_tok *t, const char *a, size_t alen, const char *b, size_t blen,
                           uint32_t rank) {
    int32_t ia = mg_tok_vocab_find(t, a, alen), ib = mg_tok_vocab_find(t, b, blen);
    if (ia < 0 || ib < 0)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "tokenizer: merge %u \"%.*s %.*s\": %s is not a token", rank, (int)alen,
                           a, (int)blen, b, ia < 0 ? "the left part" : "the right part");
    char stack[256];
    char *cat = alen + blen <= sizeof stack ? stack : malloc(alen + blen);
    if (!cat)
        return oom("a merge");
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    int32_t im = mg_tok_vocab_find(t, cat, alen + blen);
    if (cat != stack)
        free(cat);
    if (im < 0)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "tokenizer: merge %u \"%.*s %.*s\": the merged token is not in the "
                           "vocabulary",
                           rank, (int)alen, a, (int)blen, b);
    if (!mmap_put(&t->merges, pair_key(ia, ib), rank, im, t->merges_first_wins))
        return oom("the merges");
    return MG_OK;
}

mg_status mg_tok_add_added(mg_tok *t, int32_t id, const char *s, size_t len, bool special,
                           bool lstrip, bool rstrip) {
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "tokenizer: added token id %d out of range",
                           id);
    if (len == 0)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "tokenizer: added token %d is empty", id);
    uint32_t off = arena_add(t, s, len);
    if (off == UINT32_MAX ||
        !grow((void **)&t->added, &t->cap_added, t->n_added + 1, sizeof *t->added))
        return oom("the added tokens");
    if (!smap_put(t, &t->added_map, off, (uint32_t)len, id))
        return oom("the added tokens");
    t->added[t->n_added++] = (tok_added){.id = id,
                                         .off = off,
                                         .len = (uint32_t)len,
                                         .special = special,
                                         .lstrip = lstrip,
                                         .rstrip = rstrip};
    t->str_off[id] = off;
    t->str_len[id] = (uint32_t)len;
    t->flags[id] |= TF_PRESENT | TF_ADDED;
    if (special)
        t->flags[id] |= TF_SPECIAL;
    else
        t->flags[id] &= (uint8_t)~TF_SPECIAL;
    return MG_OK;
}

mg_status mg_tok_add_norm(mg_tok *t, tok_norm_type type, const char *a, size_t alen, const char *b,
                          size_t blen) {
    tok_norm *n = realloc(t->norms, (t->n_norms + 1) * sizeof *n);
    if (!n)
        return oom("the normalizer");
    t->norms = n;
    tok_norm *x = &n[t->n_norms];
    *x = (tok_norm){.type = type, .alen = alen, .blen = blen};
    x->a = malloc(alen + 1);
    x->b = malloc(blen + 1);
    if (!x->a || !x->b) {
        free(x->a);
        free(x->b);
        return oom("the normalizer");
    }
    if (alen)
        memcpy(x->a, a, alen);
    if (blen)
        memcpy(x->b, b, blen);
    t->n_norms++;
    return MG_OK;
}

mg_status mg_tok_add_pre(mg_tok *t, const tok_pre *p) {
    tok_pre *n = realloc(t->pres, (t->n_pres + 1) * sizeof *n);
    if (!n)
        return oom("the pre-tokenizer");
    t->pres = n;
    n[t->n_pres++] = *p;
    return MG_OK;
}

mg_status mg_tok_set_ids(int32_t **dst, uint32_t *n, const int32_t *ids, uint32_t count) {
    int32_t *p = realloc(*dst, (count ? count : 1) * sizeof *p);
    if (!p)
        return oom("the post-processor");
    if (count)
        memcpy(p, ids, count * sizeof *p);
    *dst = p;
    *n = count;
    return MG_OK;
}

/* "<0xNN>" with upper-case hex digits, as the ByteFallback decoder and model spell it. */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
    const mg_tok *t = ctx;
    const tok_added *x = &t->added[*(const uint32_t *)a], *y = &t->added[*(const uint32_t *)b];
    uint8_t fx = (uint8_t)t->arena[x->off], fy = (uint8_t)t->arena[y->off];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static const char META[] = "\xE2\x96\x81"; /* U+2581 */

mg_status mg_tok_finish(mg_tok *t) {
    if (t->n_added) {
        t->added_index = malloc(t->n_added * sizeof *t->added_index);
        if (!t->added_index)
            return oom("the added tokens");
        for (uint32_t i = 0; i < t->n_added; i++)
            t->added_index[i] = i;
        qsort_r(t->added_index, t->n_added, sizeof *t->added_index, cmp_added_len, t);
    }
    for (uint32_t c = 0, k = 0; c <= 256; c++) {
        while (k < t->n_added && (uint8_t)t->arena[t->added[t->added_index[k]].off] < c)
            k++;
        t->added_start[c] = k;
    }
    if (t->unk >= 0 && ((uint32_t)t->unk >= t->n_vocab || !(t->flags[t->unk] & TF_PRESENT)))
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "tokenizer: the unknown token %d is not a "
                           "token",
                           t->unk);
    /* The bytes each token decodes to. */
    int16_t to_byte[324];
    byte_alphabet(t->byte_cp, to_byte);
    bytes b = {0};
    uint32_t *off = t->piece_off, *len = t->piece_len;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TF_PRESENT))
            continue;
        const char *s = t->arena + t->str_off[id];
        size_t n = t->str_len[id];
        b.n = 0;
        int bv = byte_token_value(s, n);
        if (bv >= 0) {
            t->flags[id] |= TF_BYTE;
            t->byte_val[id] = (uint8_t)bv;
        }
        if (t->dec == DEC_BYTELEVEL) {
            bool all = true;
            for (size_t i = 0; i < n && all;) {
                uint32_t cp;
                size_t k = mg_tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
                int v = k && cp < 324 ? to_byte[cp] : -1;
                if (v < 0)
                    all = false;
                else {
                    uint8_t c = (uint8_t)v;
                    bytes_put(&b, &c, 1);
                    i += k;
                }
            }
            if (!all) {
                b.n = 0;
                bytes_put(&b, s, n);
            }
        } else if (t->dec == DEC_PIECES && t->dec_byte_fallback && bv >= 0) {
            uint8_t c = (uint8_t)bv;
            bytes_put(&b, &c, 1);
        } else if ((t->dec == DEC_PIECES && t->dec_replace_meta) || t->dec == DEC_METASPACE) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(s + i, META, 3) == 0) {
                    bytes_put(&b, " ", 1);
                    i += 3;
                } else
                    bytes_put(&b, s + i++, 1);
            }
        } else
            bytes_put(&b, s, n);
        if (b.failed) {
            free(b.p);
            return oom("the decoder");
        }
        uint32_t o = arena_add(t, b.p, b.n);
        if (o == UINT32_MAX) {
            free(b.p);
            return oom("the decoder");
        }
        off[id] = o;
        len[id] = (uint32_t)b.n;
    }
    free(b.p);
    return MG_OK;
}

void mg_tok_destroy(mg_tok *t) {
    if (!t)
        return;
    free(t->arena);
    free(t->str_off);
    free(t->str_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->flags);
    free(t->byte_val);
    free(t->scores);
    smap_free(&t->vocab);
    smap_free(&t->added_map);
    free(t->merges.keys);
    free(t->merges.rank);
    free(t->merges.merged);
    free(t->added);
    free(t->added_index);
    for (uint32_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    free(t->norms);
    free(t->pres);
    free(t->prefix);
    free(t->suffix);
    free(t);
}

/* ------------------------------------------------------------------ from a description */

mg_status mg_tok_create(const mg_tok_desc *d, mg_tok **out) {
    if (!out)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_create: out is NULL");
    *out = NULL;
    if (!d || !d->tokens || d->n_tokens == 0)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_create: %s",
                           !d ? "the description is NULL" : "no tokens");
    if (d->kind != MG_TOK_BYTE_BPE && d->kind != MG_TOK_SPM_BPE)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_create: unknown kind %d", (int)d->kind);
    if (d->n_merges && !d->merges)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "mg_tok_create: n_merges %u but merges is "
                           "NULL",
                           d->n_merges);
    int32_t ids[4] = {d->bos_id, d->eos_id, d->unk_id, d->pad_id};
    for (int k = 0; k < 4; k++)
        if (ids[k] < -1 || ids[k] >= (int64_t)d->n_tokens)
            return mg_tok_fail(
                MG_ERR_INVALID_ARGUMENT, "mg_tok_create: the %s id %d is not a token (%u tokens)",
                (const char *[]){"bos", "eos", "unk", "pad"}[k], ids[k], d->n_tokens);
    if ((d->add_bos && d->bos_id < 0) || (d->add_eos && d->eos_id < 0))
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_create: add_%s without a %s id",
                           d->add_bos && d->bos_id < 0 ? "bos" : "eos",
                           d->add_bos && d->bos_id < 0 ? "bos" : "eos");
    tok_pre pres[2];
    uint32_t n_pres = 0;
    if (d->kind == MG_TOK_BYTE_BPE) {
        const char *pre = d->pre ? d->pre : "default";
        tok_pre bl = {.type = PRE_BYTELEVEL};
        if (!strcmp(pre, "gpt2")) {
            bl.use_regex = true;
            pres[n_pres++] = bl;
        } else if (!strcmp(pre, "smollm")) {
            pres[n_pres++] = (tok_pre){.type = PRE_DIGITS, .individual = true};
            bl.use_regex = true;
            pres[n_pres++] = bl;
        } else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "qwen2")) {
            pres[n_pres++] =
                (tok_pre){.type = PRE_SPLIT, .regex = pre[0] == 'q' ? RE_QWEN2 : RE_LLAMA3};
            pres[n_pres++] = bl;
        } else
            return mg_tok_fail(MG_ERR_UNSUPPORTED,
                               "mg_tok_create: pre-tokenizer \"%s\" is not supported (known: "
                               "gpt2, smollm, llama-bpe, llama3, qwen2)",
                               pre);
        if (d->n_merges == 0)
            return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                               "mg_tok_create: byte-level BPE needs merges");
    } else if (d->n_merges == 0 && !d->scores)
        return mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                           "mg_tok_create: SentencePiece-style BPE needs merges or scores");

    mg_tok *t;
    mg_status st = mg_tok_alloc(d->n_tokens, &t);
    if (st)
        return st;
    t->merges_first_wins = true;
    for (uint32_t i = 0; i < n_pres && !st; i++)
        st = mg_tok_add_pre(t, &pres[i]);
    t->map_bytes = d->kind == MG_TOK_BYTE_BPE;
    /* llama.cpp takes a Llama-3 word that is itself a token whole (ignore_merges). */
    t->ignore_merges = d->kind == MG_TOK_BYTE_BPE && n_pres == 2 && pres[0].type == PRE_SPLIT &&
                       pres[0].regex == RE_LLAMA3;
    t->dec = d->kind == MG_TOK_BYTE_BPE ? DEC_BYTELEVEL : DEC_PIECES;
    if (d->kind == MG_TOK_SPM_BPE) {
        t->byte_fallback = true;
        t->fuse_unk = true;
        t->unk = d->unk_id;
        t->dec_replace_meta = true;
        t->dec_byte_fallback = true;
        t->dec_strip_start = d->add_space_prefix ? 1 : 0;
        if (d->add_space_prefix && !st)
            st = mg_tok_add_norm(t, NORM_PREPEND, META, 3, NULL, 0);
        if (!st)
            st = mg_tok_add_norm(t, NORM_REPLACE, " ", 1, META, 3);
    }
    for (uint32_t i = 0; i < d->n_tokens && !st; i++) {
        const char *s = d->tokens[i];
        if (!s) {
            st = mg_tok_fail(MG_ERR_INVALID_ARGUMENT, "mg_tok_create: token %u is NULL", i);
            break;
        }
        st = mg_tok_set_token(t, (int32_t)i, s, strlen(s));
    }
    for (uint32_t i = 0; i < d->n_merges && !st; i++) {
        const char *m = d->merges[i];
        const char *sp = m && m[0] ? strchr(m + 1, ' ') : NULL;
        if (!sp) {
            st = mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                             "mg_tok_create: merge %u \"%s\" is not two tokens separated by a "
                             "space",
                             i, m ? m : "(null)");
            break;
        }
        st = mg_tok_add_merge(t, m, (size_t)(sp - m), sp + 1, strlen(sp + 1), i);
    }
    if (!st && d->kind == MG_TOK_SPM_BPE && d->n_merges == 0) {
        t->by_score = true;
        t->scores = malloc(d->n_tokens * sizeof *t->scores);
        if (!t->scores)
            st = oom("the scores");
        else
            memcpy(t->scores, d->scores, d->n_tokens * sizeof *t->scores);
    }
    for (uint32_t i = 0; i < d->n_tokens && d->token_types && !st; i++) {
        int32_t ty = d->token_types[i];
        if (ty < 1 || ty > 6) {
            st = mg_tok_fail(MG_ERR_INVALID_ARGUMENT,
                             "mg_tok_create: token %u has type %d "
                             "(1..6 expected)",
                             i, ty);
            break;
        }
        if (ty == MG_TOK_TYPE_CONTROL || ty == MG_TOK_TYPE_UNKNOWN ||
            ty == MG_TOK_TYPE_USER_DEFINED) {
            const char *s = d->tokens[i];
            if (s[0])
                st = mg_tok_add_added(t, (int32_t)i, s, strlen(s), ty != MG_TOK_TYPE_USER_DEFINED,
                                      false, false);
        }
    }
    t->bos = d->bos_id;
    t->eos = d->eos_id;
    if (!st && d->add_bos)
        st = mg_tok_set_ids(&t->prefix, &t->n_prefix, &d->bos_id, 1);
    if (!st && d->add_eos)
        st = mg_tok_set_ids(&t->suffix, &t->n_suffix, &d->eos_id, 1);
    if (!st)
        st = mg_tok_finish(t);
    if (st) {
        mg_tok_destroy(t);
        return st;
    }
    *out = t;
    return MG_OK;
}

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
