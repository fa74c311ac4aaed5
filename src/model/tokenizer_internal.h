/* tokenizer_internal.h - the tokenizer's representation, shared by tokenizer.c (encode,
 * decode, the builder), tokenizer_pretok.c (Unicode classes, pre-tokenizer matchers) and
 * tokenizer_json.c (the tokenizer.json reader). Not part of any public interface. */
#ifndef METRALE_MODEL_TOKENIZER_INTERNAL_H
#define METRALE_MODEL_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* Failure with a one-line message for mg_tok_error(); returns st. */
__attribute__((format(printf, 2, 3))) mg_status mg_tok_fail(mg_status st, const char *fmt, ...);

/* ------------------------------------------------------------------ Unicode */

enum { UC_OTHER = 0, UC_L = 1, UC_N = 2, UC_S = 3 };
int mg_tok_uclass(uint32_t cp);
/* Decodes the UTF-8 character at s[0..n) into *cp; returns its length, or 0 when it is not
 * valid UTF-8 (overlong, surrogate, beyond U+10FFFF, truncated). */
size_t mg_tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
size_t mg_tok_utf8_encode(uint32_t cp, char out[4]);
/* The first invalid byte offset of s[0..n), or n when all of it is valid UTF-8. */
size_t mg_tok_utf8_check(const uint8_t *s, size_t n);

/* ------------------------------------------------------------------ pipeline steps */

typedef enum { NORM_PREPEND, NORM_REPLACE } tok_norm_type;
typedef struct tok_norm {
    tok_norm_type type;
    char *a; /* PREPEND: the text; REPLACE: the pattern */
    size_t alen;
    char *b; /* REPLACE: the replacement */
    size_t blen;
} tok_norm;

typedef enum { PRE_BYTELEVEL, PRE_DIGITS, PRE_SPLIT, PRE_METASPACE } tok_pre_type;
typedef enum { RE_GPT2, RE_LLAMA3, RE_QWEN2 } tok_regex;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend;
typedef struct tok_pre {
    tok_pre_type type;
    bool add_prefix_space; /* BYTELEVEL */
    bool use_regex;        /* BYTELEVEL: split with the GPT-2 regex */
    bool individual;       /* DIGITS: each digit alone (else runs of digits) */
    tok_regex regex;       /* SPLIT (behavior Isolated) */
    uint32_t replacement;  /* METASPACE: the code point spaces become */
    tok_prepend prepend;   /* METASPACE */
    bool split;            /* METASPACE: split before each replacement (MergedWithNext) */
} tok_pre;

typedef enum {
    DEC_JOIN,      /* no decoder: token strings joined with " " */
    DEC_BYTELEVEL, /* byte alphabet back to bytes, then lossy UTF-8 */
    DEC_PIECES,    /* per token "▁" -> " " (optionally), byte fallback runs, strip leading */
    DEC_METASPACE, /* Metaspace decoder: "▁" -> " ", all "▁" of the first token dropped */
} tok_dec_type;

typedef struct tok_added {
    int32_t id;
    uint32_t off; /* its text in the string arena */
    uint32_t len;
    bool special, lstrip, rstrip;
} tok_added;

/* Open-addressing hash tables. */
typedef struct tok_smap { /* string -> id */
    uint32_t *slots;      /* entry index + 1; 0 empty */
    uint32_t cap;         /* power of two */
    uint32_t *key_off, *key_len;
    int32_t *val;
    uint32_t n, n_cap;
} tok_smap;

typedef struct tok_mmap { /* (left id, right id) -> (rank, merged id) */
    uint64_t *keys;       /* UINT64_MAX empty */
    uint32_t *rank;
    int32_t *merged;
    uint32_t cap, n;
} tok_mmap;

enum { TF_PRESENT = 1, TF_SPECIAL = 2, TF_ADDED = 4, TF_BYTE = 8 };

struct mg_tok {
    uint32_t n_vocab;
    char *arena; /* NUL-terminated strings */
    size_t arena_len, arena_cap;
    uint32_t *str_off, *str_len;     /* the token string per id */
    uint32_t *piece_off, *piece_len; /* the decoded bytes per id */
    uint8_t *flags;                  /* TF_* per id */
    uint8_t *byte_val;               /* TF_BYTE: the byte */
    uint16_t byte_cp[256];           /* the byte alphabet's code point per byte */
    float *scores;                   /* NULL unless merging by score */

