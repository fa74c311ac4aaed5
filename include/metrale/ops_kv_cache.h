/*
 * metrale/ops_kv_cache.h - the paged KV cache: a page pool in one device allocation, a host-side
 * page allocator, the append op that writes new tokens' keys and values into their pages (with
 * optional RoPE on q and k), and attention over pages (decode: one query per request; prefill:
 * a chunk of new tokens attending to its cached prefix and itself, causal).
 *
 * The pool. Pages of `page_size` tokens (1..128), NHD inside a page: the K pool is
 * [num_pages][page_size][num_kv_heads][head_dim] elements, the V pool the same, right after it
 * in the caller's allocation (mg_kv_cache_bytes sizes it, e.g. for a model arena;
 * mg_kv_cache_pools splits it). Page p's token slot t of head h starts at element
 * ((p * page_size + t) * num_kv_heads + h) * head_dim of each pool.
 *
 * Elements are BF16 (kv_dtype MG_KV_BF16, the default) or FP8 E4M3 (MG_KV_FP8_E4M3: half the
 * bytes) with one FP32 scale per kv head for K and one for V, owned by the caller (FP32
 * [num_kv_heads] device arrays k_scale and v_scale, passed to append and to attention): the
 * stored code of a value x of head h is e4m3(x / scale[h]) (FP32 division, round to nearest
 * even, saturating to +-448), and it stands for code * scale[h]. Attention on CUDA serves
 * every head_dim the cache takes, fast at 64, 128 and 256 (see "attention over pages"); the CPU
 * backend serves every shape.
 *
 * The page table, owned by the engine, in CSR form for a batch of B requests:
 *   kv_indptr [B + 1]: request i owns kv_indices[kv_indptr[i] .. kv_indptr[i+1]), its pages in
 *                      token order (any pages of the pool, in any order, never shared);
 *   kv_last_page_len [B]: tokens in request i's last page, 1..page_size when it has pages
 *                      (ignored, conventionally 0, when it has none);
 *   so request i holds kv_len = (pages - 1) * page_size + last_page_len tokens (0 without pages).
 * For a step, qo_indptr [B + 1] (the append_indptr) delimits each request's new tokens; they are
 * the LAST qo_len tokens of the request, already counted in kv_len (the engine grows the page
 * table first, then appends, then attends).
 *
 *   mg_kv_cache_desc c = {.num_kv_heads = 8, .head_dim = 128, .page_size = 16, .num_pages = N};
 *   mg_kv_cache_bytes(&c, &bytes); mg_alloc(b, bytes, &pool); mg_kv_cache_pools(&c, pool, &k, &v);
 *   mg_kv_page_allocator *a; mg_kv_page_allocator_create(N, &a);
 *   mg_kv_page_alloc(a, 3, pages);               // MG_ERR_OUT_OF_MEMORY when exhausted
 *   mg_kv_append(b, s, &c, &append_args);         // capturable
 *   mg_paged_attention_plan_create(b, &d, &table, s, &plan);   // host arrays, not capturable
 *   mg_paged_attention_run(plan, &tensors, s);                  // capturable (fixed-grid plans)
 */
#ifndef METRALE_OPS_KV_CACHE_H
#define METRALE_OPS_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"
#include "metrale/ops_attention.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_KV_PAGE_SIZE_DEFAULT 16u
#define MG_KV_PAGE_SIZE_MAX 128u

/* The element type of the K and V pools. */
typedef enum mg_kv_dtype {
    MG_KV_BF16 = 0,     /* BF16, 2 bytes */
    MG_KV_FP8_E4M3 = 1, /* FP8 E4M3 with per-head FP32 scales, 1 byte */
} mg_kv_dtype;

