/* model_gguf.c - a GGUF checkpoint as the forward model's architecture and weights
 * (model_gguf.h). */
#include "model_gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_blocks.h"
#include "metrale/dtype.h"
#include "metrale/ops.h"

/* The per-layer tensors the model uses, by GGUF name suffix. */
static const char *const layer_names[] = {"attn_norm", "attn_q",      "attn_k",
                                          "attn_v",    "attn_output", "ffn_norm",
                                          "ffn_gate",  "ffn_up",      "ffn_down"};
enum { T_ATTN_NORM, T_Q, T_K, T_V, T_O, T_FFN_NORM, T_GATE, T_UP, T_DOWN, T_LAYER_COUNT };

/* The architectures read: llama (its Q and K rows permuted by llama.cpp's converter), qwen2
 * (q, k and v biases) and qwen3 (per-head q and k norms), whose converters leave the rows in
 * Hugging Face order (llama.cpp runs them with NEOX, i.e. rotate-half, RoPE). */
static const struct gguf_arch {
    const char *name;
    bool permuted, qkv_bias, qk_norm;
} gguf_archs[] = {
    {"llama", true, false, false}, {"qwen2", false, true, false}, {"qwen3", false, false, true}};

/* The architectures' additional per-layer tensors: the biases ([rows of attn_q, attn_k,
 * attn_v]), the head norms ([head_dim]). */
static const char *const bias_names[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
static const char *const head_norm_names[] = {"attn_q_norm.weight", "attn_k_norm.weight"};

static const struct gguf_arch *arch_of(const mg_gguf *g, char *a, size_t size) {
    if (!mg_gguf_get_string(g, "general.architecture", a, size))
        return NULL;
    for (size_t i = 0; i < sizeof gguf_archs / sizeof gguf_archs[0]; i++)
        if (!strcmp(a, gguf_archs[i].name))
            return &gguf_archs[i];
    return NULL;
}

static uint16_t load_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

/* --------------------------------------------------------------- architecture */

static mg_status need_u32(const mg_gguf *g, const char *path, const char *arch, const char *key,
                          uint32_t *out) {
    char full[128];
    uint64_t v;
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!mg_gguf_get_u64(g, full, &v))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: metadata %s is missing or not a non-negative integer",
                               path, full);
    if (v == 0 || v > (1u << 24))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: metadata %s = %llu is out of range", path, full,
                               (unsigned long long)v);
    *out = (uint32_t)v;
    return MG_OK;
}

/* Checks tensor `name`'s presence, rank-2 shape [rows, cols] (cols the row length) or rank-1
 * [cols] (rows 0), and that its type is one the loader converts. */
static mg_status check_tensor(const mg_gguf *g, const char *path, const char *name, uint64_t rows,
                              uint64_t cols, const mg_gguf_tensor **out) {
    const mg_gguf_tensor *t = mg_gguf_tensor_find(g, name);
    if (!t)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: tensor %s is missing", path,
                               name);
    bool shape_ok = rows ? t->n_dims == 2 && t->dims[0] == cols && t->dims[1] == rows
                         : t->n_dims == 1 && t->dims[0] == cols;
    if (!shape_ok)
        return mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "GGUF %s: tensor %s has %llu rows of %llu (rank %u, dims %llu x %llu x "
            "%llu x %llu), the metadata implies %llu rows of %llu",
            path, name, (unsigned long long)(t->elements / t->dims[0]),
            (unsigned long long)t->dims[0], t->n_dims, (unsigned long long)t->dims[0],
            (unsigned long long)t->dims[1], (unsigned long long)t->dims[2],
            (unsigned long long)t->dims[3], (unsigned long long)(rows ? rows : 1),
            (unsigned long long)cols);
    switch (t->type) {
    case MG_GGUF_F32:
    case MG_GGUF_F16:
    case MG_GGUF_BF16:
    case MG_GGUF_Q4_0:
    case MG_GGUF_Q4_1:
    case MG_GGUF_Q8_0:
    case MG_GGUF_Q4_K: /* K-quants become BF16 (gguf_blocks.h) */
    case MG_GGUF_Q5_K:
    case MG_GGUF_Q6_K:
        break;
    default:
        return mg_error_report(
            MG_ERR_UNSUPPORTED,
            "GGUF %s: tensor %s has type %s, which this runtime does not load yet "
            "(F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K are loaded)",
            path, name, mg_gguf_type_name(t->type));
    }
    if (out)
        *out = t;
    return MG_OK;
}

