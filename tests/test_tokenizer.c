/* test_tokenizer.c - the tokenizer (src/model/tokenizer.h) against the Hugging Face
 * `tokenizers` package: tests/tokenizer/make_reference.py builds SmolLM2's tokenizer from its
 * real GGUF vocabulary and trains small ones for the GPT-2, Llama-3, Qwen2, digit-splitting
 * and SentencePiece-style configurations, then records ids and decoded text for a corpus.
 * Here, for every tokenizer and string: the ids equal the reference's (with and without the
 * special tokens added and parsed), decode equals the reference decode, decode(encode(s)) ==
 * s where the reference round-trips, and the stream decoder's chunks are valid UTF-8 and add
 * up to the batch decode. SmolLM2 and the by-score SentencePiece model are also built from a
 * GGUF-style description (mg_tok_create) and must give the same ids. Then the bad inputs.
 *
 * The files come from the ctest fixture tokenizer_reference (tests/tokenizer/setup.sh), in
 * the folder METRALE_TOKENIZER_REFERENCE names; without it, or when the reference could not
 * be made, exit 77. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_files.h"

#include "tokenizer.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            if (failures <= 40) {                                                                  \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fprintf(stderr, "\n");                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

typedef struct buf {
    char *p;
    size_t n;
} buf;

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Hex ("-" for empty) to bytes, NUL-terminated. */
static buf unhex(const char *h) {
    buf b = {0};
    size_t n = strcmp(h, "-") ? strlen(h) / 2 : 0;
    b.p = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        b.p[i] = (char)(hexval(h[2 * i]) * 16 + hexval(h[2 * i + 1]));
    b.p[n] = 0;
    b.n = n;
    return b;
}

/* Lines of a text file, split in place. */
typedef struct lines {
    char *text;
    char **v;
    size_t n;
} lines;

static bool read_lines(const char *path, lines *l) {
    memset(l, 0, sizeof *l);
    l->text = test_read_file(path, NULL);
    if (!l->text)
        return false;
    size_t cap = 1024;
    l->v = malloc(cap * sizeof *l->v);
    for (char *s = strtok(l->text, "\n"); s; s = strtok(NULL, "\n")) {
        if (l->n == cap)
            l->v = realloc(l->v, (cap *= 2) * sizeof *l->v);
        l->v[l->n++] = s;
    }
    return true;
}

static void free_lines(lines *l) {
    free(l->text);
    free(l->v);
}

static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80                 ? 1
                   : c >= 0xC2 && c <= 0xDF ? 2
                   : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4
                                            : 0;
        if (!k || i + k > n)
            return false;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80)
                return false;
        if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F) ||
            (c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))
            return false;
        i += k;
    }
    return true;
}

static buf corpus[256];
static size_t n_corpus;

/* Decode, sized by a first call. */
static buf decode(const mg_tok *t, const int32_t *ids, size_t n, bool skip) {
    buf b = {0};
    size_t len = 0;
    mg_status st = mg_tok_decode(t, ids, n, skip, NULL, 0, &len);
    CHECK(st == MG_ERR_INVALID_ARGUMENT, "decode size query: %s", mg_status_name(st));
    b.p = malloc(len + 1);
    st = mg_tok_decode(t, ids, n, skip, b.p, len + 1, &b.n);
    CHECK(st == MG_OK && b.n == len, "decode: %s %s", mg_status_name(st), mg_tok_error());
    return b;
}

/* The stream decoder over ids: chunks valid UTF-8, together the batch decode. The output
 * buffer starts at one byte so the retry path (id not taken) runs. */
