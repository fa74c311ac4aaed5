/* model_hf_config.c - a Hugging Face config.json as the forward model's architecture
 * (model_hf.h): the text alone, so that the fuzz target fuzz_hf_config runs it. */
#include "model_hf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

/* A string value as a name: mg_jdoc_plain_string without control characters, so that a
 * message quoting it stays one line. */
static bool name_string(const mg_jdoc *d, int i, char *buf, size_t size) {
    if (!mg_jdoc_plain_string(d, i, buf, size))
        return false;
    for (const char *c = buf; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            buf[0] = 0;
            return false;
        }
    return true;
}

/* A positive integer member of at most `max` (absent or null: `def`, 0 meaning required). */
static mg_status member_u32(const mg_jdoc *d, const char *path, const char *key, uint32_t def,
                            uint32_t max, uint32_t *out) {
    const int i = mg_jdoc_get(d, 0, key);
    long long v;
    if (mg_jdoc_null(d, i) && def) {
        *out = def;
        return MG_OK;
    }
    if (!mg_jdoc_int(d, i, &v) || v <= 0)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"%s\" is missing or not a positive integer", path, key);
    if (v > max)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: \"%s\" = %lld is out of range (1..%u)",
                               path, key, v, max);
    *out = (uint32_t)v;
    return MG_OK;
}

/* The architectures read, and what each adds to the Llama layer (model.h). */
static const struct hf_arch {
    const char *name;
    bool qkv_bias, qk_norm, moe;
} hf_archs[] = {{"LlamaForCausalLM", false, false, false},
                {"MistralForCausalLM", false, false, false},
                {"Qwen2ForCausalLM", true, false, false},
                {"Qwen3ForCausalLM", false, true, false},
                {"Qwen3MoeForCausalLM", false, true, true}};

/* Qwen3-MoE's experts (model.h's MoE layers): num_experts (transformers 5 writes
 * num_local_experts), num_experts_per_tok, moe_intermediate_size (the shape's intermediate);
 * every layer sparse (decoder_sparse_step 1, no mlp_only_layers) and the top-k weights
 * renormalized (norm_topk_prob), as the model's MoE layer computes; anything else is refused. */
static mg_status read_experts(const mg_jdoc *d, const char *path, mg_model_shape *s) {
    uint32_t local = 0, step = 1;
    const bool has_local = !mg_jdoc_null(d, mg_jdoc_get(d, 0, "num_local_experts"));
    mg_status st;
    if (has_local && (st = member_u32(d, path, "num_local_experts", 0, 1024, &local)))
        return st;
    if ((st = member_u32(d, path, "num_experts", local, 1024, &s->experts)))
        return st;
    if (local && local != s->experts)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"num_experts\" %u and \"num_local_experts\" %u differ", path,
                               s->experts, local);
    if ((st = member_u32(d, path, "num_experts_per_tok", 0, s->experts, &s->experts_per_token)) ||
        (st = member_u32(d, path, "moe_intermediate_size", 0, 1u << 18, &s->intermediate)) ||
        (st = member_u32(d, path, "decoder_sparse_step", 1, 1024, &step)))
        return st;
    const int only = mg_jdoc_get(d, 0, "mlp_only_layers");
    if (step != 1 ||
        (!mg_jdoc_null(d, only) && (!mg_jdoc_is(d, only, JSMN_ARRAY) || d->tk[only].size != 0)))
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: dense layers among the MoE layers (decoder_sparse_step %u, "
                               "mlp_only_layers) are not supported",
                               path, step);
    bool bad = false;
    if (!mg_jdoc_bool(d, 0, "norm_topk_prob", false, &bad) || bad)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: \"norm_topk_prob\" is not true: top-k weights that are not "
                               "renormalized are not supported",
                               path);
    return MG_OK;
}

