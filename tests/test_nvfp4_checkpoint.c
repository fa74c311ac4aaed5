/*
 * test_nvfp4_checkpoint.c - NVFP4 Hugging Face directories (src/model/model_hf_nvfp4.h) as
 * mg_fwd_create reads them, on tiny Llama directories written here (config.json and a
 * model.safetensors of random codes, E4M3 block scales and global scales; k and v with
 * different globals in every layer):
 *  - valid ModelOpt directories (float LM head, as `ignore: ["lm_head"]` leaves it, with
 *    block scales as F8_E4M3 or, in one layer, as U8 bytes; an NVFP4 LM head; a tied float
 *    embedding), one described by hf_quant_config.json alone, and compressed-tensors
 *    directories (quantized LM head with and without activation scales; tied) each run a
 *    prefill and decode steps, eager and replayed from a captured graph with the same logits,
 *    and leave the ledger as they found it; where a CUDA backend opens, each also runs there,
 *    teacher-forced, within `run --compare`'s NVFP4 bound of the CPU's logits;
 *  - refusals, each with its status, a one-line message naming the tensor or the field, and
 *    nothing left allocated: a missing global (weight_scale_2 / weight_global_scale) or block
 *    scale, a wrong dtype of codes, scales or global, a shape that disagrees with the config,
 *    a global that is zero, a block scale with its sign bit set or NaN, a missing or malformed
 * activation scale, an activation scale beside a float linear, a float layer matrix, a quantized
 * embedding, a stray quantization tensor on a norm, an unknown quant_algo, a group size other than
 * 16, a quantized KV cache, compressed-tensors groups that are not NVFP4. The numerical check (the
 * logits against an independent implementation on the dequantized weights) is
 * tests/model/random_models.py's NVFP4 forms. The sanitizer build runs this one under ASan/UBSan:
 * nothing is read out of bounds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "test_util.h"

/* The tiny shape: hidden 32, 2 heads over 1 KV head of 16, MLP 48, vocabulary 37, 2 layers. */
enum { H = 32, HEADS = 2, KV = 1, D = 16, I = 48, V = 37, L = 2 };

typedef enum convention { MODELOPT, COMPRESSED } convention;

static char dir[256];

static void write_file(const char *name, const void *bytes, size_t len) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(bytes, 1, len, f) == len);
    if (f)
        fclose(f);
}

static void remove_file(const char *name) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

/* ------------------------------------------------------------------ safetensors */

/* What a case does to the tensor of that name: drop it, store it as BF16 (2 bytes an element,
 * the same shape), halve its rows, (an F32 scalar) store 0 or a vector of 2, or (block scales)
 * set one byte's sign bit or make it the E4M3 NaN 0x7f. */
typedef enum edit_kind {
    DROP,
    AS_BF16,
    AS_U8,
    HALF_ROWS,
    ZERO,
    TWO_VALUES,
    NEGATIVE_SCALE,
    NAN_SCALE
} edit_kind;
typedef struct edit {
    const char *name;
    edit_kind kind;
} edit;

typedef struct entry {
    char name[112];
    const char *dtype; /* "U8", "F8_E4M3", "F32" */
    uint32_t rank;
    uint64_t shape[2];
    float value; /* F32 scalars */
    int poison;  /* block scales: a byte written in the middle instead of a random one, or -1 */
} entry;

typedef struct layout {
    convention conv;
    bool head_fp4, input_scales, embedding_fp4, float_q;
    bool tied;         /* no lm_head: the (float) embedding is the head, tie_word_embeddings true */
    const char *extra; /* a further F32 scalar tensor, or NULL */
} layout;

static int add(entry *t, int n, const char *dtype, uint32_t rank, uint64_t r, uint64_t c,
               float value, const char *fmt, const char *base) {
    snprintf(t[n].name, sizeof t[n].name, fmt, base);
    t[n].dtype = dtype;
    t[n].rank = rank;
    t[n].shape[0] = r;
    t[n].shape[1] = c;
    t[n].value = value;
    t[n].poison = -1;
    return n + 1;
}