typedef struct mg_kv_cache_desc {
    uint32_t num_kv_heads; /* > 0 */
    uint32_t head_dim;     /* a positive multiple of 16 up to 512 (CUDA attention: 64, 128,
                            * 256) */
    uint32_t page_size;    /* 1..128 tokens; 0 means MG_KV_PAGE_SIZE_DEFAULT */
    uint32_t num_pages;    /* > 0, < 2^31 */
    mg_kv_dtype kv_dtype;  /* MG_KV_BF16 (0) or MG_KV_FP8_E4M3 */
} mg_kv_cache_desc;

/* Bytes per pool element of `t` (2 or 1; 0 for an unknown value). */
MG_API size_t mg_kv_dtype_bytes(mg_kv_dtype t);

/* Bytes of the whole pool (K then V) of `d`; MG_ERR_INVALID_ARGUMENT naming the problem
 * for a bad descriptor or a size beyond size_t. */
MG_API mg_status mg_kv_cache_bytes(const mg_kv_cache_desc *d, size_t *bytes);

/* The K and V pools inside a pool allocation of mg_kv_cache_bytes at `pool`. */
MG_API mg_status mg_kv_cache_pools(const mg_kv_cache_desc *d, mg_devptr pool, mg_devptr *k_pages,
                                   mg_devptr *v_pages);

/* ------------------------------------------------------------------ host page allocator
 * Pages 0..num_pages-1 on a free list (LIFO: recently freed pages are reused first). Not
 * thread-safe: one engine thread owns an allocator. */
typedef struct mg_kv_page_allocator mg_kv_page_allocator;

MG_API mg_status mg_kv_page_allocator_create(uint32_t num_pages, mg_kv_page_allocator **out);
MG_API void mg_kv_page_allocator_destroy(mg_kv_page_allocator *a);
/* Takes `count` pages into pages[0..count): all or nothing. When fewer are free it returns
 * MG_ERR_OUT_OF_MEMORY naming both counts and takes none. */
MG_API mg_status mg_kv_page_alloc(mg_kv_page_allocator *a, uint32_t count, int32_t *pages);
/* Returns pages to the free list: all or nothing; a page out of range, already free, or listed
 * twice is MG_ERR_INVALID_ARGUMENT and frees none. */
MG_API mg_status mg_kv_page_free(mg_kv_page_allocator *a, uint32_t count, const int32_t *pages);
MG_API uint32_t mg_kv_page_free_count(const mg_kv_page_allocator *a);

/* Host-side validation of a page table (what the plan and the CPU backend check): indptrs start
 * at 0 and never decrease, every index is in [0, num_pages), every last-page length of a request
 * with pages is 1..page_size, and qo_len <= kv_len. `kv_indices` may be NULL (not checked);
 * `qo_indptr` may be NULL (no new tokens). MG_ERR_INVALID_ARGUMENT naming the first problem. */
typedef struct mg_kv_page_table {
    uint32_t batch_size;
    const int32_t *qo_indptr;        /* [B + 1] new tokens per request (append_indptr) */
    const int32_t *kv_indptr;        /* [B + 1] pages per request */
    const int32_t *kv_indices;       /* [kv_indptr[B]] page ids */
    const int32_t *kv_last_page_len; /* [B] */
} mg_kv_page_table;

MG_API mg_status mg_kv_page_table_check(const mg_kv_cache_desc *d, const mg_kv_page_table *t,
                                        const char *fn);

