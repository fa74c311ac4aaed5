/* model.c - the decoder stack of model.h over the public ops: weights, arena, KV cache,
 * prefill and decode passes. */
#include "model_format.h"
#include "model_internal.h"
#include "model_plan.h"
#include "model_sampling.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrale/dtype.h"
#include "metrale/nvfp4.h"
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

mg_status mg_fwd_lib_fail(mg_status st, const char *what) {
    return mg_error_report(st, "%s: %s", what, mg_last_error());
}

/* What a configuration's requests hold, computed once for the memory check and for creation:
 * prompt tokens, KV pages for the prompts and the steps (in all, and the most of one request),
 * and the tokens of the largest pass. */
typedef struct batch_extent {
    uint64_t prompt_tokens, pages;
    uint32_t max_pages;
    uint32_t tokens; /* per pass: the prompts' total, at least one row per request */
} batch_extent;

static batch_extent batch_extent_of(const mg_fwd_config *c) {
    batch_extent e = {0};
    for (uint32_t r = 0; r < c->batch; r++) {
        const uint32_t len = mg_fwd_prompt_length(c, r), seq = len + c->steps;
        const uint32_t need = ceil_div(seq, PAGE_SIZE);
        e.prompt_tokens += len;
        e.pages += need;
        e.max_pages = need > e.max_pages ? need : e.max_pages;
    }
    e.tokens = (uint32_t)(e.prompt_tokens > c->batch ? e.prompt_tokens : c->batch);
    return e;
}

/* The plan's input for `c` on `b` (model_plan.h): `seq` holds each request's prompt + steps
 * (batch entries, the caller's), `mlx` whether the layer matrices run the MLX ops, `attention`
 * the passes' paged attention descriptor. */
static mg_fwd_plan_input plan_input_of(mg_backend *b, const mg_fwd_config *c,
                                       const mg_model_shape *shape, uint32_t tp_ranks,
                                       const batch_extent *e, uint32_t *seq, bool mlx,
                                       const mg_paged_attention_desc *attention) {
    for (uint32_t r = 0; r < c->batch; r++)
        seq[r] = mg_fwd_prompt_length(c, r) + c->steps;
    return (mg_fwd_plan_input){.b = b,
                               .shape = shape,
                               .tp_ranks = tp_ranks,
                               .weights = c->weights,
                               .mlx = mlx,
                               .qk_norm = c->preset->qk_norm,
                               .rope_table = c->preset->rope_llama3.factor > 0 ||
                                             c->preset->rope_freq_factors,
                               .tokens = e->tokens,
                               .batch = c->batch,
                               .pages = (uint32_t)e->pages,
                               .prompt_tokens = e->prompt_tokens,
                               .steps = c->steps,
                               .seq_len = seq,
                               .page_size = PAGE_SIZE,
                               .attention = attention};
}

static mg_status create_arena(mg_fwd *m, const batch_extent *e) {
    m->tokens_cap = e->tokens;
    uint32_t *seq = malloc(m->c.batch * sizeof *seq);
    if (!seq)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    const mg_paged_attention_desc attention = mg_fwd_attention_desc_of(&m->sh);
    mg_fwd_plan_input in =
        plan_input_of(m->b, &m->c, &m->sh, m->tp_ranks, e, seq, m->mlx != NULL, &attention);
    /* An NVFP4 checkpoint (weights "checkpoint") runs the NVFP4 format: its plan is NVFP4's (the
     * long prefills' BF16 expansion workspace; no separate gate_up buffer). */
    if (m->fp4)
        in.weights = MG_FWD_WEIGHTS_NVFP4;
    mg_status st = mg_fwd_plan_create(m, &in);
    free(seq);
    if (!st && m->mlx)
        st = mg_fwd_mlx_set_scratch(m->mlx, m->mlx_scratch, m->mlx_scratch_bytes);
    const mg_fwd_preset *p = m->c.preset;
    const mg_fwd_rope_llama3 *r = &p->rope_llama3;
    if (!st && (r->factor > 0 || p->rope_freq_factors)) { /* the whole-pass row holds it */
        float table[256];                                 /* head_dim <= 512 (mg_kv_cache_desc) */
        const uint32_t D = m->sh.head_dim;
        if (D / 2 > 256)
            return mg_error_report(MG_ERR_UNSUPPORTED, "a scaled RoPE over heads of %u", D);
        if (r->factor > 0)
            st = mg_rope_inv_freq_llama3(D, p->rope_theta, r->factor, r->low_freq_factor,
                                         r->high_freq_factor, r->original_max_positions, table);
        else /* each frequency in double, rounded to FP32 once (as the llama3 table is) */
            for (uint32_t i = 0; i < D / 2; i++)
                table[i] = (float)(pow(p->rope_theta, -2.0 * i / D) / p->rope_freq_factors[i]);
        if (st || (st = mg_copy_h2d(m->b, m->rope_inv_freq, table, 4 * (size_t)(D / 2))))
            return mg_fwd_lib_fail(st, "uploading the RoPE frequency table");
    }
    return st;
}

