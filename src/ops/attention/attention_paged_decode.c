/* attention_paged_decode.c - the "split_kv_decode" provider of the paged attention op on CUDA:
 * metrale's own split-KV decode kernels (kernels/cuda/attention/paged_decode_mma.cu for BF16
 * pools, tensor cores; paged_decode.cu for FP8 pools, CUDA cores; the shared layouts are in
 * kernels/cuda/common/paged_decode_abi.h).
 *
 * When it is chosen: after FlashInfer in the op's order, so for the shapes FlashInfer's paged
 * kernels are not built for (BF16 head_dim 64 with soft-cap; FP8 pools at head_dim 64 or 256,
 * or with soft-cap), at head_dim 64, 128 or 256, any GQA group, window and soft-cap; or when
 * forced by name (mg_op_force_provider). On the H200, FlashInfer's kernels are as fast or
 * faster on the shapes it has (bench/results/2026-12-01-h200-paged-decode.md). The kernels
 * compute any batch, but they take a request's rows 16 at a time (BF16) or 1..8 at a time
 * (FP8), each block reading all of its keys: built for decode (one new token per request,
 * or a few), they are slow for long prefill chunks.
 *
 * Planning (host). The batch's query rows (qo_len x G per request and KV head) are cut into
 * blocks of ROWS rows (BF16: 16, one MMA tile; FP8: the smallest of 1, 2, 4, 8 that holds a GQA
 * group); each block's visible keys are cut into chunks of one size, chosen by a small cost
 * model over powers of two from MIN_CHUNK keys (waves of CTAs x chunk length, plus the merge),
 * so a small batch still spreads over every SM. The schedule (the items, each with its
 * request's numbers) is uploaded with a stream-ordered copy; the kernel merges split chunks
 * itself, in the same launch.
 *
 * Fixed-grid plans (graph capture) launch a fixed grid whose CTAs walk the items with a stride,
 * and hold buffers sized at creation for the capacities (graph_qo_rows rows, and chunk splits
 * for two waves of CTAs); an update picks the best chunk size whose splits fit, and the
 * unsplit schedule always fits, so every batch within the capacities is accepted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_provider.h"
#include "backend_impl.h"
#include "error.h"
#include "op_builtin.h"
#include "paged_decode_abi.h"

#define WHAT "paged decode attention"
#define MIN_CHUNK 128u
/* The cost model's constants, in keys streamed by one CTA: a CTA's fixed latency (its q, the
 * first copies' round trip, the end of the item), and a merge's per chunk. */
#define ITEM_OVERHEAD_KEYS 128u
#define MERGE_KEYS_PER_CHUNK 8u

typedef struct decode_plan {
    char kernel[40];
    uint32_t rows;         /* the kernel's row-block size */
    uint32_t threads;      /* per CTA */
    uint32_t shared_bytes; /* dynamic shared memory per CTA */
    uint32_t slots;        /* CTAs the GPU runs at once */
    uint32_t div_mul, div_shift;
    bool fixed;
    uint32_t grid_x; /* fixed-grid plans: the captured grid's x; eager: items of the plan */
    uint32_t num_items;
    /* Device buffers and their capacities (items; bytes of the schedule). */
    mg_devptr schedule, partial_o, partial_ml, counters;
    size_t schedule_bytes;
    uint32_t item_capacity, partial_capacity;
    /* Host staging of the schedule. */
    int32_t *host;
    size_t host_bytes;
} decode_plan;

static bool head_dim_built(uint32_t d) {
    return d == 64 || d == 128 || d == 256;
}

static uint32_t rows_for_group(uint32_t group) {
    return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : MG_DECODE_MAX_ROWS;
}

/* (umulhi(t, mul) + t) >> shift == t / d for t < 2^31 and 1 <= d <= 2^31. */
static void division_magic(uint32_t d, uint32_t *mul, uint32_t *shift) {
    uint32_t l = 0;
    while ((1ull << l) < d)
        l++;
    *mul = (uint32_t)(((1ull << 32) * ((1ull << l) - d)) / d + 1);
    *shift = l;
}