/* A linear `base` [rows, cols]: the convention's quantized tensors, or a float weight. */
static int add_linear(entry *t, int n, const layout *lo, const char *base, uint32_t rows,
                      uint32_t cols, bool quantized, float global) {
    if (!quantized)
        return add(t, n, "F32", 2, rows, cols, 0, "%s.weight", base);
    const bool mo = lo->conv == MODELOPT;
    n = add(t, n, "U8", 2, rows, cols / 2, 0, mo ? "%s.weight" : "%s.weight_packed", base);
    n = add(t, n, "F8_E4M3", 2, rows, cols / 16, 0, "%s.weight_scale", base);
    /* compressed-tensors stores the reciprocal of the multiplier */
    n = add(t, n, "F32", mo ? 0 : 1, 1, 0, mo ? global : 1.0f / global,
            mo ? "%s.weight_scale_2" : "%s.weight_global_scale", base);
    if (lo->input_scales)
        n = add(t, n, "F32", mo ? 0 : 1, 1, 0, 0.05f,
                mo ? "%s.input_scale" : "%s.input_global_scale", base);
    return n;
}

static size_t element_bytes(const char *dtype) {
    return !strcmp(dtype, "F32") ? 4 : !strcmp(dtype, "BF16") ? 2 : 1;
}

static void write_weights(const layout *lo, const edit *edits, int edit_count) {
    static entry t[160];
    int n = 0;
    char base[96];
    n = lo->embedding_fp4 ? add_linear(t, n, lo, "model.embed_tokens", V, H, true, 0.01f)
                          : add(t, n, "F32", 2, V, H, 0, "%s.weight", "model.embed_tokens");
    n = add(t, n, "F32", 1, H, 0, 0, "%s.weight", "model.norm");
    if (!lo->tied)
        n = add_linear(t, n, lo, "lm_head", V, H, lo->head_fp4, 0.012f);
    static const struct {
        const char *name;
        uint32_t rows, cols;
        float global;
    } linears[] = {{"self_attn.q_proj", HEADS * D, H, 0.011f},
                   {"self_attn.k_proj", KV * D, H, 0.013f},
                   {"self_attn.v_proj", KV * D, H, 0.004f},
                   {"self_attn.o_proj", H, HEADS * D, 0.006f},
                   {"mlp.gate_proj", I, H, 0.009f},
                   {"mlp.up_proj", I, H, 0.007f},
                   {"mlp.down_proj", H, I, 0.005f}};
    for (int l = 0; l < L; l++) {
        snprintf(base, sizeof base, "model.layers.%d.input_layernorm", l);
        n = add(t, n, "F32", 1, H, 0, 0, "%s.weight", base);
        snprintf(base, sizeof base, "model.layers.%d.post_attention_layernorm", l);
        n = add(t, n, "F32", 1, H, 0, 0, "%s.weight", base);
        for (size_t i = 0; i < sizeof linears / sizeof linears[0]; i++) {
            snprintf(base, sizeof base, "model.layers.%d.%s", l, linears[i].name);
            n = add_linear(t, n, lo, base, linears[i].rows, linears[i].cols,
                           !(lo->float_q && i == 0), linears[i].global * (1.0f + 0.5f * l));
        }
    }
    if (lo->extra)
        n = add(t, n, "F32", 0, 1, 0, 0.5f, "%s", lo->extra);
    /* the edits */
    bool drop[160] = {false};
    size_t bytes[160];
    for (int i = 0; i < n; i++) {
        for (int e = 0; e < edit_count; e++) {
            if (strcmp(edits[e].name, t[i].name))
                continue;
            switch (edits[e].kind) {
            case DROP:
                drop[i] = true;
                break;
            case AS_BF16:
                t[i].dtype = "BF16";
                break;
            case AS_U8: /* block scales: the same bytes */
                t[i].dtype = "U8";
                break;
            case HALF_ROWS:
                t[i].shape[0] /= 2;
                break;
            case ZERO:
                t[i].value = 0.0f;
                break;
            case TWO_VALUES:
                t[i].rank = 1;
                t[i].shape[0] = 2;
                break;
            case NEGATIVE_SCALE:
                t[i].poison = 0x38 | 0x80; /* -1.0 */
                break;
            case NAN_SCALE:
                t[i].poison = 0x7f;
                break;
            }
        }
        const uint64_t count = t[i].rank == 0   ? 1
                               : t[i].rank == 1 ? t[i].shape[0]
                                                : t[i].shape[0] * t[i].shape[1];
        bytes[i] = (size_t)count * element_bytes(t[i].dtype);
    }
    static char header[32768];
    size_t hl = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        if (drop[i])
            continue;
        char shape[64];
        if (t[i].rank == 0)
            snprintf(shape, sizeof shape, "[]");
        else if (t[i].rank == 1)
            snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)t[i].shape[0]);
        else
            snprintf(shape, sizeof shape, "[%llu,%llu]", (unsigned long long)t[i].shape[0],
                     (unsigned long long)t[i].shape[1]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl,
                               ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                               t[i].name, t[i].dtype, shape, offset, offset + bytes[i]);
        offset += bytes[i];
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    while (hl % 8)
        header[hl++] = ' ';
    uint8_t *data = malloc(offset + 8 + hl);
    CHECK(data != NULL);
    if (!data)
        return;
    const uint64_t len = hl;
    memcpy(data, &len, 8);
    memcpy(data + 8, header, hl);
    uint8_t *p = data + 8 + hl;
    for (int i = 0; i < n; i++) {
        if (drop[i])
            continue;
        const bool norm = strstr(t[i].name, "norm") != NULL;
        for (size_t j = 0; j < bytes[i]; j += strcmp(t[i].dtype, "F32") ? 1 : 4) {
            if (!strcmp(t[i].dtype, "F32")) {
                /* scalars as given; matrices uniform in [-0.5, 0.5); norms near 1 */
                float v = (float)(test_rand() >> 40) / (float)(1 << 24) - 0.5f;
                v = t[i].rank == 0 || strstr(t[i].name, "scale") ? t[i].value
                    : norm                                       ? 1.0f + 0.2f * v
                                                                 : v;
                memcpy(p + j, &v, 4);
            } else if (!strcmp(t[i].dtype, "F8_E4M3") || strstr(t[i].name, "weight_scale")) {
                p[j] = t[i].poison >= 0 && j == bytes[i] / 2
                           ? (uint8_t)t[i].poison
                           : (uint8_t)test_rand_range(0x28, 0x48); /* E4M3 0.25 .. 4 */
            } else {
                p[j] = (uint8_t)test_rand(); /* codes, or BF16 bytes */
            }
        }
        p += bytes[i];
    }
    write_file("model.safetensors", data, (size_t)(p - data));
    free(data);
}

