/* model_presets.c - the synthetic presets of model.h, their weight formats' names, and the
 * deterministic random weights and prompts (the generator model.h documents). */
#include "model_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrale/dtype.h"
#include "metrale/ops.h"
#include "metrale/ops_activation.h"
#include "metrale/ops_elementwise.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_kv_cache.h"
#include "metrale/ops_moe.h"
#include "metrale/ops_moe_gemm.h"
#include "metrale/ops_nvfp4.h"
#include "metrale/ops_quantize.h"
#include "metrale/status.h"

/* ------------------------------------------------------------------ presets */

static const mg_fwd_preset presets[] = {
    {.name = "tiny",
     .description = "2 layers, hidden 256, 4 q / 2 kv heads of 128, vocab 1024 (seconds on a CPU)",
     .shape = {.hidden = 256,
               .heads = 4,
               .kv_heads = 2,
               .head_dim = 128,
               .intermediate = 512,
               .vocab = 1024},
     .layers = 2,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-5f,
     .max_batch_tokens = 4096,
     .max_batch_size = 64,
     .batch = 4,
     .prompt_len = 16,
     .steps = 8},
    {.name = "small",
     .description = "4 layers, hidden 512, 8 q / 2 kv heads of 128, vocab 4096 (under a minute "
                    "on a CPU)",
     .shape = {.hidden = 512,
               .heads = 8,
               .kv_heads = 2,
               .head_dim = 128,
               .intermediate = 1536,
               .vocab = 4096},
     .layers = 4,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-5f,
     .max_batch_tokens = 8192,
     .max_batch_size = 64,
     .batch = 4,
     .prompt_len = 32,
     .steps = 8},
    {.name = "micro",
     .description = "2 layers, hidden 128, 2 q / 1 kv heads of 128, vocab 512 (the committed MLX "
                    "checkpoints' shape)",
     .shape = {.hidden = 128,
               .heads = 2,
               .kv_heads = 1,
               .head_dim = 128,
               .intermediate = 256,
               .vocab = 512},
     .layers = 2,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-5f,
     .max_batch_tokens = 4096,
     .max_batch_size = 64,
     .batch = 4,
     .prompt_len = 16,
     .steps = 8},
    {.name = "llama-3-8b",
     .description = "32 layers of Llama-3-8B's shapes (hidden 4096, 32 q / 8 kv heads, MLP "
                    "14336, vocab 128256)",
     .shape = {.hidden = 4096,
               .heads = 32,
               .kv_heads = 8,
               .head_dim = 128,
               .intermediate = 14336,
               .vocab = 128256},
     .layers = 32,
     .rope_theta = 500000.0f,
     .norm_eps = 1e-5f,
     .max_batch_tokens = 8192,
     .max_batch_size = 256,
     .batch = 1,
     .prompt_len = 512,
     .steps = 64},
    {.name = "llama-3.2-1b",
     .description = "16 layers of Llama-3.2-1B's shapes (hidden 2048, 32 q / 8 kv heads of 64, "
                    "MLP 8192, vocab 128256; random weights keep the LM head apart from the "
                    "embedding, which a decode step reads the same way as a tied one)",
     .shape = {.hidden = 2048,
               .heads = 32,
               .kv_heads = 8,
               .head_dim = 64,
               .intermediate = 8192,
               .vocab = 128256},
     .layers = 16,
     .rope_theta = 500000.0f,
     .norm_eps = 1e-5f,
     .max_batch_tokens = 8192,
     .max_batch_size = 256,
     .batch = 1,
     .prompt_len = 512,
     .steps = 64},
    {.name = "qwen3-30b-a3b",
     .description = "48 layers of Qwen3-30B-A3B's shapes (128 experts, top-8; MoE)",
     .shape = {.hidden = 2048,
               .heads = 32,
               .kv_heads = 4,
               .head_dim = 128,
               .intermediate = 768,
               .experts = 128,
               .experts_per_token = 8,
               .vocab = 151936},
     .layers = 48,
     .rope_theta = 1000000.0f,
     .norm_eps = 1e-6f,
     .max_batch_tokens = 8192,
     .max_batch_size = 256,
     .batch = 1,
     .prompt_len = 512,
     .steps = 64},
    {.name = "tiny-moe",
     .description = "2 layers, hidden 256, 8 experts of 128, top-2, vocab 1024 (MoE; seconds on "
                    "a CPU)",
     .shape = {.hidden = 256,
               .heads = 4,
               .kv_heads = 2,
               .head_dim = 128,
               .intermediate = 128,
               .experts = 8,
               .experts_per_token = 2,
               .vocab = 1024},
     .layers = 2,
     .rope_theta = 10000.0f,
     .norm_eps = 1e-6f,
     .max_batch_tokens = 4096,
     .max_batch_size = 64,
     .batch = 4,
     .prompt_len = 16,
     .steps = 8},
};

const mg_fwd_preset *mg_fwd_presets(size_t *count) {
    *count = sizeof presets / sizeof presets[0];
    return presets;
}