/* One row block of a request: its request, first row and visible key range [lo, hi). */
typedef struct row_block {
    int32_t request, row_begin, lo, hi;
} row_block;

/* The row blocks of the batch (malloc'ed; count in *count). */
static mg_status make_row_blocks(const mg_attention_plan *p, const int32_t *qo_indptr,
                                 const int32_t *kv_indptr, uint32_t batch, uint32_t rows,
                                 row_block **out, uint32_t *count) {
    const uint32_t group = p->desc.num_qo_heads / p->desc.num_kv_heads;
    uint64_t blocks = 0;
    for (uint32_t r = 0; r < batch; r++)
        blocks += ((uint64_t)(qo_indptr[r + 1] - qo_indptr[r]) * group + rows - 1) / rows;
    *out = NULL;
    *count = 0;
    if (blocks > INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %llu row blocks are too many", WHAT,
                        (unsigned long long)blocks);
    row_block *b = malloc(sizeof *b * (blocks ? blocks : 1));
    if (!b)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", WHAT);
    uint32_t n = 0;
    for (uint32_t r = 0; r < batch; r++) {
        const int64_t qo_len = qo_indptr[r + 1] - qo_indptr[r];
        const int64_t kv_len = kv_indptr[r + 1] - kv_indptr[r];
        const int64_t total_rows = qo_len * group;
        for (int64_t first = 0; first < total_rows; first += rows) {
            const int64_t last = first + rows < total_rows ? first + rows - 1 : total_rows - 1;
            const int64_t first_token = first / group, last_token = last / group;
            int64_t lo = kv_len - qo_len + first_token - p->desc.window_left;
            if (p->desc.window_left < 0 || lo < 0)
                lo = 0;
            b[n++] = (row_block){(int32_t)r, (int32_t)first, (int32_t)lo,
                                 (int32_t)(kv_len - qo_len + last_token + 1)};
        }
    }
    *out = b;
    *count = n;
    return MG_OK;
}

/* Items and split items (those of groups of more than one chunk) of chunk size `chunk`. */
static void count_items(const row_block *b, uint32_t n, uint64_t chunk, uint64_t *items,
                        uint64_t *split) {
    *items = *split = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t len = (uint64_t)(b[i].hi - b[i].lo);
        const uint64_t c = len ? (len + chunk - 1) / chunk : 1;
        *items += c;
        if (c > 1)
            *split += c;
    }
}

/* The chunk size: the cheapest power of two times MIN_CHUNK under the cost model (whole waves
 * of CTAs times the longest item, plus the merge reads of the widest group), among those
 * within the capacities (0: unbounded); the unsplit schedule is the last candidate. */
static uint64_t choose_chunk(const decode_plan *c, const row_block *b, uint32_t n,
                             uint32_t kv_heads, uint64_t item_capacity, uint64_t partial_capacity) {
    uint64_t longest = 1;
    for (uint32_t i = 0; i < n; i++)
        if ((uint64_t)(b[i].hi - b[i].lo) > longest)
            longest = (uint64_t)(b[i].hi - b[i].lo);
    uint64_t best = longest, best_cost = UINT64_MAX;
    /* A merge group has at most MG_DECODE_MAX_SPLITS chunks. */
    uint64_t smallest = MIN_CHUNK;
    while ((longest + smallest - 1) / smallest > MG_DECODE_MAX_SPLITS)
        smallest *= 2;
    for (uint64_t chunk = smallest;; chunk *= 2) {
        const uint64_t size = chunk < longest ? chunk : longest;
        uint64_t items, split;
        count_items(b, n, size, &items, &split);
        const bool fits = (!item_capacity || items <= item_capacity) &&
                          (!partial_capacity || split <= partial_capacity);
        if (fits) {
            const uint64_t waves = (items * kv_heads + c->slots - 1) / c->slots;
            const uint64_t widest = (longest + size - 1) / size;
            const uint64_t cost = waves * (size + ITEM_OVERHEAD_KEYS) +
                                  (widest > 1 ? MERGE_KEYS_PER_CHUNK * widest : 0);
            if (cost < best_cost)
                best = size, best_cost = cost;
        }
        if (size == longest)
            break;
    }
    return best;
}