static bool is_block_type(uint32_t type) {
    return type == MG_GGUF_Q4_0 || type == MG_GGUF_Q4_1 || type == MG_GGUF_Q8_0;
}

mg_status mg_fwd_gguf_arch(const mg_gguf *g, const char *path, mg_fwd_preset *arch, char *name,
                           size_t name_size) {
    char a[64] = "";
    const struct gguf_arch *ga = arch_of(g, a, sizeof a);
    if (!*a)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: general.architecture is missing or not a short string",
                               path);
    if (!ga)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "GGUF %s: architecture %s is not supported (llama, qwen2 and qwen3 "
                               "are)",
                               path, a);
    memset(arch, 0, sizeof *arch);
    arch->qkv_bias = ga->qkv_bias;
    arch->qk_norm = ga->qk_norm;
    mg_model_shape *s = &arch->shape;
    mg_status st;
    if ((st = need_u32(g, path, a, "block_count", &arch->layers)) ||
        (st = need_u32(g, path, a, "embedding_length", &s->hidden)) ||
        (st = need_u32(g, path, a, "feed_forward_length", &s->intermediate)) ||
        (st = need_u32(g, path, a, "attention.head_count", &s->heads)) ||
        (st = need_u32(g, path, a, "attention.head_count_kv", &s->kv_heads)))
        return st;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    if (mg_gguf_find(g, key)) {
        if ((st = need_u32(g, path, a, "attention.key_length", &s->head_dim)))
            return st;
        uint32_t v;
        snprintf(key, sizeof key, "%s.attention.value_length", a);
        if (mg_gguf_find(g, key) &&
            ((st = need_u32(g, path, a, "attention.value_length", &v)) || v != s->head_dim))
            return st ? st
                      : mg_error_report(MG_ERR_UNSUPPORTED,
                                        "GGUF %s: value_length %u differs from key_length %u", path,
                                        v, s->head_dim);
    } else {
        if (s->hidden % s->heads)
            return mg_error_report(
                MG_ERR_INVALID_ARGUMENT,
                "GGUF %s: embedding_length %u is not a multiple of head_count %u", path, s->hidden,
                s->heads);
        s->head_dim = s->hidden / s->heads;
    }
    if (s->heads % s->kv_heads)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: head_count %u is not a multiple of head_count_kv %u", path,
                               s->heads, s->kv_heads);
    if (s->head_dim % 2)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: odd head dimension %u", path,
                               s->head_dim);
    snprintf(key, sizeof key, "%s.rope.dimension_count", a);
    uint64_t rope_dims = s->head_dim;
    if (mg_gguf_find(g, key) && (!mg_gguf_get_u64(g, key, &rope_dims) || rope_dims != s->head_dim))
        return mg_error_report(
            MG_ERR_UNSUPPORTED,
            "GGUF %s: %s = %llu: RoPE over part of the head (%u) is not supported", path, key,
            (unsigned long long)rope_dims, s->head_dim);
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    char scaling[32] = "none";
    if (mg_gguf_find(g, key) &&
        (!mg_gguf_get_string(g, key, scaling, sizeof scaling) || strcmp(scaling, "none")))
        return mg_error_report(MG_ERR_UNSUPPORTED, "GGUF %s: %s = %s is not supported", path, key,
                               scaling);
    static const char *const refused[] = {"expert_count", "rope.scaling.factor",
                                          "attention.sliding_window"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", a, refused[i]);
        uint64_t v = 0;
        double f = 0;
        const bool set = mg_gguf_find(g, key) && !(mg_gguf_get_u64(g, key, &v) && v == 0) &&
                         !(mg_gguf_get_f64(g, key, &f) && (f == 0 || f == 1));
        if (set)
            return mg_error_report(MG_ERR_UNSUPPORTED, "GGUF %s: %s is set: not supported", path,
                                   key);
    }
    double theta = 10000.0, eps = 0;
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    if (mg_gguf_find(g, key) && !mg_gguf_get_f64(g, key, &theta))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: %s is not a float", path, key);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if (!mg_gguf_get_f64(g, key, &eps) || !(eps > 0) || !(eps < 1))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: %s is missing or not a float in (0, 1)", path, key);
    if (!(theta > 0) || !isfinite(theta))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: rope.freq_base %g", path, theta);
    arch->rope_theta = (float)theta;
    arch->norm_eps = (float)eps;

    /* the vocabulary is the embedding's row count */
    const mg_gguf_tensor *emb = mg_gguf_tensor_find(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "GGUF %s: token_embd.weight is missing or not a matrix", path);
    if (emb->dims[1] > (1u << 24))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: vocabulary of %llu tokens", path,
                               (unsigned long long)emb->dims[1]);
    s->vocab = (uint32_t)emb->dims[1];
    const uint32_t H = s->hidden, QD = s->heads * s->head_dim, KD = s->kv_heads * s->head_dim;
    const uint32_t I = s->intermediate;
    size_t used = 0;
    if ((st = check_tensor(g, path, "token_embd.weight", s->vocab, H, NULL)) ||
        (st = check_tensor(g, path, "output_norm.weight", 0, H, NULL)))
        return st;
    used += 2;
    if (mg_gguf_tensor_find(g, "output.weight")) {
        if ((st = check_tensor(g, path, "output.weight", s->vocab, H, NULL)))
            return st;
        used++;
    }
    const uint64_t rows[T_LAYER_COUNT] = {0, QD, KD, KD, H, 0, I, I, H};
    const uint64_t cols[T_LAYER_COUNT] = {H, H, H, H, QD, H, H, H, I};
    int block_matrices = 0, float_matrices = 0;
    char tn[96];
    for (uint32_t l = 0; l < arch->layers; l++)
        for (int i = 0; i < T_LAYER_COUNT; i++) {
            const mg_gguf_tensor *t;
            snprintf(tn, sizeof tn, "blk.%u.%s.weight", l, layer_names[i]);
            if ((st = check_tensor(g, path, tn, rows[i], cols[i], &t)))
                return st;
            used++;
            if (rows[i]) {
                if (is_block_type(t->type))
                    block_matrices++;
                else
                    float_matrices++;
            }
            if (rows[i] && is_block_type(t->type) && cols[i] % 32)
                return mg_error_report(MG_ERR_INVALID_ARGUMENT, "GGUF %s: %s rows of %llu", path,
                                       tn, (unsigned long long)cols[i]);
        }
    const uint64_t bias_rows[3] = {QD, KD, KD};
    for (uint32_t l = 0; l < arch->layers; l++) {
        for (int i = 0; ga->qkv_bias && i < 3; i++) {
            snprintf(tn, sizeof tn, "blk.%u.%s", l, bias_names[i]);
            if ((st = check_tensor(g, path, tn, 0, bias_rows[i], NULL)))
                return st;
            used++;
        }
        for (int i = 0; ga->qk_norm && i < 2; i++) {
            snprintf(tn, sizeof tn, "blk.%u.%s", l, head_norm_names[i]);
            if ((st = check_tensor(g, path, tn, 0, s->head_dim, NULL)))
                return st;
            used++;
        }
    }
    /* Llama 3.1's scaled RoPE as llama.cpp's converter writes it: one divisor per frequency,
     * read in place from the mapped file (which the model keeps open) */
    const mg_gguf_tensor *freqs = mg_gguf_tensor_find(g, "rope_freqs.weight");
    if (freqs) {
        if (strcmp(a, "llama") || freqs->type != MG_GGUF_F32 || freqs->n_dims != 1 ||
            freqs->dims[0] != s->head_dim / 2 || (uintptr_t)freqs->data % 4)
            return mg_error_report(MG_ERR_UNSUPPORTED,
                                   "GGUF %s: rope_freqs.weight must be F32 [%u] of a llama "
                                   "architecture (it is of %s)",
                                   path, s->head_dim / 2, a);
        const float *f = (const float *)freqs->data;
        for (uint32_t i = 0; i < s->head_dim / 2; i++)
            if (!(f[i] > 0) || !isfinite(f[i]))
                return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                       "GGUF %s: rope_freqs.weight[%u] = %g (must be finite and "
                                       "> 0)",
                                       path, i, f[i]);
        arch->rope_freq_factors = f;
        used++;
    }
    if (block_matrices && float_matrices)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "GGUF %s: the layer matrices mix block-quantized and float types; "
                               "one kind for all of them is supported",
                               path);
    /* a tensor the model would not use (a bias, a rope table, experts) is refused rather than
     * ignored: ignoring it would run a different network */
    if (used != mg_gguf_tensor_count(g))
        for (size_t i = 0; i < mg_gguf_tensor_count(g); i++) {
            const char *n = mg_gguf_tensor_at(g, i)->name;
            bool known = !strcmp(n, "token_embd.weight") || !strcmp(n, "output_norm.weight") ||
                         !strcmp(n, "output.weight") || (freqs && !strcmp(n, "rope_freqs.weight"));
            unsigned l;
            int off = 0;
            if (!known && sscanf(n, "blk.%u.%n", &l, &off) == 1 && off > 0 && l < arch->layers)
                for (int k = 0; k < T_LAYER_COUNT && !known; k++) {
                    snprintf(tn, sizeof tn, "%s.weight", layer_names[k]);
                    known = !strcmp(n + off, tn);
                }
            for (int k = 0; !known && off > 0 && ga->qkv_bias && k < 3; k++)
                known = !strcmp(n + off, bias_names[k]);
            for (int k = 0; !known && off > 0 && ga->qk_norm && k < 2; k++)
                known = !strcmp(n + off, head_norm_names[k]);
            if (!known)
                return mg_error_report(MG_ERR_UNSUPPORTED,
                                       "GGUF %s: tensor %s is not part of the %s network this "
                                       "runtime runs (ignoring it would run another network)",
                                       path, n, a);
        }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!mg_gguf_get_string(g, "general.name", name, name_size))
        snprintf(name, name_size, "%s", base);
    arch->name = name;
    arch->description = "a GGUF checkpoint";
    uint64_t ctx = 0;
    snprintf(key, sizeof key, "%s.context_length", a);
    const bool has_ctx = mg_gguf_get_u64(g, key, &ctx) && ctx > 0;
    arch->context = has_ctx && ctx < (1u << 30) ? (uint32_t)ctx : 0;
    arch->max_batch_tokens = has_ctx && ctx < 8192 ? (uint32_t)ctx : 8192;
    arch->max_batch_size = 64;
    arch->batch = 1;
    arch->prompt_len = 16;
    arch->steps = 32;
    return MG_OK;
}