/* ------------------------------------------------------------------ config.json */

static const char *const llama_config =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 32,"
    " \"intermediate_size\": 48, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"head_dim\": 16, \"num_hidden_layers\": 2, \"vocab_size\": 37, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 10000.0, \"tie_word_embeddings\": %s, \"max_position_embeddings\": 512,"
    " \"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"%s%s}";

static const char *const modelopt_quant =
    "\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16,"
    " \"kv_cache_quant_algo\": null, \"ignore\": [\"lm_head\"]";

/* config.json with quantization_config {quant} (NULL: none), embeddings tied or not. */
static void write_config(const char *quant, bool tied) {
    char q[2048] = "", text[4096];
    if (quant)
        snprintf(q, sizeof q, "{%s}", quant);
    const int n = snprintf(text, sizeof text, llama_config, tied ? "true" : "false",
                           quant ? ", \"quantization_config\": " : "", q);
    write_file("config.json", text, (size_t)n);
}

/* A compressed-tensors quantization_config: the valid one, or with one of its values changed. */
typedef struct ct_config {
    const char *format;             /* the top-level and the group's packing */
    int bits, group_size;           /* the weights' */
    const char *status, *kv_scheme; /* quantization_status, kv_cache_scheme */
    bool act;                       /* input_activations NVFP4 (else null) */
} ct_config;

static const ct_config ct_valid = {"nvfp4-pack-quantized", 4, 16, "compressed", "null", true};

static const char *ct_quant(ct_config c) {
    static char out[2048];
    snprintf(out, sizeof out,
             "\"quant_method\": \"compressed-tensors\", \"format\": \"%s\", "
             "\"quantization_status\": \"%s\", \"kv_cache_scheme\": %s, \"ignore\": [], "
             "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"format\": \"%s\", "
             "\"weights\": {\"num_bits\": %d, \"type\": \"float\", \"group_size\": %d}, "
             "\"input_activations\": %s, \"output_activations\": null}}",
             c.format, c.status, c.kv_scheme, c.format, c.bits, c.group_size,
             c.act ? "{\"num_bits\": 4, \"type\": \"float\", \"group_size\": 16}" : "null");
    return out;
}

