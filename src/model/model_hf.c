/* model_hf.c - a Hugging Face or MLX checkpoint directory as the forward model's architecture
 * and weights (model_hf.h). */
#include "model_hf.h"
#include "model_hf_nvfp4.h"
#include "model_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrale/dtype.h"
#include "metrale/mlx.h"
#include "metrale/ops.h"
#include "metrale/safetensors.h"

#define MAX_CONFIG_BYTES (16u << 20)

struct mg_fwd_hf {
    char dir[1024];
    mg_st_model *st;
    mg_mlx_config *mlx; /* NULL unless config.json says the directory is MLX-quantized */
    uint32_t bits;
    bool tied;
    uint32_t experts; /* Qwen3-MoE: experts per layer; 0 dense */
    /* NVFP4 directories (model_hf_nvfp4.h): the convention, whether its linears carry
     * activation scales, whether the LM head is quantized (else float) */
    mg_fwd_nvfp4_convention nvfp4;
    bool nvfp4_input_scales, nvfp4_head;
    char arch_name[96];
};

/* The per-layer tensors, by Hugging Face name. */
static const char *const layer_names[] = {
    "input_layernorm",  "self_attn.q_proj", "self_attn.k_proj",
    "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
enum { H_ATTN_NORM, H_Q, H_K, H_V, H_O, H_MLP_NORM, H_GATE, H_UP, H_DOWN, H_LAYER_COUNT };

/* The architectures' additions (model_checkpoint.h's extra tensors): Qwen2's biases of the q, k
 * and v projections, Qwen3's per-head norms. */
static const char *const bias_names[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                         "self_attn.v_proj.bias"};
static const char *const head_norm_names[] = {"self_attn.q_norm.weight", "self_attn.k_norm.weight"};

static bool is_matrix(int i) {
    return i != H_ATTN_NORM && i != H_MLP_NORM;
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size >= 0 && (unsigned long)size <= MAX_CONFIG_BYTES && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)size + 1)) && fread(text, 1, (size_t)size, f) == (size_t)size) {
        text[size] = 0;
        *len = (size_t)size;
    } else {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

static mg_status read_config(mg_fwd_hf *h, const char *path, mg_fwd_preset *arch) {
    size_t len = 0;
    char *text = read_text(path, &len);
    if (!text)
        return mg_error_report(errno == ENOENT ? MG_ERR_NOT_FOUND : MG_ERR_INVALID_ARGUMENT,
                               "%s: cannot read it (or larger than %u bytes)", path,
                               MAX_CONFIG_BYTES);
    mg_fwd_hf_config c;
    mg_status st = mg_fwd_hf_config_parse(text, len, path, arch, &c);
    free(text);
    /* ModelOpt exports may describe their quantization in hf_quant_config.json alone */
    char quant_path[1200];
    snprintf(quant_path, sizeof quant_path, "%s/hf_quant_config.json", h->dir);
    if (!st && !c.bits && c.nvfp4 == MG_FWD_NVFP4_NONE) {
        if ((text = read_text(quant_path, &len))) {
            st = mg_fwd_hf_quant_config_parse(text, len, quant_path, &c);
            free(text);
        } else if (access(quant_path, F_OK) == 0) { /* there, but not readable: never ignored */
            st = mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                 "%s: cannot read it (or larger than %u bytes)", quant_path,
                                 MAX_CONFIG_BYTES);
        }
    }
    h->nvfp4 = c.nvfp4;
    h->nvfp4_input_scales = c.nvfp4_input_scales;
    h->tied = c.tied;
    h->bits = c.bits;
    snprintf(h->arch_name, sizeof h->arch_name, "%s", c.arch_name);
    return st;
}

/* Checks float tensor `name` (the full name): present, BF16, F16 or F32, of shape [rows, cols]
 * (rows 0: a vector of cols). */
