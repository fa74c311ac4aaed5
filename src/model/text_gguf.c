/* text_gguf.c - a GGUF file's tokenizer (text_gguf.h). */
#include "text_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_mlx.h" /* mg_error_report */

/* NUL-terminated copies of a string array's elements, in one allocation. */
static char **copy_strings(const mg_gguf_kv *kv) {
    size_t bytes = 0;
    for (uint64_t i = 0; i < kv->count; i++)
        bytes += kv->string_lens[i] + 1;
    char **out = malloc((size_t)kv->count * sizeof *out + bytes + 1);
    if (!out)
        return NULL;
    char *p = (char *)(out + kv->count);
    for (uint64_t i = 0; i < kv->count; i++) {
        out[i] = p;
        memcpy(p, kv->strings[i], kv->string_lens[i]);
        p += kv->string_lens[i];
        *p++ = '\0';
    }
    return out;
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* An id key: -1 when absent; false when present but not an id below n. */
static bool read_id(const mg_gguf *g, const char *key, uint32_t n, int32_t *out) {
    uint64_t v;
    *out = -1;
    if (!mg_gguf_find(g, key))
        return true;
    if (!mg_gguf_get_u64(g, key, &v) || v >= n)
        return false;
    *out = (int32_t)v;
    return true;
}

mg_status mg_gguf_tokenizer(const mg_gguf *g, const char *path, mg_tok **out) {
    *out = NULL;
    char model[32], pre[64] = "";
    if (!mg_gguf_get_string(g, "tokenizer.ggml.model", model, sizeof model))
        return mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "GGUF %s: tokenizer.ggml.model is missing: the file has no tokenizer", path);
    mg_tok_desc d = {.bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    if (!strcmp(model, "gpt2"))
        d.kind = MG_TOK_BYTE_BPE;
    else if (!strcmp(model, "llama"))
        d.kind = MG_TOK_SPM_BPE;
    else
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "GGUF %s: tokenizer model %s is not supported (gpt2 and llama are)",
                               path, model);
    if (mg_gguf_find(g, "tokenizer.ggml.pre") &&
        !mg_gguf_get_string(g, "tokenizer.ggml.pre", pre, sizeof pre))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: tokenizer.ggml.pre is not a string", path);
    d.pre = *pre ? pre : NULL;
    const mg_gguf_kv *tokens = mg_gguf_find(g, "tokenizer.ggml.tokens");
    const mg_gguf_kv *merges = mg_gguf_find(g, "tokenizer.ggml.merges");
    const mg_gguf_kv *types = mg_gguf_find(g, "tokenizer.ggml.token_type");
    const mg_gguf_kv *scores = mg_gguf_find(g, "tokenizer.ggml.scores");
    if (!tokens || tokens->type != MG_GGUF_ARRAY || tokens->elem_type != MG_GGUF_STRING ||
        !tokens->count || tokens->count > (1u << 24))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: tokenizer.ggml.tokens is missing or not a string array",
                               path);
    const uint32_t n = (uint32_t)tokens->count;
    if ((merges && (merges->type != MG_GGUF_ARRAY || merges->elem_type != MG_GGUF_STRING)) ||
        (types && (types->type != MG_GGUF_ARRAY || types->count != n ||
                   (types->elem_type != MG_GGUF_I32 && types->elem_type != MG_GGUF_U32))) ||
        (scores && (scores->type != MG_GGUF_ARRAY || scores->count != n ||
                    scores->elem_type != MG_GGUF_F32V)))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: tokenizer.ggml.merges, token_type or scores has the wrong "
                               "type or count (%u tokens)",
                               path, n);
    if (!read_id(g, "tokenizer.ggml.bos_token_id", n, &d.bos_id) ||
        !read_id(g, "tokenizer.ggml.eos_token_id", n, &d.eos_id) ||
        !read_id(g, "tokenizer.ggml.unknown_token_id", n, &d.unk_id) ||
        !read_id(g, "tokenizer.ggml.padding_token_id", n, &d.pad_id))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: a tokenizer.ggml.*_token_id is not an id below %u", path,
                               n);
    bool flag;
    if (mg_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag))
        d.add_bos = flag;
    else
        d.add_bos = d.kind == MG_TOK_SPM_BPE && d.bos_id >= 0; /* llama.cpp's default */
    if (mg_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &flag))
        d.add_eos = flag;
    if (mg_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &flag))
        d.add_space_prefix = flag;
    else
        d.add_space_prefix = d.kind == MG_TOK_SPM_BPE;
    char **tok_strings = copy_strings(tokens);
    char **merge_strings = merges ? copy_strings(merges) : NULL;
    int32_t *type_values = types ? malloc(n * sizeof *type_values) : NULL;
    float *score_values = scores ? malloc(n * sizeof *score_values) : NULL;
    mg_status st = MG_OK;
    if (!tok_strings || (merges && !merge_strings) || (types && !type_values) ||
        (scores && !score_values))
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "GGUF %s: out of host memory for the tokenizer",
                             path);
    for (uint32_t i = 0; !st && types && i < n; i++)
        type_values[i] = (int32_t)load_u32(types->value + 4ull * i);
    for (uint32_t i = 0; !st && scores && i < n; i++) {
        uint32_t bits = load_u32(scores->value + 4ull * i);
        memcpy(&score_values[i], &bits, 4);
    }
    if (!st) {
        d.tokens = (const char *const *)tok_strings;
        d.n_tokens = n;
        d.merges = (const char *const *)merge_strings;
        d.n_merges = merges ? (uint32_t)merges->count : 0;
        d.token_types = type_values;
        d.scores = score_values;
        if ((st = mg_tok_create(&d, out)))
            st = mg_error_report(st, "GGUF %s: tokenizer: %s", path, mg_tok_error());
    }
    free(tok_strings);
    free(merge_strings);
    free(type_values);
    free(score_values);
    return st;
}

mg_status mg_gguf_text_open(const char *path, mg_tok **tok, mg_chat_template *chat, bool *has_chat,
                            char *chat_problem, size_t problem_size) {
    *tok = NULL;
    *has_chat = false;
    memset(chat, 0, sizeof *chat);
    snprintf(chat_problem, problem_size, "the checkpoint has no chat template");
    mg_gguf *g = NULL;
    mg_status st = mg_gguf_open(path, &g);
    if (st)
        return st;
    if ((st = mg_gguf_tokenizer(g, path, tok))) {
        mg_gguf_close(g);
        return st;
    }
    const mg_gguf_kv *t = mg_gguf_find(g, "tokenizer.chat_template");
    if (t && t->type == MG_GGUF_STRING) {
        if (!mg_chat_template_recognise(t->str, t->str_len, chat)) {
            /* the templates that write bos_token / eos_token get the tokenizer's own (a
             * token too long for the template's fields leaves both empty) */
            const int32_t bos = mg_tok_bos(*tok), eos = mg_tok_eos(*tok);
            mg_chat_set_special_tokens(chat, bos >= 0 ? mg_tok_token_text(*tok, bos) : NULL,
                                       eos >= 0 ? mg_tok_token_text(*tok, eos) : NULL);
            *has_chat = true;
        } else
            snprintf(chat_problem, problem_size, "%s", mg_last_error());
    }
    mg_gguf_close(g);
    return MG_OK;
}