static mg_status create_kv_cache(mg_fwd *m, uint32_t num_pages) {
    m->kv = (mg_kv_cache_desc){.num_kv_heads = m->sh.kv_heads,
                               .head_dim = m->sh.head_dim,
                               .page_size = PAGE_SIZE,
                               .num_pages = num_pages};
    mg_status st = mg_kv_cache_bytes(&m->kv, &m->kv_layer_bytes);
    if (st)
        return mg_fwd_lib_fail(st, "sizing the KV cache");
    if ((st = mg_alloc(m->b, m->kv_layer_bytes * m->layers, &m->kv_pool)))
        return mg_fwd_lib_fail(st, "allocating the KV cache");
    if ((st = mg_kv_page_allocator_create(num_pages, &m->allocator)))
        return mg_fwd_lib_fail(st, "creating the page allocator");
    m->pages = calloc((size_t)m->c.batch * m->pages_per_request, sizeof *m->pages);
    if (!m->pages)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the page table");
    for (uint32_t r = 0; r < m->c.batch; r++) {
        uint32_t need = ceil_div(mg_fwd_prompt_length(&m->c, r) + m->c.steps, PAGE_SIZE);
        if ((st =
                 mg_kv_page_alloc(m->allocator, need, m->pages + (size_t)r * m->pages_per_request)))
            return mg_fwd_lib_fail(st, "allocating KV pages");
    }
    return MG_OK;
}

/* The plan of config `c` before anything loads (into *plan when not NULL, else only its device
 * bytes into *bytes): a checkpoint counted as if its matrices ran the MLX ops, the larger. */
static mg_status plan_config(mg_backend *b, const mg_fwd_config *c, mg_arena_plan **plan,
                             uint64_t *bytes) {
    const batch_extent e = batch_extent_of(c);
    uint32_t *seq = malloc(c->batch * sizeof *seq);
    if (!seq)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    const bool mlx = c->weights == MG_FWD_WEIGHTS_CHECKPOINT ||
                     ((c->weights == MG_FWD_WEIGHTS_MLX8 || c->weights == MG_FWD_WEIGHTS_MLX4) &&
                      !c->mlx_dequantized);
    const mg_paged_attention_desc attention = mg_fwd_attention_desc_of(&c->preset->shape);
    const mg_fwd_plan_input in =
        plan_input_of(b, c, &c->preset->shape, 1, &e, seq, mlx, &attention);
    mg_status st = plan ? mg_fwd_plan_build(&in, plan) : mg_fwd_plan_bytes(&in, bytes);
    free(seq);
    return st;
}

/* The model layer is built against include/metrale/ (MG_API_VERSION) and may meet another
 * libmetrale_gpu.so at run time, whose structs and signatures would then differ: refused before
 * any other call into it (gpu.h's rule). */
static mg_status check_library_version(void) {
    const uint32_t v = mg_api_version();
    if (v == MG_API_VERSION)
        return MG_OK;
    return mg_error_report(MG_ERR_UNSUPPORTED,
                           "libmetrale_gpu has API version %u; the model layer was built against "
                           "version %u (rebuild one of them)",
                           (unsigned)v, (unsigned)MG_API_VERSION);
}

