/* fuzz_gguf.c - libFuzzer target: any bytes as a GGUF file image (src/model/gguf.h), then, when
 * the reader accepts them, as a tokenizer description (text_gguf.h) and a chat template
 * (chat.h). Built with clang -fsanitize=fuzzer,address,undefined from those sources
 * (cmake/model_tests.cmake); a short run from tests/fuzz/corpus_gguf/ is the ctest test
 * fuzz_gguf_smoke. Every input must be accepted or refused with a status; when accepted, every
 * tensor's bytes and every string must lie inside the input (read here, so the sanitizer sees
 * any escape). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "gguf.h"
#include "text_gguf.h"

static volatile uint8_t fuzz_sink;

static void inside(const uint8_t *data, size_t size, const void *p, uint64_t n) {
    const uint8_t *b = p;
    if (n && (b < data || n > size || b > data + size - n))
        abort();
    if (n)
        fuzz_sink ^= b[0] ^ b[n - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mg_gguf *g;
    mg_clear_error();
    if (mg_gguf_open_memory(data, size, "fuzz", &g) != MG_OK) {
        if (!mg_last_error()[0])
            abort(); /* a refusal always says why */
        return 0;
    }
    for (size_t i = 0; i < mg_gguf_tensor_count(g); i++) {
        const mg_gguf_tensor *t = mg_gguf_tensor_at(g, i);
        inside(data, size, t->data, t->bytes);
        if (mg_gguf_tensor_find(g, t->name) != t)
            abort();
    }
    for (size_t i = 0; i < mg_gguf_kv_count(g); i++) {
        const mg_gguf_kv *kv = mg_gguf_kv_at(g, i);
        inside(data, size, kv->key, kv->key_len);
        if (kv->type == MG_GGUF_STRING)
            inside(data, size, kv->str, kv->str_len);
        for (uint64_t j = 0; kv->strings && j < kv->count; j++)
            inside(data, size, kv->strings[j], kv->string_lens[j]);
    }
    mg_tok *tok;
    if (mg_gguf_tokenizer(g, "fuzz", &tok) == MG_OK) {
        int32_t ids[64];
        size_t n = 0;
        mg_tok_encode(tok, "Hello, world 123 <|im_end|>", 27, true, true, ids, 64, &n);
        mg_tok_destroy(tok);
    }
    const mg_gguf_kv *t = mg_gguf_find(g, "tokenizer.chat_template");
    mg_chat_template chat;
    if (t && t->type == MG_GGUF_STRING &&
        mg_chat_template_recognise(t->str, t->str_len, &chat) == MG_OK) {
        const mg_chat_message m = {.role = "user", .content = "hi"};
        char out[1024];
        size_t len;
        mg_chat_render(&chat, &m, 1, true, out, sizeof out, &len);
    }
    mg_gguf_close(g);
    return 0;
}