/* ------------------------------------------------------------------ the runs */

/* A CUDA backend when one opens (NULL otherwise): every valid directory also runs there,
 * teacher-forced on the same ids, against the CPU's logits. */
static mg_backend *gpu;

/* The CUDA run's bound against the CPU: |cuda - cpu| <= 0.03 * max |cpu logit| + 1e-3 at
 * every logit of every step, `run --compare`'s NVFP4 bound. Both decode the same weights
 * exactly; they differ in the order of the FP32 sums and where a sum is rounded to BF16. */
enum { GPU_STEPS = 2 };
static void compare_gpu(const mg_fwd_config *c, const float (*cpu)[V], const int32_t *cpu_tokens,
                        const char *what) {
    uint64_t live0 = 0, count0 = 0, live1 = 0, count1 = 0;
    CHECK_OK(mg_ledger_live(gpu, &live0, &count0));
    mg_fwd *m = NULL;
    CHECK_OK(mg_fwd_create(gpu, c, &m));
    if (m) {
        mg_stream *s = mg_stream_default(gpu);
        float got[V];
        for (uint32_t i = 0; i <= GPU_STEPS; i++) {
            for (int j = 0; j < V; j++)
                got[j] = -12345.0f; /* poison: a step that writes nothing fails */
            CHECK_OK(i ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s));
            CHECK_OK(mg_fwd_logits(m, got));
            /* teacher-forced: the next step's input is the CPU's token, whatever a near-tie
             * made this run choose */
            CHECK_OK(mg_fwd_force_tokens(m, &cpu_tokens[i]));
            float peak = 0.0f, worst = 0.0f;
            for (int j = 0; j < V; j++) {
                peak = fmaxf(peak, fabsf(cpu[i][j]));
                worst = fmaxf(worst, fabsf(got[j] - cpu[i][j]));
            }
            test_checks++;
            if (!(worst <= 0.03f * peak + 1e-3f)) {
                test_failures++;
                fprintf(stderr, "FAIL %s on CUDA, step %u: max |cuda - cpu| %g, bound %g\n", what,
                        i, worst, 0.03f * peak + 1e-3f);
            }
        }
    }
    mg_fwd_destroy(m);
    CHECK_OK(mg_ledger_live(gpu, &live1, &count1));
    CHECK(live1 == live0 && count1 == count0);
}

/* mg_fwd_create on the directory; expect `want` (MG_OK: then a prefill and two decode steps,
 * eager and graph-replayed, give the same logits, and the same on CUDA when it opens is within
 * compare_gpu's bound of them), and for a refusal a one-line message naming
 * `needle`; the ledger ends as it began. */