static void free_buffers(mg_backend *b, decode_plan *c) {
    mg_free(b, c->schedule);
    mg_free(b, c->partial_o);
    mg_free(b, c->partial_ml);
    mg_free(b, c->counters);
    c->schedule = c->partial_o = c->partial_ml = c->counters = 0;
    c->schedule_bytes = 0;
    c->item_capacity = c->partial_capacity = 0;
}

/* Allocates the device buffers for `items` items (of which `partials` may be split); the
 * counters start at zero (stream `s`). Replaces older buffers only
 * after `s` has drained (earlier runs may still read them). */
static mg_status ensure_buffers(mg_attention_plan *p, decode_plan *c, uint64_t items,
                                uint64_t partials, mg_stream *s) {
    const size_t schedule_bytes =
        sizeof(int32_t) * MG_DECODE_ITEMS_OFFSET + sizeof(mg_decode_item) * (items ? items : 1);
    if (schedule_bytes <= c->schedule_bytes && items <= c->item_capacity &&
        partials <= c->partial_capacity)
        return MG_OK;
    const mg_attention_desc *d = &p->desc;
    const size_t per_item = (size_t)d->num_kv_heads * c->rows;
    const size_t slots_p = partials ? partials : 1, slots_i = items ? items : 1;
    decode_plan grown = *c;
    grown.schedule = grown.partial_o = grown.partial_ml = grown.counters = 0;
    mg_status st = mg_alloc_owned_at(p->backend, schedule_bytes, MG_ALLOC_DEVICE, &grown.schedule,
                                     __FILE__, __LINE__);
    if (!st)
        st = mg_alloc_owned_at(p->backend, 4 * slots_p * per_item * d->head_dim, MG_ALLOC_DEVICE,
                               &grown.partial_o, __FILE__, __LINE__);
    if (!st)
        st = mg_alloc_owned_at(p->backend, 8 * slots_p * per_item, MG_ALLOC_DEVICE,
                               &grown.partial_ml, __FILE__, __LINE__);
    if (!st)
        st = mg_alloc_owned_at(p->backend, 4 * slots_i * d->num_kv_heads, MG_ALLOC_DEVICE,
                               &grown.counters, __FILE__, __LINE__);
    if (!st)
        st = mg_memset_async(p->backend, grown.counters, 0, 4 * slots_i * d->num_kv_heads, s);
    if (!st && c->schedule)
        st = mg_stream_synchronize(s ? s : mg_stream_default(p->backend));
    if (st) {
        free_buffers(p->backend, &grown);
        return st;
    }
    free_buffers(p->backend, c);
    c->schedule = grown.schedule;
    c->partial_o = grown.partial_o;
    c->partial_ml = grown.partial_ml;
    c->counters = grown.counters;
    c->schedule_bytes = schedule_bytes;
    c->item_capacity = (uint32_t)slots_i;
    c->partial_capacity = (uint32_t)slots_p;
    return MG_OK;
}