mg_status mg_fwd_plan_for_config(mg_backend *b, const mg_fwd_config *c, mg_arena_plan **out) {
    *out = NULL;
    mg_status version = check_library_version();
    if (version)
        return version;
    if (c->model_path || !c->preset || !mg_fwd_format_of_config(c))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "planning needs a preset and a known weight format (a checkpoint "
                               "is planned when mg_fwd_create opens it)");
    if (!c->batch || c->batch > c->preset->max_batch_size || (!c->prompt_ids && !c->prompt_len))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "--batch %u (1..%u) and --prompt-len %u (at least 1)", c->batch,
                               c->preset->max_batch_size, c->prompt_len);
    return plan_config(b, c, out, NULL);
}

/* The device bytes beyond the weights: the KV pool (every layer's pages for the prompts and the
 * steps) and the arena, as mg_fwd_create plans them (a checkpoint counted as if its matrices
 * ran the MLX ops, the larger plan). */
static mg_status state_bytes_estimate(mg_backend *b, const mg_fwd_config *c, double *bytes) {
    const mg_fwd_preset *p = c->preset;
    const batch_extent e = batch_extent_of(c);
    const uint64_t pages = e.pages;
    if (pages >= (1u << 31))
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "the prompts and steps need %llu KV pages, too many",
                               (unsigned long long)pages);
    const mg_kv_cache_desc kv = {.num_kv_heads = p->shape.kv_heads,
                                 .head_dim = p->shape.head_dim,
                                 .page_size = PAGE_SIZE,
                                 .num_pages = (uint32_t)pages};
    size_t kv_layer_bytes = 0;
    mg_status st = mg_kv_cache_bytes(&kv, &kv_layer_bytes);
    if (st)
        return mg_fwd_lib_fail(st, "sizing the KV cache");
    uint64_t arena = 0;
    if ((st = plan_config(b, c, NULL, &arena)))
        return st;
    *bytes = (double)kv_layer_bytes * p->layers + (double)arena;
    return MG_OK;
}