/* ------------------------------------------------------------------ append
 * Writes the keys and values of num_tokens new tokens into their pages. Token t belongs to the
 * request r with qo_indptr[r] <= t < qo_indptr[r+1]; it is that request's token at kv position
 * pos = kv_len(r) - qo_len(r) + (t - qo_indptr[r]) and goes to page
 * kv_indices[kv_indptr[r] + pos / page_size], slot pos % page_size.
 *
 * RoPE (rope = true): Llama's rotate-half form on q (in place, num_qo_heads heads per row) and
 * on k (as it is written): for i < head_dim / 2, with f = rope_inv_freq[i] when the caller
 * gives that table (a scaled RoPE, e.g. mg_rope_inv_freq_llama3's), else
 * f = rope_theta^(-2i / head_dim) (FP32 powf), and a = position * f: x[i]' = x[i] cos a - x[i +
 * D/2] sin a, x[i + D/2]' = x[i + D/2] cos a + x[i] sin a, in FP32, rounded to BF16 once. position
 * = positions[t] when given, else pos. FP8 pools: k (rotated, in FP32) and v are quantized as above
 * instead of rounded to BF16; q stays BF16. The CPU backend checks every scale (finite, > 0) before
 * writing; CUDA uses them as given (a zero scale stores saturated or NaN codes).
 *
 * The page table arrays are device arrays here (the engine's). The CPU backend checks all of
 * them before writing anything (MG_ERR_INVALID_ARGUMENT); the CUDA kernel cannot without a
 * sync: it skips every token whose page entry is out of range (nothing is written out of the
 * pool), so validate on the host (mg_kv_page_table_check) when tables are built.
 * The pages share no byte with k, v, q, positions, the scales or the page table
 * (MG_ERR_INVALID_ARGUMENT naming both); q, rewritten in place, may share rows with k and v
 * (a fused QKV matrix with strides). Capturable; asynchronous. */
typedef struct mg_kv_append_args {
    /* num_tokens: rows of k, v (and q) available, >= qo_indptr[batch_size], which the kernel
     * reads on the device: a captured append serves later batches within this capacity. */
    uint32_t batch_size, num_tokens;
    uint32_t num_kv_indices;         /* entries of kv_indices (kv_indptr[batch_size]) */
    mg_devptr k, v;                  /* BF16 [num_tokens] rows of num_kv_heads * head_dim */
    uint32_t k_stride, v_stride;     /* row strides in elements (multiples of 8; 0: packed) */
    mg_devptr q;                     /* rope only: BF16 rows of num_qo_heads * head_dim, or 0 */
    uint32_t q_stride, num_qo_heads; /* rope with q */
    mg_devptr positions;             /* int32 [num_tokens], or 0: the kv position */
    bool rope;
    float rope_theta;        /* > 0, e.g. 10000 or 500000 (not read when rope_inv_freq is given) */
    mg_devptr rope_inv_freq; /* rope: FP32 [head_dim / 2] frequencies, device memory, or 0 */
    mg_devptr qo_indptr, kv_indptr, kv_indices, kv_last_page_len; /* int32, device */
    mg_devptr k_pages, v_pages;                                   /* mg_kv_cache_pools */
    mg_devptr k_scale, v_scale; /* FP8 pools: FP32 [num_kv_heads], finite and > 0; else 0 */
} mg_kv_append_args;

MG_API mg_status mg_kv_append(mg_backend *b, mg_stream *s, const mg_kv_cache_desc *cache,
                              const mg_kv_append_args *args);

/* Llama 3.1's scaled RoPE (a Hugging Face config's "rope_scaling" of rope_type "llama3") as a
 * table for rope_inv_freq: out[i] for i < head_dim / 2, from f = rope_theta^(-2i / head_dim)
 * and its wavelength w = 2 pi / f (in double): f where w < original_max_positions /
 * high_freq_factor, f / factor where w > original_max_positions / low_freq_factor, and between
 * them (1 - s) f / factor + s f with s = (original_max_positions / w - low_freq_factor) /
 * (high_freq_factor - low_freq_factor); each rounded to FP32 once. head_dim even (<= 512),
 * rope_theta > 0, factor >= 1, 0 < low_freq_factor < high_freq_factor, and
 * original_max_positions >= 1, else MG_ERR_INVALID_ARGUMENT. Host memory only; no backend. */
MG_API mg_status mg_rope_inv_freq_llama3(uint32_t head_dim, float rope_theta, float factor,
                                         float low_freq_factor, float high_freq_factor,
                                         uint32_t original_max_positions, float *out);

