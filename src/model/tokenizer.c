/* tokenizer.c - the tokenizer of tokenizer.h: its builder and the description constructor
 * (encode in tokenizer_encode.c, decode and the stream decoder in tokenizer_decode.c).
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