static mg_status check_config(mg_backend *b, const mg_fwd_config *c,
                              const mg_fwd_checkpoint *ckpt) {
    const mg_fwd_preset *p = c->preset;
    if (!p)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "no preset");
    const mg_fwd_format *f = mg_fwd_format_of_config(c);
    if (!f)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "unknown weight format %d",
                               (int)c->weights);
    mg_status st = f->check ? f->check(b, c) : MG_OK;
    if (st)
        return st;
    if (p->shape.experts && !f->moe_op_count)
        return mg_error_report(MG_ERR_UNSUPPORTED,
                               "preset %s is a mixture of experts: %s weights run dense models "
                               "only",
                               p->name, mg_fwd_weights_name(c->weights));
    /* The pass's own ops, then the format's (its experts' for a MoE model): a backend without
     * one is refused here, never mid-pass. */
    static const mg_op pass_ops[] = {MG_OP_GATHER_ROWS, MG_OP_RMSNORM, MG_OP_ARGMAX,
                                     MG_OP_KV_APPEND, MG_OP_ATTENTION_PAGED};
    const struct {
        const mg_op *ops;
        size_t count;
    } lists[] = {{pass_ops, sizeof pass_ops / sizeof pass_ops[0]},
                 {f->ops, f->op_count},
                 {f->moe_ops, p->shape.experts ? f->moe_op_count : 0}};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
        for (size_t j = 0; j < lists[i].count; j++)
            if (!mg_op_supported(b, lists[i].ops[j]))
                return mg_error_report(
                    MG_ERR_UNSUPPORTED, "the %s backend cannot run op %s (%s%s weights%s)",
                    mg_backend_kind_name(mg_backend_get_kind(b)), mg_op_name(lists[i].ops[j]),
                    i ? "" : "every model; ", f->name, i == 2 ? ", mixture of experts" : "");
    if (!c->batch || c->batch > p->max_batch_size)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "--batch %u: preset %s's arena holds 1..%u requests", c->batch,
                               p->name, p->max_batch_size);
    if (!c->prompt_ids && !c->prompt_len)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "--prompt-len must be at least 1");
    uint64_t total = 0;
    for (uint32_t r = 0; r < c->batch; r++)
        total += mg_fwd_prompt_length(c, r);
    if (total > p->max_batch_tokens)
        return mg_error_report(
            MG_ERR_INVALID_ARGUMENT,
            "the prompts hold %llu tokens: preset %s's arena holds at most %u per pass",
            (unsigned long long)total, p->name, p->max_batch_tokens);
    if (c->steps > 1u << 20 || c->prompt_len > 1u << 20)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "--steps / --prompt-len above 2^20");
    for (uint32_t r = 0; p->context && r < c->batch; r++) {
        const uint64_t seq = (uint64_t)mg_fwd_prompt_length(c, r) + c->steps;
        if (seq > p->context)
            return mg_error_report(
                MG_ERR_INVALID_ARGUMENT,
                "request %u: %u prompt tokens and %u steps make %llu, past the context "
                "of %s (%u tokens); nothing is truncated",
                r, mg_fwd_prompt_length(c, r), c->steps, (unsigned long long)seq, p->name,
                p->context);
    }
    if (c->prompt_ids && c->prompt_lengths) {
        uint64_t sum = 0;
        for (uint32_t r = 0; r < c->batch; r++) {
            if (!c->prompt_lengths[r])
                return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                       "request %u: an empty prompt: give at least one token", r);
            sum += c->prompt_lengths[r];
        }
        if (sum != c->prompt_ids_count)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "the prompt lengths add up to %llu ids, prompt_ids_count is %u",
                                   (unsigned long long)sum, c->prompt_ids_count);
    }
    if (c->prompt_ids) {
        if (!c->prompt_ids_count)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "an empty prompt: give at least one token");
        for (uint32_t i = 0; i < c->prompt_ids_count; i++)
            if (c->prompt_ids[i] < 0 || (uint32_t)c->prompt_ids[i] >= p->shape.vocab)
                return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                       "prompt token %u is id %d, outside the vocabulary of %u", i,
                                       c->prompt_ids[i], p->shape.vocab);
    }
    uint64_t free_bytes = 0, total_bytes = 0;
    const double weights =
        ckpt ? mg_fwd_checkpoint_weight_bytes(ckpt, p) : f->weight_bytes(p, c->weights);
    double state = 0.0;
    st = state_bytes_estimate(b, c, &state);
    if (st)
        return st;
    if (!mg_memory_free_bytes(b, &free_bytes, &total_bytes) && weights + state > (double)free_bytes)
        return mg_error_report(
            MG_ERR_OUT_OF_MEMORY,
            "preset %s with %s weights needs about %.1f GB (%.1f GB of weights, %.1f GB of "
            "KV cache and activations); the %s backend has %.1f GB free",
            p->name, mg_fwd_weights_name(c->weights), (weights + state) / 1e9, weights / 1e9,
            state / 1e9, mg_backend_kind_name(mg_backend_get_kind(b)), free_bytes / 1e9);
    return MG_OK;
}

