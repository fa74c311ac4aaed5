/*
 * metrale/arena.h - the per-model buffer arena: every intermediate tensor of a forward pass,
 * planned once, allocated once, and reused by every step.
 *
 *   mg_arena_plan *plan;
 *   mg_arena_plan_for_model(&shape, &limits, &plan);        // or mg_arena_plan_create + add
 *   mg_arena *arena;
 *   mg_arena_create(backend, plan, &arena);                 // the only device allocation(s)
 *   mg_arena_plan_destroy(plan);                            // the arena keeps its own copy
 *   mg_devptr qkv = mg_arena_ptr(arena, mg_arena_index(arena, "qkv"));
 *   ... every step, every layer: launch against the same addresses, capture graphs ...
 *   mg_arena_destroy(arena);                                // before mg_backend_close
 *
 * What a caller may rely on:
 *  - Addresses never change between mg_arena_create and mg_arena_release, so CUDA graphs
 *    captured against them stay valid. Nothing is allocated after creation.
 *  - A buffer of 0 bytes has address 0 (null) and occupies nothing; never dereference it.
 *  - Every buffer's address is a multiple of its alignment (default 256, any power of two
 *    up to 1 GiB) and [ptr, ptr + bytes) lies inside one device allocation.
 *  - Two buffers that are live at a common step never overlap. Buffers planned without a
 *    lifetime are live at every step, so they never share bytes with anything.
 *
 * Packing (design): a buffer with a lifetime [first_step, last_step] (inclusive) may share
 * bytes with buffers whose lifetimes do not intersect its own. Offsets are assigned by a
 * greedy interval packer: buffers are placed one at a time, each at the best gap among the
 * byte ranges of already placed buffers whose lifetimes intersect its own (or on top of
 * them). Several deterministic orders (largest first; largest size x lifetime first;
 * earliest first step first; most aligned first) and two gap rules (best fit: the smallest gap that
 * holds it; first fit: the lowest) are tried and the layout with the fewest total bytes is kept.
 * Finding the optimum is NP-hard (dynamic storage allocation); the summary reports the
 * lower bound peak_live_bytes (the most bytes live at one step) to show how close a layout is.
 *
 * Chunks: with a per-allocation limit (mg_arena_plan_set_max_chunk_bytes; 0 = none) the
 * layout is split into several chunks, each at most the limit, each one device allocation;
 * a buffer never straddles two chunks. A buffer larger than the limit is an error.
 *
 * Sizing from a model (mg_arena_plan_for_model) is described at that function.
 */
#ifndef METRALE_ARENA_H
#define METRALE_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_ARENA_DEFAULT_ALIGNMENT 256
#define MG_ARENA_MAX_ALIGNMENT (1ull << 30)
#define MG_ARENA_NAME_BYTES 48 /* names are at most 47 characters */

/* Inclusive range of forward-pass steps during which a buffer holds data someone will read. */
typedef struct mg_arena_lifetime {
    uint32_t first_step;
    uint32_t last_step; /* >= first_step */
} mg_arena_lifetime;

/* One buffer as planned and, after packing, where it lives. */
typedef struct mg_arena_buffer_info {
    const char *name; /* owned by the plan / arena */
    uint64_t bytes;
    uint64_t alignment;
    bool has_lifetime;          /* false: live at every step */
    mg_arena_lifetime lifetime; /* meaningful when has_lifetime */
    uint32_t chunk;             /* which device allocation (0 when bytes == 0) */
    uint64_t offset;            /* from the chunk's aligned base (0 when bytes == 0) */
    mg_devptr ptr;              /* arena only: the address; 0 in a plan, for 0 bytes, or released */
} mg_arena_buffer_info;

typedef struct mg_arena_summary {
    size_t buffer_count;
    uint64_t sum_bytes;       /* sum of all buffer sizes: the unpacked footprint */
    uint64_t arena_bytes;     /* sum of chunk sizes after packing */
    uint64_t peak_live_bytes; /* most bytes live at any one step: no layout can be smaller */
    uint64_t device_bytes;    /* what creation allocates: arena_bytes plus alignment slack
                                 for buffers aligned above 256 bytes */
    uint32_t chunk_count;
    uint64_t largest_chunk_bytes;
} mg_arena_summary;

/* ------------------------------------------------------------------ plans */