static mg_status decode_init(mg_attention_plan *p, decode_plan *c, uint32_t batch, mg_stream *s) {
    const mg_attention_desc *d = &p->desc;
    mg_device_info info;
    mg_status st = mg_device_get_info(p->backend, &info);
    if (st)
        return st;
    const uint32_t sms = (uint32_t)(info.multiprocessors > 0 ? info.multiprocessors : 1);
    if (p->kv_dtype == MG_KV_FP8_E4M3) {
        /* CUDA cores, 256 threads: one CTA per SM at the larger row blocks (registers), two
         * below. */
        c->rows = rows_for_group(d->num_qo_heads / d->num_kv_heads);
        c->threads = MG_DECODE_THREADS;
        c->shared_bytes = MG_DECODE_SHARED_BYTES;
        c->slots = sms * (c->rows <= 2 ? 2u : 1u);
        snprintf(c->kernel, sizeof c->kernel, "paged_decode_fp8_d%u_r%u", d->head_dim, c->rows);
    } else {
        /* Tensor cores, 128 threads, 16-row blocks; CTAs per SM bounded by shared memory (the
         * rings: 64, 96 or 128 KiB of the SM's 228). */
        c->rows = MG_DECODE_MMA_ROWS;
        c->threads = MG_DECODE_MMA_THREADS;
        c->shared_bytes = MG_DECODE_MMA_SHARED_BYTES(d->head_dim);
        c->slots = sms * (d->head_dim == 64 ? 3u : d->head_dim == 128 ? 2u : 1u);
        snprintf(c->kernel, sizeof c->kernel, "paged_decode_bf16_d%u", d->head_dim);
    }
    division_magic(p->page_size, &c->div_mul, &c->div_shift);
    c->fixed = d->graph_qo_rows != 0;
    if (c->fixed) {
        /* Capacities: the row blocks of graph_qo_rows rows over `batch` requests, plus split
         * chunks for two waves of CTAs. */
        const uint32_t group = d->num_qo_heads / d->num_kv_heads;
        const uint64_t blocks =
            ((uint64_t)d->graph_qo_rows * group + c->rows - 1) / c->rows + batch;
        const uint64_t partials = 2ull * c->slots / d->num_kv_heads + 2ull * batch;
        c->grid_x = (c->slots + d->num_kv_heads - 1) / d->num_kv_heads;
        if (blocks + partials > INT32_MAX)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the fixed-grid capacities are too large",
                            WHAT);
        return ensure_buffers(p, c, blocks + partials, partials, s);
    }
    return MG_OK;
}

static mg_status decode_plan_batch(mg_attention_plan *p, const int32_t *qo_indptr,
                                   const int32_t *kv_indptr, uint32_t batch, mg_stream *s) {
    decode_plan *c = p->impl;
    const bool first = !c;
    mg_status st;
    if (first) {
        if (!(c = calloc(1, sizeof *c)))
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", WHAT);
        p->impl = c;
        if ((st = decode_init(p, c, batch, s)))
            return st;
    }
    row_block *blocks;
    uint32_t n;
    if ((st = make_row_blocks(p, qo_indptr, kv_indptr, batch, c->rows, &blocks, &n)))
        return st;
    const uint32_t kv_heads = p->desc.num_kv_heads;
    const uint64_t chunk = choose_chunk(c, blocks, n, kv_heads, c->fixed ? c->item_capacity : 0,
                                        c->fixed ? c->partial_capacity : 0);
    uint64_t items, split;
    count_items(blocks, n, chunk, &items, &split);
    if (c->fixed && (items > c->item_capacity || split > c->partial_capacity)) {
        free(blocks);
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: this batch needs %llu work items, more than the fixed-grid plan's "
                        "%u (its graph_qo_rows); the plan keeps its previous batch",
                        mg_attention_plan_fn(p), (unsigned long long)items, c->item_capacity);
    }
    if (!c->fixed && (st = ensure_buffers(p, c, items, split, s))) {
        free(blocks);
        return st;
    }
    /* The schedule, staged on the host. */
    const size_t words = MG_DECODE_ITEMS_OFFSET + sizeof(mg_decode_item) / 4 * (size_t)items;
    if (words * 4 > c->host_bytes) {
        int32_t *grown = realloc(c->host, words * 4);
        if (!grown) {
            free(blocks);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", WHAT);
        }
        c->host = grown;
        c->host_bytes = words * 4;
    }
    int32_t *h = c->host;
    memset(h, 0, 4 * MG_DECODE_ITEMS_OFFSET);
    h[0] = (int32_t)items;
    mg_decode_item *item = (mg_decode_item *)(h + MG_DECODE_ITEMS_OFFSET);
    int32_t partial_slot = 0;
    for (uint32_t i = 0; i < n; i++) {
        const row_block *b = &blocks[i];
        const int64_t len = b->hi - b->lo;
        const int32_t chunks = len ? (int32_t)((len + (int64_t)chunk - 1) / (int64_t)chunk) : 1;
        for (int32_t k = 0; k < chunks; k++) {
            const int64_t begin = b->lo + (int64_t)k * (int64_t)chunk;
            const int64_t end = begin + (int64_t)chunk < b->hi ? begin + (int64_t)chunk : b->hi;
            const uint32_t r = (uint32_t)b->request;
            *item++ = (mg_decode_item){.row_begin = b->row_begin,
                                       .token_begin = (int32_t)begin,
                                       .token_end = (int32_t)end,
                                       .chunk = k,
                                       .num_chunks = chunks,
                                       .partial_slot = chunks > 1 ? partial_slot++ : -1,
                                       .qo_begin = qo_indptr[r],
                                       .qo_len = qo_indptr[r + 1] - qo_indptr[r],
                                       .kv_len = kv_indptr[r + 1] - kv_indptr[r],
                                       .page_begin = p->new_page_indptr[r]};
        }
    }
    free(blocks);
    st = mg_copy_h2d_async(p->backend, c->schedule, h, words * 4, s);
    if (st) {
        p->usable = false; /* part of the new schedule may have landed */
        return st;
    }
    c->num_items = (uint32_t)items;
    if (!c->fixed)
        c->grid_x = (uint32_t)items;
    return MG_OK;
}