static void check_stream(const mg_tok *t, const int32_t *ids, size_t n, bool skip, const buf *want,
                         const char *what) {
    mg_tok_stream *s;
    if (mg_tok_stream_create(t, skip, &s)) {
        CHECK(0, "stream create: %s", mg_tok_error());
        return;
    }
    char *all = malloc(want->n + 64);
    size_t total = 0, cap = 1;
    char *chunk = malloc(cap);
    bool chunks_ok = true, fits = true;
    for (size_t i = 0; i <= n; i++) {
        size_t len;
        mg_status st = i < n ? mg_tok_stream_put(s, ids[i], chunk, cap, &len)
                             : mg_tok_stream_finish(s, chunk, cap, &len);
        if (st == MG_ERR_INVALID_ARGUMENT && len + 1 > cap) {
            cap = len + 1;
            chunk = realloc(chunk, cap);
            st = i < n ? mg_tok_stream_put(s, ids[i], chunk, cap, &len)
                       : mg_tok_stream_finish(s, chunk, cap, &len);
        }
        if (st) {
            CHECK(0, "%s: stream put: %s", what, mg_tok_error());
            break;
        }
        if (!valid_utf8(chunk, len))
            chunks_ok = false;
        if (total + len > want->n + 63)
            fits = false;
        else
            memcpy(all + total, chunk, len);
        total += len;
    }
    CHECK(chunks_ok, "%s: a stream chunk is not valid UTF-8", what);
    CHECK(fits && total == want->n && memcmp(all, want->p, total) == 0,
          "%s: stream text (%zu bytes) differs from the batch decode (%zu bytes)", what, total,
          want->n);
    free(all);
    free(chunk);
    mg_tok_stream_destroy(s);
}

static size_t parse_ids(char **save, int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)strtol(strtok_r(NULL, " ", save), NULL, 10);
    return n;
}

/* Every line of NAME.ref against tokenizer t. */
static void check_ref(const mg_tok *t, const char *dir, const char *ref, const char *label) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.ref", dir, ref);
    lines l;
    if (!read_lines(path, &l)) {
        CHECK(0, "cannot read %s", path);
        return;
    }
    int32_t *ids = malloc(4096 * sizeof *ids), *got = malloc(4096 * sizeof *got);
    int before = failures, n_e = 0, n_d = 0, n_r = 0, n_rt = 0;
    for (size_t k = 0; k < l.n; k++) {
        char *save, *line = l.v[k];
        char *kind = strtok_r(line, " ", &save);
        if (!strcmp(kind, "E")) {
            int idx = atoi(strtok_r(NULL, " ", &save)), add = atoi(strtok_r(NULL, " ", &save));
            int parse = atoi(strtok_r(NULL, " ", &save));
            size_t n = parse_ids(&save, ids, (size_t)atol(strtok_r(NULL, " ", &save)));
            size_t got_n = 0;
            mg_status st =
                mg_tok_encode(t, corpus[idx].p, corpus[idx].n, add, parse, got, 4096, &got_n);
            bool same = st == MG_OK && got_n == n && !memcmp(got, ids, n * sizeof *ids);
            CHECK(same, "%s: string %d (add %d, parse %d): %zu ids, reference %zu (%s %s)%s", label,
                  idx, add, parse, got_n, n, mg_status_name(st), st ? mg_tok_error() : "", "");
            if (!same && failures <= 40) {
                fprintf(stderr, "   text \"%s\"\n   got ", corpus[idx].p);
                for (size_t i = 0; i < got_n && i < 40; i++)
                    fprintf(stderr, " %d", got[i]);
                fprintf(stderr, "\n   want");
                for (size_t i = 0; i < n && i < 40; i++)
                    fprintf(stderr, " %d", ids[i]);
                fprintf(stderr, "\n");
            }
            n_e++;
        } else if (!strcmp(kind, "D")) {
            int idx = atoi(strtok_r(NULL, " ", &save)), skip = atoi(strtok_r(NULL, " ", &save));
            int rt = atoi(strtok_r(NULL, " ", &save));
            char *h = strtok_r(NULL, " ", &save);
            buf want = unhex(h ? h : "-");
            size_t n = 0;
            mg_tok_encode(t, corpus[idx].p, corpus[idx].n, true, true, got, 4096, &n);
            buf b = decode(t, got, n, skip);
            CHECK(b.n == want.n && !memcmp(b.p, want.p, b.n),
                  "%s: string %d: decode (skip %d) \"%s\", reference \"%s\"", label, idx, skip, b.p,
                  want.p);
            check_stream(t, got, n, skip, &b, label);
            if (rt && !skip) {
                mg_tok_encode(t, corpus[idx].p, corpus[idx].n, false, true, got, 4096, &n);
                buf r = decode(t, got, n, false);
                CHECK(r.n == corpus[idx].n && !memcmp(r.p, corpus[idx].p, r.n),
                      "%s: string %d: decode(encode(s)) != s: \"%s\"", label, idx, r.p);
                free(r.p);
                n_rt++;
            }
            free(b.p);
            free(want.p);
            n_d++;
        } else if (!strcmp(kind, "R")) {
            size_t n = parse_ids(&save, ids, (size_t)atol(strtok_r(NULL, " ", &save)));
            for (int skip = 0; skip < 2; skip++) {
                buf want = unhex(strtok_r(NULL, " ", &save));
                buf b = decode(t, ids, n, skip);
                CHECK(b.n == want.n && !memcmp(b.p, want.p, b.n),
                      "%s: random ids line %zu: decode (skip %d) \"%s\", reference \"%s\"", label,
                      k, skip, b.p, want.p);
                check_stream(t, ids, n, skip, &b, label);
                free(b.p);
                free(want.p);
            }
            n_r++;
        }
    }
    printf("%-14s %4d encodes, %3d decodes (%d round trips), %3d id decodes: %s\n", label, n_e, n_d,
           n_rt, n_r, failures == before ? "ok" : "FAIL");
    free(ids);
    free(got);
    free_lines(&l);
}

