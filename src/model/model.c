/* model.c - the decoder stack of model.h over the public ops: weights, arena, KV cache,
 * prefill and decode passes. */
#include "model.h"
#include "model_checkpoint.h"
#include "model_mlx.h"

#include <math.h>
#include <stdarg.h>
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
#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
#include "metrale/status.h"

#define PAGE_SIZE 16u

static _Thread_local char error_text[512];

const char *mg_fwd_error(void) {
    return error_text;
}

__attribute__((format(printf, 2, 3))) static mg_status fail(mg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return st ? st : MG_ERR_INTERNAL;
}

mg_status mg_fwd_fail(mg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return st ? st : MG_ERR_INTERNAL;
}

/* A failed library call: its status, with `what` and the library's message. */
static mg_status lib_fail(mg_status st, const char *what) {
    return fail(st, "%s: %s", what, mg_last_error());
}

/* ------------------------------------------------------------------ presets */

static const mg_fwd_preset presets[] = {
    {.name = "tiny",
     .description = "2 layers, hidden 256, 4 q / 2 kv heads of 128, vocab 1024 (seconds on a CPU)",
     .shape = {.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 128, .intermediate = 512,
               .vocab = 1024},
     .layers = 2, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
     .max_batch_tokens = 4096, .max_batch_size = 64,
     .batch = 4, .prompt_len = 16, .steps = 8},
    {.name = "small",
     .description = "4 layers, hidden 512, 8 q / 2 kv heads of 128, vocab 4096 (under a minute "
                    "on a CPU)",
     .shape = {.hidden = 512, .heads = 8, .kv_heads = 2, .head_dim = 128, .intermediate = 1536,
               .vocab = 4096},
     .layers = 4, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
     .max_batch_tokens = 8192, .max_batch_size = 64,
     .batch = 4, .prompt_len = 32, .steps = 8},
    {.name = "micro",
     .description = "2 layers, hidden 128, 2 q / 1 kv heads of 128, vocab 512 (the committed MLX "
                    "checkpoints' shape)",
     .shape = {.hidden = 128, .heads = 2, .kv_heads = 1, .head_dim = 128, .intermediate = 256,
               .vocab = 512},
     .layers = 2, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
     .max_batch_tokens = 4096, .max_batch_size = 64,
     .batch = 4, .prompt_len = 16, .steps = 8},
    {.name = "llama-3-8b",
     .description = "32 layers of Llama-3-8B's shapes (hidden 4096, 32 q / 8 kv heads, MLP "
                    "14336, vocab 128256)",
     .shape = {.hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128,
               .intermediate = 14336, .vocab = 128256},
     .layers = 32, .rope_theta = 500000.0f, .norm_eps = 1e-5f,
     .max_batch_tokens = 8192, .max_batch_size = 256,
     .batch = 1, .prompt_len = 512, .steps = 64},
    {.name = "qwen3-30b-a3b",
     .description = "48 layers of Qwen3-30B-A3B's shapes (128 experts, top-8; MoE)",
     .shape = {.hidden = 2048, .heads = 32, .kv_heads = 4, .head_dim = 128, .intermediate = 768,
               .experts = 128, .experts_per_token = 8, .vocab = 151936},
     .layers = 48, .rope_theta = 1000000.0f, .norm_eps = 1e-6f,
     .max_batch_tokens = 8192, .max_batch_size = 256,
     .batch = 1, .prompt_len = 512, .steps = 64},
    {.name = "tiny-moe",
     .description = "2 layers, hidden 256, 8 experts of 128, top-2, vocab 1024 (MoE; seconds on "
                    "a CPU)",
     .shape = {.hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 128, .intermediate = 128,
               .experts = 8, .experts_per_token = 2, .vocab = 1024},
     .layers = 2, .rope_theta = 10000.0f, .norm_eps = 1e-6f,
     .max_batch_tokens = 4096, .max_batch_size = 64,
     .batch = 4, .prompt_len = 16, .steps = 8},
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
    return (mg_fwd_config){.preset = p, .batch = p->batch, .prompt_len = p->prompt_len,
                           .steps = p->steps, .seed = 1, .use_graphs = true};
}

uint32_t mg_fwd_prompt_length(const mg_fwd_config *c, uint32_t r) {
    if (c->prompt_ids)
        return c->prompt_ids_count;
    uint32_t l = c->prompt_len;
    uint32_t len = l - l / 4 + (r * 37u) % (l / 2 + 1);
    return len ? len : 1;
}

/* ------------------------------------------------------------------ weights */

const char *mg_fwd_weights_name(mg_fwd_weights w) {
    return w == MG_FWD_WEIGHTS_NVFP4  ? "nvfp4"
           : w == MG_FWD_WEIGHTS_FP8  ? "fp8"
           : w == MG_FWD_WEIGHTS_MLX8 ? "mlx8"
           : w == MG_FWD_WEIGHTS_MLX4 ? "mlx4"
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

static uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void mg_fwd_weight_fill(uint64_t seed, uint32_t id, float offset, float scale, uint64_t first,
                        size_t count, uint16_t *out) {
    for (size_t i = 0; i < count; i++) {
        uint64_t z = splitmix64(key(seed, id, first + i));
        float u = (float)(z >> 40) * 0x1p-23f - 1.0f;
        out[i] = bf16_rne(offset + scale * u);
    }
}

mg_status mg_fwd_tensor_shape(const mg_model_shape *s, uint32_t layers, uint32_t id,
                              uint32_t *rows, uint32_t *cols, float *offset, float *scale) {
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
        case MG_FWD_MLP_NORM: r = 1; c = s->hidden; norm = true; break;
        case MG_FWD_WQ: r = q; c = s->hidden; break;
        case MG_FWD_WKV: r = kv; c = s->hidden; break;
        case MG_FWD_WO: r = s->hidden; c = q; break;
        case MG_FWD_W_GATE_UP: r = groups * 2 * s->intermediate; c = s->hidden; break;
        case MG_FWD_W_DOWN: r = groups * s->hidden; c = s->intermediate; break;
        case MG_FWD_ROUTER: r = s->experts; c = s->hidden; break;
        default: break;
        }
    }
    if (!r)
        return fail(MG_ERR_INVALID_ARGUMENT, "forward model: no tensor %u", id);
    *rows = r;
    *cols = c;
    *offset = norm ? 1.0f : 0.0f;
    *scale = norm ? 0.1f : id == MG_FWD_TENSOR_EMBEDDING ? 1.0f : 1.0f / sqrtf((float)c);
    return MG_OK;
}

/* ------------------------------------------------------------------ the model */

/* The NVFP4 matrices of a layer: w_gate_up becomes two weights (gate rows, up rows). */
enum { FP4_Q, FP4_KV, FP4_O, FP4_GATE, FP4_UP, FP4_DOWN, FP4_SLOTS };

struct mg_fwd {
    mg_backend *b;
    mg_fwd_config c;
    /* a checkpoint's architecture (c.preset points here) and the open checkpoint */
    mg_fwd_checkpoint *ckpt;
    mg_fwd_preset arch;
    char arch_name[128];
    int32_t *prompt; /* the config's prompt ids, copied */
    mg_model_shape sh;
    uint32_t layers;
    mg_devptr embedding, final_norm, lm_head;
    mg_devptr *layer_w; /* [layers][MG_FWD_LAYER_TENSORS]; NVFP4: the matrices' are 0; FP8:
                           the matrices' E4M3 codes (their allocation also holds the scales) */
    /* FP8 only: each matrix's FP32 row scales (inside its allocation, after the codes), the
     * LM head's; the device-quantized activation of the next GEMM(s) and its per-token scales,
     * and which BF16 buffer (of how many rows) they were quantized from. */
    mg_devptr *fp8_scales; /* [layers][MG_FWD_LAYER_TENSORS] */
    /* the logits' row pitch in elements: the vocabulary rounded up to 8, as the argmax ops
     * need a pitch that is a multiple of 4 (FP32) or 8 (BF16) whatever the vocabulary */
    uint32_t logits_pitch;
    mg_devptr lm_head_scales, act_fp8, act_scales, act_fp8_source;
    uint32_t act_fp8_rows;
    uint64_t weight_bytes;
    /* NVFP4 only: prepared weights (each `values` the base of one allocation holding the
     * values then the scales), their global scales (FP32 [layers * FP4_SLOTS + 1] in one
     * allocation, the LM head's last), and the prefill's BF16 expansion workspace (0 when the
     * prompts have fewer than MG_NVFP4_BF16_PATH_MIN_M tokens). */
    mg_nvfp4_weight *fp4; /* [layers][FP4_SLOTS] */
    mg_fwd_mlx *mlx;      /* MLX weights (model_mlx.h), unless dequantized to BF16 at load */
    mg_nvfp4_weight lm_head_fp4;
    mg_devptr fp4_globals, prefill_workspace;
    size_t prefill_workspace_bytes;

    mg_arena *arena;
    mg_devptr residual, proj_out, norm_out, qkv, attn_out, gate_up, mlp_act, logits_hidden,
        logits;
    mg_devptr step_ids, qo_indptr, kv_indptr, kv_indices, last_page_len, logits_indices;
    /* Dense NVFP4 only: silu(gate) * up of the fused gate_up GEMM. Live for the whole run: the
     * arena's plan lets the BF16 path's mlp_act reuse norm_out's memory (norm_out is dead once
     * the gate_up GEMM has read it), but the fused GEMM reads norm_out while it writes. */
    mg_devptr mlp_act_fp4;
    /* MoE only (arena) */
    mg_devptr router_logits, topk_ids, topk_weights, sorted_token_ids, expert_offsets, moe_act,
        moe_down, pair_positions, sort_workspace;
    size_t sort_workspace_bytes;
    uint64_t expert_bytes; /* the experts' weights, every layer */
    mg_devptr moe_gemm_workspace; /* BF16 / FP8 experts: the grouped GEMMs' workspace */
    size_t moe_gemm_workspace_bytes;
    uint32_t tokens_cap, tokens_padded;

