/*
 * attention_provider.h - private to src/ops/attention: the attention plan object and what a
 * provider implements for metrale/ops_attention.h. attention.c validates every argument, then
 * lets the op registry choose the provider (the CPU reference, FlashInfer on CUDA); a provider
 * receives only validated plans, indptrs and tensors.
 */
#ifndef METRALE_ATTENTION_PROVIDER_H
#define METRALE_ATTENTION_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrale/ops_attention.h"
#include "metrale/ops_kv_cache.h"
#include "op_registry.h"

typedef struct mg_attention_provider mg_attention_provider;

struct mg_attention_plan {
    mg_backend *backend; /* dangles once the backend is closed: see backend_live */
    void *backend_ctx;   /* the backend's context at creation, to tell a closed backend apart */
    const mg_attention_provider *provider;
    mg_attention_desc desc;
    /* The planned batch: host copies of its indptrs (batch_size + 1 entries each). */
    uint32_t batch_size;
    int32_t *qo_indptr, *kv_indptr;
    uint32_t indptr_capacity; /* entries allocated in each array */
    bool usable;              /* false once a failed plan may have half-written the device
                               * schedule; true again after the next successful plan */
    void *impl;               /* the backend's state */
    /* Paged plans (metrale/ops_kv_cache.h) have page_size > 0 (desc.causal is set): kv_indptr
     * above then holds each request's token counts (derived), page_indptr and last_page_len
     * the page table's (same capacity). During provider->plan, new_page_indptr and
     * new_last_page_len point at the batch being planned. */
    uint32_t page_size;
    float logits_soft_cap; /* 0: none */
    mg_kv_dtype kv_dtype;  /* the pools' element type */
    int32_t *page_indptr, *last_page_len;
    const int32_t *new_page_indptr, *new_last_page_len;
};

/* What the paged op's `supports` hooks receive: the validated descriptor first (so a hook
 * written for mg_attention_desc reads it unchanged), then the paged plan's kernel choices. */
typedef struct mg_paged_attention_call {
    mg_attention_desc desc;
    float logits_soft_cap; /* 0: none */
    mg_kv_dtype kv_dtype;
} mg_paged_attention_call;

struct mg_attention_provider {
    /* First: the registry hands this back as an mg_op_provider. Its `supports` hook gets the
     * validated mg_attention_desc (e.g. the head_dims the provider has kernels for); for the
     * paged op an mg_paged_attention_call. */
    mg_op_provider base;
    /* Plans `qo_indptr` / `kv_indptr` (validated; batch_size + 1 entries) for `p`, whose
     * batch fields still describe the previous plan (batch_size 0 before the first). On
     * failure the backend keeps its previous state where it can; where a copy into the device
     * schedule the runs read may have started, it sets p->usable = false (whatever the
     * status), so runs are refused until a plan succeeds. */
    mg_status (*plan)(mg_attention_plan *p, const int32_t *qo_indptr, const int32_t *kv_indptr,
                      uint32_t batch_size, mg_stream *s);
    mg_status (*run)(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s);
    /* Runs a paged plan (validated tensors). */
    mg_status (*run_paged)(mg_attention_plan *p, const mg_paged_attention_tensors *t, mg_stream *s);
    /* Frees the backend's state. `backend_live` false: the backend was closed, which already
     * released the plan's device memory, events, kernels and pinned memory; only host memory
     * may be freed then (no call on the dead backend). */
    void (*release)(mg_attention_plan *p, bool backend_live);
    /* Fills impl, workspace_bytes and pinned_bytes. */
    void (*info)(const mg_attention_plan *p, mg_attention_plan_info *out);
    /* Optional (NULL: the provider needs no device workspace). The device bytes a plan of the
     * validated `d` and batch carves out of a caller's workspace (mg_attention_carve layout,
     * alignment included): what `plan` on a new plan of `d` would need. Host-only. */
    mg_status (*workspace_bytes)(mg_backend *b, const mg_attention_desc *d,
                                 const int32_t *qo_indptr, const int32_t *kv_indptr,
                                 uint32_t batch_size, size_t *bytes);
    /* Optional (NULL: the provider takes no caller workspace for paged plans; it is then
     * never given one, p->desc.workspace stays 0, and it allocates its own). The same for a
     * paged plan of the validated `call` and page table (qo_indptr and the derived token
     * kv_indptr, batch_size + 1 entries). Host-only. */
    mg_status (*paged_workspace_bytes)(mg_backend *b, const mg_paged_attention_call *call,
                                       const int32_t *qo_indptr, const int32_t *kv_indptr,
                                       uint32_t batch_size, size_t *bytes);
};

/* A caller's workspace (desc.workspace) is carved into consecutive sub-ranges, each starting
 * at a multiple of MG_ATTENTION_CARVE_ALIGN from the (equally aligned) start. */
#define MG_ATTENTION_CARVE_ALIGN 16u

/* Bytes of a sub-range of `bytes`, padded to the carve alignment; SIZE_MAX on overflow. */
static inline size_t mg_attention_carve_size(size_t bytes) {
    size_t a = MG_ATTENTION_CARVE_ALIGN;
    return bytes > SIZE_MAX - (a - 1) ? SIZE_MAX : (bytes + a - 1) / a * a;
}

/* The sum of `count` carved sub-ranges; false when it does not fit size_t. */
static inline bool mg_attention_carve_total(const size_t *sizes, int count, size_t *total) {
    size_t sum = 0;
    for (int i = 0; i < count; i++) {
        size_t padded = mg_attention_carve_size(sizes[i]);
        if (padded == SIZE_MAX || padded > SIZE_MAX - sum)
            return false;
        sum += padded;
    }
    *total = sum;
    return true;
}

/* FA2 and FA3 (desc.impl) name FlashInfer's kernels on CUDA: every other CUDA provider's
 * `supports` refuses such a call through this, so it never runs on other kernels. True when
 * `d` leaves the choice open; else false with the reason written. */
static inline bool mg_attention_impl_open(const mg_attention_desc *d, char *reason,
                                          size_t reason_bytes) {
    if (d->impl == MG_ATTENTION_IMPL_AUTO)
        return true;
    snprintf(reason, reason_bytes, "the caller asked for FlashInfer's %s",
             mg_attention_impl_name(d->impl));
    return false;
}

/* "mg_attention_plan_create" for a plan's first batch, "mg_attention_plan_update" after. */
static inline const char *mg_attention_plan_fn(const mg_attention_plan *p) {
    return p->batch_size ? "mg_attention_plan_update" : "mg_attention_plan_create";
}

extern const mg_attention_provider mg_attention_reference_provider;
/* attention_reference.c: the reference's plans and kernels ("kernels") on any backend that
 * ships attention_ragged_prefill / attention_paged_prefill under those names (Metal). */
extern const mg_attention_provider mg_attention_kernels_provider;
extern const mg_attention_provider mg_attention_kernels_paged_provider;
#ifdef METRALE_HAVE_CUDA
extern const mg_attention_provider mg_attention_flashinfer_provider;
/* The same provider for paged plans: its `supports` knows the paged kernels' head_dims. */
extern const mg_attention_provider mg_attention_flashinfer_paged_provider;
/* metrale's split-KV decode kernels: the paged shapes FlashInfer's kernels are not built for. */
extern const mg_attention_provider mg_attention_paged_decode_provider;
#endif

#endif