/* A model, or one rank of a tensor-parallel one (comm not NULL: model.h). */
static mg_status create_model(mg_backend *b, mg_comm *comm, const mg_fwd_config *c, mg_fwd **out) {
    *out = NULL;
    mg_status version = check_library_version();
    if (version)
        return version;
    const int ranks = comm ? mg_comm_size(comm) : 1, rank = comm ? mg_comm_rank(comm) : 0;
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "a communicator of rank %d of %d", rank,
                               ranks);
    if (comm && mg_comm_backend(comm) != b)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                               "rank %d's communicator is on another backend than the model's",
                               rank);
    mg_fwd *m = calloc(1, sizeof *m);
    if (!m)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    m->b = b;
    m->c = *c;
    m->comm = comm;
    m->tp_rank = (uint32_t)rank;
    m->tp_ranks = (uint32_t)ranks;
    mg_status st = MG_OK;
    if (c->model_path) {
        if ((st = mg_fwd_checkpoint_open(c->model_path, &m->arch, m->arch_name, sizeof m->arch_name,
                                         &m->ckpt))) {
            mg_fwd_destroy(m);
            return st;
        }
        m->c.preset = &m->arch;
        m->c.weights = MG_FWD_WEIGHTS_CHECKPOINT;
        m->c.checkpoint = NULL;
        m->c.mlx_dequantized = false;
    }
    if (c->prompt_ids && c->prompt_ids_count) {
        /* per-request prompt lengths, when given, are kept after the ids */
        const size_t lengths = c->prompt_lengths ? c->batch : 0;
        if (!(m->prompt = malloc((c->prompt_ids_count + lengths) * sizeof *m->prompt))) {
            mg_fwd_destroy(m);
            return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
        }
        memcpy(m->prompt, c->prompt_ids, c->prompt_ids_count * sizeof *m->prompt);
        m->c.prompt_ids = m->prompt;
        if (lengths) {
            memcpy(m->prompt + c->prompt_ids_count, c->prompt_lengths, lengths * sizeof(uint32_t));
            m->c.prompt_lengths = (const uint32_t *)(m->prompt + c->prompt_ids_count);
        }
    } else {
        m->c.prompt_lengths = NULL;
    }
    if ((st = check_config(b, &m->c, m->ckpt)) ||
        (m->tp_ranks > 1 && (st = mg_fwd_tp_check(&m->c, m->tp_ranks)))) {
        mg_fwd_destroy(m);
        return st;
    }
    c = &m->c;
    m->full_sh = c->preset->shape;
    mg_fwd_tp_set_shape(m);
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
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    if (!st)
        st = mg_fwd_create_weights(m);
    if (!st)
        st = mg_fwd_tp_shard_weights(m);
    if (!st) {
        m->format = mg_fwd_format_of_model(m);
        /* one token row per decode step: its q and kv projections can be one GEMV (a
         * tensor-parallel decode runs unfused: mg_fwd_decide_fusion) */
        if (B == 1 && !c->unfused && m->format->fused_gemms && !m->format->mlp && !m->sh.experts &&
            m->tp_ranks == 1)
            st = mg_fwd_join_qkv(m);
    }
    if (!st) {
        st = create_arena(m, &extent);
    }
    if (!st)
        st = create_kv_cache(m, num_pages);
    if (st) {
        mg_fwd_destroy(m);
        return st;
    }
    *out = m;
    return MG_OK;
}

mg_status mg_fwd_create(mg_backend *b, const mg_fwd_config *c, mg_fwd **out) {
    return create_model(b, NULL, c, out);
}

mg_status mg_fwd_create_rank(mg_backend *b, mg_comm *comm, const mg_fwd_config *c, mg_fwd **out) {
    return create_model(b, comm, c, out);
}

const mg_fwd_preset *mg_fwd_get_preset(const mg_fwd *m, mg_fwd_weights *weights) {
    if (weights)
        *weights = m->c.weights;
    return m->c.preset;
}

void mg_fwd_destroy(mg_fwd *m) {
    if (!m)
        return;
    if (m->group) { /* mg_fwd_create_tp's rank 0: every rank, then the communicators */
        struct mg_fwd_tp_group *group = m->group;
        m->group = NULL;
        mg_fwd_tp_group_destroy(group);
        return;
    }
    if (m->graph)
        mg_graph_destroy(m->graph);
    mg_fwd_sampling_destroy(m);
    mg_attention_plan_destroy(m->decode_plan);
    mg_kv_page_allocator_destroy(m->allocator);
    if (m->kv_pool)
        mg_free(m->b, m->kv_pool);
    mg_arena_destroy(m->arena);
    mg_fwd_mlx_destroy(m->mlx);
    for (size_t i = 0; m->layer_w && i < (size_t)m->layers * MG_FWD_LAYER_TENSORS; i++)
        if (m->layer_w[i] && !(m->qkv_joined && i % MG_FWD_LAYER_TENSORS == MG_FWD_WKV))
            mg_free(m->b, m->layer_w[i]);
    for (size_t i = 0; m->layer_extra && i < (size_t)m->layers * MG_FWD_EXTRA_TENSORS; i++)
        if (m->layer_extra[i])
            mg_free(m->b, m->layer_extra[i]);
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
    free(m->fp4);
    free(m->fp8_scales);
    free(m->layer_w);
    free(m->layer_extra);
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
    *t = (mg_kv_page_table){.batch_size = B,
                            .qo_indptr = m->h_qo,
                            .kv_indptr = m->h_kv_indptr,
                            .kv_indices = m->h_kv_indices,
                            .kv_last_page_len = m->h_last};
    mg_status st = mg_kv_page_table_check(&m->kv, t, "forward model");
    size_t b1 = (B + 1) * sizeof(int32_t), bb = B * sizeof(int32_t);
    if (st || (st = mg_copy_h2d(m->b, m->qo_indptr, m->h_qo, b1)) ||
        (st = mg_copy_h2d(m->b, m->kv_indptr, m->h_kv_indptr, b1)) ||
        (st = mg_copy_h2d(m->b, m->kv_indices, m->h_kv_indices,
                          (size_t)m->h_kv_indptr[B] * sizeof(int32_t))) ||
        (st = mg_copy_h2d(m->b, m->last_page_len, m->h_last, bb)) ||
        (st = mg_copy_h2d(m->b, m->logits_indices, m->h_logits_indices, bb)))
        return mg_fwd_lib_fail(st, "uploading the page table");
    return MG_OK;
}

