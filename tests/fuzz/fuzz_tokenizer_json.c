/* fuzz_tokenizer_json.c - libFuzzer target: any bytes as a tokenizer.json. Built with clang
 * -fsanitize=fuzzer,address,undefined from the tokenizer's own sources
 * (cmake/tokenizer_tests.cmake); a short run is the ctest test fuzz_tokenizer_json_smoke.
 * Every input must be accepted or refused with a status and a message; an accepted one must
 * encode a few fixed strings and decode the ids back, in one call and through the stream
 * decoder, with the same text. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char *const texts[] = {
    "",
    "Hello world",
    " a  b\t\n\r\n 123 4567 it's",
    "<s>x</s><|im_start|>",
    "\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mg_tok *t;
    mg_status st = mg_tok_from_json_text((const char *)data, size, &t);
    if (st != MG_OK) {
        if (!mg_tok_error()[0] || t)
            abort();
        return 0;
    }
    int32_t ids[256];
    char out[4096], chunk[4096];
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        size_t n, len, total = 0, cl;
        if (mg_tok_encode(t, texts[k], strlen(texts[k]), true, k & 1, ids, 256, &n) != MG_OK)
            continue;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= mg_tok_vocab_size(t))
                abort();
        if (mg_tok_decode(t, ids, n, k & 2, out, sizeof out, &len) != MG_OK)
            continue;
        mg_tok_stream *s;
        if (mg_tok_stream_create(t, k & 2, &s) != MG_OK)
            abort();
        for (size_t i = 0; i <= n; i++) {
            st = i < n ? mg_tok_stream_put(s, ids[i], chunk, sizeof chunk, &cl)
                       : mg_tok_stream_finish(s, chunk, sizeof chunk, &cl);
            if (st != MG_OK || total + cl > len || memcmp(out + total, chunk, cl) != 0)
                abort();
            total += cl;
        }
        if (total != len)
            abort();
        mg_tok_stream_destroy(s);
    }
    mg_tok_destroy(t);
    return 0;
}