    mg_kv_cache_desc kv;
    size_t kv_layer_bytes;
    mg_devptr kv_pool;
    mg_kv_page_allocator *allocator;
    uint32_t pages_per_request;
    int32_t *pages;    /* [batch][pages_per_request], each request's pages in token order */
    uint32_t *kv_len;  /* [batch] tokens cached per request */
    int32_t *h_qo, *h_kv_indptr, *h_kv_indices, *h_last, *h_logits_indices;

    mg_attention_plan *decode_plan;
    mg_graph *graph;
    mg_timing *timing; /* mg_fwd_set_timing; NULL when not attached */
    mg_timing_span open_span; /* the op span begun and not yet ended (OP), 0 when none */
    uint32_t lane_prefill, lane_decode;
    uint32_t decode_calls, graph_steps;
    int32_t *tokens; /* [batch][steps + 1] */
    uint32_t token_count;
    uint64_t prompt_tokens, decode_kv_bytes;
};

static uint32_t ceil_div(uint64_t a, uint32_t b) {
    return (uint32_t)((a + b - 1) / b);
}

/* What a configuration's requests hold, computed once for the memory check and for creation:
 * prompt tokens, KV pages for the prompts and the steps (in all, and the most of one request),
 * and the engine limits the arena is planned for. */
typedef struct batch_extent {
    uint64_t prompt_tokens, pages;
    uint32_t max_pages;
    mg_engine_limits limits;
} batch_extent;

static batch_extent batch_extent_of(const mg_fwd_config *c) {
    batch_extent e = {0};
    uint32_t max_seq = 0;
    for (uint32_t r = 0; r < c->batch; r++) {
        const uint32_t len = mg_fwd_prompt_length(c, r), seq = len + c->steps;
        const uint32_t need = ceil_div(seq, PAGE_SIZE);
        e.prompt_tokens += len;
        e.pages += need;
        e.max_pages = need > e.max_pages ? need : e.max_pages;
        max_seq = seq > max_seq ? seq : max_seq;
    }
    e.limits = (mg_engine_limits){
        .max_batch_tokens =
            (uint32_t)(e.prompt_tokens > c->batch ? e.prompt_tokens : c->batch),
        .max_seq_len = max_seq,
        .kv_block_size = PAGE_SIZE,
        .max_batch_size = c->batch};
    return e;
}

static mg_devptr *layer_tensor(mg_fwd *m, uint32_t layer, uint32_t slot) {
    return &m->layer_w[(size_t)layer * MG_FWD_LAYER_TENSORS + slot];
}

/* fn(ctx, first, count) over a part [first, first + count) of a range. */
typedef mg_status (*range_fn)(void *ctx, size_t first, size_t count);

typedef struct range_job {
    range_fn fn;
    void *ctx;
    size_t first, count;
    mg_status st;
} range_job;

static void *range_thread(void *arg) {
    range_job *j = arg;
    j->st = j->count ? j->fn(j->ctx, j->first, j->count) : MG_OK;
    return NULL;
}

/* Runs fn over [0, total) in parts on up to 16 threads (one when total < serial_below), the
 * calling thread included; the first failing part's status. */
static mg_status parallel_ranges(size_t total, size_t serial_below, range_fn fn, void *ctx) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned threads = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
    if (total < serial_below)
        threads = 1;
    pthread_t tid[16];
    range_job jobs[16];
    size_t per = (total + threads - 1) / threads;
    unsigned started = 0;
    for (unsigned t = 0; t < threads; t++) {
        size_t first = (size_t)t * per < total ? (size_t)t * per : total;
        jobs[t] = (range_job){fn, ctx, first, total - first < per ? total - first : per, MG_OK};
        if (t == 0 || pthread_create(&tid[t], NULL, range_thread, &jobs[t]) != 0)
            continue;
        started |= 1u << t;
    }
    range_thread(&jobs[0]);
    mg_status st = jobs[0].st;
    for (unsigned t = 1; t < threads; t++) {
        if (started & (1u << t))
            pthread_join(tid[t], NULL);
        else
            range_thread(&jobs[t]);
        if (!st)
            st = jobs[t].st;
    }
    return st;
}

typedef struct fill_job {
    uint64_t seed;
    uint32_t id;
    float offset, scale;
    uint16_t *out;
} fill_job;

static mg_status fill_range(void *ctx, size_t first, size_t count) {
    fill_job *j = ctx;
    mg_fwd_weight_fill(j->seed, j->id, j->offset, j->scale, first, count, j->out + first);
    return MG_OK;
}

/* Generates tensor `id` into `host` (over up to 16 threads); its shape in rows x cols. */
static mg_status generate_tensor(mg_fwd *m, uint32_t id, uint16_t *host, uint32_t *rows_out,
                                 uint32_t *cols_out) {
    uint32_t rows, cols;
    float offset, scale;
    mg_status st = mg_fwd_tensor_shape(&m->sh, m->layers, id, &rows, &cols, &offset, &scale);
    if (st)
        return st;
    *rows_out = rows;
    *cols_out = cols;
    fill_job job = {m->c.seed, id, offset, scale, host};
    return parallel_ranges((size_t)rows * cols, 1u << 20, fill_range, &job);
}

/* Generates tensor `id` on the host and uploads it as BF16. */
static mg_status upload_tensor(mg_fwd *m, uint32_t id, uint16_t *host, mg_devptr *out) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    size_t bytes = (size_t)rows * cols * 2;
    if ((st = mg_alloc(m->b, bytes, out)))
        return lib_fail(st, "allocating weights");
    if ((st = mg_copy_h2d(m->b, *out, host, bytes)))
        return lib_fail(st, "uploading weights");
    m->weight_bytes += bytes;
    return MG_OK;
}

typedef struct fp8_job {
    const uint16_t *bf16;
    uint32_t cols;
    uint8_t *codes;
    float *scales;
} fp8_job;

static mg_status fp8_rows(void *ctx, size_t first, size_t count) {
    fp8_job *j = ctx;
    return mg_fp8_quantize_rowwise(j->bf16 + first * j->cols, (uint32_t)count, j->cols,
                                   j->codes + first * j->cols, j->scales + first);
}

/* Tensor `id` generated on the host in BF16, quantized there to E4M3 with one scale per row
 * (mg_fp8_quantize_rowwise; model.h) and uploaded as one allocation: the codes [rows, cols]
 * at *codes_out, then the FP32 scales [rows] at the next 16-byte boundary (*scales_out). */
static mg_status upload_fp8_tensor(mg_fwd *m, uint32_t id, uint16_t *host, mg_devptr *codes_out,
                                   mg_devptr *scales_out) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    size_t codes_bytes = ((size_t)rows * cols + 15) & ~(size_t)15, bytes = codes_bytes + 4ull * rows;
    uint8_t *codes = malloc(bytes);
    if (!codes)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the FP8 weights");
    fp8_job job = {host, cols, codes, (float *)(codes + codes_bytes)};
    if ((st = parallel_ranges(rows, (1u << 20) / cols + 1, fp8_rows, &job)))
        st = fail(st, "quantizing weights to FP8: %s", mg_last_error());
    else if ((st = mg_alloc(m->b, bytes, codes_out)))
        st = lib_fail(st, "allocating FP8 weights");
    else if ((st = mg_copy_h2d(m->b, *codes_out, codes, bytes)))
        st = lib_fail(st, "uploading FP8 weights");
    free(codes);
    if (st)
        return st;
    *scales_out = *codes_out + codes_bytes;
    m->weight_bytes += bytes;
    return MG_OK;
}

/* Device staging for quantizing one tensor at a time: its BF16 copy, codes and scales. */
typedef struct fp4_staging {
    mg_devptr bf16, codes, scales;
} fp4_staging;

/* Global scales per NVFP4 weight: one per expert (1 for a dense weight). */
static size_t global_group(const mg_fwd *m) {
    return m->sh.experts ? m->sh.experts : 1;
}

/* Tensor `id` (a layer matrix or the LM head) generated on the host, uploaded into the staging
 * buffers, quantized with its global scale (model.h), and prepared into `parts` weights (w_gate_up:
 * gate, then up) of `experts` stacked experts each (rows = experts * parts * n: expert e's part
 * p at rows (e * parts + p) * n), whose global scales (global_group(m) of them per part, all the
 * tensor's) are entries global_index.. of m->fp4_globals. Ordered on the default stream, which
 * the next blocking upload into the staging buffers waits for. */
static mg_status quantize_tensor(mg_fwd *m, uint32_t id, uint16_t *host, const fp4_staging *sg,
                                 uint32_t experts, uint32_t parts, mg_nvfp4_weight *out,
                                 size_t global_index) {
    uint32_t rows, cols;
    mg_status st = generate_tensor(m, id, host, &rows, &cols);
    if (st)
        return st;
    size_t group = global_group(m);
    float global = mg_nvfp4_global_scale(host, rows, cols, 0);
    float *globals = malloc(group * sizeof *globals);
    if (!globals)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    for (size_t i = 0; i < group; i++)
        globals[i] = global;
    mg_stream *s0 = mg_stream_default(m->b);
    for (uint32_t p = 0; !st && p < parts; p++)
        st = mg_copy_h2d(m->b, m->fp4_globals + 4 * (global_index + p * group), globals,
                         group * sizeof *globals);
    if (st || (st = mg_copy_h2d(m->b, sg->bf16, host, (size_t)rows * cols * 2)) ||
        (st = mg_nvfp4_quantize(m->b, s0, rows, cols, 0, sg->bf16, m->fp4_globals + 4 * global_index,
                                sg->codes, sg->scales)))
        st = lib_fail(st, "quantizing weights to NVFP4");
    uint32_t n = rows / (experts * parts);
    size_t vb = mg_nvfp4_prepared_value_bytes(n, cols), sb = mg_nvfp4_prepared_scale_bytes(n, cols);
    size_t codes_bytes = mg_nvfp4_packed_bytes(n, cols), scale_bytes = mg_nvfp4_scale_bytes(n, cols);
    for (uint32_t p = 0; !st && p < parts; p++) {
        mg_devptr base, g = m->fp4_globals + 4 * (global_index + p * group);
        if ((st = mg_alloc(m->b, experts * (vb + sb), &base))) {
            st = lib_fail(st, "allocating NVFP4 weights");
            break;
        }
        out[p] = (mg_nvfp4_weight){.values = base, .scales = base + experts * vb, .global_scale = g};
        m->weight_bytes += experts * (vb + sb);
        if (m->sh.experts)
            m->expert_bytes += experts * (vb + sb);
        for (uint32_t e = 0; !st && e < experts; e++) {
            uint64_t block = (uint64_t)e * parts + p;
            if ((st = mg_nvfp4_prepare(m->b, s0, n, cols, 1, sg->codes + block * codes_bytes,
                                       sg->scales + block * scale_bytes, out[p].values + e * vb,
                                       out[p].scales + e * sb)))
                st = lib_fail(st, "preparing NVFP4 weights");
        }
    }
    free(globals);
    return st;
}

