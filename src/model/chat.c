/* chat.c - chat templates recognised and rendered in C (chat.h). */
#include "chat.h"

#include <string.h>

#include "model_mlx.h" /* mg_error_report */

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

/* Meta-Llama-3-8B-Instruct's template. */
static const char llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|star"
    "t_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|e"
    "ot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ con"
    "tent }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_heade"
    "r_id|>\n\n' }}{% endif %}";
/* Mistral-7B-Instruct-v0.1's (and v0.2's first) template: no system role. */
static const char mistral[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index"
    "0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assi"
    "stant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content']"
    " + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{%"
    " endfor %}";
/* Mistral-7B-Instruct-v0.2's later template: an optional first system message. */
static const char mistral_system[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content"
    "'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages ="
    " messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%-"
    " if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('A"
    "fter the optional system message, conversation roles must alternate user/assistant/user/assi"
    "stant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if lo"
    "op.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\"
    "n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' "
    "+ message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == "
    "'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n       "
    " {{- raise_exception('Only user and assistant roles are supported, with the exception of an "
    "initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n";

static bool same(const char *text, size_t len, const char *lit, size_t lit_len) {
    return len == lit_len && !memcmp(text, lit, len);
}

mg_status mg_chat_template_recognise(const char *text, size_t len, mg_chat_template *out) {
    memset(out, 0, sizeof *out);
    const size_t head = sizeof chatml_system_head - 1, tail = sizeof chatml_system_tail - 1;
    if (same(text, len, chatml, sizeof chatml - 1)) {
        out->format = MG_CHAT_CHATML;
        return MG_OK;
    }
    if (same(text, len, llama3, sizeof llama3 - 1)) {
        out->format = MG_CHAT_LLAMA3;
        return MG_OK;
    }
    if (same(text, len, mistral, sizeof mistral - 1)) {
        out->format = MG_CHAT_MISTRAL;
        return MG_OK;
    }
    if (same(text, len, mistral_system, sizeof mistral_system - 1)) {
        out->format = MG_CHAT_MISTRAL_SYSTEM;
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
    return mg_error_report(MG_ERR_UNSUPPORTED,
                           "the checkpoint's chat template is not one this runtime renders (ChatML "
                           "with or without a default system message, Llama-3, Mistral-instruct)");
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

mg_status mg_chat_set_special_tokens(mg_chat_template *t, const char *bos, const char *eos) {
    bos = bos ? bos : "";
    eos = eos ? eos : "";
    if (strlen(bos) >= sizeof t->bos_token || strlen(eos) >= sizeof t->eos_token)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "chat template: a special token is longer than %zu bytes",
                               sizeof t->bos_token - 1);
    strcpy(t->bos_token, bos);
    strcpy(t->eos_token, eos);
    return MG_OK;
}

bool mg_chat_writes_bos(const mg_chat_template *t, size_t count) {
    return t->format == MG_CHAT_MISTRAL || t->format == MG_CHAT_MISTRAL_SYSTEM ||
           (t->format == MG_CHAT_LLAMA3 && count > 0);
}

/* The code point of the UTF-8 sequence at s[0..n) that is exactly n bytes long, or -1 (an
 * invalid, overlong or surrogate sequence is no code point, so never whitespace). */
static long utf8_exact(const unsigned char *s, size_t n) {
    static const long min[5] = {0, 0, 0x80, 0x800, 0x10000};
    const size_t want = s[0] < 0x80             ? 1
                        : (s[0] & 0xE0) == 0xC0 ? 2
                        : (s[0] & 0xF0) == 0xE0 ? 3
                        : (s[0] & 0xF8) == 0xF0 ? 4
                                                : 0;
    if (want != n)
        return -1;
    long cp = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    return cp;
}

/* Python's str.isspace(), which str.strip() and Jinja's trim filter use. */
static bool py_space(long cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* The length of the code point starting at s (1-4; 0 when s[0..n) does not start with one). */
static size_t utf8_len_at(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++)
        if (utf8_exact(s, k) >= 0)
            return k;
    return 0;
}

/* Writes s with leading and trailing Python whitespace removed. */
static void put_trimmed(writer *w, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    size_t b = 0, e = strlen(text), k;
    while (b < e && (k = utf8_len_at(s + b, e - b)) && py_space(utf8_exact(s + b, k)))
        b += k;
    while (e > b) {
        /* the last code point ends at e: it starts at most 4 bytes back */
        size_t start = e;
        long cp = -1;
        for (size_t back = 1; back <= 4 && back <= e - b && cp < 0; back++)
            if ((cp = utf8_exact(s + e - back, back)) >= 0)
                start = e - back;
        if (cp < 0 || !py_space(cp))
            break;
        e = start;
    }
    if (w->out && w->len + (e - b) < w->cap)
        memcpy(w->out + w->len, s + b, e - b);
    w->len += e - b;
}

/* The Mistral templates' checks, in their order (raise_exception): after the optional system
 * message (skip 1), user at even places and assistant at odd ones, no other role. */
static mg_status mistral_check(const mg_chat_message *m, size_t count, size_t skip) {
    for (size_t i = skip; i < count; i++) {
        const bool user = !strcmp(m[i].role, "user");
        if (user != ((i - skip) % 2 == 0))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "the Mistral chat template refuses message %zu (%s): roles must "
                                   "alternate user/assistant/user/...%s",
                                   i, m[i].role, skip ? " after the optional system message" : "");
        if (!user && strcmp(m[i].role, "assistant"))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "the Mistral chat template refuses message %zu: only user and "
                                   "assistant roles are supported%s, not %s",
                                   i, skip ? " after an optional first system message" : "",
                                   m[i].role);
    }
    return MG_OK;
}

mg_status mg_chat_render(const mg_chat_template *t, const mg_chat_message *messages, size_t count,
                         bool add_generation_prompt, char *out, size_t cap, size_t *len) {
    writer w = {.out = cap ? out : NULL, .cap = cap};
    *len = 0;
    for (size_t i = 0; i < count; i++)
        if (!messages[i].role || !messages[i].content)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "chat message %zu has no role or content", i);
    switch (t->format) {
    case MG_CHAT_CHATML:
        for (size_t i = 0; i < count; i++) {
            /* the default system message stands before the first message, unless the
             * conversation opens with a system message of its own (the template's loop.first
             * test) */
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
        break;
    case MG_CHAT_LLAMA3:
        for (size_t i = 0; i < count; i++) {
            if (i == 0)
                put(&w, t->bos_token);
            put(&w, "<|start_header_id|>");
            put(&w, messages[i].role);
            put(&w, "<|end_header_id|>\n\n");
            put_trimmed(&w, messages[i].content);
            put(&w, "<|eot_id|>");
        }
        if (add_generation_prompt)
            put(&w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case MG_CHAT_MISTRAL: {
        mg_status st = mistral_check(messages, count, 0);
        if (st)
            return st;
        put(&w, t->bos_token);
        for (size_t i = 0; i < count; i++) {
            if (!strcmp(messages[i].role, "user")) {
                put(&w, "[INST] ");
                put(&w, messages[i].content);
                put(&w, " [/INST]");
            } else {
                put(&w, messages[i].content);
                put(&w, t->eos_token);
            }
        }
        break;
    }
    case MG_CHAT_MISTRAL_SYSTEM: {
        if (count == 0) /* the template reads messages[0]['role'] */
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "the Mistral chat template needs at least one message");
        const size_t skip = !strcmp(messages[0].role, "system");
        mg_status st = mistral_check(messages, count, skip);
        if (st)
            return st;
        put(&w, t->bos_token);
        for (size_t i = skip; i < count; i++) {
            if (!strcmp(messages[i].role, "user")) {
                put(&w, " [INST] ");
                if (skip && i == 1) {
                    put(&w, messages[0].content);
                    put(&w, "\n\n");
                }
                put(&w, messages[i].content);
                put(&w, " [/INST]");
            } else {
                put(&w, " ");
                put(&w, messages[i].content);
                put(&w, t->eos_token);
            }
        }
        break;
    }
    default:
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "unknown chat format %d", (int)t->format);
    }
    *len = w.len;
    if (w.len + 1 > cap)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "chat rendering needs %zu bytes, %zu given",
                               w.len + 1, cap);
    out[w.len] = '\0';
    return MG_OK;
}