/* Llama 3.1's scaling from object `o` of key `key` (its four numbers, all required). */
static mg_status read_llama3(const mg_jdoc *d, int o, const char *path, const char *key,
                             mg_fwd_rope_llama3 *out) {
    static const char *const names[4] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings"};
    double v[4];
    for (int i = 0; i < 4; i++)
        if (!mg_jdoc_num(d, mg_jdoc_get(d, o, names[i]), &v[i]) || !isfinite(v[i]))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "%s: \"%s.%s\" is missing or not a number (RoPE scaling "
                                   "\"llama3\")",
                                   path, key, names[i]);
    if (!(v[0] >= 1 && v[0] <= 1e6) || !(v[1] > 0) || !(v[1] < v[2]) || !(v[2] <= 1e6) ||
        !(v[3] >= 1 && v[3] <= 1e9) || v[3] != floor(v[3]))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"%s\" of RoPE scaling \"llama3\" is out of range: factor "
                               "%g (1..1e6), low_freq_factor %g < high_freq_factor %g (both > 0), "
                               "original_max_position_embeddings %g (an integer >= 1)",
                               path, key, v[0], v[1], v[2], v[3]);
    *out = (mg_fwd_rope_llama3){(float)v[0], (float)v[1], (float)v[2], (uint32_t)v[3]};
    return MG_OK;
}

/* RoPE: the theta (rope_parameters.rope_theta, as transformers 5 writes it, or the older
 * top-level rope_theta; default 10000) and the scaling, which must be absent, of type
 * "default", or Llama 3.1's "llama3" (into *llama3; both keys giving it must agree): any other
 * scaled RoPE (linear, dynamic, yarn, longrope) is refused by name, never run unscaled. */
static mg_status read_rope(const mg_jdoc *d, const char *path, double *theta,
                           mg_fwd_rope_llama3 *llama3) {
    const int params = mg_jdoc_get(d, 0, "rope_parameters"), top = mg_jdoc_get(d, 0, "rope_theta");
    if (!mg_jdoc_null(d, params) && !mg_jdoc_is(d, params, JSMN_OBJECT))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: \"rope_parameters\" is not an object",
                               path);
    const int nested = mg_jdoc_null(d, params) ? -1 : mg_jdoc_get(d, params, "rope_theta");
    double t = 10000.0, other = 0;
    if (!mg_jdoc_null(d, nested) && !mg_jdoc_num(d, nested, &t))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"rope_parameters.rope_theta\" is not a number", path);
    if (!mg_jdoc_null(d, top) && !mg_jdoc_num(d, top, mg_jdoc_null(d, nested) ? &t : &other))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: \"rope_theta\" is not a number", path);
    if (!mg_jdoc_null(d, top) && !mg_jdoc_null(d, nested) && other != t)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"rope_theta\" %g and \"rope_parameters.rope_theta\" %g differ",
                               path, other, t);
    if (!((float)t > 0) || t > 1e12) /* the model keeps it in single precision */
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: rope_theta %g is not in (0, 1e12]",
                               path, t);
    *theta = t;
    const char *const scaling_keys[] = {"rope_scaling", "rope_parameters"};
    for (int k = 0; k < 2; k++) {
        const int o = mg_jdoc_get(d, 0, scaling_keys[k]);
        if (mg_jdoc_null(d, o))
            continue;
        if (!mg_jdoc_is(d, o, JSMN_OBJECT))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: \"%s\" is not an object", path,
                                   scaling_keys[k]);
        int ti = mg_jdoc_get(d, o, "rope_type");
        if (mg_jdoc_null(d, ti))
            ti = mg_jdoc_get(d, o, "type");
        char type[32] = "default";
        if (!mg_jdoc_null(d, ti) && !name_string(d, ti, type, sizeof type))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "%s: \"%s\" has a rope type that is not a short string", path,
                                   scaling_keys[k]);
        if (!strcmp(type, "llama3")) {
            mg_fwd_rope_llama3 r;
            mg_status st = read_llama3(d, o, path, scaling_keys[k], &r);
            if (st)
                return st;
            if (llama3->factor > 0 && memcmp(llama3, &r, sizeof r))
                return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                       "%s: \"rope_scaling\" and \"rope_parameters\" give "
                                       "different \"llama3\" scalings",
                                       path);
            *llama3 = r;
        } else if (strcmp(type, "default")) {
            return mg_error_report(MG_ERR_UNSUPPORTED,
                                   "%s: RoPE scaling type \"%s\" (%s) is not supported: only "
                                   "unscaled RoPE (type \"default\") and Llama 3.1's "
                                   "(\"llama3\") are",
                                   path, type, scaling_keys[k]);
        }
    }
    return MG_OK;
}

