/* tokenizer_internal.h - the tokenizer's representation, shared by tokenizer.c (encode,
 * decode, the builder), tokenizer_pretok.c (Unicode classes, pre-tokenizer matchers) and
 * tokenizer_json.c (the tokenizer.json reader). Not part of any public interface. */
#ifndef METRALE_MODEL_TOKENIZER_INTERNAL_H
#define METRALE_MODEL_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