/* A GGUF-style description from NAME.desc. */
static mg_status create_from_desc(const char *dir, char **f, mg_tok **out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.desc", dir, f[1]);
    lines l;
    if (!read_lines(path, &l))
        return MG_ERR_NOT_FOUND;
    buf *strs = calloc(l.n, sizeof *strs);
    const char **tokens = calloc(l.n, sizeof *tokens), **merges = calloc(l.n, sizeof *merges);
    int32_t *types = calloc(l.n, sizeof *types);
    float *scores = calloc(l.n, sizeof *scores);
    uint32_t nt = 0, nm = 0, ns = 0;
    for (size_t k = 0; k < l.n; k++) {
        char *save, *kind = strtok_r(l.v[k], " ", &save);
        if (kind[0] == 'T') {
            types[nt] = atoi(strtok_r(NULL, " ", &save));
            strs[k] = unhex(strtok_r(NULL, " ", &save));
            tokens[nt++] = strs[k].p;
        } else if (kind[0] == 'M') {
            strs[k] = unhex(strtok_r(NULL, " ", &save));
            merges[nm++] = strs[k].p;
        } else
            scores[ns++] = strtof(strtok_r(NULL, " ", &save), NULL);
    }
    mg_tok_desc d = {.kind = !strcmp(f[3], "byte") ? MG_TOK_BYTE_BPE : MG_TOK_SPM_BPE,
                     .tokens = tokens,
                     .n_tokens = nt,
                     .merges = nm ? merges : NULL,
                     .n_merges = nm,
                     .token_types = types,
                     .scores = ns ? scores : NULL,
                     .pre = strcmp(f[4], "-") ? f[4] : NULL,
                     .add_bos = atoi(f[5]),
                     .add_space_prefix = atoi(f[6]),
                     .bos_id = atoi(f[7]),
                     .eos_id = atoi(f[8]),
                     .unk_id = atoi(f[9]),
                     .pad_id = -1};
    mg_status st = mg_tok_create(&d, out);
    /* The description is only read during the call: free it all before use. */
    for (size_t k = 0; k < l.n; k++)
        free(strs[k].p);
    free(strs);
    free(tokens);
    free(merges);
    free(types);
    free(scores);
    free_lines(&l);
    return st;
}

/* ------------------------------------------------------------------ bad input */

static void expect_json_error(const char *json, mg_status want, const char *needle,
                              const char *what) {
    mg_tok *t = (mg_tok *)&t;
    mg_status st = mg_tok_from_json_text(json, strlen(json), &t);
    CHECK(st == want && t == NULL && strstr(mg_tok_error(), needle),
          "%s: %s \"%s\" (want %s, \"%s\")", what, mg_status_name(st), mg_tok_error(),
          mg_status_name(want), needle);
    if (st == MG_OK)
        mg_tok_destroy(t);
}

