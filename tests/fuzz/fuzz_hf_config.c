/* fuzz_hf_config.c - libFuzzer target: any bytes as a Hugging Face config.json
 * (mg_fwd_hf_config_parse, src/model/model_hf_config.c) and as ModelOpt's hf_quant_config.json
 * (mg_fwd_hf_quant_config_parse, which must accept only what names NVFP4 the ModelOpt way). Built
 * with clang -fsanitize=fuzzer,address,undefined from that file and json.c
 * (cmake/model_tests.cmake); a short run is the ctest test fuzz_hf_config_smoke. Every input must
 * be accepted or refused with a status and a one-line message; an accepted one must describe a
 * network the model can size without overflow: every dimension positive and in range, heads a
 * multiple of KV heads, an even head dimension, experts only with a top-k within them, a finite
 * positive RoPE theta and an eps in (0, 1). The seeds (tests/fuzz/corpus_hf_config/) are the
 * configs tests/model/random_models.py writes with transformers' classes and mlx-lm's converter
 * (two of them its NVFP4 forms' quantization_config) and one hf_quant_config.json as ModelOpt
 * writes it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_hf.h"

/* A refusal's message: one line naming the file. */
static void check_refusal(const char *path) {
    if (!mg_last_error()[0] || strchr(mg_last_error(), '\n') || !strstr(mg_last_error(), path))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mg_fwd_preset arch;
    mg_fwd_hf_config c;
    mg_clear_error();
    memset(&c, 0, sizeof c);
    if (mg_fwd_hf_quant_config_parse((const char *)data, size, "fuzz/hf_quant_config.json", &c))
        check_refusal("fuzz/hf_quant_config.json");
    else if (c.nvfp4 != MG_FWD_NVFP4_MODELOPT)
        abort();
    mg_clear_error();
    memset(&arch, 0xA5, sizeof arch);
    mg_status st = mg_fwd_hf_config_parse((const char *)data, size, "fuzz/config.json", &arch, &c);
    if (st != MG_OK) {
        check_refusal("fuzz/config.json");
        return 0;
    }
    const mg_model_shape *s = &arch.shape;
    const uint32_t dims[] = {s->hidden,   s->intermediate, s->heads,   s->kv_heads,
                             s->head_dim, s->vocab,        arch.layers};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] == 0 || dims[i] > (1u << 24))
            abort();
    if (s->heads % s->kv_heads || s->head_dim % 2 || (uint64_t)s->heads * s->head_dim > 1u << 16)
        abort();
    if (s->experts ? s->experts_per_token == 0 || s->experts_per_token > s->experts
                   : s->experts_per_token != 0)
        abort();
    if (!(arch.rope_theta > 0) || !isfinite(arch.rope_theta) || !(arch.norm_eps > 0) ||
        !(arch.norm_eps < 1))
        abort();
    if (arch.qkv_bias && arch.qk_norm)
        abort();
    if (c.bits != 0 && c.bits != 4 && c.bits != 8)
        abort();
    if (!c.arch_name[0] || !memchr(c.arch_name, 0, sizeof c.arch_name))
        abort();
    return 0;
}