static void create(mg_backend *b, mg_status want, const char *needle, const char *what) {
    uint64_t live0 = 0, count0 = 0, live1 = 0, count1 = 0;
    CHECK_OK(mg_ledger_live(b, &live0, &count0));
    const int32_t prompt[] = {3, 36, 7, 0, 12};
    mg_fwd_config c = {.batch = 1,
                       .steps = GPU_STEPS,
                       .seed = 1,
                       .model_path = dir,
                       .prompt_ids = prompt,
                       .prompt_ids_count = 5};
    mg_fwd *m = NULL, *g = NULL;
    mg_status st = mg_fwd_create(b, &c, &m);
    test_checks++;
    if (st != want) {
        test_failures++;
        fprintf(stderr, "FAIL %s: mg_fwd_create returned %s, expected %s (%s)\n", what,
                mg_status_name(st), mg_status_name(want), mg_last_error());
    }
    if (want != MG_OK) {
        CHECK(m == NULL);
        CHECK(mg_last_error()[0] && !strchr(mg_last_error(), '\n'));
        test_checks++;
        if (needle && !strstr(mg_last_error(), needle)) {
            test_failures++;
            fprintf(stderr, "FAIL %s: message \"%s\" does not mention \"%s\"\n", what,
                    mg_last_error(), needle);
        }
    }
    c.use_graphs = true;
    if (m)
        CHECK_OK(mg_fwd_create(b, &c, &g));
    if (m && g) {
        mg_stream *s = mg_stream_default(b);
        float eager[GPU_STEPS + 1][V], replayed[V];
        int32_t tokens[GPU_STEPS + 1] = {0};
        for (uint32_t i = 0; i <= c.steps; i++) {
            CHECK_OK(i ? mg_fwd_decode(m, s) : mg_fwd_prefill(m, s));
            CHECK_OK(i ? mg_fwd_decode(g, s) : mg_fwd_prefill(g, s));
            CHECK_OK(mg_fwd_logits(m, eager[i]));
            CHECK_OK(mg_fwd_logits(g, replayed));
            CHECK(!memcmp(eager[i], replayed, sizeof replayed));
            uint32_t count = 0;
            const int32_t *ids = mg_fwd_tokens(m, 0, &count);
            CHECK(ids && count > 0);
            if (ids && count > 0)
                tokens[i] = ids[count - 1];
            bool finite = true, varied = false;
            for (int j = 0; j < V; j++) {
                finite &= eager[i][j] == eager[i][j] && eager[i][j] - eager[i][j] == 0.0f;
                varied |= eager[i][j] != eager[i][0];
            }
            CHECK(finite && varied);
        }
        if (gpu)
            compare_gpu(&c, (const float(*)[V])eager, tokens, what);
    }
    mg_fwd_destroy(m);
    mg_fwd_destroy(g);
    CHECK_OK(mg_ledger_live(b, &live1, &count1));
    CHECK(live1 == live0 && count1 == count0);
}

static void run_case(mg_backend *b, const layout *lo, const char *quant, const edit *edits,
                     int edit_count, mg_status want, const char *needle, const char *what) {
    write_config(quant, lo->tied);
    write_weights(lo, edits, edit_count);
    create(b, want, needle, what);
}

static const layout modelopt = {.conv = MODELOPT, .input_scales = true};
static const layout compressed = {.conv = COMPRESSED, .head_fp4 = true, .input_scales = true};

static void test_valid(mg_backend *b) {
    run_case(b, &modelopt, modelopt_quant, NULL, 0, MG_OK, NULL, "ModelOpt, float LM head");
    const edit u8_scales[] = {{"model.layers.1.mlp.down_proj.weight_scale", AS_U8}};
    run_case(b, &modelopt, modelopt_quant, u8_scales, 1, MG_OK, NULL,
             "block scales stored as U8 bytes");
    run_case(b, &compressed, ct_quant(ct_valid), NULL, 0, MG_OK, NULL,
             "compressed-tensors W4A4, NVFP4 LM head");
    static const char modelopt_all[] =
        "\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16, "
        "\"kv_cache_quant_algo\": null, \"ignore\": []";
    const layout modelopt_head = {.conv = MODELOPT, .head_fp4 = true, .input_scales = true};
    run_case(b, &modelopt_head, modelopt_all, NULL, 0, MG_OK, NULL, "ModelOpt, NVFP4 LM head");
    const layout modelopt_tied = {.conv = MODELOPT, .input_scales = true, .tied = true};
    run_case(b, &modelopt_tied, modelopt_quant, NULL, 0, MG_OK, NULL,
             "ModelOpt, tied float embedding");
    const layout compressed_tied = {.conv = COMPRESSED, .tied = true};
    ct_config tied_a16 = ct_valid;
    tied_a16.act = false;
    run_case(b, &compressed_tied, ct_quant(tied_a16), NULL, 0, MG_OK, NULL,
             "compressed-tensors W4A16, tied float embedding");
    const layout a16 = {.conv = COMPRESSED, .head_fp4 = true};
    ct_config c = ct_valid;
    c.act = false;
    run_case(b, &a16, ct_quant(c), NULL, 0, MG_OK, NULL,
             "compressed-tensors W4A16 (no activation scales)");
    /* ModelOpt's own hf_quant_config.json, config.json naming no quantization */
    static const char hq[] = "{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": "
                             "{\"quant_algo\": \"NVFP4\", \"group_size\": 16, "
                             "\"exclude_modules\": [\"lm_head\"]}}";
    write_file("hf_quant_config.json", hq, sizeof hq - 1);
    run_case(b, &modelopt, NULL, NULL, 0, MG_OK, NULL, "hf_quant_config.json");
    static const char bad_hq[] = "{\"quantization\": {\"quant_algo\": \"W4A8_AWQ\"}}";
    write_file("hf_quant_config.json", bad_hq, sizeof bad_hq - 1);
    run_case(b, &modelopt, NULL, NULL, 0, MG_ERR_UNSUPPORTED, "W4A8_AWQ",
             "hf_quant_config.json quant_algo");
    remove_file("hf_quant_config.json");
    /* there but unreadable (a folder of that name): refused, never taken as absent */
    char quant_dir[400];
    snprintf(quant_dir, sizeof quant_dir, "%s/hf_quant_config.json", dir);
    CHECK(mkdir(quant_dir, 0700) == 0);
    run_case(b, &modelopt, NULL, NULL, 0, MG_ERR_INVALID_ARGUMENT,
             "hf_quant_config.json: cannot read it", "an unreadable hf_quant_config.json");
    CHECK(rmdir(quant_dir) == 0);
}

