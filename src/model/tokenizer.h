/*
 * tokenizer.h - text to token ids and back, for the model layer: byte-level BPE (GPT-2,
 * SmolLM, Llama-3, Qwen2) and SentencePiece-style BPE (Llama-2, Mistral), read from a Hugging
 * Face tokenizer.json or built from a description (what a GGUF file's tokenizer.ggml.* keys
 * hold).
 *
 * What a caller may rely on:
 *  - Ids equal those of the Hugging Face `tokenizers` package for the configurations accepted
 *    here (tests/test_tokenizer.c checks them against tokenizers 0.23.3). A configuration this
 *    code does not implement (a normalizer, pre-tokenizer, decoder or post-processor type, or
 *    a Split regex other than the GPT-2, Llama-3 and Qwen2 ones) is refused at creation with
 *    MG_ERR_UNSUPPORTED and a message naming it; nothing is approximated.
 *  - Input text must be valid UTF-8: encode refuses anything else with
 *    MG_ERR_INVALID_ARGUMENT and the byte offset of the first bad sequence.
 *  - Bytes with no token are dropped. A byte-level vocabulary may lack tokens for some byte
 *    values (SmolLM2 has none for 21 of them): such a byte in the input yields no id, as in
 *    llama.cpp and in `tokenizers` without an unknown token. SentencePiece-style models use
 *    their <0xNN> byte tokens (byte fallback) and, failing those, the unknown token when the
 *    model names one; otherwise the character is dropped too.
 *  - Decoded text is always valid UTF-8. Byte-level decoding replaces each maximal invalid
 *    subsequence with U+FFFD (as Rust's String::from_utf8_lossy); SentencePiece byte fallback
 *    turns a run of <0xNN> tokens that is not valid UTF-8 as a whole into one U+FFFD per byte
 *    (as the `tokenizers` ByteFallback decoder). The stream decoder gives the same text.
 *  - The Unicode classes (\p{L}, \p{N}, \s) are Unicode 15.1 (tokenizer_unicode_tables.h).
 *    The reference's regex engine (Oniguruma in `tokenizers` 0.23) and Rust's char tables are
 *    newer: code points assigned after 15.1 may split differently.
 *  - A tokenizer is immutable after creation and may be used from several threads at once;
 *    a stream decoder belongs to one thread at a time.
 *
 * Errors: every call returns an mg_status; a failing call leaves a one-line message for
 * mg_tok_error() (thread-local, kept until the next failing mg_tok_* call on the thread). The
 * public library has no call for upper layers to set mg_last_error(), hence a message of its
 * own, like mg_last_error().
 */
#ifndef METRALE_MODEL_TOKENIZER_H
#define METRALE_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_tok mg_tok;

typedef enum mg_tok_kind {
    /* GPT-2 style: text bytes map to the 256-character byte alphabet, pre-tokenized by the
     * `pre` regex, merged by merge rank (GGUF tokenizer.ggml.model "gpt2"). */
    MG_TOK_BYTE_BPE = 1,
    /* SentencePiece style: spaces become U+2581 "▁", a "▁" is prepended to the text and to
     * each stretch of text after an added token (when add_space_prefix), no pre-tokenizer;
     * merged by merge rank when merges are given, otherwise by token score (highest first,
     * llama.cpp's algorithm); characters without a token fall back to <0xNN> byte tokens
     * (GGUF tokenizer.ggml.model "llama"). */
    MG_TOK_SPM_BPE = 2,
} mg_tok_kind;

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    MG_TOK_TYPE_NORMAL = 1,
    MG_TOK_TYPE_UNKNOWN = 2,      /* treated as a special token */
    MG_TOK_TYPE_CONTROL = 3,      /* special: matched in text only with parse_special */
    MG_TOK_TYPE_USER_DEFINED = 4, /* added token: always matched in text, never skipped */
    MG_TOK_TYPE_UNUSED = 5,       /* an ordinary vocabulary entry */
    MG_TOK_TYPE_BYTE = 6,         /* <0xNN>; recognised by its text, as the type is optional */
};

/* What a GGUF file's tokenizer keys say; every pointer is only read during mg_tok_create. */
typedef struct mg_tok_desc {
    mg_tok_kind kind;
    const char *const *tokens; /* n_tokens UTF-8 strings; the index is the id (tokens) */
    uint32_t n_tokens;
    /* "left right" pairs, best first (tokenizer.ggml.merges); split at the first space after
     * the first byte. Both halves and their concatenation must be tokens. Required for
     * MG_TOK_BYTE_BPE; optional for MG_TOK_SPM_BPE (then scores are used). */
    const char *const *merges;
    uint32_t n_merges;
    const int32_t *token_types; /* n_tokens MG_TOK_TYPE_* (token_type); NULL: all normal */
    const float *scores;        /* n_tokens (scores); SPM without merges needs them; else NULL */
    /* tokenizer.ggml.pre for MG_TOK_BYTE_BPE: "gpt2", "smollm" (each digit split off, then
     * the GPT-2 regex), "llama-bpe" or "llama3" (the Llama-3 regex; a word that is itself a
     * token is taken whole), "qwen2"; NULL or "default" is refused for byte-level BPE, whose
     * llama.cpp default is a different regex set. Ignored for MG_TOK_SPM_BPE. */
    const char *pre;
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when none */
    bool add_bos;                           /* encode with add_special prepends bos_id */
    bool add_eos;                           /* encode with add_special appends eos_id */
    bool add_space_prefix; /* MG_TOK_SPM_BPE: prepend "▁" (tokenizer.ggml.add_space_prefix) */
} mg_tok_desc;