typedef struct mg_arena_plan mg_arena_plan;

MG_API mg_status mg_arena_plan_create(mg_arena_plan **out);
/* NULL is a no-op. */
MG_API void mg_arena_plan_destroy(mg_arena_plan *plan);

/* Adds a buffer. `name` is unique within the plan, 1..47 characters. `alignment` 0 means
 * MG_ARENA_DEFAULT_ALIGNMENT, otherwise a power of two <= MG_ARENA_MAX_ALIGNMENT.
 * `lifetime` NULL means live at every step (never shares). `bytes` may be 0 (a null buffer).
 * The buffer's index (its position in the plan, counting from 0) goes to *index_out when
 * that is not NULL. On error the plan is unchanged. */
MG_API mg_status mg_arena_plan_add(mg_arena_plan *plan, const char *name, uint64_t bytes,
                                   uint64_t alignment, const mg_arena_lifetime *lifetime,
                                   size_t *index_out);

/* Largest size of one device allocation; 0 (the default) is no limit. */
MG_API mg_status mg_arena_plan_set_max_chunk_bytes(mg_arena_plan *plan, uint64_t max_chunk_bytes);

MG_API size_t mg_arena_plan_count(const mg_arena_plan *plan);

/* Computes the layout (done implicitly by the queries below and by mg_arena_create; adding
 * a buffer or changing the chunk limit invalidates it). Fails when a buffer is larger than
 * the chunk limit (the message names it) or host memory runs out. */
MG_API mg_status mg_arena_plan_pack(mg_arena_plan *plan);
MG_API mg_status mg_arena_plan_summary(mg_arena_plan *plan, mg_arena_summary *out);
MG_API mg_status mg_arena_plan_buffer(mg_arena_plan *plan, size_t index, mg_arena_buffer_info *out);
/* Index of `name`; MG_ERR_NOT_FOUND (message names it) when there is none. */
MG_API mg_status mg_arena_plan_find(const mg_arena_plan *plan, const char *name, size_t *index_out);

/* Prints one line per buffer (index, name, bytes, alignment, lifetime, chunk, offset) and the
 * totals: sum, packed, ratio, peak live. Packs first. */
MG_API mg_status mg_arena_plan_print(mg_arena_plan *plan, FILE *f);

/* ------------------------------------------------------------------ arenas */

typedef struct mg_arena mg_arena;

/* Packs `plan` if needed, then takes the device memory: one mg_alloc_at(MG_ALLOC_ARENA) per
 * chunk, recorded in the ledger at the caller's file:line. If any allocation fails, every
 * chunk already taken is freed, *out stays NULL, and the message names the chunk, its bytes,
 * how many buffers it holds and the largest of them, followed by the backend's reason.
 * The arena copies what it needs: the plan may be destroyed afterwards. */
MG_API mg_status mg_arena_create_at(mg_backend *b, mg_arena_plan *plan, mg_arena **out,
                                    const char *file, int line);
#define mg_arena_create(b, plan, out) mg_arena_create_at((b), (plan), (out), __FILE__, __LINE__)

/* Frees the device memory; every address reads 0 afterwards. Idempotent: a second call (and
 * NULL) is a no-op returning MG_OK. Frees every chunk even when one free fails, and returns
 * the first failure. Call it before closing the backend. */
MG_API mg_status mg_arena_release(mg_arena *arena);
/* mg_arena_release, then frees the arena object itself. NULL is a no-op. */
MG_API mg_status mg_arena_destroy(mg_arena *arena);

MG_API size_t mg_arena_count(const mg_arena *arena);
/* Address of buffer `index`; 0 for a 0-byte buffer, an index out of range, or after release. */
MG_API mg_devptr mg_arena_ptr(const mg_arena *arena, size_t index);
/* Index of `name`, or SIZE_MAX when there is none (then mg_arena_ptr reads 0). */
MG_API size_t mg_arena_index(const mg_arena *arena, const char *name);
/* Address and size by name; MG_ERR_NOT_FOUND (message names it) when there is none. */
MG_API mg_status mg_arena_find(const mg_arena *arena, const char *name, mg_devptr *ptr_out,
                               uint64_t *bytes_out);
MG_API mg_status mg_arena_buffer(const mg_arena *arena, size_t index, mg_arena_buffer_info *out);
MG_API mg_status mg_arena_summary_get(const mg_arena *arena, mg_arena_summary *out);

