/* chat.c - chat templates recognised and rendered in C (chat.h). */
#include "chat.h"

#include <string.h>

#include "model_mlx.h" /* mg_fwd_fail */

/* The templates as the checkpoints write them; DEFAULT_SYSTEM marks where the default system
 * text stands (a Jinja string literal: any text without a quote or a backslash). */
static const char chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";
static const char chatml_system_head[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\n";
static const char chatml_system_tail[] =
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";

mg_status mg_chat_template_recognise(const char *text, size_t len, mg_chat_template *out) {
    memset(out, 0, sizeof *out);
    const size_t head = sizeof chatml_system_head - 1, tail = sizeof chatml_system_tail - 1;
    if (len == sizeof chatml - 1 && !memcmp(text, chatml, len)) {
        out->format = MG_CHAT_CHATML;
        return MG_OK;
    }
    if (len > head + tail && !memcmp(text, chatml_system_head, head) &&
        !memcmp(text + len - tail, chatml_system_tail, tail)) {
        const char *sys = text + head;
        const size_t n = len - head - tail;
        if (n < sizeof out->default_system && !memchr(sys, '\'', n) && !memchr(sys, '\\', n) &&
            !memchr(sys, '{', n) && !memchr(sys, '\0', n)) {
            out->format = MG_CHAT_CHATML;
            memcpy(out->default_system, sys, n);
            out->default_system[n] = '\0';
            return MG_OK;
        }
    }
    return mg_fwd_fail(MG_ERR_UNSUPPORTED,
                       "the checkpoint's chat template is not one this runtime renders (ChatML, "
                       "with or without a default system message)");
}

typedef struct writer {
    char *out;
    size_t cap, len;
} writer;

static void put(writer *w, const char *s) {
    const size_t n = strlen(s);
    if (w->out && w->len + n < w->cap)
        memcpy(w->out + w->len, s, n);
    w->len += n;
}

mg_status mg_chat_render(const mg_chat_template *t, const mg_chat_message *messages, size_t count,
                         bool add_generation_prompt, char *out, size_t cap, size_t *len) {
    writer w = {.out = cap ? out : NULL, .cap = cap};
    for (size_t i = 0; i < count; i++)
        if (!messages[i].role || !messages[i].content)
            return mg_fwd_fail(MG_ERR_INVALID_ARGUMENT, "chat message %zu has no role or content",
                               i);
    if (t->format != MG_CHAT_CHATML)
        return mg_fwd_fail(MG_ERR_INVALID_ARGUMENT, "unknown chat format %d", (int)t->format);
    for (size_t i = 0; i < count; i++) {
        /* the default system message stands before the first message, unless the conversation
         * opens with a system message of its own (as the template's loop.first test) */
        if (i == 0 && t->default_system[0] && strcmp(messages[0].role, "system")) {
            put(&w, "<|im_start|>system\n");
            put(&w, t->default_system);
            put(&w, "<|im_end|>\n");
        }
        put(&w, "<|im_start|>");
        put(&w, messages[i].role);
        put(&w, "\n");
        put(&w, messages[i].content);
        put(&w, "<|im_end|>\n");
    }
    if (add_generation_prompt)
        put(&w, "<|im_start|>assistant\n");
    *len = w.len;
    if (w.len + 1 > cap)
        return mg_fwd_fail(MG_ERR_INVALID_ARGUMENT, "chat rendering needs %zu bytes, %zu given",
                           w.len + 1, cap);
    out[w.len] = '\0';
    return MG_OK;
}