/* The layer matrices and the LM head in NVFP4 (model.h): staging sized for the largest, one
 * tensor at a time. */
static mg_status create_nvfp4_matrices(mg_fwd *m, uint16_t *host, size_t largest_matrix) {
    size_t count = (size_t)m->layers * FP4_SLOTS, group = global_group(m);
    uint32_t experts = m->sh.experts ? m->sh.experts : 1;
    m->fp4 = calloc(count, sizeof *m->fp4);
    if (!m->fp4)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    fp4_staging sg = {0};
    mg_status st = mg_alloc(m->b, 4 * (count + 1) * group, &m->fp4_globals);
    if (!st)
        st = mg_alloc(m->b, largest_matrix * 2, &sg.bf16);
    if (!st)
        st = mg_alloc(m->b, largest_matrix / 2, &sg.codes);
    if (!st)
        st = mg_alloc(m->b, largest_matrix / MG_NVFP4_BLOCK, &sg.scales);
    if (st)
        st = lib_fail(st, "allocating the NVFP4 staging buffers");
    static const struct {
        uint32_t slot, fp4, parts;
        bool expert; /* one per expert in a MoE model */
    } matrices[] = {{MG_FWD_WQ, FP4_Q, 1, false},         {MG_FWD_WKV, FP4_KV, 1, false},
                    {MG_FWD_WO, FP4_O, 1, false},         {MG_FWD_W_GATE_UP, FP4_GATE, 2, true},
                    {MG_FWD_W_DOWN, FP4_DOWN, 1, true}};
    for (uint32_t l = 0; !st && l < m->layers; l++)
        for (size_t i = 0; !st && i < sizeof matrices / sizeof matrices[0]; i++) {
            size_t at = (size_t)l * FP4_SLOTS + matrices[i].fp4;
            st = quantize_tensor(m, mg_fwd_layer_tensor(l, matrices[i].slot), host, &sg,
                                 matrices[i].expert ? experts : 1, matrices[i].parts,
                                 m->fp4 + at, at * group);
        }
    if (!st)
        st = quantize_tensor(m, MG_FWD_TENSOR_LM_HEAD, host, &sg, 1, 1, &m->lm_head_fp4,
                             count * group);
    /* the staging buffers are freed only after the queued quantize and prepare calls ran */
    mg_status sync = mg_stream_synchronize(mg_stream_default(m->b));
    if (!st && sync)
        st = lib_fail(sync, "quantizing weights to NVFP4");
    mg_devptr staging[] = {sg.bf16, sg.codes, sg.scales};
    for (size_t i = 0; i < 3; i++)
        if (staging[i])
            mg_free(m->b, staging[i]);
    if (st || m->prompt_tokens < MG_NVFP4_BF16_PATH_MIN_M)
        return st;
    /* The prefill's workspace: the largest BF16 expansion of a dense layer matrix. */
    const mg_model_shape *s = &m->sh;
    uint32_t M = (uint32_t)m->prompt_tokens, H = s->hidden, QD = s->heads * s->head_dim;
    uint32_t shapes[4][2] = {{QD, H}, {2 * s->kv_heads * s->head_dim, H}, {H, QD},
                             {H, s->intermediate}};
    for (size_t i = 0; i < (s->experts ? 3u : 4u); i++) {
        size_t w = mg_nvfp4_gemm_workspace_bytes(M, shapes[i][0], shapes[i][1]);
        m->prefill_workspace_bytes = w > m->prefill_workspace_bytes ? w : m->prefill_workspace_bytes;
    }
    if (m->prefill_workspace_bytes &&
        (st = mg_alloc(m->b, m->prefill_workspace_bytes, &m->prefill_workspace)))
        return lib_fail(st, "allocating the prefill workspace");
    return MG_OK;
}

static bool is_fp4_matrix(uint32_t slot) {
    return slot == MG_FWD_WQ || slot == MG_FWD_WKV || slot == MG_FWD_WO ||
           slot == MG_FWD_W_GATE_UP || slot == MG_FWD_W_DOWN;
}

static mg_status create_weights(mg_fwd *m) {
    const mg_model_shape *s = &m->sh;
    size_t largest = (size_t)s->vocab * s->hidden;
    size_t matrix = (size_t)(s->experts ? s->experts : 1) * 2 * s->intermediate * s->hidden;
    size_t q = (size_t)s->heads * s->head_dim * s->hidden;
    if (q > matrix)
        matrix = q;
    if (matrix > largest)
        largest = matrix;
    bool fp4 = m->c.weights == MG_FWD_WEIGHTS_NVFP4, fp8 = m->c.weights == MG_FWD_WEIGHTS_FP8;
    bool mlx = m->c.weights == MG_FWD_WEIGHTS_MLX8 || m->c.weights == MG_FWD_WEIGHTS_MLX4;
    if (m->ckpt) {
        m->layer_w = calloc((size_t)m->layers * MG_FWD_LAYER_TENSORS, sizeof *m->layer_w);
        if (!m->layer_w)
            return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
        mg_fwd_checkpoint_weights gw;
        mg_status st = mg_fwd_checkpoint_load(m->b, m->ckpt, &m->arch, m->layer_w, &gw);
        m->embedding = gw.embedding; /* what was loaded, freed with the model on failure */
        m->final_norm = gw.final_norm;
        m->lm_head = gw.lm_head;
        m->mlx = gw.mlx;
        m->weight_bytes = gw.bytes;
        return st;
    }
    uint16_t *host = malloc(largest * 2);
    m->layer_w = calloc((size_t)m->layers * MG_FWD_LAYER_TENSORS, sizeof *m->layer_w);
    if (fp8)
        m->fp8_scales = calloc((size_t)m->layers * MG_FWD_LAYER_TENSORS, sizeof *m->fp8_scales);
    if (!host || !m->layer_w || (fp8 && !m->fp8_scales)) {
        free(host);
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the weights");
    }
    mg_status st = upload_tensor(m, MG_FWD_TENSOR_EMBEDDING, host, &m->embedding);
    if (!st)
        st = upload_tensor(m, MG_FWD_TENSOR_FINAL_NORM, host, &m->final_norm);
    if (!st && fp8)
        st = upload_fp8_tensor(m, MG_FWD_TENSOR_LM_HEAD, host, &m->lm_head, &m->lm_head_scales);
    else if (!st && !fp4)
        st = upload_tensor(m, MG_FWD_TENSOR_LM_HEAD, host, &m->lm_head);
    for (uint32_t l = 0; !st && l < m->layers; l++)
        for (uint32_t slot = 0; !st && slot < MG_FWD_LAYER_TENSORS; slot++) {
            uint32_t id = mg_fwd_layer_tensor(l, slot);
            /* the experts' BF16 or FP8 matrices count as expert bytes (the NVFP4 ones are
             * counted where they are quantized) */
            bool expert_matrix = s->experts && (slot == MG_FWD_W_GATE_UP || slot == MG_FWD_W_DOWN);
            uint64_t before = m->weight_bytes;
            if (fp8 && is_fp4_matrix(slot)) /* the same matrices as NVFP4's */
                st = upload_fp8_tensor(m, id, host, layer_tensor(m, l, slot),
                                       &m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS + slot]);
            else if ((!(fp4 || mlx) || !is_fp4_matrix(slot)) && (slot != MG_FWD_ROUTER || s->experts))
                st = upload_tensor(m, id, host, layer_tensor(m, l, slot));
            if (expert_matrix && !fp4)
                m->expert_bytes += m->weight_bytes - before;
        }
    if (!st && fp4)
        st = create_nvfp4_matrices(m, host, largest);
    if (!st && mlx)
        st = mg_fwd_mlx_attach(m->b, &m->c, m->layer_w, &m->mlx, &m->weight_bytes);
    free(host);
    return st;
}

/* The arena: the library's plan for the model's shape and this run's limits, plus the
 * run's own always-live buffers (ids, page table, logits row indices). */
/* The BF16 / FP8 experts' grouped GEMMs (metrale/ops_moe_gemm.h) of a pass of up to
 * `expert_rows` routed rows: gate_up (fused SiLU-mul) and down share one workspace, sized for
 * the larger. */
static mg_moe_gemm_desc moe_gemm_desc(const mg_fwd *m, bool gate_up, uint32_t tokens) {
    uint32_t K = m->sh.experts_per_token;
    return (mg_moe_gemm_desc){
        .kind = m->c.weights == MG_FWD_WEIGHTS_FP8 ? MG_MOE_GEMM_FP8_ROWWISE : MG_MOE_GEMM_BF16,
        .experts = m->sh.experts,
        .rows = tokens * K,
        .act_rows = gate_up ? tokens : tokens * K,
        .n = gate_up ? m->sh.intermediate : m->sh.hidden,
        .k = gate_up ? m->sh.hidden : m->sh.intermediate,
        .gate_up = gate_up};
}

static mg_status moe_gemm_workspace(mg_fwd *m, uint64_t expert_rows, mg_arena_plan *plan) {
    uint32_t tokens = (uint32_t)(expert_rows / m->sh.experts_per_token);
    size_t need = 256;
    for (int gate_up = 0; gate_up < 2; gate_up++) {
        mg_moe_gemm_desc d = moe_gemm_desc(m, gate_up, tokens);
        size_t bytes = 0;
        mg_status st = mg_moe_gemm_workspace_bytes(m->b, &d, &bytes);
        if (st)
            return lib_fail(st, "sizing the experts' GEMM workspace");
        need = bytes > need ? bytes : need;
    }
    m->moe_gemm_workspace_bytes = need;
    mg_status st = mg_arena_plan_add(plan, "moe_gemm_workspace", need, 0, NULL, NULL);
    return st ? lib_fail(st, "creating the arena") : MG_OK;
}