const mg_fwd_preset *mg_fwd_preset_find(const char *name) {
    for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name))
            return &presets[i];
    return NULL;
}

mg_fwd_config mg_fwd_config_default(const mg_fwd_preset *p) {
    return (mg_fwd_config){.preset = p,
                           .batch = p->batch,
                           .prompt_len = p->prompt_len,
                           .steps = p->steps,
                           .seed = 1,
                           .use_graphs = true};
}

uint32_t mg_fwd_prompt_length(const mg_fwd_config *c, uint32_t r) {
    if (c->prompt_ids && c->prompt_lengths)
        return c->prompt_lengths[r];
    if (c->prompt_ids)
        return c->prompt_ids_count;
    uint32_t l = c->prompt_len;
    uint32_t len = l - l / 4 + (r * 37u) % (l / 2 + 1);
    return len ? len : 1;
}

/* ------------------------------------------------------------------ weights */

const char *mg_fwd_weights_name(mg_fwd_weights w) {
    return w == MG_FWD_WEIGHTS_NVFP4        ? "nvfp4"
           : w == MG_FWD_WEIGHTS_FP8        ? "fp8"
           : w == MG_FWD_WEIGHTS_MLX8       ? "mlx8"
           : w == MG_FWD_WEIGHTS_MLX4       ? "mlx4"
           : w == MG_FWD_WEIGHTS_CHECKPOINT ? "checkpoint"
                                            : "bf16";
}

int mg_fwd_weights_find(const char *name) {
    if (name && !strcmp(name, "bf16"))
        return MG_FWD_WEIGHTS_BF16;
    if (name && !strcmp(name, "nvfp4"))
        return MG_FWD_WEIGHTS_NVFP4;
    if (name && !strcmp(name, "mlx8"))
        return MG_FWD_WEIGHTS_MLX8;
    if (name && !strcmp(name, "mlx4"))
        return MG_FWD_WEIGHTS_MLX4;
    if (name && !strcmp(name, "fp8"))
        return MG_FWD_WEIGHTS_FP8;
    return -1;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t key(uint64_t seed, uint32_t id, uint64_t index) {
    return seed * 0x9E3779B97F4A7C15ull + ((uint64_t)id << 40) + index;
}

int32_t mg_fwd_prompt_token(uint64_t seed, uint32_t vocab, uint32_t r, uint32_t t) {
    /* tensor id 15 is reserved for prompts */
    return (int32_t)(splitmix64(key(seed, 15, ((uint64_t)r << 32) + t)) % vocab);
}

uint64_t mg_fwd_weight_counter(uint64_t seed, uint32_t id) {
    return key(seed, id, 0);
}

void mg_fwd_weight_fill(uint64_t seed, uint32_t id, float offset, float scale, uint64_t first,
                        size_t count, uint16_t *out) {
    mg_uniform_bf16_host(mg_fwd_weight_counter(seed, id) + first, offset, scale, count, out);
}

mg_status mg_fwd_tensor_shape(const mg_model_shape *s, uint32_t layers, uint32_t id, uint32_t *rows,
                              uint32_t *cols, float *offset, float *scale) {
    uint32_t q = s->heads * s->head_dim, kv = 2 * s->kv_heads * s->head_dim;
    uint32_t r = 0, c = 0;
    bool norm = false;
    if (id == MG_FWD_TENSOR_EMBEDDING || id == MG_FWD_TENSOR_LM_HEAD) {
        r = s->vocab;
        c = s->hidden;
    } else if (id == MG_FWD_TENSOR_FINAL_NORM) {
        r = 1;
        c = s->hidden;
        norm = true;
    } else if (id >= 16 && (id - 16) / 8 < layers) {
        uint32_t groups = s->experts ? s->experts : 1;
        switch ((id - 16) % 8) {
        case MG_FWD_ATTN_NORM:
        case MG_FWD_MLP_NORM:
            r = 1;
            c = s->hidden;
            norm = true;
            break;
        case MG_FWD_WQ:
            r = q;
            c = s->hidden;
            break;
        case MG_FWD_WKV:
            r = kv;
            c = s->hidden;
            break;
        case MG_FWD_WO:
            r = s->hidden;
            c = q;
            break;
        case MG_FWD_W_GATE_UP:
            r = groups * 2 * s->intermediate;
            c = s->hidden;
            break;
        case MG_FWD_W_DOWN:
            r = groups * s->hidden;
            c = s->intermediate;
            break;
        case MG_FWD_ROUTER:
            r = s->experts;
            c = s->hidden;
            break;
        default:
            break;
        }
    }
    if (!r)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "forward model: no tensor %u", id);
    *rows = r;
    *cols = c;
    *offset = norm ? 1.0f : 0.0f;
    *scale = norm ? 0.1f : id == MG_FWD_TENSOR_EMBEDDING ? 1.0f : 1.0f / sqrtf((float)c);
    return MG_OK;
}