/* ------------------------------------------------------------------ attention over pages
 * Causal (bottom-right aligned) attention of each request's qo_len new tokens over its kv_len
 * cached tokens (which include them): decode is qo_len = 1, prefill of a chunk qo_len > 1 (a
 * request with qo_len = 0 is skipped). Semantics as metrale/ops_attention.h with causal = true,
 * plus an optional logits soft-cap c > 0: scores s = sm_scale q.k become c * tanh(s / c) before
 * the softmax (the LSE is of those). CUDA, three providers (mg_op_force_provider picks one):
 *  - "flashinfer", chosen where built: FlashInfer's paged kernels (split-KV, so a small batch
 *    still fills the GPU), page_size as the cache, for BF16 pools at head_dim 128 and 256 (with
 *    or without soft-cap) and 64 (without), and FP8 pools at head_dim 128 without soft-cap;
 *  - "split_kv_decode", for the rest of head_dim 64, 128 and 256 (BF16 at 64 with soft-cap; FP8
 *    at 64 or 256, or with soft-cap): metrale's split-KV decode kernels, one launch per run
 *    (tensor cores on BF16 pools, CUDA cores on FP8). They compute any batch, but a request's
 *    rows 16 (BF16) or 1-8 (FP8) at a time, each block reading all its keys: made for decode
 *    and short chunks, slow for long prefill chunks;
 *  - "kernels", for every other head_dim (16, 48, 80, 96, ... up to 512) and any pool, window
 *    and soft-cap: metrale's by-row kernels, one CTA per query row and head over all its keys
 *    (kernels/cuda/attention/attention_by_row.cu). Correct on any shape, not fast: a decode
 *    step runs only num_qo_heads CTAs per request. Never chosen for a plan that demands FA2
 *    or FA3 (desc.impl): that is MG_ERR_UNSUPPORTED where FlashInfer lacks the path.
 * CPU: the reference, any shape. FP8
 * pools: scores use k = code * k_scale[h], outputs v = code * v_scale[h].
 *
 * Plans follow mg_attention_plan (create / update / destroy / get_info / flops work on them):
 * plan on the host from the host page table (its kv_indices may be NULL: only counts matter),
 * which is validated; the plan uploads qo_indptr, kv_indptr and kv_last_page_len itself, so a
 * run reads only kv_indices from the caller's device memory. Fixed-grid plans (graph_qo_rows >
 * 0, graph_kv_tokens > 0): runs are capturable, and after an update with the same batch_size
 * (pages and lengths may change, totals within the capacities) a replay computes the new batch.
 * Caller-owned workspace, as for ragged plans (metrale/ops_attention.h): set desc.workspace /
 * desc.workspace_bytes to device memory of the plan's backend (16-byte aligned, at least
 * mg_paged_attention_workspace_bytes for the page table it is created with: else
 * MG_ERR_INVALID_ARGUMENT naming both sizes), and a provider that takes one carves every
 * device buffer of the plan out of it and allocates no device memory of its own (create,
 * update and run leave the allocation ledger unchanged; the plan writes the range from create
 * until destroy, never grows it, never frees it). The CPU reference takes one (its device copy
 * of the four page-table indptr arrays). CUDA's providers do not yet: for them
 * mg_paged_attention_workspace_bytes reports 0 and the plan keeps its own workspaces, exactly
 * as with desc.workspace 0, so a caller sizing an arena from that answer stays correct.
 *
 * FlashInfer's paths on CUDA (desc.impl; mg_attention_plan_get_info says which one a plan took,
 * AUTO for a "split_kv_decode" plan): FA2 serves every shape FlashInfer is built for. FA3
 * (FlashInfer's Hopper paged prefill) is built for BF16 pools at head_dim 128 without soft-cap, any
 * page size, with or without a sliding window, and runs on compute capability 9.0 only;
 * MG_ATTENTION_IMPL_FA3 elsewhere (or for another shape, or a batch too large for its per-head
 * schedule) is MG_ERR_UNSUPPORTED when planned. MG_ATTENTION_IMPL_AUTO (0, the default) takes FA3
 * where it can serve the plan and the batch is prefill-like: at least 128 query rows per request on
 * average (qo_indptr[B] over the requests with new tokens, or a fixed-grid plan's graph_qo_rows /
 * B, decided once at creation); decode and short chunks stay on FA2, whose split-KV schedule and
 * packed GQA heads suit them. A fixed-grid plan keeps the path it was created with. The CPU backend
 * ignores impl (its reference serves every plan). */