/* s with the first `from` replaced by `to` (malloc'd). */
static char *replace(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (!at)
        return NULL;
    size_t a = (size_t)(at - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *r = malloc(n - fl + tl + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, at + fl, n - a - fl + 1);
    return r;
}

static void bad_inputs(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gpt2.json", dir);
    size_t n;
    char *json = test_read_file(path, &n);
    CHECK(json, "cannot read %s", path);
    if (!json)
        return;
    mg_tok *t = NULL;
    CHECK(mg_tok_from_json_text(json, n, &t) == MG_OK, "gpt2.json: %s", mg_tok_error());

    /* Truncated at many points: always a clean error, never a tokenizer. */
    int truncated_ok = 0, cuts = 0;
    for (size_t cut = 0; cut < n; cut += n / 97 + 1, cuts++) {
        mg_tok *x = NULL;
        mg_status st = mg_tok_from_json_text(json, cut, &x);
        if (st == MG_ERR_INVALID_ARGUMENT && !x && mg_tok_error()[0])
            truncated_ok++;
        mg_tok_destroy(x);
    }
    CHECK(truncated_ok == cuts, "truncated tokenizer.json: %d of %d cuts refused cleanly",
          truncated_ok, cuts);
    expect_json_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}",
                      MG_ERR_INVALID_ARGUMENT, "truncated", "unclosed object");
    expect_json_error("{\"model\": @}", MG_ERR_INVALID_ARGUMENT, "malformed", "malformed JSON");
    expect_json_error("[1, 2]", MG_ERR_INVALID_ARGUMENT, "not an object", "top-level array");
    /* a sparse id would size the id-indexed tables by it (the fuzzer's 4.9 GB allocation) */
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1000000000}, "
                      "\"merges\": []}}",
                      MG_ERR_INVALID_ARGUMENT, "far past", "sparse token id");
    expect_json_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
                      MG_ERR_UNSUPPORTED, "WordPiece", "WordPiece model");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
                      "\"merges\": [\"a b\"]}}",
                      MG_ERR_INVALID_ARGUMENT, "merged token", "merge result not a token");
    expect_json_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": "
                      "[\"a\"]}}",
                      MG_ERR_INVALID_ARGUMENT, "two tokens", "merge without a space");

    struct {
        const char *from, *to, *needle;
        mg_status st;
    } edits[] = {
        {"\"pre_tokenizer\": {\"type\": \"ByteLevel\"",
         "\"pre_tokenizer\": {\"type\": \"Whitespace\"", "pre_tokenizer \"Whitespace\"",
         MG_ERR_UNSUPPORTED},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}", "normalizer \"NFKC\"",
         MG_ERR_UNSUPPORTED},
        {"\"decoder\": {\"type\": \"ByteLevel\"", "\"decoder\": {\"type\": \"WordPiece\"",
         "decoder \"WordPiece\"", MG_ERR_UNSUPPORTED},
        {"\"truncation\": null", "\"truncation\": {\"max_length\": 8}", "truncation",
         MG_ERR_UNSUPPORTED},
        {"\"dropout\": null", "\"dropout\": 0.1", "dropout", MG_ERR_UNSUPPORTED},
    };
    for (size_t k = 0; k < sizeof edits / sizeof *edits; k++) {
        char *e = replace(json, edits[k].from, edits[k].to);
        CHECK(e, "gpt2.json has no \"%s\" to edit", edits[k].from);
        if (e)
            expect_json_error(e, edits[k].st, edits[k].needle, edits[k].to);
        free(e);
    }
    snprintf(path, sizeof path, "%s/llama3.json", dir);
    char *l3 = test_read_file(path, NULL);
    char *e = l3 ? replace(l3, "\\\\p{N}{1,3}", "\\\\p{N}{1,4}") : NULL;
    CHECK(e, "llama3.json has no \\p{N}{1,3}");
    if (e)
        expect_json_error(e, MG_ERR_UNSUPPORTED, "is not one of", "unknown Split regex");
    free(e);
    free(l3);

    snprintf(path, sizeof path, "%s/spm_legacy.json", dir);
    char *spm = test_read_file(path, NULL);
    e = spm ? replace(spm, "\"normalized\": false", "\"normalized\": true") : NULL;
    CHECK(e, "spm_legacy.json has no normalized added token to edit");
    if (e)
        expect_json_error(e, MG_ERR_UNSUPPORTED, "normalized added tokens",
                          "normalized added token with a normalizer");
    free(e);
    free(spm);

    mg_tok *x = (mg_tok *)&x;
    CHECK(mg_tok_from_json("/nonexistent/tokenizer.json", &x) == MG_ERR_NOT_FOUND && !x,
          "missing file: %s", mg_tok_error());
    CHECK(mg_tok_from_json(NULL, &x) == MG_ERR_INVALID_ARGUMENT, "NULL path");
    CHECK(mg_tok_from_json(path, NULL) == MG_ERR_INVALID_ARGUMENT, "NULL out");
    CHECK(mg_tok_create(NULL, &x) == MG_ERR_INVALID_ARGUMENT, "NULL desc");
    const char *toks[] = {"a", "b", "ab"}, *mer[] = {"a b"};
    mg_tok_desc d = {.kind = MG_TOK_BYTE_BPE,
                     .tokens = toks,
                     .n_tokens = 3,
                     .merges = mer,
                     .n_merges = 1,
                     .pre = "falcon",
                     .bos_id = -1,
                     .eos_id = -1,
                     .unk_id = -1,
                     .pad_id = -1};
    CHECK(mg_tok_create(&d, &x) == MG_ERR_UNSUPPORTED && strstr(mg_tok_error(), "falcon"),
          "unknown pre-tokenizer name: %s", mg_tok_error());
    d.pre = "gpt2";
    d.bos_id = 7;
    CHECK(mg_tok_create(&d, &x) == MG_ERR_INVALID_ARGUMENT, "bos out of range");
    d.bos_id = -1;
    const char *mer2[] = {"a c"};
    d.merges = mer2;
    CHECK(mg_tok_create(&d, &x) == MG_ERR_INVALID_ARGUMENT && strstr(mg_tok_error(), "right"),
          "merge of a missing token: %s", mg_tok_error());
    d.merges = mer;
    CHECK(mg_tok_create(&d, &x) == MG_OK, "tiny description: %s", mg_tok_error());
    mg_tok_destroy(x);

    if (t) {
        int32_t ids[4];
        size_t got = 99;
        const char *text = "hello world, hello again";
        mg_status st = mg_tok_encode(t, text, strlen(text), false, true, ids, 2, &got);
        CHECK(st == MG_ERR_INVALID_ARGUMENT && got > 2 && strstr(mg_tok_error(), "needs"),
              "cap too small: %s, n %zu", mg_status_name(st), got);
        st = mg_tok_encode(t, "ab\xC3(", 4, false, true, ids, 4, &got);
        CHECK(st == MG_ERR_INVALID_ARGUMENT && strstr(mg_tok_error(), "UTF-8 at byte 2"),
              "invalid UTF-8: %s", mg_tok_error());
        CHECK(mg_tok_encode(t, "\xED\xA0\x80", 3, false, true, ids, 4, &got) ==
                  MG_ERR_INVALID_ARGUMENT,
              "surrogate in UTF-8");
        CHECK(mg_tok_encode(NULL, "a", 1, false, true, ids, 4, &got) == MG_ERR_INVALID_ARGUMENT,
              "NULL tokenizer");
        CHECK(mg_tok_encode(t, NULL, 1, false, true, ids, 4, &got) == MG_ERR_INVALID_ARGUMENT,
              "NULL text");
        CHECK(mg_tok_encode(t, "a", 1, false, true, NULL, 4, &got) == MG_ERR_INVALID_ARGUMENT,
              "NULL ids");
        CHECK(mg_tok_encode(t, NULL, 0, false, true, NULL, 0, &got) == MG_OK && got == 0,
              "empty text, size query");
        int32_t bad_id = (int32_t)mg_tok_vocab_size(t);
        char out[16];
        size_t len;
        CHECK(mg_tok_decode(t, &bad_id, 1, false, out, sizeof out, &len) == MG_ERR_INVALID_ARGUMENT,
              "decode of an id out of range");
        int32_t one = 0;
        CHECK(mg_tok_decode(t, &one, 1, false, NULL, 4, &len) == MG_ERR_INVALID_ARGUMENT,
              "decode NULL out");
        mg_tok_stream *s;
        CHECK(mg_tok_stream_create(t, false, &s) == MG_OK, "stream create");
        CHECK(mg_tok_stream_put(s, -1, out, sizeof out, &len) == MG_ERR_INVALID_ARGUMENT,
              "stream put of a negative id");
        mg_tok_stream_destroy(s);
        const char *piece;
        CHECK(mg_tok_token_to_piece(t, bad_id, &piece, &len) == MG_ERR_INVALID_ARGUMENT,
              "piece of an id out of range");
        CHECK(mg_tok_token_text(t, bad_id) == NULL && mg_tok_token_id(t, "<no such>") == -1,
              "lookups of unknown tokens");
        mg_tok_destroy(t);
    }
    free(json);
}