static mg_status create_arena(mg_fwd *m, const batch_extent *e) {
    const uint32_t num_pages = (uint32_t)e->pages;
    m->tokens_cap = e->limits.max_batch_tokens;
    const mg_engine_limits limits = e->limits;
    mg_model_shape dense = m->sh;
    mg_arena_plan *plan = NULL;
    mg_model_rows rows;
    mg_status st = mg_model_rows_compute(&dense, &limits, &rows);
    if (st || (st = mg_arena_plan_for_model(&dense, &limits, &plan)))
        return lib_fail(st, "planning the arena");
    m->tokens_padded = (uint32_t)rows.tokens_padded;
    uint64_t b1 = 4ull * (m->c.batch + 1);
    if ((st = mg_arena_plan_add(plan, "step_ids", 4ull * m->tokens_cap, 0, NULL, NULL)) ||
        (st = mg_arena_plan_add(plan, "page_qo_indptr", b1, 0, NULL, NULL)) ||
        (st = mg_arena_plan_add(plan, "page_kv_indptr", b1, 0, NULL, NULL)) ||
        (st = mg_arena_plan_add(plan, "page_kv_indices", 4ull * num_pages, 0, NULL, NULL)) ||
        (st = mg_arena_plan_add(plan, "page_last_len", 4ull * m->c.batch, 0, NULL, NULL)) ||
        (st = mg_arena_plan_add(plan, "last_token_rows", 4ull * m->c.batch, 0, NULL, NULL))) {
        mg_arena_plan_destroy(plan);
        return lib_fail(st, "creating the arena");
    }
    uint32_t E = m->sh.experts, K = m->sh.experts_per_token;
    bool dense_fp4 = m->c.weights == MG_FWD_WEIGHTS_NVFP4 && !E;
    if (dense_fp4 && (st = mg_arena_plan_add(plan, "mlp_act_fp4",
                                             2ull * m->tokens_cap * m->sh.intermediate, 0, NULL,
                                             NULL))) {
        mg_arena_plan_destroy(plan);
        return lib_fail(st, "creating the arena");
    }
    /* FP8: the quantized input of the next GEMM (the widest of hidden, q heads, intermediate)
     * and its per-token scales, live throughout (each is rewritten before every GEMM group). */
    bool fp8 = m->c.weights == MG_FWD_WEIGHTS_FP8;
    uint32_t widest = m->sh.hidden, qd = m->sh.heads * m->sh.head_dim;
    widest = qd > widest ? qd : widest;
    widest = m->sh.intermediate > widest ? m->sh.intermediate : widest;
    if (fp8 && ((st = mg_arena_plan_add(plan, "fp8_act", (uint64_t)m->tokens_cap * widest, 0,
                                        NULL, NULL)) ||
                (st = mg_arena_plan_add(plan, "fp8_act_scales", 4ull * m->tokens_cap, 0, NULL,
                                        NULL)))) {
        mg_arena_plan_destroy(plan);
        return lib_fail(st, "creating the arena");
    }
    if (E) {
        mg_moe_sort_desc sd = {.tokens = m->tokens_cap, .experts = E, .k = K};
        m->sort_workspace_bytes = mg_moe_sort_workspace_bytes(&sd);
        /* The fused expert gate_up reads norm_out, which the plan lets die at the permute step
         * (a gather this model skips): its output gets a buffer of its own, live throughout. */
        if ((st = mg_arena_plan_add(plan, "moe_pair_positions", 4ull * m->tokens_cap * K, 0, NULL,
                                    NULL)) ||
            (st = mg_arena_plan_add(plan, "moe_expert_act",
                                    2ull * rows.expert_rows * m->sh.intermediate, 0, NULL, NULL)) ||
            (st = mg_arena_plan_add(plan, "moe_sort_workspace", m->sort_workspace_bytes, 0, NULL,
                                    NULL))) {
            mg_arena_plan_destroy(plan);
            return lib_fail(st, "creating the arena");
        }
        if (!m->fp4 && (st = moe_gemm_workspace(m, rows.expert_rows, plan))) {
            mg_arena_plan_destroy(plan);
            return st;
        }
    }
    if ((st = mg_arena_create(m->b, plan, &m->arena))) {
        mg_arena_plan_destroy(plan);
        return lib_fail(st, "creating the arena");
    }
    mg_arena_plan_destroy(plan);
    /* the first 13 in every model; then the dense MLP's two, or the MoE's nine */
    static const char *const names[] = {
        "residual", "proj_out", "norm_out", "qkv", "attn_out", "logits_hidden", "logits",
        "step_ids", "page_qo_indptr", "page_kv_indptr", "page_kv_indices", "page_last_len",
        "last_token_rows", "gate_up", "mlp_act", "router_logits", "topk_ids", "topk_weights",
        "sorted_token_ids", "expert_offsets", "moe_expert_act", "moe_down", "moe_pair_positions",
        "moe_sort_workspace"};
    mg_devptr *ptrs[] = {&m->residual, &m->proj_out, &m->norm_out, &m->qkv, &m->attn_out,
                         &m->logits_hidden, &m->logits, &m->step_ids, &m->qo_indptr,
                         &m->kv_indptr, &m->kv_indices, &m->last_page_len, &m->logits_indices,
                         &m->gate_up, &m->mlp_act, &m->router_logits, &m->topk_ids,
                         &m->topk_weights, &m->sorted_token_ids, &m->expert_offsets, &m->moe_act,
                         &m->moe_down, &m->pair_positions, &m->sort_workspace};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        bool moe_only = i >= 15, dense_only = i == 13 || i == 14;
        if ((E && dense_only) || (!E && moe_only))
            continue;
        if ((st = mg_arena_find(m->arena, names[i], ptrs[i], NULL)))
            return lib_fail(st, "arena buffer");
    }
    m->logits_pitch = (m->sh.vocab + 7) / 8 * 8;
    size_t logits_bytes = 0;
    if ((st = mg_arena_find(m->arena, "logits", &m->logits, &logits_bytes)))
        return lib_fail(st, "arena buffer");
    if ((uint64_t)m->c.batch * m->logits_pitch * 4 > logits_bytes)
        return fail(MG_ERR_UNSUPPORTED,
                    "a vocabulary of %u tokens at batch %u: the planned logits (%zu bytes) do not "
                    "hold %u rows of %u",
                    m->sh.vocab, m->c.batch, logits_bytes, m->c.batch, m->logits_pitch);
    if (dense_fp4 && (st = mg_arena_find(m->arena, "mlp_act_fp4", &m->mlp_act_fp4, NULL)))
        return lib_fail(st, "arena buffer");
    if (fp8 && ((st = mg_arena_find(m->arena, "fp8_act", &m->act_fp8, NULL)) ||
                (st = mg_arena_find(m->arena, "fp8_act_scales", &m->act_scales, NULL))))
        return lib_fail(st, "arena buffer");
    if (E && !m->fp4 &&
        (st = mg_arena_find(m->arena, "moe_gemm_workspace", &m->moe_gemm_workspace, NULL)))
        return lib_fail(st, "arena buffer");
    return MG_OK;
}

static mg_status create_kv_cache(mg_fwd *m, uint32_t num_pages) {
    m->kv = (mg_kv_cache_desc){.num_kv_heads = m->sh.kv_heads, .head_dim = m->sh.head_dim,
                               .page_size = PAGE_SIZE, .num_pages = num_pages};
    mg_status st = mg_kv_cache_bytes(&m->kv, &m->kv_layer_bytes);
    if (st)
        return lib_fail(st, "sizing the KV cache");
    if ((st = mg_alloc(m->b, m->kv_layer_bytes * m->layers, &m->kv_pool)))
        return lib_fail(st, "allocating the KV cache");
    if ((st = mg_kv_page_allocator_create(num_pages, &m->allocator)))
        return lib_fail(st, "creating the page allocator");
    m->pages = calloc((size_t)m->c.batch * m->pages_per_request, sizeof *m->pages);
    if (!m->pages)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the page table");
    for (uint32_t r = 0; r < m->c.batch; r++) {
        uint32_t need = ceil_div(mg_fwd_prompt_length(&m->c, r) + m->c.steps, PAGE_SIZE);
        if ((st = mg_kv_page_alloc(m->allocator, need, m->pages + (size_t)r * m->pages_per_request)))
            return lib_fail(st, "allocating KV pages");
    }
    return MG_OK;
}

/* The device bytes of the preset's weights in format `w`, from the tensor shapes: BF16 2 bytes
 * per element, FP8 1 (+ a row scale), NVFP4 and MLX about what their packing takes. An
 * estimate for refusing a model that cannot fit, not the allocation itself. */
static double weight_bytes_estimate(const mg_fwd_preset *p, mg_fwd_weights w) {
    double per_element = w == MG_FWD_WEIGHTS_FP8     ? 1.0
                         : w == MG_FWD_WEIGHTS_NVFP4 ? 0.5625
                         : w == MG_FWD_WEIGHTS_MLX8  ? 1.0625
                         : w == MG_FWD_WEIGHTS_MLX4  ? 0.5625
                                                     : 2.0;
    double total = 2.0 * p->shape.vocab * p->shape.hidden; /* the BF16 embedding table */
    for (uint32_t l = 0; l < p->layers; l++)
        for (uint32_t slot = 0; slot < MG_FWD_LAYER_TENSORS; slot++) {
            uint32_t rows = 0, cols = 0;
            float offset, scale;
            if ((slot == MG_FWD_ROUTER && !p->shape.experts) ||
                mg_fwd_tensor_shape(&p->shape, p->layers, mg_fwd_layer_tensor(l, slot), &rows,
                                    &cols, &offset, &scale))
                continue;
            total += (double)rows * cols * (is_fp4_matrix(slot) ? per_element : 2.0);
            if (w == MG_FWD_WEIGHTS_FP8 && is_fp4_matrix(slot))
                total += 4.0 * rows; /* the FP32 row scales */
        }
    total += w == MG_FWD_WEIGHTS_FP8 ? 4.0 * p->shape.vocab : 0.0;
    return total + (double)p->shape.vocab * p->shape.hidden * per_element; /* LM head */
}