double mg_fwd_gguf_weight_bytes(const mg_gguf *g, const mg_fwd_preset *arch) {
    (void)arch;
    double total = 0;
    for (size_t i = 0; i < mg_gguf_tensor_count(g); i++) {
        const mg_gguf_tensor *t = mg_gguf_tensor_at(g, i);
        /* block matrices keep their size (an MLX group of 32 is as large as the block); the
         * rest become BF16 */
        total += is_block_type(t->type) && t->n_dims == 2 && strncmp(t->name, "token_embd", 10)
                     ? (double)t->bytes * 1.1
                     : 2.0 * (double)t->elements;
    }
    return total;
}

/* --------------------------------------------------------------- conversions */

/* Row `row` of t (row length cols) as FP32, exactly as ggml dequantizes it. */
static void row_to_f32(const mg_gguf_tensor *t, uint64_t row, uint32_t cols, float *out) {
    uint32_t be, bb;
    mg_gguf_type_block(t->type, &be, &bb);
    const uint8_t *p = t->data + row * (cols / be) * bb;
    switch (t->type) {
    case MG_GGUF_F32:
        memcpy(out, p, (size_t)cols * 4);
        return;
    case MG_GGUF_F16:
        for (uint32_t j = 0; j < cols; j++)
            out[j] = mg_f16_to_f32(load_u16(p + 2 * j));
        return;
    case MG_GGUF_BF16:
        for (uint32_t j = 0; j < cols; j++)
            out[j] = mg_bf16_to_f32(load_u16(p + 2 * j));
        return;
    }
    if (mg_gguf_k_blocks_to_f32(t->type, p, cols / be, out))
        return;
    for (uint32_t blk = 0; blk < cols / 32; blk++, p += bb) {
        const float d = mg_f16_to_f32(load_u16(p));
        float *o = out + 32 * blk;
        if (t->type == MG_GGUF_Q8_0) {
            for (int j = 0; j < 32; j++)
                o[j] = d * (float)(int8_t)p[2 + j];
        } else if (t->type == MG_GGUF_Q4_0) {
            for (int j = 0; j < 16; j++) {
                o[j] = d * (float)((p[2 + j] & 15) - 8);
                o[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        } else { /* Q4_1 */
            const float m = mg_f16_to_f32(load_u16(p + 2));
            for (int j = 0; j < 16; j++) {
                o[j] = d * (float)(p[4 + j] & 15) + m;
                o[j + 16] = d * (float)(p[4 + j] >> 4) + m;
            }
        }
    }
}

static mg_status upload(mg_backend *b, const void *host, size_t bytes, mg_devptr *out,
                        uint64_t *total, const char *what) {
    mg_status st = mg_alloc(b, bytes, out);
    if (!st && (st = mg_copy_h2d(b, *out, host, bytes))) {
        mg_free(b, *out);
        *out = 0;
    }
    if (st)
        return mg_error_report(st, "uploading %s: %s", what, mg_last_error());
    *total += bytes;
    return MG_OK;
}

/* A whole tensor (rows x cols) converted to BF16 and uploaded; `row_of` maps each output row to
 * its row in the file (NULL: the same). */
static mg_status upload_bf16(mg_backend *b, const mg_gguf_tensor *t, uint64_t rows, uint32_t cols,
                             uint16_t *host, float *scratch, mg_devptr *out, uint64_t *total) {
    for (uint64_t r = 0; r < rows; r++) {
        row_to_f32(t, r, cols, scratch);
        for (uint32_t j = 0; j < cols; j++)
            host[r * cols + j] = mg_f32_to_bf16(scratch[j]);
    }
    return upload(b, host, (size_t)(rows * cols * 2), out, total, t->name);
}

/* The file row of output row r of a Q or K projection: the inverse of llama.cpp's permutation
 * for interleaved RoPE (model_gguf.h), per head of `head_dim` rows. */
static uint64_t unpermuted_row(uint64_t r, uint32_t head_dim) {
    const uint32_t half = head_dim / 2;
    const uint64_t head = r / head_dim, i = r % head_dim;
    return head * head_dim + 2 * (i % half) + i / half;
}

/* Appends `rows` rows of block tensor t (MLX layout) to the host buffers of one MLX layer at
 * row `first`: codes (bits 4 or 8), FP16 scales and biases [rows, cols / 32]. */
static mg_status repack_rows(const mg_gguf_tensor *t, uint32_t rows, uint32_t cols, bool permute,
                             uint32_t head_dim, uint32_t bits, uint32_t first, uint8_t *codes,
                             uint16_t *scales, uint16_t *biases) {
    const uint32_t groups = cols / 32, row_code_bytes = cols * bits / 8;
    uint32_t be, bb;
    mg_gguf_type_block(t->type, &be, &bb);
    for (uint32_t r = 0; r < rows; r++) {
        const uint64_t src_row = permute ? unpermuted_row(r, head_dim) : r;
        const uint8_t *p = t->data + src_row * groups * bb;
        uint8_t *c = codes + (size_t)(first + r) * row_code_bytes;
        uint16_t *sc = scales + (size_t)(first + r) * groups;
        uint16_t *bi = biases + (size_t)(first + r) * groups;
        for (uint32_t g = 0; g < groups; g++, p += bb) {
            const uint16_t dbits = load_u16(p);
            const float d = mg_f16_to_f32(dbits);
            sc[g] = dbits;
            if (t->type == MG_GGUF_Q4_1) {
                bi[g] = load_u16(p + 2);
                for (int j = 0; j < 16; j++) /* MLX: element 2j low nibble, 2j + 1 high */
                    c[g * 16 + j] = 0;
                for (int j = 0; j < 32; j++) {
                    const uint8_t q = j < 16 ? p[4 + j] & 15 : p[4 + j - 16] >> 4;
                    c[g * 16 + j / 2] |= (uint8_t)(q << (4 * (j & 1)));
                }
                continue;
            }
            /* Q4_0 and Q8_0: codes shifted to unsigned, the shift in the bias; exact while the
             * bias fits FP16 */
            const float bias = t->type == MG_GGUF_Q4_0 ? -8.0f * d : -128.0f * d;
            bi[g] = mg_f32_to_f16(bias);
            if (mg_f16_to_f32(bi[g]) != bias)
                return mg_error_report(MG_ERR_UNSUPPORTED,
                                       "GGUF tensor %s: block scale %g has no exact FP16 bias",
                                       t->name, (double)d);
            if (t->type == MG_GGUF_Q4_0) {
                for (int j = 0; j < 16; j++)
                    c[g * 16 + j] = 0;
                for (int j = 0; j < 32; j++) {
                    const uint8_t q = j < 16 ? p[2 + j] & 15 : p[2 + j - 16] >> 4;
                    c[g * 16 + j / 2] |= (uint8_t)(q << (4 * (j & 1)));
                }
            } else {
                for (int j = 0; j < 32; j++)
                    c[g * 32 + j] = (uint8_t)((int)(int8_t)p[2 + j] + 128);
            }
        }
    }
    return MG_OK;
}

/* One MLX layer from one or two block tensors of `rows` rows each (joined in order); part i's
 * rows are un-permuted when bit i of `permute` is set. */
static mg_status mlx_layer(mg_backend *b, const mg_gguf_tensor *const *parts, int count,
                           uint32_t rows, uint32_t cols, unsigned permute, uint32_t head_dim,
                           mg_mlx_linear *out, uint64_t *total) {
    const uint32_t bits = parts[0]->type == MG_GGUF_Q8_0 ? 8 : 4;
    for (int i = 1; i < count; i++)
        if ((parts[i]->type == MG_GGUF_Q8_0) != (bits == 8))
            return mg_error_report(
                MG_ERR_UNSUPPORTED,
                "GGUF tensors %s (%s) and %s (%s) are joined into one matrix and "
                "must share 4 or 8 bits",
                parts[0]->name, mg_gguf_type_name(parts[0]->type), parts[i]->name,
                mg_gguf_type_name(parts[i]->type));
    const uint32_t n = rows * (uint32_t)count, groups = cols / 32;
    const size_t code_bytes = (size_t)n * cols * bits / 8, group_bytes = (size_t)n * groups * 2;
    uint8_t *codes = malloc(code_bytes);
    uint16_t *scales = malloc(group_bytes), *biases = malloc(group_bytes);
    mg_status st = MG_OK;
    if (!codes || !scales || !biases)
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for %s", parts[0]->name);
    for (int i = 0; !st && i < count; i++)
        st = repack_rows(parts[i], rows, cols, (permute >> i) & 1, head_dim, bits,
                         (uint32_t)i * rows, codes, scales, biases);
    *out = (mg_mlx_linear){.experts = 1,
                           .n = n,
                           .k = cols,
                           .bits = bits,
                           .group_size = 32,
                           .scale_type = MG_DTYPE_F16};
    if (!st)
        st = upload(b, codes, code_bytes, &out->weight, total, parts[0]->name);
    if (!st)
        st = upload(b, scales, group_bytes, &out->scales, total, parts[0]->name);
    if (!st)
        st = upload(b, biases, group_bytes, &out->biases, total, parts[0]->name);
    free(codes);
    free(scales);
    free(biases);
    if (st)
        mg_mlx_linear_free(b, out);
    return st;
}

/* One BF16 matrix from one or two float tensors (joined), rows permuted as for mlx_layer. */
static mg_status bf16_matrix(mg_backend *b, const mg_gguf_tensor *const *parts, int count,
                             uint32_t rows, uint32_t cols, unsigned permute, uint32_t head_dim,
                             uint16_t *host, float *scratch, mg_devptr *out, uint64_t *total) {
    for (int i = 0; i < count; i++)
        for (uint32_t r = 0; r < rows; r++) {
            row_to_f32(parts[i], (permute >> i) & 1 ? unpermuted_row(r, head_dim) : r, cols,
                       scratch);
            uint16_t *o = host + ((size_t)i * rows + r) * cols;
            for (uint32_t j = 0; j < cols; j++)
                o[j] = mg_f32_to_bf16(scratch[j]);
        }
    return upload(b, host, (size_t)count * rows * cols * 2, out, total, parts[0]->name);
}

/* Tensors `names` of layer l (rank 1, `n` elements each), joined, as one FP32 (f32) or BF16
 * device buffer. */
static mg_status upload_vectors(mg_backend *b, const mg_gguf *g, uint32_t l,
                                const char *const *names, int count, uint32_t n, bool f32,
                                float *scratch, uint16_t *host, mg_devptr *out, uint64_t *total) {
    float *host32 = (float *)(void *)host;
    char tn[96];
    for (int i = 0; i < count; i++) {
        snprintf(tn, sizeof tn, "blk.%u.%s", l, names[i]);
        row_to_f32(mg_gguf_tensor_find(g, tn), 0, n, scratch); /* checked by mg_fwd_gguf_arch */
        for (uint32_t j = 0; j < n; j++) {
            if (f32)
                host32[(size_t)i * n + j] = scratch[j];
            else
                host[(size_t)i * n + j] = mg_f32_to_bf16(scratch[j]);
        }
    }
    snprintf(tn, sizeof tn, "blk.%u.%s", l, names[0]);
    return upload(b, host, (size_t)count * n * (f32 ? 4 : 2), out, total, tn);
}

mg_status mg_fwd_gguf_load(mg_backend *b, const mg_gguf *g, const mg_fwd_preset *arch,
                           mg_devptr *layer_w, mg_devptr *extra, mg_fwd_checkpoint_weights *out) {
    memset(out, 0, sizeof *out);
    char a[64] = "";
    const struct gguf_arch *ga = arch_of(g, a, sizeof a);
    const unsigned permute = ga && ga->permuted ? 1u : 0u;
    const mg_model_shape *s = &arch->shape;
    const uint32_t H = s->hidden, QD = s->heads * s->head_dim, KD = s->kv_heads * s->head_dim;
    const uint32_t I = s->intermediate, L = arch->layers;
    uint32_t widest = H > QD ? H : QD;
    widest = I > widest ? I : widest;
    size_t largest = (size_t)s->vocab * H;
    const size_t joined = (size_t)2 * (I > KD ? I : KD) * H, attn = (size_t)QD * H;
    largest = joined > largest ? joined : largest;
    largest = attn > largest ? attn : largest;
    uint16_t *host = malloc(largest * 2);
    float *scratch = malloc((size_t)widest * 4);
    mg_mlx_linear *mlx = NULL;
    mg_status st = MG_OK;
    if (!host || !scratch)
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    const mg_gguf_tensor *emb = mg_gguf_tensor_find(g, "token_embd.weight");
    const mg_gguf_tensor *head = mg_gguf_tensor_find(g, "output.weight");
    if (!st)
        st = upload_bf16(b, emb, s->vocab, H, host, scratch, &out->embedding, &out->bytes);
    if (!st)
        st = upload_bf16(b, mg_gguf_tensor_find(g, "output_norm.weight"), 1, H, host, scratch,
                         &out->final_norm, &out->bytes);
    if (!st && head)
        st = upload_bf16(b, head, s->vocab, H, host, scratch, &out->lm_head, &out->bytes);
    else if (!st)
        out->lm_head = out->embedding;
    char tn[96];
    const mg_gguf_tensor *t[T_LAYER_COUNT];
    for (uint32_t l = 0; !st && l < L; l++) {
        for (int i = 0; i < T_LAYER_COUNT; i++) {
            snprintf(tn, sizeof tn, "blk.%u.%s.weight", l, layer_names[i]);
            t[i] = mg_gguf_tensor_find(g, tn); /* present and shaped: mg_fwd_gguf_arch */
        }
        mg_devptr *w = layer_w + (size_t)l * MG_FWD_LAYER_TENSORS;
        st = upload_bf16(b, t[T_ATTN_NORM], 1, H, host, scratch, &w[MG_FWD_ATTN_NORM], &out->bytes);
        if (!st)
            st = upload_bf16(b, t[T_FFN_NORM], 1, H, host, scratch, &w[MG_FWD_MLP_NORM],
                             &out->bytes);
        const mg_gguf_tensor *q[] = {t[T_Q]}, *kv[] = {t[T_K], t[T_V]}, *o[] = {t[T_O]};
        const mg_gguf_tensor *gu[] = {t[T_GATE], t[T_UP]}, *down[] = {t[T_DOWN]};
        const uint32_t D = s->head_dim;
        mg_devptr *x = extra + (size_t)l * MG_FWD_EXTRA_TENSORS;
        if (!st && arch->qkv_bias &&
            !(st = upload_vectors(b, g, l, bias_names, 1, QD, true, scratch, host,
                                  &x[MG_FWD_Q_BIAS], &out->bytes)))
            st = upload_vectors(b, g, l, bias_names + 1, 2, KD, true, scratch, host,
                                &x[MG_FWD_KV_BIAS], &out->bytes);
        if (!st && arch->qk_norm &&
            !(st = upload_vectors(b, g, l, head_norm_names, 1, D, false, scratch, host,
                                  &x[MG_FWD_Q_NORM], &out->bytes)))
            st = upload_vectors(b, g, l, head_norm_names + 1, 1, D, false, scratch, host,
                                &x[MG_FWD_K_NORM], &out->bytes);
        if (st)
            break;
        if (is_block_type(t[T_Q]->type)) {
            if (!mlx && !(mlx = calloc((size_t)L * MX_SLOTS, sizeof *mlx))) {
                st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
                break;
            }
            /* q and k un-permuted (bit 0: the first part), v as stored */
            mg_mlx_linear *x = mlx + (size_t)l * MX_SLOTS;
            if ((st = mlx_layer(b, q, 1, QD, H, permute, D, &x[MX_Q], &out->bytes)) ||
                (st = mlx_layer(b, kv, 2, KD, H, permute, D, &x[MX_KV], &out->bytes)) ||
                (st = mlx_layer(b, o, 1, H, QD, 0, 0, &x[MX_O], &out->bytes)) ||
                (st = mlx_layer(b, gu, 2, I, H, 0, 0, &x[MX_GATE_UP], &out->bytes)) ||
                (st = mlx_layer(b, down, 1, H, I, 0, 0, &x[MX_DOWN], &out->bytes)))
                break;
        } else if ((st = bf16_matrix(b, q, 1, QD, H, permute, D, host, scratch, &w[MG_FWD_WQ],
                                     &out->bytes)) ||
                   (st = bf16_matrix(b, kv, 2, KD, H, permute, D, host, scratch, &w[MG_FWD_WKV],
                                     &out->bytes)) ||
                   (st = bf16_matrix(b, o, 1, H, QD, 0, 0, host, scratch, &w[MG_FWD_WO],
                                     &out->bytes)) ||
                   (st = bf16_matrix(b, gu, 2, I, H, 0, 0, host, scratch, &w[MG_FWD_W_GATE_UP],
                                     &out->bytes)) ||
                   (st = bf16_matrix(b, down, 1, H, I, 0, 0, host, scratch, &w[MG_FWD_W_DOWN],
                                     &out->bytes))) {
            break;
        }
    }
    if (mlx && !st) {
        st = mg_fwd_mlx_adopt(b, s, L, mlx, &out->mlx); /* frees the layers when it fails */
    } else if (mlx) {
        for (size_t i = 0; i < (size_t)L * MX_SLOTS; i++)
            mg_mlx_linear_free(b, &mlx[i]);
    }
    free(mlx);
    free(host);
    free(scratch);
    return st;
}