mg_status mg_fwd_set_timing(mg_fwd *m, mg_timing *t) {
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
    /* a tensor-parallel rank waits at most its communicator's timeout, watching for a failed
     * peer (metrale/comm.h), where a plain synchronize could wait forever on a hung one */
    TRY(m->comm ? mg_comm_wait(m->comm, s) : mg_stream_synchronize(s), "running the pass");
    uint32_t B = m->c.batch;
    int32_t *ids = m->h_logits_indices; /* scratch of B entries, rebuilt by every upload */
    TRY(mg_copy_d2h(m->b, ids, m->step_ids, B * sizeof(int32_t)), "reading the tokens");
    mg_status st = mg_fwd_sampling_check_ids(m, ids);
    if (st)
        return st;
    for (uint32_t r = 0; r < B; r++)
        m->tokens[(size_t)r * (m->c.steps + 1) + m->token_count] = ids[r];
    m->token_count++;
    return MG_OK;
}

mg_status mg_fwd_pass_allowed(const mg_fwd *m, bool prefill) {
    mg_status stopped = mg_fwd_tp_usable(m);
    if (stopped)
        return stopped;
    if (prefill && m->token_count)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "the prefill already ran");
    if (!prefill && !m->token_count)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "decode before the prefill");
    if (!prefill && m->token_count > m->c.steps)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "all %u planned decode steps already ran",
                               m->c.steps);
    return MG_OK;
}

mg_status mg_fwd_prefill(mg_fwd *m, mg_stream *s) {
    return m->group ? mg_fwd_tp_run(m, s, true) : mg_fwd_prefill_rank(m, s);
}

mg_status mg_fwd_decode(mg_fwd *m, mg_stream *s) {
    return m->group ? mg_fwd_tp_run(m, s, false) : mg_fwd_decode_rank(m, s);
}

static mg_status prefill_pass(mg_fwd *m, mg_stream *s);
static mg_status decode_pass(mg_fwd *m, mg_stream *s);

mg_status mg_fwd_prefill_rank(mg_fwd *m, mg_stream *s) {
    mg_status st = mg_fwd_pass_allowed(m, true);
    if (!st && (st = prefill_pass(m, s)))
        mg_fwd_tp_stop(m, mg_last_error()); /* its peers' collectives fail: model.h */
    return st;
}

/* The decode step's kernels outside the layers and in its first layer, into
 * m->graph_outside_kernels and m->graph_layer_kernels: the step captured twice more (neither
 * capture launched) with the pass cut to no layer and to one. Left 0 where the backend cannot
 * count a graph, and for a tensor-parallel model (whose ranks capture together). */