typedef struct mg_paged_attention_desc {
    uint32_t num_qo_heads, num_kv_heads, head_dim;
    uint32_t page_size;       /* as the cache (0: default 16) */
    int32_t window_left;      /* -1: none; else query at p sees keys p - w .. p */
    float sm_scale;           /* finite, > 0 */
    float logits_soft_cap;    /* 0: none; else finite > 0 */
    uint32_t graph_qo_rows;   /* 0: eager; else q/o capacity in rows (fixed-grid) */
    uint32_t graph_kv_tokens; /* fixed-grid: bound on the planned kv tokens */
    mg_kv_dtype kv_dtype;     /* as the cache */
    mg_attention_impl impl;   /* 0 (AUTO): see above; FA2 or FA3 demands that path (CUDA) */
    /* Caller-owned device workspace (see above), or 0 (and workspace_bytes 0): the plan
     * allocates its own. Not owned by the plan: never grown, never freed by it. */
    mg_devptr workspace;
    size_t workspace_bytes;
} mg_paged_attention_desc;

typedef struct mg_paged_attention_tensors {
    mg_devptr q, o;             /* BF16 [qo_rows, num_qo_heads, head_dim], 16-byte aligned */
    mg_devptr lse;              /* FP32 [qo_rows, num_qo_heads] base-2, or 0 */
    uint32_t qo_rows;           /* the plan's qo total (fixed-grid: the capacity) */
    mg_devptr k_pages, v_pages; /* mg_kv_cache_pools */
    uint32_t num_pages;         /* pages in each pool */
    mg_devptr kv_indices;       /* int32 device array, num_kv_indices entries */
    uint32_t num_kv_indices;    /* >= the planned kv_indptr[batch_size] */
    mg_devptr k_scale, v_scale; /* FP8 plans: FP32 [num_kv_heads] (as append); else 0 */
} mg_paged_attention_tensors;

/* The device workspace bytes a paged plan of `d` created with `table` carves out of a caller's
 * workspace (pass at least that as d->workspace_bytes): 0 when the provider chosen for `d`
 * takes no caller workspace (it then allocates its own). For a fixed-grid plan it is all the
 * plan ever uses; an eager plan's later tables of more requests may need more. Validates like
 * mg_paged_attention_plan_create; d->workspace and workspace_bytes are ignored; host-only. */
MG_API mg_status mg_paged_attention_workspace_bytes(mg_backend *b, const mg_paged_attention_desc *d,
                                                    const mg_kv_page_table *table, size_t *bytes);
MG_API mg_status mg_paged_attention_plan_create(mg_backend *b, const mg_paged_attention_desc *d,
                                                const mg_kv_page_table *table, mg_stream *s,
                                                mg_attention_plan **out);
MG_API mg_status mg_paged_attention_plan_update(mg_attention_plan *p, const mg_kv_page_table *table,
                                                mg_stream *s);
/* Launches the planned attention. The CPU backend checks every planned kv_indices entry
 * against num_pages before computing; CUDA trusts them (validate tables on the host). */
MG_API mg_status mg_paged_attention_run(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                                        mg_stream *s);

#ifdef __cplusplus
}
#endif
#endif
