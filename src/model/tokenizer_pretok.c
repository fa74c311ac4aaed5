/* tokenizer_pretok.c - UTF-8, the Unicode classes and the pre-tokenizer regexes, matched by
 * hand. Each matcher follows its regex's alternation in order with the backtracking a
 * regex engine would do (leftmost branch first, greedy repeats), so it splits exactly where
 * Oniguruma (the `tokenizers` package) and llama.cpp split, given the same Unicode tables:
 *
 * GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Qwen2:   the Llama-3 one with \p{N} in place of \p{N}{1,3}. */
#include "tokenizer_internal.h"

#include "tokenizer_unicode_tables.h"

int mg_tok_uclass(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
            return UC_L;
        if (cp >= '0' && cp <= '9')
            return UC_N;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
            return UC_S;
        return UC_OTHER;
    }
    size_t lo = 0, hi = MG_TOK_UNICODE_RANGES;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < mg_tok_uranges[mid].lo)
            hi = mid;
        else if (cp > mg_tok_uranges[mid].hi)
            lo = mid + 1;
        else
            return mg_tok_uranges[mid].cls;
    }
    return UC_OTHER;
}

size_t mg_tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0)
        return 0;
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < need || s[1] < lo || s[1] > hi)
        return 0;
    uint32_t v = b & (0x7F >> need);
    for (size_t k = 1; k < need; k++) {
        if (k > 1 && (s[k] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    *cp = v;
    return need;
}

size_t mg_tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t mg_tok_utf8_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = mg_tok_utf8_decode(s + i, n - i, &cp);
        if (!k)
            return i;
        i += k;
    }
    return n;
}

/* ------------------------------------------------------------------ matchers */

static int cls_at(const uint32_t *cp, size_t n, size_t i) {
    return i < n ? mg_tok_uclass(cp[i]) : -1;
}

static size_t run_of(const uint32_t *cp, size_t n, size_t i, int cls) {
    size_t j = i;
    while (j < n && mg_tok_uclass(cp[j]) == cls)
        j++;
    return j;
}

/* \s+(?!\S)|\s+ at a whitespace code point: the whole run when it ends the text, else the run
 * less its last code point (which then starts the next match), else the single one. */
static size_t whitespace_tail(const uint32_t *cp, size_t n, size_t i) {
    size_t j = run_of(cp, n, i, UC_S);
    if (j == n)
        return j - i;
    return j - i >= 2 ? j - i - 1 : 1;
}

static bool is_lower(uint32_t c, char want) {
    return c == (uint32_t)want || c == (uint32_t)(want - 'a' + 'A');
}

/* 's 't 're 've 'm 'll 'd after an apostrophe at cp[i]; case-insensitive as Oniguruma folds
 * (U+017F LONG S folds to s). Returns the match length or 0. */
static size_t contraction(const uint32_t *cp, size_t n, size_t i, bool fold) {
    if (cp[i] != '\'' || i + 1 >= n)
        return 0;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (!fold) {
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
        return 0;
    }
    if (is_lower(a, 's') || a == 0x17F || is_lower(a, 't') || is_lower(a, 'm') || is_lower(a, 'd'))
        return 2;
    if ((is_lower(a, 'r') && is_lower(b, 'e')) || (is_lower(a, 'v') && is_lower(b, 'e')) ||
        (is_lower(a, 'l') && is_lower(b, 'l')))
        return 3;
    return 0;
}

size_t mg_tok_match_gpt2(const uint32_t *cp, size_t n, size_t i) {
    size_t k = contraction(cp, n, i, false);
    if (k)
        return k;
    /* ' ?X+' for X in L, N, other: the optional space is U+0020 only. */
    size_t j = cp[i] == ' ' ? i + 1 : i;
    int c = cls_at(cp, n, j);
    if (c == UC_L || c == UC_N || c == UC_OTHER)
        return run_of(cp, n, j, c) - i;
    return whitespace_tail(cp, n, i);
}

static bool is_crlf(uint32_t c) {
    return c == '\r' || c == '\n';
}

size_t mg_tok_match_llama3(const uint32_t *cp, size_t n, size_t i, size_t max_digits) {
    size_t k = contraction(cp, n, i, true);
    if (k)
        return k;
    int c = mg_tok_uclass(cp[i]);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c != UC_L && c != UC_N && !is_crlf(cp[i]) && cls_at(cp, n, i + 1) == UC_L)
        return run_of(cp, n, i + 1, UC_L) - i;
    if (c == UC_L)
        return run_of(cp, n, i, UC_L) - i;
    /* \p{N}{1,3} */
    if (c == UC_N) {
        size_t j = run_of(cp, n, i, UC_N);
        return j - i < max_digits ? j - i : max_digits;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = cp[i] == ' ' ? i + 1 : i;
    if (cls_at(cp, n, j) == UC_OTHER) {
        j = run_of(cp, n, j, UC_OTHER);
        while (j < n && is_crlf(cp[j]))
            j++;
        return j - i;
    }
    /* Only whitespace is left. \s*[\r\n]+ : up to the last line break of the run. */
    size_t end = run_of(cp, n, i, UC_S);
    for (size_t p = end; p > i; p--)
        if (is_crlf(cp[p - 1]))
            return p - i;
    return whitespace_tail(cp, n, i);
}