static void count_layer_kernels(mg_fwd *m, mg_stream *s) {
    if (m->tp_ranks > 1 || !m->layers)
        return;
    const uint32_t layers = m->layers;
    size_t kernels[2] = {0, 0};
    mg_status st = MG_OK;
    for (uint32_t n = 0; n < 2 && !st; n++) {
        mg_graph *g = NULL;
        m->layers = n; /* the pass's loop bound; nothing else reads it while capturing */
        if (!(st = mg_graph_begin_capture(s))) {
            if ((st = mg_fwd_forward(m, s, false, m->c.batch, m->decode_plan)) ||
                (st = mg_fwd_sampling_launch(m, s)))
                mg_graph_abort_capture(s);
            else if (!(st = mg_graph_end_capture(s, &g)))
                st = mg_graph_count_nodes(g, &kernels[n], NULL);
        }
        if (g)
            mg_graph_destroy(g);
    }
    m->layers = layers;
    if (!st && kernels[1] >= kernels[0]) {
        m->graph_outside_kernels = (uint32_t)kernels[0];
        m->graph_layer_kernels = (uint32_t)(kernels[1] - kernels[0]);
    }
}

mg_status mg_fwd_decode_rank(mg_fwd *m, mg_stream *s) {
    mg_status st = mg_fwd_pass_allowed(m, false);
    if (!st && (st = decode_pass(m, s)))
        mg_fwd_tp_stop(m, mg_last_error());
    return st;
}

static mg_status prefill_pass(mg_fwd *m, mg_stream *s) {
    uint32_t B = m->c.batch, *qo = calloc(B, sizeof *qo);
    int32_t *ids = malloc(m->prompt_tokens * sizeof *ids);
    mg_status st = MG_OK;
    if (!qo || !ids)
        st = mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    size_t n = 0;
    for (uint32_t r = 0; !st && r < B; r++) {
        qo[r] = m->kv_len[r] = mg_fwd_prompt_length(&m->c, r);
        const size_t first = m->c.prompt_lengths ? n : 0; /* request r's prompt */
        for (uint32_t t = 0; t < qo[r]; t++)
            ids[n++] = m->c.prompt_ids ? m->c.prompt_ids[first + t]
                                       : mg_fwd_prompt_token(m->c.seed, m->sh.vocab, r, t);
    }
    mg_kv_page_table table;
    mg_attention_plan *plan = NULL;
    mg_paged_attention_desc d = mg_fwd_attention_desc(m);
    if (!st && !(st = upload_tables(m, qo, &table))) {
        if ((st = mg_copy_h2d(m->b, m->step_ids, ids, n * sizeof *ids)) ||
            (st = mg_paged_attention_plan_create(m->b, &d, &table, s, &plan)))
            st = mg_fwd_lib_fail(st, "prefill plan");
    }
    if (!st)
        st = mg_fwd_sampling_upload(m);
    if (!st && !(st = mg_fwd_timed_forward(m, s, true, (uint32_t)n, plan)) &&
        !(st = mg_fwd_sampling_launch(m, s)))
        st = collect_tokens(m, s);
    mg_attention_plan_destroy(plan);
    free(qo);
    free(ids);
    return st;
}