/* The device bytes beyond the weights: the KV pool (every layer's pages for the prompts and the
 * steps) and the arena of the model's intermediates as mg_arena_plan_for_model plans it (the
 * forward pass adds a few small buffers to it: page tables, step ids, FP8 staging). */
static mg_status state_bytes_estimate(const mg_fwd_config *c, double *bytes) {
    const mg_fwd_preset *p = c->preset;
    const batch_extent e = batch_extent_of(c);
    const uint64_t pages = e.pages;
    if (pages >= (1u << 31))
        return fail(MG_ERR_INVALID_ARGUMENT, "the prompts and steps need %llu KV pages, too many",
                    (unsigned long long)pages);
    const mg_kv_cache_desc kv = {.num_kv_heads = p->shape.kv_heads,
                                 .head_dim = p->shape.head_dim,
                                 .page_size = PAGE_SIZE,
                                 .num_pages = (uint32_t)pages};
    size_t kv_layer_bytes = 0;
    mg_status st = mg_kv_cache_bytes(&kv, &kv_layer_bytes);
    if (st)
        return lib_fail(st, "sizing the KV cache");
    mg_arena_plan *plan = NULL;
    mg_arena_summary summary = {0};
    if (!(st = mg_arena_plan_for_model(&p->shape, &e.limits, &plan)) &&
        !(st = mg_arena_plan_pack(plan)))
        st = mg_arena_plan_summary(plan, &summary);
    mg_arena_plan_destroy(plan);
    if (st)
        return lib_fail(st, "planning the arena");
    *bytes = (double)kv_layer_bytes * p->layers + (double)summary.device_bytes;
    return MG_OK;
}

static mg_status check_config(mg_backend *b, const mg_fwd_config *c,
                              const mg_fwd_checkpoint *ckpt) {
    const mg_fwd_preset *p = c->preset;
    if (!p)
        return fail(MG_ERR_INVALID_ARGUMENT, "no preset");
    if (p->shape.experts && c->weights != MG_FWD_WEIGHTS_NVFP4 &&
        (!mg_op_supported(b, MG_OP_MOE_GEMM) || !mg_op_supported(b, MG_OP_MOE_ROUTING)))
        return fail(MG_ERR_UNSUPPORTED,
                    "preset %s is a mixture of experts: %s experts need the ops moe_gemm and "
                    "moe_routing, which the %s backend cannot run (run it with NVFP4 weights)",
                    p->name, mg_fwd_weights_name(c->weights),
                    mg_backend_kind_name(mg_backend_get_kind(b)));
    if (!c->batch || c->batch > p->max_batch_size)
        return fail(MG_ERR_INVALID_ARGUMENT, "--batch %u: preset %s's arena holds 1..%u requests",
                    c->batch, p->name, p->max_batch_size);
    if (!c->prompt_ids && !c->prompt_len)
        return fail(MG_ERR_INVALID_ARGUMENT, "--prompt-len must be at least 1");
    uint64_t total = 0;
    for (uint32_t r = 0; r < c->batch; r++)
        total += mg_fwd_prompt_length(c, r);
    if (total > p->max_batch_tokens)
        return fail(MG_ERR_INVALID_ARGUMENT,
                    "the prompts hold %llu tokens: preset %s's arena holds at most %u per pass",
                    (unsigned long long)total, p->name, p->max_batch_tokens);
    if (c->steps > 1u << 20 || c->prompt_len > 1u << 20)
        return fail(MG_ERR_INVALID_ARGUMENT, "--steps / --prompt-len above 2^20");
    for (uint32_t r = 0; p->context && r < c->batch; r++) {
        const uint64_t seq = (uint64_t)mg_fwd_prompt_length(c, r) + c->steps;
        if (seq > p->context)
            return fail(MG_ERR_INVALID_ARGUMENT,
                        "request %u: %u prompt tokens and %u steps make %llu, past the context "
                        "of %s (%u tokens); nothing is truncated",
                        r, mg_fwd_prompt_length(c, r), c->steps, (unsigned long long)seq,
                        p->name, p->context);
    }
    static const mg_op needed[] = {MG_OP_GEMM_BF16, MG_OP_GATHER_ROWS, MG_OP_RMSNORM,
                                   MG_OP_ARGMAX, MG_OP_SILU_MUL, MG_OP_KV_APPEND,
                                   MG_OP_ATTENTION_PAGED};
    static const mg_op needed_nvfp4[] = {MG_OP_NVFP4_FORMAT, MG_OP_NVFP4_GEMM, MG_OP_MOE_ROUTING,
                                         MG_OP_NVFP4_MOE_GEMM};
    static const mg_op needed_fp8[] = {MG_OP_GEMM_FP8, MG_OP_FP8_QUANTIZE};
    bool fp4 = c->weights == MG_FWD_WEIGHTS_NVFP4, fp8 = c->weights == MG_FWD_WEIGHTS_FP8;
    if (c->prompt_ids) {
        if (!c->prompt_ids_count)
            return fail(MG_ERR_INVALID_ARGUMENT, "an empty prompt: give at least one token");
        for (uint32_t i = 0; i < c->prompt_ids_count; i++)
            if (c->prompt_ids[i] < 0 || (uint32_t)c->prompt_ids[i] >= p->shape.vocab)
                return fail(MG_ERR_INVALID_ARGUMENT,
                            "prompt token %u is id %d, outside the vocabulary of %u", i,
                            c->prompt_ids[i], p->shape.vocab);
    }
    if (c->weights == MG_FWD_WEIGHTS_CHECKPOINT) {
        if (!mg_op_supported(b, MG_OP_MLX_QUANT))
            return fail(MG_ERR_UNSUPPORTED, "the %s backend cannot run op %s",
                        mg_backend_kind_name(mg_backend_get_kind(b)), mg_op_name(MG_OP_MLX_QUANT));
    } else if (c->weights == MG_FWD_WEIGHTS_MLX8 || c->weights == MG_FWD_WEIGHTS_MLX4) {
        mg_status st = mg_fwd_mlx_check_config(b, c);
        if (st)
            return st;
    } else if (c->weights != MG_FWD_WEIGHTS_BF16 && !fp4 && !fp8)
        return fail(MG_ERR_INVALID_ARGUMENT, "unknown weight format %d", (int)c->weights);
    size_t extra = fp8 ? 2 : !fp4 ? 0 : p->shape.experts ? 4 : 2;
    for (size_t i = 0; i < sizeof needed / sizeof needed[0] + extra; i++) {
        mg_op op = i < sizeof needed / sizeof needed[0] ? needed[i]
                   : fp8 ? needed_fp8[i - sizeof needed / sizeof needed[0]]
                         : needed_nvfp4[i - sizeof needed / sizeof needed[0]];
        if (!mg_op_supported(b, op))
            return fail(MG_ERR_UNSUPPORTED, "the %s backend cannot run op %s",
                        mg_backend_kind_name(mg_backend_get_kind(b)), mg_op_name(op));
    }
    uint64_t free_bytes = 0, total_bytes = 0;
    const double weights = ckpt ? mg_fwd_checkpoint_weight_bytes(ckpt, p)
                                : weight_bytes_estimate(p, c->weights);
    double state = 0.0;
    mg_status st = state_bytes_estimate(c, &state);
    if (st)
        return st;
    if (!mg_memory_free_bytes(b, &free_bytes, &total_bytes) && weights + state > (double)free_bytes)
        return fail(MG_ERR_OUT_OF_MEMORY,
                    "preset %s with %s weights needs about %.1f GB (%.1f GB of weights, %.1f GB of "
                    "KV cache and activations); the %s backend has %.1f GB free",
                    p->name, mg_fwd_weights_name(c->weights), (weights + state) / 1e9,
                    weights / 1e9, state / 1e9, mg_backend_kind_name(mg_backend_get_kind(b)),
                    free_bytes / 1e9);
    return MG_OK;
}