static mg_status check_float(const mg_fwd_hf *h, const char *name, uint64_t rows, uint64_t cols) {
    mg_st_tensor t;
    if (mg_st_find(h->st, name, &t))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "checkpoint %s: tensor %s is missing",
                               h->dir, name);
    if (t.dtype != MG_ST_BF16 && t.dtype != MG_ST_F16 && t.dtype != MG_ST_F32)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "checkpoint %s: tensor %s is %s (BF16, F16 and F32 are loaded)",
                               h->dir, name, mg_st_dtype_name(t.dtype));
    const bool ok = rows ? t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols
                         : t.rank == 1 && t.shape[0] == cols;
    if (!ok)
        return mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "checkpoint %s: tensor %s has shape [%llu, %llu] (rank %u), the config "
            "implies [%llu, %llu]",
            h->dir, name, (unsigned long long)t.shape[0],
            (unsigned long long)(t.rank > 1 ? t.shape[1] : 0), t.rank, (unsigned long long)rows,
            (unsigned long long)cols);
    return MG_OK;
}

/* Checks the layer `base`: its `.weight` as check_float does, or (quantized) the MLX triple or
 * the NVFP4 linear; *fp4 (when not NULL) says whether it is NVFP4. */
static mg_status check_tensor(const mg_fwd_hf *h, const char *base, uint64_t rows, uint64_t cols,
                              bool may_be_quantized, bool *fp4_out) {
    char name[160];
    mg_st_tensor t;
    if (fp4_out)
        *fp4_out = false;
    /* ".scales" and ".weight" are equally long: one check covers both names */
    if (snprintf(name, sizeof name, "%s.scales", base) >= (int)sizeof name)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "checkpoint %s: tensor name %s.weight is longer than %zu bytes",
                               h->dir, base, sizeof name - 1);
    if (may_be_quantized && h->mlx && mg_st_find(h->st, name, &t) == MG_OK)
        return MG_OK; /* an MLX layer: mg_mlx_linear_load checks its three tensors */
    bool fp4 = false;
    mg_status st = may_be_quantized && h->nvfp4
                       ? mg_fwd_hf_nvfp4_check(h->st, h->dir, h->nvfp4, h->nvfp4_input_scales, base,
                                               rows, cols, &fp4)
                       : MG_OK;
    if (fp4_out)
        *fp4_out = fp4;
    if (st || fp4)
        return st;
    if (snprintf(name, sizeof name, "%s.weight", base) >= (int)sizeof name)
        return MG_ERR_INTERNAL; /* unreachable: the same length as above */
    return check_float(h, name, rows, cols);
}

/* Whether `name` is a tensor the network uses (or a derived table it may ignore). */
static bool known_tensor(const mg_fwd_hf *h, const char *name, uint32_t layers) {
    static const char *const suffixes[] = {".weight", ".scales", ".biases"};
    size_t n = strlen(name), base = n;
    for (size_t s = 0; s < 3; s++) {
        size_t sl = strlen(suffixes[s]);
        if (n > sl && !strcmp(name + n - sl, suffixes[s]) && (s == 0 || h->mlx))
            base = n - sl;
    }
    /* an NVFP4 linear's tensors (mg_fwd_hf_open checked each quantized linear whole) */
    const bool fp4_tensor = mg_fwd_hf_nvfp4_suffix(h->nvfp4, name, &base);
    if (base == n)
        return strstr(name, "rotary_emb.inv_freq") != NULL; /* recomputed, as every engine does */
    char b[160];
    snprintf(b, sizeof b, "%.*s", (int)base, name);
    if ((!fp4_tensor && (!strcmp(b, "model.embed_tokens") || !strcmp(b, "model.norm"))) ||
        (!h->tied && !strcmp(b, "lm_head")))
        return true;
    unsigned l;
    int off = 0;
    if (sscanf(b, "model.layers.%u.%n", &l, &off) != 1 || off <= 0 || l >= layers)
        return false;
    for (int i = 0; i < H_LAYER_COUNT; i++)
        if ((!h->experts || i < H_GATE) && (!fp4_tensor || is_matrix(i)) &&
            !strcmp(b + off, layer_names[i]))
            return true;
    unsigned e;
    int end = 0;
    char proj[16];
    if (fp4_tensor)
        return false;
    if (h->experts && !strcmp(b + off, "mlp.gate"))
        return true;
    return h->experts && sscanf(b + off, "mlp.experts.%u.%15[a-z_]%n", &e, proj, &end) == 2 &&
           !b[off + end] && e < h->experts &&
           (!strcmp(proj, "gate_proj") || !strcmp(proj, "up_proj") || !strcmp(proj, "down_proj"));
}

