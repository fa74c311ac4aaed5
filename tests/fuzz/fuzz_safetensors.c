/* fuzz_safetensors.c - libFuzzer target: any bytes as a safetensors file image and as a
 * config.json. Built with clang -fsanitize=fuzzer,address,undefined from the reader's own
 * sources (CMakeLists.txt, METRALE_FUZZ); a short run is the ctest test fuzz_safetensors_smoke.
 * Every input must be accepted or refused with a status; when accepted, every tensor's bytes
 * must lie inside the input (read here, so the sanitizer sees any escape). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "metrale/mlx.h"
#include "metrale/safetensors.h"

/* Where the reads of tensor bytes go, so they are not optimised away. */
static volatile uint8_t fuzz_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mg_st_model *m;
    if (mg_st_open_memory(data, size, "fuzz", &m) == MG_OK) {
        for (size_t i = 0; i < mg_st_count(m); i++) {
            mg_st_tensor t;
            if (mg_st_get(m, i, &t) != MG_OK)
                abort();
            const uint8_t *p = t.data;
            if (t.bytes && (p < data || p + t.bytes > data + size))
                abort();
            if (t.bytes)
                fuzz_sink ^= p[0] ^ p[t.bytes - 1];
            mg_st_tensor again;
            if (mg_st_find(m, t.name, &again) != MG_OK || again.data != t.data)
                abort();
        }
        (void)mg_st_metadata(m, "format");
        mg_st_close(m);
    }
    mg_mlx_config *c;
    if (mg_mlx_config_parse((const char *)data, size, "fuzz", &c) == MG_OK) {
        mg_mlx_quant q;
        if (mg_mlx_config_module(c, "model.layers.0.mlp.gate", &q) != MG_OK)
            abort();
        mg_mlx_config_close(c);
    }
    return 0;
}