#define EDITS(...) ((const edit[]){__VA_ARGS__})
#define COUNT(...) (int)(sizeof((const edit[]){__VA_ARGS__}) / sizeof(edit))
#define MO_CASE(want, needle, ...)                                                                 \
    run_case(b, &modelopt, modelopt_quant, EDITS(__VA_ARGS__), COUNT(__VA_ARGS__), want, needle,   \
             #__VA_ARGS__)
#define CT_CASE(want, needle, ...)                                                                 \
    run_case(b, &compressed, ct_quant(ct_valid), EDITS(__VA_ARGS__), COUNT(__VA_ARGS__), want,     \
             needle, #__VA_ARGS__)

static void test_bad_tensors(mg_backend *b) {
    const mg_status INV = MG_ERR_INVALID_ARGUMENT;
    MO_CASE(INV, "model.layers.1.self_attn.v_proj.weight_scale_2",
            {"model.layers.1.self_attn.v_proj.weight_scale_2", DROP});
    MO_CASE(INV, "model.layers.0.mlp.up_proj.weight_scale_2",
            {"model.layers.0.mlp.up_proj.weight_scale_2", AS_BF16});
    MO_CASE(INV, "model.layers.0.self_attn.k_proj: mg_nvfp4_import_modelopt: weight_scale_2 is 0",
            {"model.layers.0.self_attn.k_proj.weight_scale_2", ZERO});
    MO_CASE(INV, "weight_scale_2", {"model.layers.0.self_attn.k_proj.weight_scale_2", TWO_VALUES});
    MO_CASE(INV, "model.layers.0.self_attn.q_proj.weight",
            {"model.layers.0.self_attn.q_proj.weight", AS_BF16});
    MO_CASE(INV, "model.layers.1.mlp.down_proj.weight_scale",
            {"model.layers.1.mlp.down_proj.weight_scale", AS_BF16});
    MO_CASE(INV, "model.layers.0.mlp.gate_proj", {"model.layers.0.mlp.gate_proj.weight", HALF_ROWS},
            {"model.layers.0.mlp.gate_proj.weight_scale", HALF_ROWS});
    MO_CASE(INV, "weight_scale", {"model.layers.0.self_attn.o_proj.weight_scale", HALF_ROWS});
    /* block scales this format never writes: the sign bit set, the E4M3 NaN */
    MO_CASE(INV, "model.layers.1.mlp.up_proj: mg_nvfp4_import_modelopt: weight_scale[",
            {"model.layers.1.mlp.up_proj.weight_scale", NEGATIVE_SCALE});
    CT_CASE(INV, "is 0x7f", {"model.layers.0.self_attn.v_proj.weight_scale", NAN_SCALE});
    CT_CASE(INV, "lm_head: mg_nvfp4_import_compressed_tensors: weight_scale[",
            {"lm_head.weight_scale", NEGATIVE_SCALE});
    /* without its block scales a linear reads as float: its U8 weight is then no float */
    MO_CASE(INV, "model.layers.0.self_attn.o_proj.weight_scale_2",
            {"model.layers.0.self_attn.o_proj.weight_scale", DROP});
    MO_CASE(INV, "model.layers.1.self_attn.q_proj.input_scale",
            {"model.layers.1.self_attn.q_proj.input_scale", DROP});
    MO_CASE(INV, "model.layers.1.self_attn.q_proj.input_scale",
            {"model.layers.1.self_attn.q_proj.input_scale", AS_BF16});
    CT_CASE(INV, "model.layers.0.mlp.up_proj.weight_global_scale",
            {"model.layers.0.mlp.up_proj.weight_global_scale", DROP});
    CT_CASE(INV, "lm_head.weight_packed", {"lm_head.weight_packed", AS_BF16});
    CT_CASE(INV,
            "model.layers.1.mlp.gate_proj: mg_nvfp4_import_compressed_tensors: "
            "weight_global_scale is 0",
            {"model.layers.1.mlp.gate_proj.weight_global_scale", ZERO});
    CT_CASE(INV, "model.layers.0.self_attn.k_proj.input_global_scale",
            {"model.layers.0.self_attn.k_proj.input_global_scale", DROP});
    /* the layouts the runtime does not run, and stray tensors */
    const layout float_q = {.conv = MODELOPT, .input_scales = true, .float_q = true};
    run_case(b, &float_q, modelopt_quant, NULL, 0, MG_ERR_UNSUPPORTED,
             "q_proj.weight_scale, so it is not NVFP4", "a float layer matrix");
    const layout embedding = {.conv = MODELOPT, .input_scales = true, .embedding_fp4 = true};
    run_case(b, &embedding, modelopt_quant, NULL, 0, MG_ERR_UNSUPPORTED, "embedding",
             "a quantized embedding");
    const layout stray_input = {
        .conv = MODELOPT, .input_scales = true, .extra = "lm_head.input_scale"};
    run_case(b, &stray_input, modelopt_quant, NULL, 0, INV, "lm_head.input_scale",
             "an input scale beside a float LM head");
    const layout stray_norm = {
        .conv = MODELOPT, .input_scales = true, .extra = "model.norm.weight_scale_2"};
    run_case(b, &stray_norm, modelopt_quant, NULL, 0, MG_ERR_UNSUPPORTED,
             "model.norm.weight_scale_2", "a quantization tensor on a norm");
}

static void test_bad_configs(mg_backend *b) {
    const mg_status UNS = MG_ERR_UNSUPPORTED;
    static const struct {
        const char *quant, *needle;
        mg_status want;
    } cases[] = {
        {"\"quant_method\": \"modelopt\", \"quant_algo\": \"FP8\"", "quant_algo \"FP8\"", UNS},
        {"\"quant_method\": \"modelopt\"", "quant_algo", UNS},
        {"\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 32",
         "group_size", UNS},
        {"\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": "
         "\"FP8\"",
         "kv_cache_quant_algo", UNS},
        {"\"quant_method\": \"gptq\", \"bits\": 4", "quant_method \"gptq\"", UNS},
        {"\"quant_method\": \"compressed-tensors\", \"format\": \"nvfp4-pack-quantized\"",
         "config_groups", MG_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(b, &modelopt, cases[i].quant, NULL, 0, cases[i].want, cases[i].needle,
                 cases[i].quant);
    ct_config bad[5];
    for (int i = 0; i < 5; i++)
        bad[i] = ct_valid;
    bad[0].format = "float-quantized";
    bad[1].bits = 8;
    bad[2].group_size = 32;
    bad[3].status = "frozen";
    bad[4].kv_scheme = "{\"num_bits\": 8}";
    static const char *const needles[5] = {"group_0", "group_0", "group_0", "quantization_status",
                                           "kv_cache_scheme"};
    for (int i = 0; i < 5; i++)
        run_case(b, &compressed, ct_quant(bad[i]), NULL, 0, UNS, needles[i], needles[i]);
}

int main(void) {
    test_seed();
    snprintf(dir, sizeof dir, "/tmp/metrale_nvfp4_ckpt_%d", (int)getpid());
    mkdir(dir, 0700);
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (mg_backend_open(MG_BACKEND_CUDA, 0, &gpu) != MG_OK)
        printf("no CUDA backend (%s): the CPU runs only\n", mg_last_error());
    if (b) {
        test_valid(b);
        test_bad_tensors(b);
        test_bad_configs(b);
        mg_backend_close(b);
    }
    if (gpu)
        mg_backend_close(gpu);
    remove_file("config.json");
    remove_file("model.safetensors");
    remove_file("hf_quant_config.json");
    rmdir(dir);
    return test_finish();
}