/* Facts of SmolLM2-135M-Instruct's tokenizer (its tokenizer.json and GGUF metadata). */
static void smollm2_facts(const mg_tok *t) {
    CHECK(mg_tok_vocab_size(t) == 49152, "SmolLM2 vocabulary %u", mg_tok_vocab_size(t));
    CHECK(mg_tok_token_id(t, "<|im_start|>") == 1 && mg_tok_token_id(t, "<|im_end|>") == 2 &&
              mg_tok_token_id(t, "<|endoftext|>") == 0,
          "SmolLM2 control token ids");
    CHECK(mg_tok_is_special(t, 1) && !mg_tok_is_special(t, 100), "SmolLM2 special flags");
    const char *piece;
    size_t len;
    int32_t id = mg_tok_token_id(t, "\xC4\xA0the"); /* "Ġthe" */
    CHECK(id >= 0 && mg_tok_token_to_piece(t, id, &piece, &len) == MG_OK && len == 4 &&
              !memcmp(piece, " the", 4),
          "SmolLM2 piece of \"Ġthe\"");
}

int main(void) {
    const char *dir = getenv("METRALE_TOKENIZER_REFERENCE");
    if (!dir) {
        printf("skip: METRALE_TOKENIZER_REFERENCE is not set (ctest fixture "
               "tokenizer_reference)\n");
        return 77;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/SKIP", dir);
    char *why = test_read_file(path, NULL);
    if (why) {
        printf("skip: the tokenizer reference could not be made: %s", why);
        free(why);
        return 77;
    }
    lines c, index;
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    if (!read_lines(path, &c)) {
        fprintf(stderr, "FAIL: cannot read %s\n", path);
        return 1;
    }
    for (size_t i = 0; i < c.n && n_corpus < 256; i++)
        corpus[n_corpus++] = unhex(c.v[i]);
    free_lines(&c);
    snprintf(path, sizeof path, "%s/index.txt", dir);
    if (!read_lines(path, &index)) {
        fprintf(stderr, "FAIL: cannot read %s\n", path);
        return 1;
    }
    for (size_t k = 0; k < index.n; k++) {
        char *f[10] = {0}, *save;
        int nf = 0;
        for (char *w = strtok_r(index.v[k], " ", &save); w && nf < 10;
             w = strtok_r(NULL, " ", &save))
            f[nf++] = w;
        mg_tok *t = NULL;
        mg_status st;
        const char *ref = f[1];
        if (!strcmp(f[0], "json")) {
            snprintf(path, sizeof path, "%s/%s.json", dir, f[1]);
            st = mg_tok_from_json(path, &t);
        } else {
            st = nf == 10 ? create_from_desc(dir, f, &t) : MG_ERR_INVALID_ARGUMENT;
            ref = f[2];
        }
        CHECK(st == MG_OK, "%s: %s", f[1], mg_tok_error());
        if (st)
            continue;
        check_ref(t, dir, ref, f[1]);
        if (!strcmp(f[1], "smollm2") || !strcmp(f[1], "smollm2_gguf"))
            smollm2_facts(t);
        mg_tok_destroy(t);
    }
    free_lines(&index);
    bad_inputs(dir);
    for (size_t i = 0; i < n_corpus; i++)
        free(corpus[i].p);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