static mg_status decode_run_paged(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                                  mg_stream *s) {
    decode_plan *c = p->impl;
    if (!c->fixed && !c->num_items)
        return MG_OK; /* no request has a new token */
    const mg_attention_desc *d = &p->desc;
    const mg_decode_params params = {
        .q = t->q,
        .o = t->o,
        .lse = t->lse,
        .k_pages = t->k_pages,
        .v_pages = t->v_pages,
        .kv_indices = t->kv_indices,
        .k_scale = t->k_scale,
        .v_scale = t->v_scale,
        .schedule = c->schedule,
        .partial_o = c->partial_o,
        .partial_ml = c->partial_ml,
        .counters = c->counters,
        .num_qo_heads = d->num_qo_heads,
        .num_kv_heads = d->num_kv_heads,
        .page_size = p->page_size,
        .page_div_mul = c->div_mul,
        .page_div_shift = c->div_shift,
        .window_left = d->window_left,
        .sm_scale = d->sm_scale,
        .soft_cap = p->logits_soft_cap,
    };
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){c->grid_x, d->num_kv_heads, 1}, (mg_dim3){c->threads, 1, 1},
                   c->shared_bytes);
    mg_launch_arg_bytes(&l, &params, sizeof params);
    const char *kernel = c->kernel;
    return mg_op_launch_kernels(p->backend, s, &kernel, &l, 1);
}

static void decode_release(mg_attention_plan *p, bool backend_live) {
    decode_plan *c = p->impl;
    if (!c)
        return;
    if (backend_live)
        free_buffers(p->backend, c);
    free(c->host);
    free(c);
    p->impl = NULL;
}

static void decode_info(const mg_attention_plan *p, mg_attention_plan_info *out) {
    const decode_plan *c = p->impl;
    if (!c)
        return;
    const mg_attention_desc *d = &p->desc;
    out->impl = MG_ATTENTION_IMPL_AUTO; /* neither of FlashInfer's */
    out->workspace_bytes =
        c->schedule_bytes +
        (uint64_t)c->partial_capacity * d->num_kv_heads * c->rows * (4ull * d->head_dim + 8) +
        4ull * c->item_capacity * d->num_kv_heads;
}

static bool decode_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    const mg_paged_attention_call *c = call;
    if (!head_dim_built(c->desc.head_dim)) {
        snprintf(reason, reason_bytes, "head_dim %u has no decode kernels (built: 64, 128, 256)",
                 c->desc.head_dim);
        return false;
    }
    return mg_attention_impl_open(&c->desc, reason, reason_bytes);
}

const mg_attention_provider mg_attention_paged_decode_provider = {
    .base = {.name = "split_kv_decode",
             .backend = MG_BACKEND_CUDA,
             .kernels = MG_OP_KERNEL_NAMES("paged_decode_bf16_d128"),
             .supports = decode_supports},
    .plan = decode_plan_batch,
    .run_paged = decode_run_paged,
    .release = decode_release,
    .info = decode_info,
};