mg_status mg_fwd_create(mg_backend *b, const mg_fwd_config *c, mg_fwd **out) {
    *out = NULL;
    error_text[0] = '\0';
    mg_fwd *m = calloc(1, sizeof *m);
    if (!m)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    m->b = b;
    m->c = *c;
    mg_status st = MG_OK;
    if (c->model_path) {
        if ((st = mg_fwd_checkpoint_open(c->model_path, &m->arch, m->arch_name,
                                         sizeof m->arch_name, &m->ckpt))) {
            mg_fwd_destroy(m);
            return st;
        }
        m->c.preset = &m->arch;
        m->c.weights = MG_FWD_WEIGHTS_CHECKPOINT;
        m->c.checkpoint = NULL;
        m->c.mlx_dequantized = false;
    }
    if (c->prompt_ids && c->prompt_ids_count) {
        if (!(m->prompt = malloc(c->prompt_ids_count * sizeof *m->prompt))) {
            mg_fwd_destroy(m);
            return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory");
        }
        memcpy(m->prompt, c->prompt_ids, c->prompt_ids_count * sizeof *m->prompt);
        m->c.prompt_ids = m->prompt;
    }
    if ((st = check_config(b, &m->c, m->ckpt))) {
        mg_fwd_destroy(m);
        return st;
    }
    c = &m->c;
    m->sh = c->preset->shape;
    m->layers = c->preset->layers;
    const uint32_t B = c->batch;
    const batch_extent extent = batch_extent_of(c); /* pages < 2^31: check_config */
    const uint32_t num_pages = (uint32_t)extent.pages;
    m->prompt_tokens = extent.prompt_tokens;
    m->pages_per_request = extent.max_pages;
    m->kv_len = calloc(B, sizeof *m->kv_len);
    m->h_qo = calloc(B + 1, sizeof(int32_t));
    m->h_kv_indptr = calloc(B + 1, sizeof(int32_t));
    m->h_kv_indices = calloc(num_pages, sizeof(int32_t));
    m->h_last = calloc(B, sizeof(int32_t));
    m->h_logits_indices = calloc(B, sizeof(int32_t));
    m->tokens = calloc((size_t)B * (c->steps + 1), sizeof(int32_t));
    if (!m->kv_len || !m->h_qo || !m->h_kv_indptr || !m->h_kv_indices || !m->h_last ||
        !m->h_logits_indices || !m->tokens)
        st = fail(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    if (!st)
        st = create_weights(m);
    if (!st)
        st = create_arena(m, &extent);
    if (!st)
        st = create_kv_cache(m, num_pages);
    if (st) {
        mg_fwd_destroy(m);
        return st;
    }
    *out = m;
    return MG_OK;
}

const mg_fwd_preset *mg_fwd_get_preset(const mg_fwd *m, mg_fwd_weights *weights) {
    if (weights)
        *weights = m->c.weights;
    return m->c.preset;
}

void mg_fwd_destroy(mg_fwd *m) {
    if (!m)
        return;
    if (m->graph)
        mg_graph_destroy(m->graph);
    mg_attention_plan_destroy(m->decode_plan);
    mg_kv_page_allocator_destroy(m->allocator);
    if (m->kv_pool)
        mg_free(m->b, m->kv_pool);
    mg_arena_destroy(m->arena);
    mg_fwd_mlx_destroy(m->mlx);
    for (size_t i = 0; m->layer_w && i < (size_t)m->layers * MG_FWD_LAYER_TENSORS; i++)
        if (m->layer_w[i])
            mg_free(m->b, m->layer_w[i]);
    /* a tied LM head is the embedding itself */
    mg_devptr top[] = {m->embedding, m->final_norm, m->lm_head != m->embedding ? m->lm_head : 0};
    for (size_t i = 0; i < 3; i++)
        if (top[i])
            mg_free(m->b, top[i]);
    for (size_t i = 0; m->fp4 && i < (size_t)m->layers * FP4_SLOTS; i++)
        if (m->fp4[i].values)
            mg_free(m->b, m->fp4[i].values);
    if (m->lm_head_fp4.values)
        mg_free(m->b, m->lm_head_fp4.values);
    if (m->fp4_globals)
        mg_free(m->b, m->fp4_globals);
    if (m->prefill_workspace)
        mg_free(m->b, m->prefill_workspace);
    free(m->fp4);
    free(m->fp8_scales);
    free(m->layer_w);
    free(m->pages);
    free(m->kv_len);
    free(m->h_qo);
    free(m->h_kv_indptr);
    free(m->h_kv_indices);
    free(m->h_last);
    free(m->h_logits_indices);
    free(m->tokens);
    free(m->prompt);
    mg_fwd_checkpoint_close(m->ckpt);
    free(m);
}

/* Builds the host page table for kv_len[] and `qo[r]` new tokens per request, validates it,
 * and uploads it with the rows of each request's last token. */
static mg_status upload_tables(mg_fwd *m, const uint32_t *qo, mg_kv_page_table *t) {
    uint32_t B = m->c.batch;
    m->h_qo[0] = m->h_kv_indptr[0] = 0;
    m->decode_kv_bytes = 0;
    for (uint32_t r = 0; r < B; r++) {
        uint32_t pages = ceil_div(m->kv_len[r], PAGE_SIZE);
        m->h_qo[r + 1] = m->h_qo[r] + (int32_t)qo[r];
        m->h_kv_indptr[r + 1] = m->h_kv_indptr[r] + (int32_t)pages;
        memcpy(m->h_kv_indices + m->h_kv_indptr[r], m->pages + (size_t)r * m->pages_per_request,
               pages * sizeof(int32_t));
        m->h_last[r] = (int32_t)(m->kv_len[r] - (pages - 1) * PAGE_SIZE);
        m->h_logits_indices[r] = m->h_qo[r + 1] - 1;
        m->decode_kv_bytes += 2ull * m->kv_len[r] * m->sh.kv_heads * m->sh.head_dim * 2;
    }
    m->decode_kv_bytes *= m->layers;
    *t = (mg_kv_page_table){.batch_size = B, .qo_indptr = m->h_qo, .kv_indptr = m->h_kv_indptr,
                            .kv_indices = m->h_kv_indices, .kv_last_page_len = m->h_last};
    mg_status st = mg_kv_page_table_check(&m->kv, t, "forward model");
    size_t b1 = (B + 1) * sizeof(int32_t), bb = B * sizeof(int32_t);
    if (st || (st = mg_copy_h2d(m->b, m->qo_indptr, m->h_qo, b1)) ||
        (st = mg_copy_h2d(m->b, m->kv_indptr, m->h_kv_indptr, b1)) ||
        (st = mg_copy_h2d(m->b, m->kv_indices, m->h_kv_indices,
                          (size_t)m->h_kv_indptr[B] * sizeof(int32_t))) ||
        (st = mg_copy_h2d(m->b, m->last_page_len, m->h_last, bb)) ||
        (st = mg_copy_h2d(m->b, m->logits_indices, m->h_logits_indices, bb)))
        return lib_fail(st, "uploading the page table");
    return MG_OK;
}

static mg_paged_attention_desc attention_desc(const mg_fwd *m) {
    return (mg_paged_attention_desc){.num_qo_heads = m->sh.heads,
                                     .num_kv_heads = m->sh.kv_heads,
                                     .head_dim = m->sh.head_dim,
                                     .page_size = PAGE_SIZE,
                                     .window_left = -1,
                                     .sm_scale = 1.0f / sqrtf((float)m->sh.head_dim)};
}

#define TRY(call, what)                                                                            \
    do {                                                                                           \
        mg_status st_ = (call);                                                                    \
        if (st_)                                                                                   \
            return lib_fail(st_, what);                                                            \
    } while (0)

/* A span named `op` (model.h's names) around the statements that follow, when a timing object
 * is attached (mg_fwd_set_timing); nothing otherwise. Needs `m` and the stream `s` in scope.
 * The span is kept in m->open_span while the statements run, so that a failing statement's
 * early return leaves it for timed_forward to close. */
#define OP(op, ...)                                                                                \
    do {                                                                                           \
        if (m->timing)                                                                             \
            TRY(mg_timing_kernel_begin(m->timing, op, s, &m->open_span), "timing span");           \
        __VA_ARGS__;                                                                               \
        const mg_timing_span span_ = m->open_span;                                                 \
        m->open_span = 0;                                                                          \
        TRY(span_ ? mg_timing_span_end(m->timing, span_, s) : MG_OK, "timing span");             \
    } while (0)

/* FP8 weights: quantizes act[rows, k] (BF16) per token into act_fp8 and act_scales, the input
 * of the next GEMM(s) (model.h). */
static mg_status quantize_act(mg_fwd *m, mg_stream *s, uint32_t rows, uint32_t k, mg_devptr act) {
    mg_fp8_quant_desc d = {.mode = MG_FP8_QUANT_ROW, .rows = rows, .cols = k};
    m->act_fp8_source = act;
    m->act_fp8_rows = rows;
    return mg_fp8_quantize(m->b, s, &d, act, m->act_fp8, m->act_scales);
}

/* out[rows, n] = act[rows, k] times layer l's matrix (BF16 or FP8 `slot`, or NVFP4
 * `fp4_slot`). FP8: act must have been quantized by quantize_act just before. The prefill's
 * NVFP4 GEMMs expand the weight to BF16 in the workspace (mg_nvfp4_gemm_with_workspace);
 * decode steps decode it in the GEMM tiles. */
static mg_status linear(mg_fwd *m, mg_stream *s, bool prefill, uint32_t l, uint32_t slot,
                        uint32_t fp4_slot, uint32_t rows, uint32_t n, uint32_t k, mg_devptr act,
                        mg_devptr out) {
    if (m->mlx)
        return mg_fwd_mlx_linear(m->mlx, s, l, slot, rows, act, out);
    if (m->fp8_scales) {
        if (m->act_fp8_source != act || m->act_fp8_rows != rows)
            return fail(MG_ERR_INTERNAL, "forward model: FP8 GEMM input not quantized");
        return mg_gemm_fp8_rowwise(m->b, s, rows, n, k, m->act_fp8, m->act_scales,
                                   *layer_tensor(m, l, slot),
                                   m->fp8_scales[(size_t)l * MG_FWD_LAYER_TENSORS + slot], out, n);
    }
    if (!m->fp4)
        return mg_gemm_bf16(m->b, s, rows, n, k, act, *layer_tensor(m, l, slot), out,
                            MG_DTYPE_BF16, n);
    const mg_nvfp4_weight *w = &m->fp4[(size_t)l * FP4_SLOTS + fp4_slot];
    if (prefill && m->prefill_workspace)
        return mg_nvfp4_gemm_with_workspace(m->b, s, rows, n, k, act, k, w, out, n,
                                            m->prefill_workspace, m->prefill_workspace_bytes);
    return mg_nvfp4_gemm(m->b, s, rows, n, k, act, k, w, out, n);
}

/* The MoE MLP of layer l over norm_out[rows] into proj_out (model.h): router, top-k, sort, the
 * grouped NVFP4 GEMMs (gate_up fused with SiLU, then down), the weighted combine. */
static mg_status moe_mlp(mg_fwd *m, mg_stream *s, uint32_t l, uint32_t rows) {
    mg_backend *b = m->b;
    const mg_model_shape *sh = &m->sh;
    uint32_t E = sh->experts, K = sh->experts_per_token, H = sh->hidden, I = sh->intermediate;
    OP("moe_router", TRY(mg_gemm_bf16(b, s, rows, E, H, m->norm_out,
                                      *layer_tensor(m, l, MG_FWD_ROUTER), m->router_logits,
                                      MG_DTYPE_F32, E),
                         "router"));
    mg_moe_topk_desc td = {.tokens = rows, .experts = E, .k = K, .logits_dtype = MG_DTYPE_F32,
                           .renormalize = true};
    OP("moe_topk",
       TRY(mg_moe_topk(b, s, &td, m->router_logits, m->topk_ids, m->topk_weights), "top-k"));
    mg_moe_sort_desc sd = {.tokens = rows, .experts = E, .k = K};
    OP("moe_sort", TRY(mg_moe_sort(b, s, &sd, m->topk_ids, m->sort_workspace,
                                   m->sort_workspace_bytes, m->expert_offsets,
                                   m->sorted_token_ids, m->pair_positions),
                       "expert sort"));
    if (m->fp4) {
        const mg_nvfp4_weight *fw = &m->fp4[(size_t)l * FP4_SLOTS];
        mg_nvfp4_moe_desc gd = {.experts = E, .rows = rows * K, .act_rows = rows, .n = I, .k = H};
        mg_nvfp4_moe_tensors gt = {.act = m->norm_out, .sorted_token_ids = m->sorted_token_ids,
                                   .expert_offsets = m->expert_offsets, .w = fw[FP4_GATE],
                                   .up = &fw[FP4_UP], .out = m->moe_act};
        OP("moe_gate_up",
           TRY(mg_nvfp4_moe_gemm(b, s, &gd, &gt), "experts' gate_up with SiLU-mul"));
        mg_nvfp4_moe_desc dd = {.experts = E, .rows = rows * K, .act_rows = rows * K, .n = H,
                                .k = I};
        mg_nvfp4_moe_tensors dt = {.act = m->moe_act, .expert_offsets = m->expert_offsets,
                                   .w = fw[FP4_DOWN], .out = m->moe_down};
        OP("moe_down", TRY(mg_nvfp4_moe_gemm(b, s, &dd, &dt), "experts' down"));
    } else { /* BF16 or FP8 (row-wise) experts: metrale/ops_moe_gemm.h */
        size_t gu = (size_t)l * MG_FWD_LAYER_TENSORS + MG_FWD_W_GATE_UP;
        size_t dn = (size_t)l * MG_FWD_LAYER_TENSORS + MG_FWD_W_DOWN;
        mg_moe_gemm_desc gd = moe_gemm_desc(m, true, rows);
        mg_moe_gemm_tensors gt = {.act = m->norm_out,
                                  .sorted_token_ids = m->sorted_token_ids,
                                  .expert_offsets = m->expert_offsets,
                                  .weight = m->layer_w[gu],
                                  .weight_scale = m->fp8_scales ? m->fp8_scales[gu] : 0,
                                  .out = m->moe_act,
                                  .workspace = m->moe_gemm_workspace,
                                  .workspace_bytes = m->moe_gemm_workspace_bytes};
        OP("moe_gate_up", TRY(mg_moe_gemm(b, s, &gd, &gt), "experts' gate_up with SiLU-mul"));
        mg_moe_gemm_desc dd = moe_gemm_desc(m, false, rows);
        mg_moe_gemm_tensors dt = {.act = m->moe_act,
                                  .expert_offsets = m->expert_offsets,
                                  .weight = m->layer_w[dn],
                                  .weight_scale = m->fp8_scales ? m->fp8_scales[dn] : 0,
                                  .out = m->moe_down,
                                  .workspace = m->moe_gemm_workspace,
                                  .workspace_bytes = m->moe_gemm_workspace_bytes};
        OP("moe_down", TRY(mg_moe_gemm(b, s, &dd, &dt), "experts' down"));
    }
    mg_moe_combine_desc cd = {.tokens = rows, .k = K, .hidden = H};
    OP("moe_combine", TRY(mg_moe_combine(b, s, &cd, m->moe_down, m->pair_positions,
                                         m->topk_weights, 0, m->proj_out),
                          "expert combine"));
    return MG_OK;
}

/* One pass over `rows` new tokens (their ids in step_ids), launched on `s`: every layer, the
 * last token rows of each request, the LM head and the argmax into step_ids[0..batch). */
static mg_status forward(mg_fwd *m, mg_stream *s, bool prefill, uint32_t rows,
                         mg_attention_plan *plan) {
    mg_backend *b = m->b;
    const mg_model_shape *sh = &m->sh;
    uint32_t H = sh->hidden, QD = sh->heads * sh->head_dim, KVD = 2 * sh->kv_heads * sh->head_dim;
    uint32_t I = sh->intermediate, B = m->c.batch;
    float eps = m->c.preset->norm_eps;
    mg_devptr q = m->qkv, kv = m->qkv + (uint64_t)m->tokens_padded * QD * 2;
    bool fp8 = m->fp8_scales != NULL;
    OP("embedding", TRY(mg_gather_rows_bf16(b, s, rows, H, m->step_ids, sh->vocab, m->embedding,
                                            0, m->residual),
                        "embedding"));
    for (uint32_t l = 0; l < m->layers; l++) {
        mg_devptr *w = layer_tensor(m, l, 0);
        mg_devptr k_pages, v_pages;
        TRY(mg_kv_cache_pools(&m->kv, m->kv_pool + (uint64_t)l * m->kv_layer_bytes, &k_pages,
                              &v_pages),
            "KV pools");
        OP("rmsnorm", TRY(mg_rmsnorm_bf16(b, s, rows, H, eps, m->residual, l ? m->proj_out : 0,
                                          w[MG_FWD_ATTN_NORM], m->norm_out),
                          "attention norm"));
        if (fp8)
            OP("fp8_quant", TRY(quantize_act(m, s, rows, H, m->norm_out), "quantizing to FP8"));
        OP("qkv_gemm",
           TRY(linear(m, s, prefill, l, MG_FWD_WQ, FP4_Q, rows, QD, H, m->norm_out, q),
               "q projection");
           TRY(linear(m, s, prefill, l, MG_FWD_WKV, FP4_KV, rows, KVD, H, m->norm_out, kv),
               "kv projection"));
        mg_kv_append_args a = {.batch_size = B,
                               .num_tokens = rows,
                               .num_kv_indices = m->kv.num_pages,
                               .k = kv,
                               .v = kv + (uint64_t)(KVD / 2) * 2,
                               .k_stride = KVD,
                               .v_stride = KVD,
                               .q = q,
                               .q_stride = QD,
                               .num_qo_heads = sh->heads,
                               .rope = true,
                               .rope_theta = m->c.preset->rope_theta,
                               .qo_indptr = m->qo_indptr,
                               .kv_indptr = m->kv_indptr,
                               .kv_indices = m->kv_indices,
                               .kv_last_page_len = m->last_page_len,
                               .k_pages = k_pages,
                               .v_pages = v_pages};
        OP("rope_append", TRY(mg_kv_append(b, s, &m->kv, &a), "RoPE and KV append"));
        mg_paged_attention_tensors t = {.q = q, .o = m->attn_out, .qo_rows = rows,
                                        .k_pages = k_pages, .v_pages = v_pages,
                                        .num_pages = m->kv.num_pages,
                                        .kv_indices = m->kv_indices,
                                        .num_kv_indices = m->kv.num_pages};
        OP("attention", TRY(mg_paged_attention_run(plan, &t, s), "attention"));
        if (fp8)
            OP("fp8_quant", TRY(quantize_act(m, s, rows, QD, m->attn_out), "quantizing to FP8"));
        OP("o_gemm", TRY(linear(m, s, prefill, l, MG_FWD_WO, FP4_O, rows, H, QD, m->attn_out,
                                m->proj_out),
                         "output projection"));
        OP("rmsnorm", TRY(mg_rmsnorm_bf16(b, s, rows, H, eps, m->residual, m->proj_out,
                                          w[MG_FWD_MLP_NORM], m->norm_out),
                          "MLP norm"));
        if (sh->experts) {
            mg_status st = moe_mlp(m, s, l, rows);
            if (st)
                return st;
            continue;
        }
        if (m->mlx) {
            OP("mlp", TRY(mg_fwd_mlx_mlp(m->mlx, s, l, rows, m->norm_out, m->gate_up,
                                         m->mlp_act, m->proj_out),
                          "MLP"));
            continue;
        }
        if (m->fp4) {
            const mg_nvfp4_weight *fw = &m->fp4[(size_t)l * FP4_SLOTS];
            OP("gate_up", TRY(mg_nvfp4_gemm_gate_up(b, s, rows, I, H, m->norm_out, H,
                                                    &fw[FP4_GATE], &fw[FP4_UP], m->mlp_act_fp4, I),
                              "gate_up projection with SiLU-mul"));
        } else {
            if (fp8)
                OP("fp8_quant",
                   TRY(quantize_act(m, s, rows, H, m->norm_out), "quantizing to FP8"));
            OP("gate_up", TRY(linear(m, s, prefill, l, MG_FWD_W_GATE_UP, 0, rows, 2 * I, H,
                                     m->norm_out, m->gate_up),
                              "gate_up projection"));
            OP("silu_mul",
               TRY(mg_silu_mul_bf16(b, s, rows, I, m->gate_up, 2 * I, m->mlp_act, I), "SiLU-mul"));
            if (fp8)
                OP("fp8_quant", TRY(quantize_act(m, s, rows, I, m->mlp_act), "quantizing to FP8"));
        }
        OP("down", TRY(linear(m, s, prefill, l, MG_FWD_W_DOWN, FP4_DOWN, rows, H, I,
                              m->fp4 ? m->mlp_act_fp4 : m->mlp_act, m->proj_out),
                       "down projection"));
    }
    OP("last_rows", TRY(mg_gather_rows_bf16(b, s, B, H, m->logits_indices, rows, m->residual,
                                            m->proj_out, m->logits_hidden),
                        "last-token rows"));
    OP("rmsnorm", TRY(mg_rmsnorm_bf16(b, s, B, H, eps, m->logits_hidden, 0, m->final_norm,
                                      m->logits_hidden),
                      "final norm"));
    if (m->fp4 || fp8) { /* BF16 logits (in the FP32 logits buffer) */
        if (fp8)
            OP("fp8_quant",
               TRY(quantize_act(m, s, B, H, m->logits_hidden), "quantizing to FP8"));
        OP("lm_head",
           TRY(fp8 ? mg_gemm_fp8_rowwise(b, s, B, sh->vocab, H, m->act_fp8, m->act_scales,
                                         m->lm_head, m->lm_head_scales, m->logits, m->logits_pitch)
                   : mg_nvfp4_gemm(b, s, B, sh->vocab, H, m->logits_hidden, H, &m->lm_head_fp4,
                                   m->logits, m->logits_pitch),
               "LM head"));
        OP("argmax",
           TRY(mg_argmax_bf16(b, s, B, sh->vocab, m->logits, m->logits_pitch, m->step_ids),
               "argmax"));
    } else {
        OP("lm_head", TRY(mg_gemm_bf16(b, s, B, sh->vocab, H, m->logits_hidden, m->lm_head,
                                       m->logits, MG_DTYPE_F32, m->logits_pitch),
                          "LM head"));
        OP("argmax",
           TRY(mg_argmax_f32(b, s, B, sh->vocab, m->logits, m->logits_pitch, m->step_ids),
               "argmax"));
    }
    return MG_OK;
}

/* forward() inside a lane span ("prefill" or "decode", step = the pass's index) when a timing
 * object is attached; the pass's op spans are armed by that step. */
static mg_status timed_forward(mg_fwd *m, mg_stream *s, bool prefill, uint32_t rows,
                               mg_attention_plan *plan) {
    if (!m->timing)
        return forward(m, s, prefill, rows, plan);
    mg_timing_span lane = 0;
    TRY(mg_timing_step_begin(m->timing, m->token_count), "timing step");
    TRY(mg_timing_lane_begin(m->timing, prefill ? m->lane_prefill : m->lane_decode, s, &lane),
        "timing span");
    mg_status st = forward(m, s, prefill, rows, plan);
    if (st) {
        /* An op failed mid-pass: its span and the lane's are ended anyway, so the timing object
         * holds no span left open (their times mean nothing; the status is what counts). */
        if (m->open_span)
            mg_timing_span_end(m->timing, m->open_span, s);
        m->open_span = 0;
        mg_timing_span_end(m->timing, lane, s);
        return st;
    }
    TRY(mg_timing_span_end(m->timing, lane, s), "timing span");
    return MG_OK;
}

mg_status mg_fwd_set_timing(mg_fwd *m, mg_timing *t) {
    error_text[0] = '\0';
    m->timing = NULL;
    if (t) {
        TRY(mg_timing_lane(t, "prefill", &m->lane_prefill), "timing lane");
        TRY(mg_timing_lane(t, "decode", &m->lane_decode), "timing lane");
    }
    m->timing = t;
    return MG_OK;
}

/* Reads step_ids[0..batch) into the token history. */
static mg_status collect_tokens(mg_fwd *m, mg_stream *s) {
    TRY(mg_stream_synchronize(s), "running the pass");
    uint32_t B = m->c.batch;
    int32_t *ids = m->h_logits_indices; /* scratch of B entries, rebuilt by every upload */
    TRY(mg_copy_d2h(m->b, ids, m->step_ids, B * sizeof(int32_t)), "reading the tokens");
    for (uint32_t r = 0; r < B; r++)
        m->tokens[(size_t)r * (m->c.steps + 1) + m->token_count] = ids[r];
    m->token_count++;
    return MG_OK;
}

mg_status mg_fwd_prefill(mg_fwd *m, mg_stream *s) {
    error_text[0] = '\0';
    if (m->token_count)
        return fail(MG_ERR_INVALID_ARGUMENT, "the prefill already ran");
    uint32_t B = m->c.batch, *qo = calloc(B, sizeof *qo);
    int32_t *ids = malloc(m->prompt_tokens * sizeof *ids);
    mg_status st = MG_OK;
    if (!qo || !ids)
        st = fail(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    size_t n = 0;
    for (uint32_t r = 0; !st && r < B; r++) {
        qo[r] = m->kv_len[r] = mg_fwd_prompt_length(&m->c, r);
        for (uint32_t t = 0; t < qo[r]; t++)
            ids[n++] = m->c.prompt_ids ? m->c.prompt_ids[t]
                                       : mg_fwd_prompt_token(m->c.seed, m->sh.vocab, r, t);
    }
    mg_kv_page_table table;
    mg_attention_plan *plan = NULL;
    mg_paged_attention_desc d = attention_desc(m);
    if (!st && !(st = upload_tables(m, qo, &table))) {
        if ((st = mg_copy_h2d(m->b, m->step_ids, ids, n * sizeof *ids)) ||
            (st = mg_paged_attention_plan_create(m->b, &d, &table, s, &plan)))
            st = lib_fail(st, "prefill plan");
    }
    if (!st && !(st = timed_forward(m, s, true, (uint32_t)n, plan)))
        st = collect_tokens(m, s);
    mg_attention_plan_destroy(plan);
    free(qo);
    free(ids);
    return st;
}

mg_status mg_fwd_decode(mg_fwd *m, mg_stream *s) {
    error_text[0] = '\0';
    if (!m->token_count)
        return fail(MG_ERR_INVALID_ARGUMENT, "decode before the prefill");
    if (m->token_count > m->c.steps)
        return fail(MG_ERR_INVALID_ARGUMENT, "all %u planned decode steps already ran",
                    m->c.steps);
    uint32_t B = m->c.batch, *qo = calloc(B, sizeof *qo);
    if (!qo)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    for (uint32_t r = 0; r < B; r++) {
        qo[r] = 1;
        m->kv_len[r]++;
    }
    mg_kv_page_table table;
    mg_status st = upload_tables(m, qo, &table);
    free(qo);
    if (st)
        return st;
    if (!m->decode_plan) {
        mg_paged_attention_desc d = attention_desc(m);
        d.graph_qo_rows = B;
        d.graph_kv_tokens = m->kv.num_pages * PAGE_SIZE;
        TRY(mg_paged_attention_plan_create(m->b, &d, &table, s, &m->decode_plan), "decode plan");
    } else {
        TRY(mg_paged_attention_plan_update(m->decode_plan, &table, s), "decode plan update");
    }
    bool replay = m->c.use_graphs && m->decode_calls > 0 && !m->timing;
    m->decode_calls++;
    if (!replay) {
        if ((st = timed_forward(m, s, false, B, m->decode_plan)))
            return st;
        return collect_tokens(m, s);
    }
    if (!m->graph) {
        TRY(mg_graph_begin_capture(s), "capturing the decode step");
        if ((st = forward(m, s, false, B, m->decode_plan))) {
            mg_graph_abort_capture(s);
            return st;
        }
        TRY(mg_graph_end_capture(s, &m->graph), "capturing the decode step");
    }
    TRY(mg_graph_launch(m->graph, s), "replaying the decode step");
    m->graph_steps++;
    return collect_tokens(m, s);
}

const int32_t *mg_fwd_tokens(const mg_fwd *m, uint32_t r, uint32_t *count) {
    *count = m->token_count;
    return m->tokens + (size_t)r * (m->c.steps + 1);
}

mg_status mg_fwd_final_hidden(mg_fwd *m, uint16_t *out) {
    TRY(mg_copy_d2h(m->b, out, m->logits_hidden, (size_t)m->c.batch * m->sh.hidden * 2),
        "reading the final hidden states");
    return MG_OK;
}

mg_status mg_fwd_logits(mg_fwd *m, float *out) {
    error_text[0] = '\0';
    if (!m->token_count)
        return fail(MG_ERR_INVALID_ARGUMENT, "no pass has run: no logits yet");
    const size_t V = m->sh.vocab, P = m->logits_pitch, B = m->c.batch;
    const bool bf16 = m->fp4 || m->fp8_scales; /* BF16 logits (forward()) */
    void *rows = malloc(B * P * (bf16 ? 2 : 4));
    if (!rows)
        return fail(MG_ERR_OUT_OF_MEMORY, "out of host memory for the logits");
    mg_status st = mg_copy_d2h(m->b, rows, m->logits, B * P * (bf16 ? 2 : 4));
    for (size_t r = 0; !st && r < B; r++)
        for (size_t j = 0; j < V; j++)
            out[r * V + j] = bf16 ? mg_bf16_to_f32(((const uint16_t *)rows)[r * P + j])
                                  : ((const float *)rows)[r * P + j];
    free(rows);
    return st ? lib_fail(st, "reading the logits") : MG_OK;
}

mg_status mg_fwd_force_tokens(mg_fwd *m, const int32_t *ids) {
    error_text[0] = '\0';
    if (!m->token_count)
        return fail(MG_ERR_INVALID_ARGUMENT, "no pass has run: no token to replace");
    for (uint32_t r = 0; r < m->c.batch; r++)
        if (ids[r] < 0 || (uint32_t)ids[r] >= m->sh.vocab)
            return fail(MG_ERR_INVALID_ARGUMENT, "forced token %d of request %u outside [0, %u)",
                        ids[r], r, m->sh.vocab);
    TRY(mg_copy_h2d(m->b, m->step_ids, ids, m->c.batch * sizeof(int32_t)), "forcing the tokens");
    for (uint32_t r = 0; r < m->c.batch; r++)
        m->tokens[(size_t)r * (m->c.steps + 1) + m->token_count - 1] = ids[r];
    return MG_OK;
}

void mg_fwd_get_info(const mg_fwd *m, mg_fwd_info *out) {
    memset(out, 0, sizeof *out);
    out->weight_bytes = m->weight_bytes;
    /* a decode step reads every weight but the embedding table (a row gather); of the experts,
     * the expected distinct ones of batch * k uniform picks */
    out->decode_weight_bytes = m->weight_bytes - (m->lm_head == m->embedding
                                                      ? 0 /* tied: the LM head reads it all */
                                                      : 2ull * m->sh.vocab * m->sh.hidden);
    if (m->sh.experts) {
        double E = m->sh.experts, k = m->sh.experts_per_token;
        double used = 1.0 - pow(1.0 - k / E, (double)m->c.batch);
        out->decode_weight_bytes -= m->expert_bytes - (uint64_t)(m->expert_bytes * used);
    }
    out->kv_pool_bytes = (uint64_t)m->kv_layer_bytes * m->layers;
    out->decode_kv_bytes = m->decode_kv_bytes;
    out->prompt_tokens = m->prompt_tokens;
    mg_arena_summary_get(m->arena, &out->arena);
    out->graph_steps = m->graph_steps;
}
