/*
 * chat.h - chat templates without a template engine: a checkpoint's template string
 * (tokenizer.chat_template, or chat_template in tokenizer_config.json) is recognised as one of
 * the formats below and rendered in C exactly as the template renders it.
 *
 * Recognised (the whole template must be one of these, character for character, apart from
 * the default system text):
 *  - ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
 *    `<|im_start|>assistant\n` when a generation prompt is asked for;
 *  - ChatML with a default system message (SmolLM2): the same, preceded by
 *    `<|im_start|>system\n{default}<|im_end|>\n` when the first message is not a system one;
 *  - Llama-3 (Meta-Llama-3-8B-Instruct's template): bos_token before the first message, then
 *    `<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>` per message
 *    and `<|start_header_id|>assistant<|end_header_id|>\n\n` for a generation prompt. Trimmed
 *    is Python's str.strip(): the Unicode whitespace code points (ASCII whitespace, U+001C-
 *    U+001F, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000)
 *    at both ends; bytes that are not valid UTF-8 are never whitespace. Any role is written.
 *  - Mistral-instruct without a system role (Mistral-7B-Instruct-v0.1's and v0.2's first
 *    template): bos_token, then `[INST] {content} [/INST]` per user message and
 *    `{content}{eos_token}` per assistant message;
 *  - Mistral-instruct with an optional system message (Mistral-7B-Instruct-v0.2's later
 *    template): a first system message is taken out; then bos_token, ` [INST] {content}
 *    [/INST]` per user message (the first one as ` [INST] {system}\n\n{content} [/INST]` when
 *    there was a system message) and ` {content}{eos_token}` per assistant message.
 *   Both Mistral templates ignore add_generation_prompt (the rendering already ends where the
 *   assistant writes) and refuse, as the templates' raise_exception does, a conversation whose
 *   roles (after the optional system message) do not alternate user, assistant, user, ... or
 *   that has another role; the one with a system message also refuses an empty conversation
 *   (the template reads messages[0]). A refusal is MG_ERR_INVALID_ARGUMENT with the template's
 *   reason, and nothing is written.
 * Any other template is MG_ERR_UNSUPPORTED with a message that says so (the CLI suggests
 * --prompt, which takes the text as it is). Contents are copied as they are: text that spells
 * a special token (e.g. "<|im_end|>") stays in the rendering, as the templates leave it.
 *
 * bos_token and eos_token are the tokenizer's special tokens as text (Hugging Face passes
 * them to the template under those names); the caller sets them after recognising, with
 * mg_chat_set_special_tokens (mg_gguf_text_open does, from the GGUF's tokenizer). Unset they
 * render as the empty string, as a template does when the tokenizer has no such token. Where
 * the rendering starts with bos_token (mg_chat_writes_bos), encode it without adding BOS again:
 * transformers tokenizes a chat rendering with add_special_tokens=False.
 */
#ifndef METRALE_MODEL_CHAT_H
#define METRALE_MODEL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "metrale/status.h"

typedef enum mg_chat_format {
    MG_CHAT_CHATML = 1,
    MG_CHAT_LLAMA3 = 2,
    MG_CHAT_MISTRAL = 3,        /* no system role */
    MG_CHAT_MISTRAL_SYSTEM = 4, /* an optional first system message */
} mg_chat_format;

typedef struct mg_chat_template {
    mg_chat_format format;
    char default_system[512]; /* "" when the template adds none */
    char bos_token[64];       /* "" until mg_chat_set_special_tokens */
    char eos_token[64];
} mg_chat_template;

typedef struct mg_chat_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content; /* UTF-8, NUL-terminated */
} mg_chat_message;

/* Recognises `text` (len bytes); the message (mg_last_error) names what did not match. */
mg_status mg_chat_template_recognise(const char *text, size_t len, mg_chat_template *out);

/* Sets bos_token and eos_token (NULL for none, i.e. ""); MG_ERR_INVALID_ARGUMENT, leaving
 * both unchanged, when one is longer than 63 bytes. */
mg_status mg_chat_set_special_tokens(mg_chat_template *t, const char *bos, const char *eos);

/* Whether a rendering of `count` messages starts with bos_token (the Llama-3 and Mistral
 * templates write it; ChatML does not). */
bool mg_chat_writes_bos(const mg_chat_template *t, size_t count);

/* Renders the messages; writes up to cap bytes and a NUL when it fits, *len always the full
 * length (MG_ERR_INVALID_ARGUMENT when len + 1 > cap; out may be NULL with cap 0 to ask). A
 * conversation the template refuses (see above) is MG_ERR_INVALID_ARGUMENT with *len 0. */
mg_status mg_chat_render(const mg_chat_template *t, const mg_chat_message *messages, size_t count,
                         bool add_generation_prompt, char *out, size_t cap, size_t *len);

#endif