    tok_smap vocab; /* the model's vocabulary (what BPE looks up) */
    tok_smap added_map;
    tok_mmap merges;
    bool merges_first_wins; /* duplicate merge lines: llama.cpp keeps the first */

    tok_added *added;
    uint32_t n_added, cap_added;
    /* added tokens by first byte, longest first: indices into added[] */
    uint32_t *added_index, added_start[257];

    tok_norm *norms;
    uint32_t n_norms;
    tok_pre *pres;
    uint32_t n_pres;

    /* model */
    bool map_bytes; /* a ByteLevel pre-tokenizer: BPE runs on the byte alphabet */
    bool byte_fallback;
    bool fuse_unk;
    bool ignore_merges;
    bool by_score;
    int32_t unk;

    /* decoder */
    tok_dec_type dec;
    bool dec_replace_meta; /* DEC_PIECES: "▁" -> " " */
    bool dec_byte_fallback;
    uint32_t dec_strip_start; /* DEC_PIECES: leading spaces stripped from the text */
    bool dec_meta_first;      /* DEC_METASPACE: prepend scheme is not "never" */

    int32_t *prefix, *suffix; /* added by add_special */
    uint32_t n_prefix, n_suffix;
    int32_t bos, eos;
};

/* Builder (tokenizer.c), used by mg_tok_create and the JSON reader. */
mg_status mg_tok_alloc(uint32_t n_vocab, mg_tok **out);
/* A model vocabulary entry; a later one for the same string replaces it in the lookup. */
mg_status mg_tok_set_token(mg_tok *t, int32_t id, const char *s, size_t len);
mg_status mg_tok_add_merge(mg_tok *t, const char *a, size_t alen, const char *b, size_t blen,
                           uint32_t rank);
mg_status mg_tok_add_added(mg_tok *t, int32_t id, const char *s, size_t len, bool special,
                           bool lstrip, bool rstrip);
mg_status mg_tok_add_norm(mg_tok *t, tok_norm_type type, const char *a, size_t alen, const char *b,
                          size_t blen);
mg_status mg_tok_add_pre(mg_tok *t, const tok_pre *p);
mg_status mg_tok_set_ids(int32_t **dst, uint32_t *n, const int32_t *ids, uint32_t count);
/* Derives the decode pieces and the added-token index; checks what spans several parts. */
mg_status mg_tok_finish(mg_tok *t);
int32_t mg_tok_vocab_find(const mg_tok *t, const char *s, size_t len);

/* Pre-tokenizer matchers (tokenizer_pretok.c): the length, in code points, of the regex
 * match that starts at cp[i] (always >= 1: every code point is matched by some branch). */
size_t mg_tok_match_gpt2(const uint32_t *cp, size_t n, size_t i);
size_t mg_tok_match_llama3(const uint32_t *cp, size_t n, size_t i, size_t max_digits);

/* SentencePiece's space, U+2581 "▁" in UTF-8. */
static const char META[] = "\xE2\x96\x81";

/* ---- small helpers shared by tokenizer.c (building), tokenizer_encode.c and
 * tokenizer_decode.c */

static inline mg_status oom(const char *what) {
    return mg_tok_fail(MG_ERR_OUT_OF_MEMORY, "tokenizer: no host memory for %s", what);
}

/* Grows *p (elements of `size`) to hold at least `need`; false when out of memory. */
static inline bool grow(void **p, uint32_t *cap, size_t need, size_t size) {
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

static inline void bytes_put(bytes *b, const void *s, size_t n) {
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

static inline void ids_put(idvec *v, int32_t id) {
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

static inline uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static inline const char *arena_at(const mg_tok *t, uint32_t off) {
    return t->arena + off;
}

static inline int32_t smap_find(const mg_tok *t, const tok_smap *m, const char *s, size_t n) {
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
static inline bool smap_put(mg_tok *t, tok_smap *m, uint32_t off, uint32_t len, int32_t val) {
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

static inline void smap_free(tok_smap *m) {
    free(m->slots);
    free(m->key_off);
    free(m->key_len);
    free(m->val);
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static inline uint32_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static inline bool mmap_find(const tok_mmap *m, int32_t a, int32_t b, uint32_t *rank,
                             int32_t *merged) {
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

static inline bool mmap_put(tok_mmap *m, uint64_t k, uint32_t rank, int32_t merged,
                            bool first_wins) {
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

#endif