/* ------------------------------------------------------------------ sizing from a model */

/* A decoder-only transformer. Dense when experts == 0; MoE when experts >= 2, with
 * `experts_per_token` (top-k) routed experts of `intermediate` each. */
typedef struct mg_model_shape {
    uint32_t hidden;   /* d_model */
    uint32_t heads;    /* query heads */
    uint32_t kv_heads; /* divides heads (GQA) */
    uint32_t head_dim;
    uint32_t intermediate;      /* MLP intermediate size (per expert for MoE) */
    uint32_t experts;           /* 0: dense */
    uint32_t experts_per_token; /* top-k; 0 when dense */
    uint32_t vocab;
} mg_model_shape;

/* The engine's limits for one forward pass. */
typedef struct mg_engine_limits {
    uint32_t max_batch_tokens; /* M: tokens in one forward pass */
    uint32_t max_seq_len;      /* longest sequence (prompt + output) */
    uint32_t kv_block_size;    /* tokens per KV-cache block */
    uint32_t max_batch_size;   /* sequences in one pass; also the decode rows */
    bool fp8_activations;      /* plan the FP8 activation-quantization scratch */
} mg_engine_limits;

/* Steps of the forward-pass timeline that lifetimes in a model plan refer to. The layer
 * body (ATTN_NORM .. MOE_COMBINE) repeats for every layer over the same buffers, so a buffer
 * is layer-local only when it is written and last read within one layer; anything read
 * across layers (positions, metadata, the residual) lives from EMBED through the layer body.
 * Dense models use the MLP_* steps, MoE models the MOE_* steps with the same numbers. */
typedef enum mg_model_step {
    MG_STEP_EMBED = 0,          /* inputs uploaded; token embedding -> residual */
    MG_STEP_ATTN_NORM = 1,      /* residual (+= proj_out) -> norm_out */
    MG_STEP_QKV_PROJ = 2,       /* norm_out -> qkv */
    MG_STEP_ROPE = 3,           /* qkv in place, positions */
    MG_STEP_KV_WRITE = 4,       /* k, v -> KV cache through slot_mapping */
    MG_STEP_ATTENTION = 5,      /* q + paged KV cache -> attn_out */
    MG_STEP_O_PROJ = 6,         /* attn_out -> proj_out */
    MG_STEP_MLP_NORM = 7,       /* residual += proj_out; -> norm_out */
    MG_STEP_MLP_GATE_UP = 8,    /* dense: norm_out -> gate_up */
    MG_STEP_MLP_ACT = 9,        /* dense: silu(gate) * up -> mlp_act */
    MG_STEP_MLP_DOWN = 10,      /* dense: mlp_act -> proj_out */
    MG_STEP_MOE_ROUTER = 8,     /* MoE: norm_out -> router_logits */
    MG_STEP_MOE_TOPK = 9,       /* router_logits -> topk_ids, topk_weights */
    MG_STEP_MOE_ALIGN = 10,     /* topk_ids -> sorted_token_ids, expert_offsets, group args */
    MG_STEP_MOE_PERMUTE = 11,   /* norm_out rows gathered -> moe_permuted */
    MG_STEP_MOE_GATE_UP = 12,   /* grouped GEMM -> moe_gate_up */
    MG_STEP_MOE_ACT = 13,       /* -> moe_act */
    MG_STEP_MOE_DOWN = 14,      /* grouped GEMM -> moe_down */
    MG_STEP_MOE_COMBINE = 15,   /* weighted sum of moe_down rows -> proj_out */
    MG_STEP_LOGITS_GATHER = 16, /* rows at logits_indices of residual + proj_out -> logits_hidden */
    MG_STEP_FINAL_NORM = 17,    /* logits_hidden in place */
    MG_STEP_LM_HEAD = 18,       /* logits_hidden -> logits */
    MG_STEP_SAMPLE = 19,        /* logits -> sampled_ids */
} mg_model_step;