/* Expert e's projection `proj` (gate_proj, up_proj, down_proj) of layer l. */
static void expert_name(char *buf, size_t size, uint32_t l, uint32_t e, const char *proj) {
    snprintf(buf, size, "model.layers.%u.mlp.experts.%u.%s.weight", l, e, proj);
}

/* Whether `name` is one of the architecture's additions (bias_names, head_norm_names). */
static bool known_addition(const mg_fwd_preset *arch, const char *name) {
    unsigned l;
    int off = 0;
    if (sscanf(name, "model.layers.%u.%n", &l, &off) != 1 || off <= 0 || l >= arch->layers)
        return false;
    for (int i = 0; arch->qkv_bias && i < 3; i++)
        if (!strcmp(name + off, bias_names[i]))
            return true;
    for (int i = 0; arch->qk_norm && i < 2; i++)
        if (!strcmp(name + off, head_norm_names[i]))
            return true;
    return false;
}

mg_status mg_fwd_hf_open(const char *dir, mg_fwd_preset *arch, char *name, size_t name_size,
                         mg_fwd_hf **out) {
    *out = NULL;
    memset(arch, 0, sizeof *arch);
    mg_fwd_hf *h = calloc(1, sizeof *h);
    if (!h)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mg_status st = read_config(h, path, arch);
    if (!st && (st = mg_st_open(dir, &h->st)))
        st = mg_error_report(st, "checkpoint %s: %s", dir, mg_last_error());
    if (!st && h->bits && (st = mg_mlx_config_open(dir, &h->mlx)))
        st = mg_error_report(st, "checkpoint %s: %s", dir, mg_last_error());
    const mg_model_shape *s = &arch->shape;
    const uint32_t H = s->hidden, QD = s->heads * s->head_dim, KD = s->kv_heads * s->head_dim;
    const uint32_t I = s->intermediate;
    /* An NVFP4 directory: every layer matrix NVFP4 (below), the LM head NVFP4 or float, the
     * embedding float, a dense model; whether the backend runs it is mg_fwd_hf_load's question. */
    bool fp4 = false;
    if (!st && !(st = check_tensor(h, "model.embed_tokens", s->vocab, H, true, &fp4)) && fp4)
        st = mg_error_report(MG_ERR_UNSUPPORTED,
                             "checkpoint %s: an NVFP4-quantized embedding (model.embed_tokens) is "
                             "not supported",
                             dir);
    if (!st && !(st = check_tensor(h, "model.norm", 0, H, false, NULL)) && !h->tied)
        st = check_tensor(h, "lm_head", s->vocab, H, true, &h->nvfp4_head);
    const uint64_t rows[H_LAYER_COUNT] = {0, QD, KD, KD, H, 0, I, I, H};
    const uint64_t cols[H_LAYER_COUNT] = {H, H, H, H, QD, H, H, H, I};
    char base[160];
    h->experts = s->experts;
    if (!st && h->nvfp4 && h->experts)
        st = mg_error_report(MG_ERR_UNSUPPORTED,
                             "checkpoint %s: NVFP4 checkpoints of mixture-of-experts models are "
                             "not supported (dense ones are)",
                             dir);
    if (!st && h->mlx && h->experts)
        st = mg_error_report(MG_ERR_UNSUPPORTED,
                             "checkpoint %s: MLX-quantized experts are not supported (BF16, F16 or "
                             "F32 experts are)",
                             dir);
    for (uint32_t l = 0; !st && l < arch->layers; l++) {
        /* a MoE layer has a router and its experts where a dense one has its MLP */
        for (int i = 0; !st && i < (h->experts ? H_GATE : H_LAYER_COUNT); i++) {
            snprintf(base, sizeof base, "model.layers.%u.%s", l, layer_names[i]);
            st = check_tensor(h, base, rows[i], cols[i], is_matrix(i), &fp4);
            if (!st && h->nvfp4 && is_matrix(i) && !fp4)
                st = mg_error_report(MG_ERR_UNSUPPORTED,
                                     "checkpoint %s: %s has no %s.weight_scale, so it is not "
                                     "NVFP4 (a float layer matrix in an NVFP4 checkpoint is not "
                                     "supported; only the LM head may stay float)",
                                     dir, base, base);
        }
        if (!st && h->experts) {
            snprintf(base, sizeof base, "model.layers.%u.mlp.gate", l);
            st = check_tensor(h, base, h->experts, H, false, NULL);
        }
        static const char *const projs[] = {"gate_proj", "up_proj", "down_proj"};
        for (uint32_t e = 0; !st && e < h->experts; e++)
            for (int p = 0; !st && p < 3; p++) {
                snprintf(base, sizeof base, "model.layers.%u.mlp.experts.%u.%s", l, e, projs[p]);
                st = check_tensor(h, base, p < 2 ? I : H, p < 2 ? H : I, false, NULL);
            }
    }
    for (uint32_t l = 0; !st && l < arch->layers; l++) {
        const uint64_t bias_rows[3] = {QD, KD, KD};
        for (int i = 0; !st && arch->qkv_bias && i < 3; i++) {
            snprintf(base, sizeof base, "model.layers.%u.%s", l, bias_names[i]);
            st = check_float(h, base, 0, bias_rows[i]);
        }
        for (int i = 0; !st && arch->qk_norm && i < 2; i++) {
            snprintf(base, sizeof base, "model.layers.%u.%s", l, head_norm_names[i]);
            st = check_float(h, base, 0, s->head_dim);
        }
    }
    for (size_t i = 0; !st && i < mg_st_count(h->st); i++) {
        mg_st_tensor t;
        if (!mg_st_get(h->st, i, &t) && !known_tensor(h, t.name, arch->layers) &&
            !known_addition(arch, t.name))
            st = mg_error_report(MG_ERR_UNSUPPORTED,
                                 "checkpoint %s: tensor %s is not part of the %s network this "
                                 "runtime runs (ignoring it would run another network)",
                                 dir, t.name, h->arch_name);
    }
    if (st) {
        mg_fwd_hf_close(h);
        return st;
    }
    /* the name: the directory's last component, trailing slashes aside */
    size_t end = strlen(dir);
    while (end > 1 && dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(name, name_size, "%.*s", (int)(end - start), dir + start);
    arch->name = name;
    arch->description = h->mlx     ? "an MLX checkpoint"
                        : h->nvfp4 ? "an NVFP4 Hugging Face checkpoint"
                                   : "a Hugging Face checkpoint";
    arch->max_batch_size = 64;
    arch->batch = 1;
    arch->prompt_len = 16;
    arch->steps = 32;
    *out = h;
    return MG_OK;
}

void mg_fwd_hf_close(mg_fwd_hf *h) {
    if (!h)
        return;
    mg_st_close(h->st);
    mg_mlx_config_close(h->mlx);
    free(h);
}

double mg_fwd_hf_weight_bytes(const mg_fwd_hf *h) {
    double total = 0;
    for (size_t i = 0; i < mg_st_count(h->st); i++) {
        mg_st_tensor t;
        if (mg_st_get(h->st, i, &t))
            continue;
        /* an NVFP4 linear: its prepared bytes (rows and K padded), counted at its block scales
         * (shapes checked at open); its other tensors (ModelOpt's U8 codes are `.weight`) none */
        size_t base = 0;
        if (h->nvfp4 && mg_fwd_hf_nvfp4_suffix(h->nvfp4, t.name, &base)) {
            if (!strcmp(t.name + base, ".weight_scale") && t.rank == 2) {
                const uint32_t n = (uint32_t)t.shape[0], k = (uint32_t)(t.shape[1] * 16);
                total += (double)mg_nvfp4_prepared_value_bytes(n, k) +
                         (double)mg_nvfp4_prepared_scale_bytes(n, k) + 16.0;
            }
            continue;
        }
        if (h->nvfp4 && t.dtype == MG_ST_U8)
            continue;
        /* F32 tensors become BF16; the rest (BF16, F16, packed MLX) keep their size */
        total += t.dtype == MG_ST_F32 ? t.bytes / 2.0 : (double)t.bytes;
    }
    return total;
}

/* Element j of a float tensor as FP32. */
static float element(const mg_st_tensor *t, size_t j) {
    uint16_t h;
    float f;
    switch (t->dtype) {
    case MG_ST_F32:
        memcpy(&f, (const char *)t->data + 4 * j, 4);
        return f;
    case MG_ST_F16:
        memcpy(&h, (const char *)t->data + 2 * j, 2);
        return mg_f16_to_f32(h);
    default:
        memcpy(&h, (const char *)t->data + 2 * j, 2);
        return mg_bf16_to_f32(h);
    }
}

/* The named float tensors, joined row-wise, as one BF16 (or, f32, FP32) device buffer. */
static mg_status upload_float(mg_backend *b, const mg_fwd_hf *h, const char *const *names,
                              int count, bool f32, mg_devptr *out, uint64_t *total) {
    mg_st_tensor *t = malloc((size_t)count * sizeof *t);
    if (!t)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for %s", names[0]);
    size_t elements = 0;
    for (int i = 0; i < count; i++) {
        mg_status st = mg_st_find(h->st, names[i], &t[i]);
        if (st) {
            free(t);
            return mg_error_report(st, "checkpoint %s: %s", h->dir, mg_last_error());
        }
        elements += (size_t)(t[i].bytes / mg_st_dtype_bytes(t[i].dtype));
    }
    const size_t size = f32 ? 4 : 2;
    uint16_t *host = malloc(elements * size);
    float *host32 = (float *)(void *)host;
    if (!host) {
        free(t);
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for %s", names[0]);
    }
    size_t o = 0;
    for (int i = 0; i < count; i++) {
        const size_t n = (size_t)(t[i].bytes / mg_st_dtype_bytes(t[i].dtype));
        if (f32) {
            for (size_t j = 0; j < n; j++)
                host32[o + j] = element(&t[i], j);
        } else if (t[i].dtype == MG_ST_BF16) {
            memcpy(host + o, t[i].data, n * 2);
        } else {
            for (size_t j = 0; j < n; j++)
                host[o + j] = mg_f32_to_bf16(element(&t[i], j));
        }
        o += n;
    }
    free(t);
    mg_status st = mg_alloc(b, elements * size, out);
    if (!st && (st = mg_copy_h2d(b, *out, host, elements * size))) {
        mg_free(b, *out);
        *out = 0;
    }
    free(host);
    if (st)
        return mg_error_report(st, "uploading %s: %s", names[0], mg_last_error());
    *total += elements * size;
    return MG_OK;
}

static mg_status upload_bf16(mg_backend *b, const mg_fwd_hf *h, const char *const *names, int count,
                             mg_devptr *out, uint64_t *total) {
    return upload_float(b, h, names, count, false, out, total);
}

/* `base` (model.embed_tokens or lm_head) as BF16: as it is, or dequantized on the device when
 * the directory holds it MLX-quantized. */
static mg_status upload_table(mg_backend *b, const mg_fwd_hf *h, const char *base, mg_devptr *out,
                              uint64_t *total) {
    char name[160];
    mg_st_tensor t;
    snprintf(name, sizeof name, "%s.scales", base);
    if (!h->mlx || mg_st_find(h->st, name, &t)) {
        snprintf(name, sizeof name, "%s.weight", base);
        const char *names[] = {name};
        return upload_bf16(b, h, names, 1, out, total);
    }
    mg_mlx_linear q;
    mg_status st = mg_mlx_linear_load(b, h->st, h->mlx, base, &q);
    if (st)
        return mg_error_report(st, "checkpoint %s: %s", h->dir, mg_last_error());
    const uint64_t bytes = mg_mlx_gemm_scratch_bytes(&q);
    if (!(st = mg_alloc(b, bytes, out)) && !(st = mg_mlx_dequant(b, NULL, &q, 0, *out)))
        st = mg_stream_synchronize(mg_stream_default(b));
    mg_mlx_linear_free(b, &q);
    if (st) {
        if (*out)
            mg_free(b, *out);
        *out = 0;
        return mg_error_report(st, "dequantizing %s: %s", base, mg_last_error());
    }
    *total += bytes;
    return MG_OK;
}

/* Layer l's additions (model_checkpoint.h): the q bias and the joined k and v biases in FP32
 * unless the MLX linears add their own, the head norms in BF16. */
static mg_status upload_additions(mg_backend *b, const mg_fwd_hf *h, const mg_fwd_preset *arch,
                                  uint32_t l, mg_devptr *x, uint64_t *total) {
    char n[3][160];
    mg_status st = MG_OK;
    if (arch->qkv_bias && !h->mlx) {
        for (int i = 0; i < 3; i++)
            snprintf(n[i], sizeof n[i], "model.layers.%u.%s", l, bias_names[i]);
        const char *q[] = {n[0]}, *kv[] = {n[1], n[2]};
        if (!(st = upload_float(b, h, q, 1, true, &x[MG_FWD_Q_BIAS], total)))
            st = upload_float(b, h, kv, 2, true, &x[MG_FWD_KV_BIAS], total);
    }
    if (!st && arch->qk_norm) {
        for (int i = 0; i < 2; i++)
            snprintf(n[i], sizeof n[i], "model.layers.%u.%s", l, head_norm_names[i]);
        const char *q[] = {n[0]}, *k[] = {n[1]};
        if (!(st = upload_bf16(b, h, q, 1, &x[MG_FWD_Q_NORM], total)))
            st = upload_bf16(b, h, k, 1, &x[MG_FWD_K_NORM], total);
    }
    return st;
}

/* Layer l's router and experts in model.h's MoE layout: the router [E, hidden], w_gate_up
 * expert e's gate rows then its up rows at rows e * 2 I, w_down expert e at rows e * hidden. */
static mg_status upload_experts(mg_backend *b, const mg_fwd_hf *h, uint32_t l, mg_devptr *w,
                                uint64_t *total) {
    const uint32_t E = h->experts;
    char router[160];
    snprintf(router, sizeof router, "model.layers.%u.mlp.gate.weight", l);
    const char *rn[] = {router};
    char(*names)[160] = malloc((size_t)3 * E * sizeof *names);
    const char **gu = malloc((size_t)3 * E * sizeof *gu), **down = gu + 2 * E;
    mg_status st = MG_OK;
    if (!names || !gu)
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the experts' names");
    for (uint32_t e = 0; !st && e < E; e++) {
        expert_name(names[3 * e], sizeof names[0], l, e, "gate_proj");
        expert_name(names[3 * e + 1], sizeof names[0], l, e, "up_proj");
        expert_name(names[3 * e + 2], sizeof names[0], l, e, "down_proj");
        gu[2 * e] = names[3 * e];
        gu[2 * e + 1] = names[3 * e + 1];
        down[e] = names[3 * e + 2];
    }
    if (!st && !(st = upload_bf16(b, h, rn, 1, &w[MG_FWD_ROUTER], total)) &&
        !(st = upload_bf16(b, h, gu, (int)(2 * E), &w[MG_FWD_W_GATE_UP], total)))
        st = upload_bf16(b, h, down, (int)E, &w[MG_FWD_W_DOWN], total);
    free(names);
    free(gu);
    return st;
}

mg_status mg_fwd_hf_load(mg_backend *b, mg_fwd_hf *h, const mg_fwd_preset *arch, mg_devptr *layer_w,
                         mg_devptr *extra, mg_fwd_checkpoint_weights *out) {
    memset(out, 0, sizeof *out);
    mg_status st = upload_table(b, h, "model.embed_tokens", &out->embedding, &out->bytes);
    const char *norm[] = {"model.norm.weight"};
    if (!st)
        st = upload_bf16(b, h, norm, 1, &out->final_norm, &out->bytes);
    if (!st && h->nvfp4 && !mg_op_supported(b, MG_OP_NVFP4_GEMM))
        st = mg_error_report(
            MG_ERR_UNSUPPORTED, "checkpoint %s: the %s backend cannot run op %s (NVFP4 weights)",
            h->dir, mg_backend_kind_name(mg_backend_get_kind(b)), mg_op_name(MG_OP_NVFP4_GEMM));
    if (!st && h->nvfp4 && !(out->fp4 = calloc((size_t)arch->layers * FP4_SLOTS, sizeof *out->fp4)))
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the NVFP4 weights");
    if (!st && h->nvfp4_head)
        st = mg_fwd_hf_nvfp4_upload(b, h->st, h->dir, h->nvfp4, "lm_head", &out->lm_head_fp4,
                                    &out->bytes);
    else if (!st && !h->tied)
        st = upload_table(b, h, "lm_head", &out->lm_head, &out->bytes);
    else if (!st)
        out->lm_head = out->embedding;
    char n[H_LAYER_COUNT][160];
    for (uint32_t l = 0; !st && l < arch->layers; l++) {
        for (int i = 0; i < H_LAYER_COUNT; i++)
            snprintf(n[i], sizeof n[i], "model.layers.%u.%s.weight", l, layer_names[i]);
        mg_devptr *w = layer_w + (size_t)l * MG_FWD_LAYER_TENSORS;
        const char *an[] = {n[H_ATTN_NORM]}, *mn[] = {n[H_MLP_NORM]};
        if ((st = upload_additions(b, h, arch, l, extra + (size_t)l * MG_FWD_EXTRA_TENSORS,
                                   &out->bytes)) ||
            (st = upload_bf16(b, h, an, 1, &w[MG_FWD_ATTN_NORM], &out->bytes)) ||
            (st = upload_bf16(b, h, mn, 1, &w[MG_FWD_MLP_NORM], &out->bytes)) || h->mlx)
            continue;
        if (h->nvfp4) {
            /* k and v keep their own global scales: FP4_KV holds k, FP4_V v (model_internal.h) */
            static const int fp4_slot[H_LAYER_COUNT] = {-1, FP4_Q,    FP4_KV, FP4_V,   FP4_O,
                                                        -1, FP4_GATE, FP4_UP, FP4_DOWN};
            mg_nvfp4_weight *fw = out->fp4 + (size_t)l * FP4_SLOTS;
            char base[160];
            for (int i = 0; !st && i < H_LAYER_COUNT; i++)
                if (fp4_slot[i] >= 0) {
                    snprintf(base, sizeof base, "model.layers.%u.%s", l, layer_names[i]);
                    st = mg_fwd_hf_nvfp4_upload(b, h->st, h->dir, h->nvfp4, base, &fw[fp4_slot[i]],
                                                &out->bytes);
                }
            continue;
        }
        const char *q[] = {n[H_Q]}, *kv[] = {n[H_K], n[H_V]}, *o[] = {n[H_O]};
        const char *gu[] = {n[H_GATE], n[H_UP]}, *down[] = {n[H_DOWN]};
        if (!(st = upload_bf16(b, h, q, 1, &w[MG_FWD_WQ], &out->bytes)) &&
            !(st = upload_bf16(b, h, kv, 2, &w[MG_FWD_WKV], &out->bytes)) &&
            !(st = upload_bf16(b, h, o, 1, &w[MG_FWD_WO], &out->bytes)) && !h->experts &&
            !(st = upload_bf16(b, h, gu, 2, &w[MG_FWD_W_GATE_UP], &out->bytes)))
            st = upload_bf16(b, h, down, 1, &w[MG_FWD_W_DOWN], &out->bytes);
        if (!st && h->experts)
            st = upload_experts(b, h, l, w, &out->bytes);
    }
    if (!st && h->mlx &&
        !(st = mg_fwd_mlx_create(b, &arch->shape, arch->layers, h->dir, h->bits, &out->mlx)))
        out->bytes += mg_fwd_mlx_bytes(out->mlx);
    return st;
}
