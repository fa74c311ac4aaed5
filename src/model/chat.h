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
 *    `<|im_start|>system\n{default}<|im_end|>\n` when the first message is not a system one.
 * Any other template is MG_ERR_UNSUPPORTED with a message that says so (the CLI suggests
 * --prompt, which takes the text as it is). Llama-3 and Mistral-instruct templates are not
 * recognised yet.
 */
#ifndef METRALE_MODEL_CHAT_H
#define METRALE_MODEL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "metrale/status.h"

typedef enum mg_chat_format {
    MG_CHAT_CHATML = 1,
} mg_chat_format;

typedef struct mg_chat_template {
    mg_chat_format format;
    char default_system[512]; /* "" when the template adds none */
} mg_chat_template;

typedef struct mg_chat_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content; /* UTF-8, NUL-terminated */
} mg_chat_message;

/* Recognises `text` (len bytes); the message (mg_fwd_error) names what did not match. */
mg_status mg_chat_template_recognise(const char *text, size_t len, mg_chat_template *out);

/* Renders the messages; writes up to cap bytes and a NUL when it fits, *len always the full
 * length (MG_ERR_INVALID_ARGUMENT when len + 1 > cap; out may be NULL with cap 0 to ask). */
mg_status mg_chat_render(const mg_chat_template *t, const mg_chat_message *messages, size_t count,
                         bool add_generation_prompt, char *out, size_t cap, size_t *len);

#endif