/* Sliding-window attention: where a window applies (Mistral's sliding_window; Qwen's with
 * use_sliding_window, or layer_types naming "sliding_attention"), attention within the window
 * is full attention, so the model's context is capped at the window and a longer run is
 * refused (mg_fwd_create) rather than attended past it. */
static mg_status read_window(const mg_jdoc *d, const char *path, bool qwen, uint32_t *context) {
    bool bad = false, windowed = !qwen;
    if (qwen)
        windowed = mg_jdoc_bool(d, 0, "use_sliding_window", false, &bad);
    if (bad)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"use_sliding_window\" is not a boolean", path);
    const int lt = mg_jdoc_get(d, 0, "layer_types");
    if (!mg_jdoc_null(d, lt)) {
        if (!mg_jdoc_is(d, lt, JSMN_ARRAY))
            return mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: \"layer_types\" is not an array",
                                   path);
        bool sliding = false;
        for (int i = lt + 1, n = 0; n < d->tk[lt].size; n++, i = mg_jdoc_skip(d, i)) {
            char type[32] = "";
            if (!name_string(d, i, type, sizeof type) ||
                (strcmp(type, "full_attention") && strcmp(type, "sliding_attention")))
                return mg_error_report(MG_ERR_UNSUPPORTED,
                                       "%s: layer_types[%d] \"%s\" is not supported "
                                       "(full_attention and sliding_attention are)",
                                       path, n, type);
            sliding |= !strcmp(type, "sliding_attention");
        }
        windowed = sliding || (windowed && !qwen);
    }
    const int w = mg_jdoc_get(d, 0, "sliding_window");
    long long v = 0;
    if (!windowed || mg_jdoc_null(d, w))
        return MG_OK;
    if (!mg_jdoc_int(d, w, &v) || v <= 0)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: \"sliding_window\" is not a positive integer", path);
    if (!*context || (unsigned long long)v < *context)
        *context = v < (1 << 30) ? (uint32_t)v : 1u << 30;
    return MG_OK;
}

/* Whether member `key` of the object at obj is the string `want`. */
static bool member_is(const mg_jdoc *d, int obj, const char *key, const char *want) {
    char buf[48];
    return name_string(d, mg_jdoc_get(d, obj, key), buf, sizeof buf) && !strcmp(buf, want);
}

/* A quantization args object (compressed-tensors' "weights" or "input_activations") that
 * describes NVFP4: 4-bit floats in groups of 16. */
static bool is_nvfp4_args(const mg_jdoc *d, int args) {
    long long bits = 0, group = 0;
    return mg_jdoc_is(d, args, JSMN_OBJECT) &&
           mg_jdoc_int(d, mg_jdoc_get(d, args, "num_bits"), &bits) && bits == 4 &&
           member_is(d, args, "type", "float") &&
           mg_jdoc_int(d, mg_jdoc_get(d, args, "group_size"), &group) && group == 16;
}

/* compressed-tensors: every group of config_groups NVFP4 ("nvfp4-pack-quantized" packing, here
 * or at the top; NVFP4 weights), its activations NVFP4 or not quantized. */
