/*
 * paged_decode_abi.h - what the split-KV decode kernels (kernels/cuda/attention/paged_decode.cu)
 * and their host side (src/ops/attention/attention_paged_decode.c) share: the kernels' one
 * parameter block, passed by value (mg_launch_arg_bytes), and the schedule's layout in device
 * memory. Plain C, fixed-width fields, no padding.
 *
 * The schedule (int32 words): word 0 the item count, words 1..3 zero; then the items, 12 words
 * each (mg_decode_item: self-contained, so a CTA starts with one round of loads).
 */
#ifndef METRALE_PAGED_DECODE_ABI_H
#define METRALE_PAGED_DECODE_ABI_H

#include <stdint.h>

/* The BF16 kernels (tensor cores): 4 warps, 16-row blocks, dynamic shared memory for the
 * warps' rings of key and value tiles (stages of 16 keys: 4 at head_dim 64, 3 at 128, 2 at
 * 256). */
#define MG_DECODE_MMA_THREADS 128u
#define MG_DECODE_MMA_ROWS 16u
#define MG_DECODE_MMA_SHARED_BYTES(head_dim)                                                       \
    ((head_dim) == 64 ? 65536u : (head_dim) == 128 ? 98304u : 131072u)
/* The FP8 kernels (CUDA cores): 8 warps, row blocks of 1, 2, 4 or 8 rows, each warp's ring of
 * copies in flight MG_DECODE_STAGES steps of 4 KiB (K and V). */
#define MG_DECODE_THREADS 256u
#define MG_DECODE_MAX_ROWS 8u
#define MG_DECODE_STAGES 3
/* The most chunks a merge group may have (the merging CTA keeps two floats per chunk and row in
 * shared memory). */
#define MG_DECODE_MAX_SPLITS 256u
#define MG_DECODE_SHARED_BYTES (8u * MG_DECODE_STAGES * 4096u)

/* One work item: a block of query rows of one request and one chunk of its keys, with the
 * request's numbers. */
typedef struct mg_decode_item {
    int32_t row_begin;   /* first row of the block among the request's qo_len * G rows */
    int32_t token_begin; /* the chunk: keys [token_begin, token_end) of the request */
    int32_t token_end;
    int32_t chunk;        /* index of the item in its merge group (consecutive items) */
    int32_t num_chunks;   /* items in the group: 1 means the item writes the output itself */
    int32_t partial_slot; /* split items: its index among them (the partials' slot); else -1 */
    int32_t qo_begin;     /* the request's first row of q and o (qo_indptr) */
    int32_t qo_len;       /* its new tokens */
    int32_t kv_len;       /* its cached tokens (the new ones included) */
    int32_t page_begin;   /* its first entry of kv_indices (kv_indptr of the page table) */
    int32_t reserved[2];
} mg_decode_item;

/* Word offset of the items in a schedule. */
#define MG_DECODE_ITEMS_OFFSET 4u

typedef struct mg_decode_params {
    uint64_t q, o, lse; /* BF16 [rows][Hq][D] in and out; FP32 [rows][Hq] or 0 */
    uint64_t k_pages, v_pages;
    uint64_t kv_indices;       /* int32 */
    uint64_t k_scale, v_scale; /* FP8 pools: FP32 [Hkv]; else 0 */
    uint64_t schedule;         /* int32 words, layout above */
    uint64_t partial_o;        /* FP32 [split items][Hkv][ROWS][D] */
    uint64_t partial_ml;       /* FP32 pairs (max, sum) [split items][Hkv][ROWS] */
    uint64_t counters;         /* uint32 [items][Hkv], zero between launches */
    uint32_t num_qo_heads, num_kv_heads, page_size;
    uint32_t page_div_mul, page_div_shift; /* t / page_size = (umulhi(t, mul) + t) >> shift */
    int32_t window_left;                   /* -1: none */
    float sm_scale, soft_cap;              /* soft_cap 0: none */
} mg_decode_params;

#endif
