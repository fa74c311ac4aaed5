/*
 * test_hf_config.c - Hugging Face checkpoint directories (src/model/model_hf.h) as mg_fwd_create
 * reads them, on tiny directories written here (config.json and a model.safetensors of random
 * FP32 weights):
 *  - a valid Llama, Qwen2 (q/k/v biases) and Qwen3 (head norms) directory each run (prefill and
 *    decode steps, eager and replayed from a captured graph, with the same logits) and leave
 *    the ledger as they found it;
 *  - every prefix of a valid config.json is refused as JSON that is truncated, malformed or
 *    empty, naming the file;
 *  - a table of bad configs (wrong types, absurd sizes, missing fields, heads that do not
 *    divide, unsupported RoPE scaling types, activations, biases, layer types, quantization
 *    methods, architectures) is each refused with its status and a message naming the field or
 *    value, and nothing is left allocated;
 *  - configs that disagree with the weights (sizes, an architecture's missing or extra tensors)
 *    are refused naming the tensor;
 *  - a sliding window caps the context: a run within it works, one past it is refused.
 * The sanitizer build runs all of it under ASan/UBSan: nothing is read out of bounds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "test_util.h"

/* The tiny shape: hidden 32, 2 heads over 1 KV head of 16 (the KV cache's smallest head),
 * MLP 48, vocabulary 37, 2 layers. */
enum { H = 32, HEADS = 2, KV = 1, D = 16, I = 48, V = 37, L = 2 };

static char dir[256];

static void write_text(const char *name, const char *text, size_t len) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(text, 1, len, f) == len);
    if (f)
        fclose(f);
}

/* ------------------------------------------------------------------ safetensors */

typedef struct tensor {
    char name[96];
    uint32_t rows, cols; /* rows 0: a vector */
} tensor;

/* model.safetensors with the tensors of the tiny shape: the Llama set, plus Qwen2's biases
 * and/or Qwen3's head norms; `hidden` may differ from H to disagree with a config. */