static mg_status read_compressed_tensors(const mg_jdoc *d, int q, const char *path,
                                         mg_fwd_hf_config *out) {
    const bool packed = member_is(d, q, "format", "nvfp4-pack-quantized");
    const int groups = mg_jdoc_get(d, q, "config_groups");
    if (!mg_jdoc_is(d, groups, JSMN_OBJECT) || d->tk[groups].size < 1)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "%s: compressed-tensors quantization_config has no config_groups",
                               path);
    if (!mg_jdoc_null(d, mg_jdoc_get(d, q, "kv_cache_scheme")))
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: a quantized KV cache (kv_cache_scheme) is not supported: the "
                               "KV cache is BF16",
                               path);
    const int status = mg_jdoc_get(d, q, "quantization_status");
    if (!mg_jdoc_null(d, status) && !member_is(d, q, "quantization_status", "compressed"))
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: compressed-tensors quantization_status is not \"compressed\" "
                               "(only packed NVFP4 weights are read)",
                               path);
    int key = groups + 1;
    for (int g = 0; g < d->tk[groups].size; g++, key = mg_jdoc_skip(d, key + 1)) {
        const int group = key + 1;
        char name[48] = "?";
        name_string(d, key, name, sizeof name);
        const bool group_packed = member_is(d, group, "format", "nvfp4-pack-quantized");
        if ((!packed && !group_packed) || !is_nvfp4_args(d, mg_jdoc_get(d, group, "weights")))
            return mg_error_report(MG_ERR_UNSUPPORTED,
                                   "%s: compressed-tensors group %s is not NVFP4 "
                                   "(\"nvfp4-pack-quantized\", 4-bit float weights in groups of "
                                   "16 are supported)",
                                   path, name);
        const int act = mg_jdoc_get(d, group, "input_activations");
        if (!mg_jdoc_null(d, act) && !is_nvfp4_args(d, act))
            return mg_error_report(MG_ERR_UNSUPPORTED,
                                   "%s: compressed-tensors group %s quantizes activations other "
                                   "than as NVFP4",
                                   path, name);
        out->nvfp4_input_scales |= !mg_jdoc_null(d, act);
        if (!mg_jdoc_null(d, mg_jdoc_get(d, group, "output_activations")))
            return mg_error_report(MG_ERR_UNSUPPORTED,
                                   "%s: compressed-tensors group %s quantizes output activations",
                                   path, name);
    }
    out->nvfp4 = MG_FWD_NVFP4_COMPRESSED_TENSORS;
    return MG_OK;
}

/* ModelOpt: quant_algo NVFP4 (at q or in its "quantization" object, hf_quant_config.json's
 * layout), group_size 16 where given, no quantized KV cache. */
static mg_status read_modelopt(const mg_jdoc *d, int q, const char *path, mg_fwd_hf_config *out) {
    const int inner = mg_jdoc_get(d, q, "quantization");
    if (mg_jdoc_is(d, inner, JSMN_OBJECT))
        q = inner;
    char algo[48] = "";
    const int ai = mg_jdoc_get(d, q, "quant_algo");
    if (!name_string(d, ai, algo, sizeof algo) || strcmp(algo, "NVFP4"))
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: ModelOpt quant_algo \"%s\" is not supported (NVFP4 is)", path,
                               mg_jdoc_null(d, ai) ? "(missing)"
                               : algo[0]           ? algo
                                                   : "?");
    long long group = 16;
    const int gi = mg_jdoc_get(d, q, "group_size");
    if (!mg_jdoc_null(d, gi) && (!mg_jdoc_int(d, gi, &group) || group != 16))
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: ModelOpt NVFP4 group_size is not 16 (blocks of 16 are "
                               "supported)",
                               path);
    if (!mg_jdoc_null(d, mg_jdoc_get(d, q, "kv_cache_quant_algo")))
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "%s: a quantized KV cache (kv_cache_quant_algo) is not supported: "
                               "the KV cache is BF16",
                               path);
    out->nvfp4 = MG_FWD_NVFP4_MODELOPT;
    out->nvfp4_input_scales = true; /* ModelOpt's NVFP4 is W4A4: every linear has input_scale */
    return MG_OK;
}

static mg_status read_nvfp4_quantization(const mg_jdoc *d, int q, const char *path,
                                         const char *method, mg_fwd_hf_config *out) {
    return !strcmp(method, "modelopt") ? read_modelopt(d, q, path, out)
                                       : read_compressed_tensors(d, q, path, out);
}

mg_status mg_fwd_hf_quant_config_parse(const char *text, size_t len, const char *path,
                                       mg_fwd_hf_config *out) {
    mg_jdoc d;
    unsigned pos = 0;
    const int parsed = mg_jdoc_parse(text, len, &d, &pos);
    if (parsed)
        return mg_error_report(parsed == 4 ? MG_ERR_OUT_OF_MEMORY : MG_ERR_INVALID_ARGUMENT,
                               "%s: not valid JSON (byte %u)", path, pos);
    mg_status st =
        mg_jdoc_is(&d, 0, JSMN_OBJECT) &&
                mg_jdoc_is(&d, mg_jdoc_get(&d, 0, "quantization"), JSMN_OBJECT)
            ? read_modelopt(&d, 0, path, out)
            : mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: no \"quantization\" object", path);
    mg_jdoc_free(&d);
    return st;
}