static mg_status decode_pass(mg_fwd *m, mg_stream *s) {
    uint32_t B = m->c.batch, *qo = calloc(B, sizeof *qo);
    if (!qo)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    for (uint32_t r = 0; r < B; r++) {
        qo[r] = 1;
        m->kv_len[r]++;
    }
    mg_kv_page_table table;
    mg_status st = upload_tables(m, qo, &table);
    free(qo);
    if (st || (st = mg_fwd_sampling_upload(m)))
        return st;
    if (!m->decode_plan) {
        mg_paged_attention_desc d = mg_fwd_attention_desc(m);
        d.graph_qo_rows = B;
        d.graph_kv_tokens = m->kv.num_pages * PAGE_SIZE;
        TRY(mg_paged_attention_plan_create(m->b, &d, &table, s, &m->decode_plan), "decode plan");
    } else {
        TRY(mg_paged_attention_plan_update(m->decode_plan, &table, s), "decode plan update");
    }
    if (!m->fusion_decided && (st = mg_fwd_decide_fusion(m, s)))
        return st;
    bool replay = m->c.use_graphs && m->decode_calls > 0 && !m->timing;
    m->decode_calls++;
    if (!replay) {
        if ((st = mg_fwd_timed_forward(m, s, false, B, m->decode_plan)) ||
            (st = mg_fwd_sampling_launch(m, s)))
            return st;
        return collect_tokens(m, s);
    }
    if (!m->graph) {
        TRY(mg_graph_begin_capture(s), "capturing the decode step");
        if ((st = mg_fwd_forward(m, s, false, B, m->decode_plan)) ||
            (st = mg_fwd_sampling_launch(m, s))) {
            mg_graph_abort_capture(s);
            return st;
        }
        TRY(mg_graph_end_capture(s, &m->graph), "capturing the decode step");
        size_t kernels = 0, nodes = 0;
        if (mg_graph_count_nodes(m->graph, &kernels, &nodes) == MG_OK) {
            m->graph_kernels = (uint32_t)kernels;
            m->graph_nodes = (uint32_t)nodes;
            count_layer_kernels(m, s);
        }
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
    if (!m->token_count)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "no pass has run: no logits yet");
    const size_t V = m->sh.vocab, P = m->logits_pitch, B = m->c.batch;
    const bool bf16 = m->format->bf16_logits;
    void *rows = malloc(B * P * (bf16 ? 2 : 4));
    if (!rows)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory for the logits");
    mg_status st = mg_copy_d2h(m->b, rows, m->logits, B * P * (bf16 ? 2 : 4));
    for (size_t r = 0; !st && r < B; r++)
        for (size_t j = 0; j < V; j++)
            out[r * V + j] = bf16 ? mg_bf16_to_f32(((const uint16_t *)rows)[r * P + j])
                                  : ((const float *)rows)[r * P + j];
    free(rows);
    return st ? mg_fwd_lib_fail(st, "reading the logits") : MG_OK;
}

static mg_status force_tokens_rank(mg_fwd *m, const int32_t *ids);

mg_status mg_fwd_force_tokens(mg_fwd *m, const int32_t *ids) {
    mg_status st = mg_fwd_tp_usable(m);
    if (st)
        return st;
    /* rank 0 checks the ids for every rank (all hold the same tokens and vocabulary): a refusal
     * changes nothing anywhere */
    if (!m->token_count)
        return mg_error_report(MG_ERR_INVALID_ARGUMENT, "no pass has run: no token to replace");
    for (uint32_t r = 0; r < m->c.batch; r++)
        if (ids[r] < 0 || (uint32_t)ids[r] >= m->sh.vocab)
            return mg_error_report(MG_ERR_INVALID_ARGUMENT,
                                   "forced token %d of request %u outside [0, %u)", ids[r], r,
                                   m->sh.vocab);
    /* a rank failing now leaves the ranks before it forced and the rest not: all stopped */
    uint32_t peers = 0;
    mg_fwd *const *peer = mg_fwd_tp_peers(m, &peers);
    if ((st = force_tokens_rank(m, ids)))
        return mg_fwd_tp_setter_failed(m, m->tp_rank, st, "forcing the tokens");
    for (uint32_t r = 0; r < peers; r++)
        if ((st = force_tokens_rank(peer[r], ids)))
            return mg_fwd_tp_setter_failed(m, peer[r]->tp_rank, st, "forcing the tokens");
    return MG_OK;
}

/* The checked ids into rank m's latest tokens. */
static mg_status force_tokens_rank(mg_fwd *m, const int32_t *ids) {
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
    out->decode_weight_bytes =
        m->weight_bytes - (m->lm_head == m->embedding ? 0 /* tied: the LM head reads it all */
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
    out->graph_kernels = m->graph_kernels;
    out->graph_nodes = m->graph_nodes;
    out->graph_outside_kernels = m->graph_outside_kernels;
    out->graph_layer_kernels = m->graph_layer_kernels;
    out->fused_decode = m->fused_decode;
    out->fused_qkv = m->fused_decode && m->qkv_mode != MG_FWD_QKV_APART;
    out->fused_kv_append = m->fused_decode && m->qkv_mode == MG_FWD_QKV_JOINED_APPEND;
    out->tp_ranks = m->tp_ranks;
    out->tp_rank = m->tp_rank;
}