static void write_weights(bool biases, bool head_norms, bool tied, uint32_t hidden) {
    tensor t[64];
    int n = 0;
#define ADD(r, c, ...)                                                                             \
    do {                                                                                           \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                                        \
        t[n].rows = (r);                                                                           \
        t[n++].cols = (c);                                                                         \
    } while (0)
    ADD(V, hidden, "model.embed_tokens.weight");
    ADD(0, hidden, "model.norm.weight");
    if (!tied)
        ADD(V, hidden, "lm_head.weight");
    for (int l = 0; l < L; l++) {
        ADD(0, hidden, "model.layers.%d.input_layernorm.weight", l);
        ADD(0, hidden, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(HEADS * D, hidden, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(KV * D, hidden, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(KV * D, hidden, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(hidden, HEADS * D, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(I, hidden, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(I, hidden, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(hidden, I, "model.layers.%d.mlp.down_proj.weight", l);
        if (biases) {
            ADD(0, HEADS * D, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(0, KV * D, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(0, KV * D, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (head_norms) {
            ADD(0, D, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(0, D, "model.layers.%d.self_attn.k_norm.weight", l);
        }
    }
#undef ADD
    char header[16384];
    size_t hl = 0, offset = 0;
    hl +=
        (size_t)snprintf(header + hl, sizeof header - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t bytes = 4ull * (t[i].rows ? t[i].rows : 1) * t[i].cols;
        if (t[i].rows)
            hl += (size_t)snprintf(header + hl, sizeof header - hl,
                                   ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%u,%u],"
                                   "\"data_offsets\":[%zu,%zu]}",
                                   t[i].name, t[i].rows, t[i].cols, offset, offset + bytes);
        else
            hl += (size_t)snprintf(header + hl, sizeof header - hl,
                                   ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%u],"
                                   "\"data_offsets\":[%zu,%zu]}",
                                   t[i].name, t[i].cols, offset, offset + bytes);
        offset += bytes;
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    while (hl % 8)
        header[hl++] = ' ';
    char path[400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t len = hl;
    CHECK(f && fwrite(&len, 8, 1, f) == 1 && fwrite(header, 1, hl, f) == hl);
    for (int i = 0; f && i < n; i++) {
        size_t count = (size_t)(t[i].rows ? t[i].rows : 1) * t[i].cols;
        bool norm = strstr(t[i].name, "norm") != NULL;
        for (size_t j = 0; j < count; j++) {
            /* norms near 1; the rest uniform in [-0.5, 0.5) */
            float v = (float)(test_rand() >> 40) / (float)(1 << 24) - 0.5f;
            v = norm ? 1.0f + 0.2f * v : v;
            CHECK(fwrite(&v, 4, 1, f) == 1);
        }
    }
    if (f)
        fclose(f);
}

/* ------------------------------------------------------------------ config.json */

/* The members of a valid config of the tiny shape, in order; a case replaces, removes (value
 * NULL) or adds members. */
typedef struct member {
    const char *key, *value;
} member;

static const member base[] = {
    {"architectures", "[\"Qwen3ForCausalLM\"]"},
    {"model_type", "\"qwen3\""},
    {"hidden_size", "32"},
    {"intermediate_size", "48"},
    {"num_attention_heads", "2"},
    {"num_key_value_heads", "1"},
    {"head_dim", "16"},
    {"num_hidden_layers", "2"},
    {"vocab_size", "37"},
    {"rms_norm_eps", "1e-06"},
    {"rope_parameters", "{\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}"},
    {"tie_word_embeddings", "true"},
    {"max_position_embeddings", "512"},
    {"hidden_act", "\"silu\""},
    {"attention_bias", "false"},
    {"use_sliding_window", "false"},
    {"sliding_window", "null"},
    {"layer_types", "[\"full_attention\", \"full_attention\"]"},
    {"torch_dtype", "\"float32\""},
};

/* config.json of `base` with the members of `edits` (up to 8) applied. */
static size_t make_config(const member *edits, int count, char *out, size_t size) {
    size_t n = (size_t)snprintf(out, size, "{");
    bool first = true, used[8] = {false};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        const char *v = base[i].value;
        for (int e = 0; e < count; e++)
            if (!strcmp(edits[e].key, base[i].key)) {
                v = edits[e].value;
                used[e] = true;
            }
        if (v) {
            n += (size_t)snprintf(out + n, size - n, "%s\n \"%s\": %s", first ? "" : ",",
                                  base[i].key, v);
            first = false;
        }
    }
    for (int e = 0; e < count; e++)
        if (!used[e] && edits[e].value)
            n +=
                (size_t)snprintf(out + n, size - n, ",\n \"%s\": %s", edits[e].key, edits[e].value);
    n += (size_t)snprintf(out + n, size - n, "\n}\n");
    return n;
}

/* mg_fwd_create on the directory; expect `want` (MG_OK: then prefill and `steps` decode steps
 * run), and for a refusal a message naming `needle`; the ledger ends as it began. */
static void create(mg_backend *b, mg_status want, const char *needle, uint32_t steps,
                   const char *what) {
    uint64_t live0 = 0, count0 = 0, live1 = 0, count1 = 0;
    CHECK_OK(mg_ledger_live(b, &live0, &count0));
    const int32_t prompt[] = {3, 36, 7, 0, 12};
    mg_fwd_config c = {.batch = 1,
                       .steps = steps,
                       .seed = 1,
                       .model_path = dir,
                       .prompt_ids = prompt,
                       .prompt_ids_count = 5};
    mg_fwd *m = NULL;
    mg_status st = mg_fwd_create(b, &c, &m);
    test_checks++;
    if (st != want) {
        test_failures++;
        fprintf(stderr, "FAIL %s: mg_fwd_create returned %s, expected %s (%s)\n", what,
                mg_status_name(st), mg_status_name(want), mg_last_error());
    }
    if (want != MG_OK) {
        CHECK(m == NULL);
        CHECK(mg_last_error()[0] && !strchr(mg_last_error(), '\n')); /* one line */
        if (needle && !strstr(mg_last_error(), needle)) {
            test_failures++;
            fprintf(stderr, "FAIL %s: message \"%s\" does not mention \"%s\"\n", what,
                    mg_last_error(), needle);
        }
        test_checks++;
    }
    /* the same run with its decode steps replayed from a captured graph (biases, head norms
     * and the keys' packing included) gives the same logits bit for bit */
    mg_fwd *g = NULL;
    c.use_graphs = true;
    if (m)
        CHECK_OK(mg_fwd_create(b, &c, &g));
    if (m && g) {
        mg_stream *s = mg_stream_default(b);
        float eager[V], replayed[V];
        for (uint32_t i = 0; i <= steps; i++) {
            CHECK_OK(i ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s));
            CHECK_OK(i ? mg_fwd_decode(g, s) : mg_fwd_prefill(g, s));
            CHECK_OK(mg_fwd_logits(m, eager));
            CHECK_OK(mg_fwd_logits(g, replayed));
            CHECK(!memcmp(eager, replayed, sizeof eager));
        }
        uint32_t n = 0;
        const int32_t *ids = mg_fwd_tokens(m, 0, &n);
        CHECK(n == steps + 1);
        for (uint32_t i = 0; i < n; i++)
            CHECK(ids[i] >= 0 && ids[i] < V);
        mg_fwd_info info;
        mg_fwd_get_info(g, &info);
        CHECK(steps < 2 || info.graph_steps > 0);
    }
    mg_fwd_destroy(m);
    mg_fwd_destroy(g);
    CHECK_OK(mg_ledger_live(b, &live1, &count1));
    CHECK(live1 == live0 && count1 == count0);
}

static void config_case(mg_backend *b, const member *edits, int count, mg_status want,
                        const char *needle, const char *what) {
    static char text[65536];
    size_t n = make_config(edits, count, text, sizeof text);
    write_text("config.json", text, n);
    create(b, want, needle, 2, what);
}

#define E(...) ((const member[]){__VA_ARGS__})
#define N(...) (int)(sizeof((const member[]){__VA_ARGS__}) / sizeof(member))
#define CASE(want, needle, ...)                                                                    \
    config_case(b, E(__VA_ARGS__), N(__VA_ARGS__), want, needle, #__VA_ARGS__)

static void test_valid(mg_backend *b) {
    write_weights(false, true, true, H);
    CASE(MG_OK, NULL, {"torch_dtype", "\"float32\""});
    /* the older form: a top-level rope_theta, alone or agreeing with rope_parameters */
    CASE(MG_OK, NULL, {"rope_parameters", NULL}, {"rope_theta", "10000.0"});
    CASE(MG_OK, NULL, {"rope_theta", "1000000"});
    CASE(MG_OK, NULL, {"head_dim", "null"}); /* the default: hidden / heads = 8 */
    write_weights(true, false, false, H);
    CASE(MG_OK, NULL, {"architectures", "[\"Qwen2ForCausalLM\"]"}, {"tie_word_embeddings", "false"},
         {"sliding_window", "131072"});
    write_weights(false, false, false, H);
    CASE(MG_OK, NULL, {"architectures", "[\"LlamaForCausalLM\"]"}, {"tie_word_embeddings", "false"},
         {"layer_types", NULL});
}

/* Every prefix of a valid config.json. */
static void test_truncated(mg_backend *b) {
    write_weights(false, true, true, H);
    char text[8192];
    const size_t n = make_config(NULL, 0, text, sizeof text);
    size_t trailing = n; /* the prefixes that end in the trailing newline are whole objects */
    while (trailing > 0 && (text[trailing - 1] == '\n' || text[trailing - 1] == ' '))
        trailing--;
    int failures = test_failures;
    for (size_t len = 0; len < trailing && test_failures == failures; len++) {
        write_text("config.json", text, len);
        char what[64];
        snprintf(what, sizeof what, "config.json cut at byte %zu of %zu", len, n);
        create(b, MG_ERR_INVALID_ARGUMENT, "JSON", 0, what);
    }
}

static void test_bad_configs(mg_backend *b) {
    write_weights(false, true, true, H);
    const mg_status BAD = MG_ERR_INVALID_ARGUMENT, NO = MG_ERR_UNSUPPORTED;
    /* the document and the architecture */
    write_text("config.json", "[1, 2]", 6);
    create(b, BAD, "not a JSON object", 0, "an array");
    write_text("config.json", "{\"a\" 1}", 8);
    create(b, BAD, "malformed JSON", 0, "a missing colon");
    CASE(BAD, "architectures", {"architectures", NULL});
    CASE(BAD, "architectures", {"architectures", "\"Qwen3ForCausalLM\""});
    CASE(BAD, "architectures", {"architectures", "[]"});
    CASE(BAD, "architectures", {"architectures", "[7]"});
    CASE(BAD, "num_experts", {"architectures", "[\"Qwen3MoeForCausalLM\"]"});
    const char *moe = "[\"Qwen3MoeForCausalLM\"]";
    CASE(NO, "norm_topk_prob", {"architectures", moe}, {"num_experts", "4"},
         {"num_experts_per_tok", "2"}, {"moe_intermediate_size", "32"});
    CASE(BAD, "num_experts_per_tok", {"architectures", moe}, {"num_experts", "4"},
         {"num_experts_per_tok", "5"}, {"moe_intermediate_size", "32"});
    CASE(BAD, "differ", {"architectures", moe}, {"num_experts", "4"}, {"num_local_experts", "8"},
         {"moe_intermediate_size", "32"});
    CASE(NO, "dense layers", {"architectures", moe}, {"num_experts", "4"},
         {"decoder_sparse_step", "2"}, {"num_experts_per_tok", "2"},
         {"moe_intermediate_size", "32"});
    CASE(NO, "GPT2LMHeadModel", {"architectures", "[\"GPT2LMHeadModel\"]"});
    /* sizes: wrong types, absurd values, missing */
    CASE(BAD, "\"hidden_size\" is missing or not a positive integer", {"hidden_size", "\"32\""});
    CASE(BAD, "hidden_size", {"hidden_size", "-32"});
    CASE(BAD, "hidden_size", {"hidden_size", "0"});
    CASE(BAD, "hidden_size", {"hidden_size", "32.5"});
    CASE(BAD, "hidden_size", {"hidden_size", NULL});
    CASE(BAD, "hidden_size", {"hidden_size", "null"});
    CASE(BAD, "\"hidden_size\" = 1000000000 is out of range", {"hidden_size", "1000000000"});
    CASE(BAD, "hidden_size", {"hidden_size", "99999999999999999999999999"});
    CASE(BAD, "vocab_size", {"vocab_size", "4294967296"});
    CASE(BAD, "vocab_size", {"vocab_size", "1e3"});
    CASE(BAD, "num_hidden_layers", {"num_hidden_layers", "100000"});
    CASE(BAD, "intermediate_size", {"intermediate_size", "true"});
    CASE(BAD, "num_attention_heads", {"num_attention_heads", NULL});
    CASE(BAD, "num_key_value_heads", {"num_key_value_heads", "[1]"});
    CASE(BAD, "head_dim", {"head_dim", "1000000"});
    CASE(BAD, "heads must be a multiple of KV heads", {"num_key_value_heads", "3"});
    CASE(BAD, "the head dimension even", {"head_dim", "7"});
    CASE(BAD, "heads of", {"num_attention_heads", "1000"}, {"head_dim", "1000"});
    /* norms and RoPE */
    CASE(BAD, "rms_norm_eps", {"rms_norm_eps", NULL});
    CASE(BAD, "rms_norm_eps", {"rms_norm_eps", "0"});
    CASE(BAD, "rms_norm_eps", {"rms_norm_eps", "\"1e-6\""});
    CASE(BAD, "rms_norm_eps", {"rms_norm_eps", "2"});
    CASE(BAD, "rope_theta", {"rope_theta", "\"10000\""});
    CASE(BAD, "rope_theta",
         {"rope_parameters", "{\"rope_theta\": -1, \"rope_type\": \"default\"}"});
    CASE(BAD, "rope_theta", {"rope_parameters", "{\"rope_theta\": \"x\"}"});
    CASE(BAD, "differ", {"rope_theta", "10000"});
    CASE(BAD, "rope_parameters", {"rope_parameters", "5"});
    /* Llama 3.1's scaling runs (it is checked against mlx-lm by tests/model/random_models.py's
     * llama31_scaled); its four numbers are required and checked */
    CASE(MG_OK, NULL,
         {"rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
          " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"});
    CASE(BAD, "rope_scaling.high_freq_factor",
         {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                          " \"original_max_position_embeddings\": 8192}"});
    CASE(BAD, "out of range",
         {"rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
          " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"});
    CASE(BAD, "out of range",
         {"rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 0.5, \"low_freq_factor\": 1.0,"
          " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192.5}"});
    CASE(
        BAD, "different",
        {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                         " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"},
        {"rope_parameters", "{\"rope_theta\": 10000.0, \"rope_type\": \"llama3\", \"factor\": 32.0,"
                            " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                            " \"original_max_position_embeddings\": 8192}"});
    CASE(NO, "\"linear\"", {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}"});
    CASE(
        NO, "\"yarn\"",
        {"rope_parameters", "{\"rope_theta\": 1000000.0, \"rope_type\": \"yarn\", \"factor\": 4}"});
    CASE(BAD, "rope_scaling", {"rope_scaling", "[1]"});
    CASE(BAD, "rope type", {"rope_scaling", "{\"rope_type\": 3}"});
    CASE(NO, "partial rotary", {"partial_rotary_factor", "0.5"});
    /* what the network would compute differently */
    CASE(NO, "hidden_act", {"hidden_act", "\"gelu\""});
    CASE(BAD, "hidden_act", {"hidden_act", "7"});
    CASE(NO, "biases", {"attention_bias", "true"});
    CASE(NO, "biases", {"mlp_bias", "true"});
    CASE(BAD, "not a boolean", {"mlp_bias", "\"yes\""});
    CASE(BAD, "tie_word_embeddings", {"tie_word_embeddings", "\"true\""});
    CASE(BAD, "max_position_embeddings", {"max_position_embeddings", "\"512\""});
    CASE(BAD, "max_position_embeddings", {"max_position_embeddings", "-1"});
    CASE(NO, "\"chunked_attention\"",
         {"layer_types", "[\"full_attention\", \"chunked_attention\"]"});
    CASE(NO, "layer_types[0]", {"layer_types", "[1, 2]"});
    CASE(NO, "layer_types[1] \"\"", {"layer_types", "[\"full_attention\", \"full\n\"]"});
    CASE(BAD, "not an array of names", {"architectures", "[\"Llama\tForCausalLM\"]"});
    CASE(BAD, "layer_types", {"layer_types", "\"full_attention\""});
    CASE(BAD, "use_sliding_window", {"use_sliding_window", "1"});
    CASE(BAD, "sliding_window", {"use_sliding_window", "true"}, {"sliding_window", "-5"},
         {"layer_types", NULL});
    CASE(NO, "\"gptq\"", {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4}"});
    CASE(NO, "quantization", {"quantization_config", "{\"quant_method\": \"fp8\"}"});
    CASE(NO, "quantization", {"quantization", "{\"group_size\": 64, \"bits\": 3}"});
    /* deep nesting and long strings elsewhere in the document are skipped, not recursed into */
    static char deep[40000];
    size_t n = 0;
    for (int i = 0; i < 15000; i++)
        deep[n++] = '[';
    for (int i = 0; i < 15000; i++)
        deep[n++] = ']';
    deep[n] = 0;
    CASE(MG_OK, NULL, {"unrelated", deep});
    /* no config.json at all */
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    create(b, MG_ERR_NOT_FOUND, "config.json", 0, "no config.json");
}

/* A config whose network the weights do not hold. */
static void test_disagreeing_weights(mg_backend *b) {
    const mg_status BAD = MG_ERR_INVALID_ARGUMENT, NO = MG_ERR_UNSUPPORTED;
    write_weights(false, true, true, 40);
    CASE(BAD, "model.embed_tokens.weight has shape [37, 40]", {"torch_dtype", "\"float32\""});
    write_weights(false, false, true, H); /* Qwen3 without its head norms */
    CASE(BAD, "self_attn.q_norm.weight is missing", {"torch_dtype", "\"float32\""});
    write_weights(false, true, true, H); /* Qwen2 without its biases */
    CASE(BAD, "self_attn.q_proj.bias is missing", {"architectures", "[\"Qwen2ForCausalLM\"]"});
    write_weights(true, true, true, H); /* Qwen2 with Qwen3's head norms */
    CASE(NO, "_norm.weight is not part of the Qwen2ForCausalLM network",
         {"architectures", "[\"Qwen2ForCausalLM\"]"}, {"attention_bias", NULL});
    write_weights(true, false, true, H); /* Llama with Qwen2's biases */
    CASE(NO, "_proj.bias is not part of the LlamaForCausalLM network",
         {"architectures", "[\"LlamaForCausalLM\"]"});
    write_weights(false, true, false, H); /* an untied LM head in a tied config */
    CASE(NO, "lm_head.weight is not part of", {"torch_dtype", "\"float32\""});
    write_weights(false, true, true, H);
    CASE(BAD, "lm_head.weight is missing", {"tie_word_embeddings", "false"});
    CASE(BAD, "the config implies [38, 32]", {"vocab_size", "38"});
}

/* A sliding window that applies caps the context (5 prompt tokens plus the steps). */
static void test_sliding_window(mg_backend *b) {
    write_weights(false, false, true, H);
    const member mistral[] = {{"architectures", "[\"MistralForCausalLM\"]"},
                              {"sliding_window", "12"},
                              {"layer_types", NULL}};
    char text[8192];
    size_t n = make_config(mistral, 3, text, sizeof text);
    write_text("config.json", text, n);
    create(b, MG_OK, NULL, 7, "Mistral, 12 tokens in a window of 12");
    create(b, MG_ERR_INVALID_ARGUMENT, "past the context", 8, "Mistral, 13 tokens in 12");
    const member qwen[] = {{"architectures", "[\"Qwen3ForCausalLM\"]"},
                           {"sliding_window", "12"},
                           {"layer_types", "[\"sliding_attention\", \"full_attention\"]"}};
    write_weights(false, true, true, H);
    n = make_config(qwen, 3, text, sizeof text);
    write_text("config.json", text, n);
    create(b, MG_ERR_INVALID_ARGUMENT, "past the context", 8, "Qwen3 sliding layer, 13 in 12");
    const member off[] = {{"use_sliding_window", "false"}, {"sliding_window", "12"}};
    n = make_config(off, 2, text, sizeof text);
    write_text("config.json", text, n);
    create(b, MG_OK, NULL, 8, "Qwen3, window not used");
}

int main(void) {
    test_seed();
    snprintf(dir, sizeof dir, "/tmp/metrale_hf_config_%d", (int)getpid());
    mkdir(dir, 0700);
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (b) {
        test_valid(b);
        test_truncated(b);
        test_bad_configs(b);
        test_disagreeing_weights(b);
        test_sliding_window(b);
        mg_backend_close(b);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    return test_finish();
}