mg_status mg_fwd_hf_config_parse(const char *text, size_t len, const char *path,
                                 mg_fwd_preset *arch, mg_fwd_hf_config *out) {
    memset(out, 0, sizeof *out);
    mg_jdoc d;
    unsigned pos = 0;
    const int parsed = mg_jdoc_parse(text, len, &d, &pos);
    mg_status st = MG_OK;
    if (parsed)
        st = mg_error_report(parsed == 4 ? MG_ERR_OUT_OF_MEMORY : MG_ERR_INVALID_ARGUMENT,
                             "%s: %s JSON (byte %u)", path,
                             parsed == 1   ? "truncated"
                             : parsed == 3 ? "empty"
                                           : "malformed",
                             pos);
    else if (!mg_jdoc_is(&d, 0, JSMN_OBJECT))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: not a JSON object", path);
    char name[96] = "";
    const int archs = st ? -1 : mg_jdoc_get(&d, 0, "architectures");
    if (!st && (!mg_jdoc_is(&d, archs, JSMN_ARRAY) || d.tk[archs].size < 1 ||
                !name_string(&d, archs + 1, name, sizeof name)))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                             "%s: \"architectures\" is missing or not an array of names", path);
    const struct hf_arch *ha = NULL;
    for (size_t i = 0; !st && i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (!strcmp(name, hf_archs[i].name))
            ha = &hf_archs[i];
    if (!st && !ha)
        st = mg_error_report(MG_ERR_UNSUPPORTED,
                             "%s: architecture %s is not supported (LlamaForCausalLM, "
                             "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and "
                             "Qwen3MoeForCausalLM are)",
                             path, name);
    /* Limits well past any released model, so that products of them stay far from overflow
     * and an absurd value gets its own message before anything is sized from it. */
    mg_model_shape *s = &arch->shape;
    if (!st && !(st = member_u32(&d, path, "hidden_size", 0, 1u << 16, &s->hidden)) &&
        !(st = member_u32(&d, path, "intermediate_size", 0, 1u << 18, &s->intermediate)) &&
        !(st = member_u32(&d, path, "num_attention_heads", 0, 1024, &s->heads)) &&
        !(st = member_u32(&d, path, "num_key_value_heads", s->heads, 1024, &s->kv_heads)) &&
        !(st = member_u32(&d, path, "num_hidden_layers", 0, 1024, &arch->layers)) &&
        !(st = member_u32(&d, path, "vocab_size", 0, 1u << 24, &s->vocab)))
        st = member_u32(&d, path, "head_dim", s->hidden / s->heads ? s->hidden / s->heads : 1, 1024,
                        &s->head_dim);
    if (!st && ha->moe)
        st = read_experts(&d, path, s);
    if (!st && (s->heads % s->kv_heads || s->head_dim % 2))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                             "%s: %u heads over %u KV heads of %u: heads must be a multiple of KV "
                             "heads, the head dimension even",
                             path, s->heads, s->kv_heads, s->head_dim);
    if (!st && (uint64_t)s->heads * s->head_dim > (1u << 16))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: %u heads of %u is out of range", path,
                             s->heads, s->head_dim);
    double theta = 10000.0, eps = 0, rotary = 1.0;
    mg_fwd_rope_llama3 llama3 = {0};
    if (!st)
        st = read_rope(&d, path, &theta, &llama3);
    if (!st && (!mg_jdoc_num(&d, mg_jdoc_get(&d, 0, "rms_norm_eps"), &eps) || !(eps >= 1e-30) ||
                !(eps < 1)))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                             "%s: \"rms_norm_eps\" is missing or not in [1e-30, 1)", path);
    /* what this runtime does not implement is refused, never approximated; Qwen2's q, k and v
     * biases are part of its architecture, whatever attention_bias says */
    bool bad = false, attention_bias = false, mlp_bias = false;
    if (!st) {
        attention_bias = mg_jdoc_bool(&d, 0, "attention_bias", false, &bad);
        mlp_bias = mg_jdoc_bool(&d, 0, "mlp_bias", false, &bad);
    }
    if (!st && bad)
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                             "%s: \"attention_bias\" or \"mlp_bias\" is not a boolean", path);
    if (!st && ((attention_bias && !ha->qkv_bias) || mlp_bias))
        st = mg_error_report(MG_ERR_UNSUPPORTED,
                             "%s: attention or MLP biases (attention_bias, mlp_bias) are not "
                             "supported for %s",
                             path, name);
    char act[32] = "silu";
    const int ai = mg_jdoc_get(&d, 0, "hidden_act");
    if (!st && !mg_jdoc_null(&d, ai) && !name_string(&d, ai, act, sizeof act))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT, "%s: \"hidden_act\" is not a short string",
                             path);
    if (!st && strcmp(act, "silu"))
        st = mg_error_report(MG_ERR_UNSUPPORTED, "%s: \"hidden_act\" %s is not supported (silu is)",
                             path, act);
    const int pr = mg_jdoc_get(&d, 0, "partial_rotary_factor");
    if (!st && !mg_jdoc_null(&d, pr) && (!mg_jdoc_num(&d, pr, &rotary) || rotary != 1.0))
        st = mg_error_report(MG_ERR_UNSUPPORTED, "%s: partial rotary embeddings are not supported",
                             path);
    if (!st) {
        out->tied = mg_jdoc_bool(&d, 0, "tie_word_embeddings", false, &bad);
        if (bad)
            st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                 "%s: \"tie_word_embeddings\" is not a boolean", path);
    }
    long long ctx = 0;
    const int ci = st ? -1 : mg_jdoc_get(&d, 0, "max_position_embeddings");
    if (!st && !mg_jdoc_null(&d, ci) && (!mg_jdoc_int(&d, ci, &ctx) || ctx <= 0))
        st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                             "%s: \"max_position_embeddings\" is not a positive integer", path);
    arch->context = ctx > 0 && ctx < (1 << 30) ? (uint32_t)ctx : 0;
    if (!st)
        st = read_window(&d, path, ha->qkv_bias || ha->qk_norm, &arch->context);
    arch->max_batch_tokens = arch->context && arch->context < 8192 ? arch->context : 8192;
    /* quantization: MLX's affine form (mg_mlx_config_open reads the details), NVFP4 in the
     * ModelOpt or compressed-tensors convention (read_nvfp4_quantization), or nothing */
    int q = st ? -1 : mg_jdoc_get(&d, 0, "quantization");
    if (mg_jdoc_null(&d, q) && !st)
        q = mg_jdoc_get(&d, 0, "quantization_config");
    char method[32] = "";
    const int qm = !st && !mg_jdoc_null(&d, q) ? mg_jdoc_get(&d, q, "quant_method") : -1;
    const bool named = name_string(&d, qm, method, sizeof method);
    if (!mg_jdoc_null(&d, qm) && named &&
        (!strcmp(method, "modelopt") || !strcmp(method, "compressed-tensors")))
        st = read_nvfp4_quantization(&d, q, path, method, out);
    else if (!mg_jdoc_null(&d, qm)) /* MLX writes none: gptq, awq, fp8, ... are other formats */
        st = mg_error_report(MG_ERR_UNSUPPORTED,
                             "%s: quantization_config quant_method \"%s\" is not supported (MLX's "
                             "affine 4 or 8 bits, ModelOpt and compressed-tensors NVFP4 are)",
                             path, named ? method : "?");
    else if (!st && !mg_jdoc_null(&d, q)) {
        long long bits = 0;
        if (!mg_jdoc_int(&d, mg_jdoc_get(&d, q, "bits"), &bits) || (bits != 4 && bits != 8))
            st = mg_error_report(MG_ERR_UNSUPPORTED,
                                 "%s: the quantization is not MLX's affine 4 or 8 bits (another "
                                 "quantization_config method is not supported here)",
                                 path);
        out->bits = (uint32_t)bits;
    }
    if (!st) {
        snprintf(out->arch_name, sizeof out->arch_name, "%s", name);
        arch->qkv_bias = ha->qkv_bias;
        arch->qk_norm = ha->qk_norm;
    }
    arch->rope_theta = (float)theta;
    arch->rope_llama3 = llama3;
    arch->norm_eps = (float)eps;
    mg_jdoc_free(&d);
    return st;
}