/* A tokenizer from a description. MG_ERR_INVALID_ARGUMENT for an inconsistent one (an id out
 * of range, a merge whose halves or result are not tokens, no tokens), MG_ERR_UNSUPPORTED for
 * an unknown pre-tokenizer name. */
mg_status mg_tok_create(const mg_tok_desc *d, mg_tok **out);

/* A tokenizer from a Hugging Face tokenizer.json. Accepted: model BPE (vocab; merges as
 * "a b" strings or [a, b] pairs; unk_token, fuse_unk, byte_fallback, ignore_merges; no
 * dropout, continuing_subword_prefix or end_of_word_suffix); normalizer null or a Sequence of
 * Prepend / Replace (string patterns); pre_tokenizer null, ByteLevel (last in a sequence),
 * Digits, Split with the GPT-2, Llama-3 or Qwen2 regex (behavior Isolated, not inverted),
 * Metaspace, or a Sequence of those; decoder ByteLevel, Metaspace, or Sequence of Replace,
 * ByteFallback, Fuse, Strip; post_processor null, ByteLevel, TemplateProcessing (special
 * tokens around $A) or a Sequence of those; added_tokens with special, lstrip, rstrip
 * (normalized ones only when there is no normalizer; no single_word). MG_ERR_NOT_FOUND when the
 * file cannot be read. */
mg_status mg_tok_from_json(const char *tokenizer_json_path, mg_tok **out);
/* The same from text in memory (`len` bytes; need not be NUL-terminated). */
mg_status mg_tok_from_json_text(const char *json, size_t len, mg_tok **out);

void mg_tok_destroy(mg_tok *t);

/* Text to ids. `text` is `len` bytes of UTF-8 (NULL allowed when len is 0).
 * add_special: add the tokens the tokenizer's post-processor (tokenizer.json) or add_bos /
 * add_eos (description) name, e.g. Llama's BOS. parse_special: special tokens written in the
 * text (e.g. "<|im_start|>") become their ids; otherwise they are tokenized as plain text.
 * Added tokens that are not special are always matched. Matching is leftmost, longest first.
 * Writes up to `cap` ids; *n is always the number the text needs: when it exceeds cap, the
 * call returns MG_ERR_INVALID_ARGUMENT, ids holds the first cap of them, and a call with a
 * larger array gives the whole. ids may be NULL when cap is 0 (a size query). */
mg_status mg_tok_encode(const mg_tok *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *ids, size_t cap, size_t *n);

/* Ids to text, as the tokenizer's decoder defines it (see the top of this file). skip_special
 * leaves out special tokens. Writes up to `cap` bytes and a terminating NUL when it fits;
 * *len is always the text's length without the NUL: MG_ERR_INVALID_ARGUMENT when len + 1 >
 * cap (out may be NULL with cap 0 to ask). An id out of range is MG_ERR_INVALID_ARGUMENT. */
mg_status mg_tok_decode(const mg_tok *t, const int32_t *ids, size_t n, bool skip_special, char *out,
                        size_t cap, size_t *len);

/* The bytes one token stands for, before the decoder's whole-text steps (no U+FFFD
 * replacement, no leading-space strip): byte-level tokens give their raw bytes, <0xNN> tokens
 * their byte, SentencePiece pieces their text with "▁" as a space, added tokens their text.
 * Valid until mg_tok_destroy; not NUL-terminated. MG_ERR_INVALID_ARGUMENT out of range. */
mg_status mg_tok_token_to_piece(const mg_tok *t, int32_t id, const char **piece, size_t *len);

/* The token's string as the vocabulary writes it (e.g. "Ġthe", "▁the", "<0x0A>"), NUL-
 * terminated; NULL for an id out of range or a gap in the id space. */
const char *mg_tok_token_text(const mg_tok *t, int32_t id);
/* The id of a vocabulary or added token given its exact string; -1 when there is none. */
int32_t mg_tok_token_id(const mg_tok *t, const char *text);

uint32_t mg_tok_vocab_size(const mg_tok *t); /* the largest id + 1 */
int32_t mg_tok_bos(const mg_tok *t);         /* -1 when none */
int32_t mg_tok_eos(const mg_tok *t);         /* -1 when none */
bool mg_tok_is_special(const mg_tok *t, int32_t id);

/* The message of the latest failing mg_tok_* call on this thread; "" when none. */
const char *mg_tok_error(void);

/* ------------------------------------------------------------------ streaming decoder */

/* Decodes ids one at a time as they are generated, emitting only complete UTF-8: bytes of a
 * character split over several tokens are held back until it is complete (a run of <0xNN>
 * tokens until the run ends, since the whole run decides how it decodes). The concatenation
 * of everything put and finish return equals mg_tok_decode of the same ids, and every
 * returned chunk is valid UTF-8 on its own. */
typedef struct mg_tok_stream mg_tok_stream;

mg_status mg_tok_stream_create(const mg_tok *t, bool skip_special, mg_tok_stream **out);
/* Feeds one id; writes the text it completes (possibly none) and a NUL when it fits. When
 * *len + 1 > cap it returns MG_ERR_INVALID_ARGUMENT with *len set and the id NOT taken, so
 * the call can be repeated with a larger buffer. */
mg_status mg_tok_stream_put(mg_tok_stream *s, int32_t id, char *out, size_t cap, size_t *len);
/* The text still held back (an incomplete character becomes U+FFFD), then the stream is
 * empty again, ready for a new sequence. Same buffer rule as put. */
mg_status mg_tok_stream_finish(mg_tok_stream *s, char *out, size_t cap, size_t *len);
void mg_tok_stream_destroy(mg_tok_stream *s);

#ifdef __cplusplus
}
#endif
#endif