/* Derived row counts, exposed so callers and tests agree on them. */
typedef struct mg_model_rows {
    uint64_t tokens;        /* M */
    uint64_t tokens_padded; /* ceil16(M): rows of every buffer cuBLASLt reads or writes */
    uint64_t decode_rows;   /* = max_batch_size: one sampled row per sequence */
    uint64_t logits_rows;   /* min(M, max(160, decode_rows + 1)): decode rows + 1 sampler row, at
                               least 160 */
    uint64_t logits_rows_padded; /* ceil16(logits_rows): the LM head is a cuBLASLt GEMM */
    uint64_t expert_rows;        /* MoE: ceil16(M * top_k + experts * 15): every expert's group
                                    padded to 16 rows; 0 when dense */
    uint64_t kv_blocks_per_seq;  /* ceil(max_seq_len / kv_block_size) */
    uint64_t attn_split_rows;    /* max(ceil16(M), 16 * max_batch_size): split-KV partials */
} mg_model_rows;

MG_API mg_status mg_model_rows_compute(const mg_model_shape *shape, const mg_engine_limits *limits,
                                       mg_model_rows *out);

/* Builds the plan of a forward pass. Element types: activations BF16; router logits, top-k
 * weights, logits and attention partials FP32; ids, indices and indptrs INT32, slot_mapping
 * INT64. Buffers (name: rows x columns, lifetime):
 *   input_ids M, [EMBED];  positions M, slot_mapping M (i64), seq_lens B, qo_indptr B+1,
 *   kv_indptr B+1, block_tables B x kv_blocks_per_seq, attn_plan (FlashInfer's int workspace,
 *   written once per pass by the host-side plan): [EMBED, MOE_COMBINE];
 *   logits_indices logits_rows: [EMBED, LOGITS_GATHER];
 *   residual M x hidden, proj_out Mp x hidden, cublaslt_workspace 32 MiB: whole pass;
 *   norm_out Mp x hidden [ATTN_NORM, MLP_GATE_UP] (MoE: to MOE_PERMUTE);
 *   qkv Mp x (heads + 2 kv_heads) head_dim [QKV_PROJ, ATTENTION];
 *   attn_out Mp x heads head_dim [ATTENTION, O_PROJ];
 *   attn_partial attn_split_rows x heads x (head_dim + 1) f32 [ATTENTION];
 *   dense: gate_up Mp x 2I [GATE_UP, ACT], mlp_act Mp x I [ACT, DOWN];
 *   MoE: router_logits Mp x E f32 [ROUTER, TOPK], topk_ids / topk_weights M x k
 *   [TOPK, COMBINE], sorted_token_ids expert_rows [ALIGN, COMBINE], expert_offsets E+1
 *   [ALIGN, MOE_DOWN], moe_group_args E x 128 bytes [ALIGN, MOE_DOWN], moe_permuted
 *   expert_rows x hidden [PERMUTE, GATE_UP], moe_gate_up expert_rows x 2I [GATE_UP, ACT],
 *   moe_act expert_rows x I [ACT, DOWN], moe_down expert_rows x hidden [DOWN, COMBINE];
 *   fp8 (only with fp8_activations): act_fp8 rows x K bytes and act_scales ceil(K/128) x rows
 *   f32 for the largest GEMM input, [QKV_PROJ, MLP_DOWN / MOE_DOWN];
 *   logits_hidden LRp x hidden [LOGITS_GATHER, LM_HEAD]; logits LRp x vocab f32
 *   [LM_HEAD, SAMPLE]; sampled_ids B [SAMPLE].
 * (Mp = tokens_padded, LRp = logits_rows_padded, B = max_batch_size.) The KV cache itself
 * is not in the arena: it is a separate block pool sized from free memory. The cuBLASLt
 * workspace is this arena's stream's own (one per stream; never shared across streams).
 * MG_ERR_INVALID_ARGUMENT names the bad field or the buffer whose size overflows. */
MG_API mg_status mg_arena_plan_for_model(const mg_model_shape *shape,
                                         const mg_engine_limits *limits, mg_arena_plan **out);

/* Built-in model presets (see arena_model.c for the engine limits they use). */
typedef struct mg_model_preset {
    const char *name; /* "llama-3-8b", "qwen3-30b-a3b" */
    const char *description;
    mg_model_shape shape;
    mg_engine_limits limits;
} mg_model_preset;

/* The presets, `*count` of them; never NULL. */
MG_API const mg_model_preset *mg_model_presets(size_t *count);
/* The preset named `name`, or NULL. */
MG_API const mg_model_preset *mg_model_preset_find(const char *name);

#ifdef __cplusplus
}
#endif
#endif
