/* attention.c - the front of metrale/ops_attention.h: argument validation, then the ragged
 * prefill attention of the provider the op registry chooses (attention_provider.h). Every check
 * runs before anything is planned or launched, so a rejected call changes nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_provider.h"
#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "kv_cache_host.h"
#include "op_builtin.h"

/* Beyond this, a batch is certainly a bug (and indptr arrays would be huge). */
#define MG_ATTENTION_MAX_BATCH (1u << 20)
#define MG_ATTENTION_MAX_HEAD_DIM 512u
/* Far above any model (the largest use 128 query heads); it keeps a row of q or o
 * (num_qo_heads * head_dim elements, at most 2^19) well inside the kernels' 32-bit strides. */
#define MG_ATTENTION_MAX_HEADS 1024u

const char *mg_attention_impl_name(mg_attention_impl impl) {
    switch (impl) {
    case MG_ATTENTION_IMPL_AUTO:
        return "auto";
    case MG_ATTENTION_IMPL_FA2:
        return "fa2";
    case MG_ATTENTION_IMPL_FA3:
        return "fa3";
    }
    return "?";
}

/* The providers, in order of preference. */
static const mg_op_provider *const attention_providers[] = {
#ifdef METRALE_HAVE_CUDA
    &mg_attention_flashinfer_provider.base,
#endif
    &mg_attention_reference_provider.base,
    &mg_attention_kernels_provider.base,
    NULL,
};

const mg_op_def mg_attention_ragged_op = {MG_OP_ATTENTION_RAGGED, "attention_ragged",
                                          attention_providers};

static const mg_op_provider *const paged_attention_providers[] = {
#ifdef METRALE_HAVE_CUDA
    &mg_attention_flashinfer_paged_provider.base, &mg_attention_paged_decode_provider.base,
#endif
    &mg_attention_reference_provider.base,        &mg_attention_kernels_paged_provider.base, NULL,
};

const mg_op_def mg_attention_paged_op = {MG_OP_ATTENTION_PAGED, "attention_paged",
                                         paged_attention_providers};

static mg_status check_desc(const mg_attention_desc *d, const char *fn) {
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL descriptor", fn);
    if (!d->num_qo_heads || !d->num_kv_heads)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: head counts must be positive (num_qo_heads %u, num_kv_heads %u)", fn,
                        d->num_qo_heads, d->num_kv_heads);
    if (d->num_qo_heads > MG_ATTENTION_MAX_HEADS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: num_qo_heads %u exceeds the limit of %u", fn,
                        d->num_qo_heads, MG_ATTENTION_MAX_HEADS);
    if (d->num_qo_heads % d->num_kv_heads)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: num_kv_heads %u does not divide num_qo_heads %u (GQA groups)", fn,
                        d->num_kv_heads, d->num_qo_heads);
    if (!d->head_dim || d->head_dim % 8 || d->head_dim > MG_ATTENTION_MAX_HEAD_DIM)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: head_dim %u must be a positive multiple of 8 up to %u", fn,
                        d->head_dim, MG_ATTENTION_MAX_HEAD_DIM);
    if (d->window_left < -1)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: window_left %d must be -1 (no window) or >= 0", fn, d->window_left);
    /* FlashInfer schedules a window as the causal band [p - w, p]; a one-sided bound without
     * causal would need the whole tail of the keys, which its split-KV plan drops. */
    if (d->window_left >= 0 && !d->causal)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: window_left %d needs causal (a sliding window is a causal band)", fn,
                        d->window_left);
    if (!isfinite(d->sm_scale) || !(d->sm_scale > 0.0f))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: sm_scale %g must be finite and > 0", fn,
                        (double)d->sm_scale);
    if ((d->graph_qo_rows == 0) != (d->graph_kv_rows == 0))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: fixed-grid mode needs both graph_qo_rows (%u) and graph_kv_rows (%u) "
                        "> 0, eager mode both 0",
                        fn, d->graph_qo_rows, d->graph_kv_rows);
    if (d->graph_qo_rows > (uint32_t)INT32_MAX || d->graph_kv_rows > (uint32_t)INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: capacities %u / %u rows exceed INT32_MAX", fn,
                        d->graph_qo_rows, d->graph_kv_rows);
    if (d->impl != MG_ATTENTION_IMPL_AUTO && d->impl != MG_ATTENTION_IMPL_FA2 &&
        d->impl != MG_ATTENTION_IMPL_FA3)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown impl %d", fn, (int)d->impl);
    return MG_OK;
}

/* One indptr array: starts at 0, never decreases. */
static mg_status check_indptr(const int32_t *indptr, uint32_t batch_size, const char *name,
                              const char *fn) {
    if (!indptr)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, name);
    if (indptr[0] != 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s[0] = %d, must be 0", fn, name, indptr[0]);
    for (uint32_t i = 0; i < batch_size; i++)
        if (indptr[i + 1] < indptr[i])
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: %s decreases at request %u (%s[%u] = %d < %s[%u] = %d)", fn, name,
                            i, name, i + 1, indptr[i + 1], name, i, indptr[i]);
    return MG_OK;
}

static mg_status check_batch(const mg_attention_desc *d, const int32_t *qo_indptr,
                             const int32_t *kv_indptr, uint32_t batch_size, const char *fn) {
    if (batch_size == 0 || batch_size > MG_ATTENTION_MAX_BATCH)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: batch_size %u must be in 1..%u", fn,
                        batch_size, MG_ATTENTION_MAX_BATCH);
    mg_status st = check_indptr(qo_indptr, batch_size, "qo_indptr", fn);
    if (!st)
        st = check_indptr(kv_indptr, batch_size, "kv_indptr", fn);
    if (st)
        return st;
    if (d->causal)
        for (uint32_t i = 0; i < batch_size; i++) {
            int32_t lq = qo_indptr[i + 1] - qo_indptr[i], lk = kv_indptr[i + 1] - kv_indptr[i];
            if (lq > lk)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "%s: request %u has %d queries but only %d keys; a causal "
                                "(bottom-right aligned) mask needs qo length <= kv length",
                                fn, i, lq, lk);
        }
    if (d->graph_qo_rows && ((uint32_t)qo_indptr[batch_size] > d->graph_qo_rows ||
                             (uint32_t)kv_indptr[batch_size] > d->graph_kv_rows))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: the batch needs %d query and %d key rows, beyond the fixed-grid "
                        "capacities %u and %u",
                        fn, qo_indptr[batch_size], kv_indptr[batch_size], d->graph_qo_rows,
                        d->graph_kv_rows);
    return MG_OK;
}

/* After mg_backend_close the plan's backend pointer dangles: it is only used once the handle
 * registry (mg_backend_context) confirms the backend still exists, and still has the context
 * the plan was created on. */
static bool backend_live(const mg_attention_plan *p) {
    void *ctx = mg_backend_context(p->backend);
    return ctx && ctx == p->backend_ctx;
}

static mg_status check_backend_live(const mg_attention_plan *p, const char *fn) {
    if (backend_live(p))
        return MG_OK;
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                    "%s: the plan's backend %p was closed; only mg_attention_plan_destroy is "
                    "allowed on this plan",
                    fn, (void *)p->backend);
}

static mg_status check_stream(mg_backend *b, mg_stream *s, const char *fn) {
    if (s && mg_stream_backend(s) != b)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: stream %p is not a stream of the plan's backend", fn, (void *)s);
    return mg_stream_impl(b, s) ? MG_OK : MG_ERR_INVALID_ARGUMENT;
}

/* A caller's workspace (desc.workspace): 16-byte aligned, inside one live allocation of `b`. */
static mg_status check_workspace(mg_backend *b, const mg_attention_desc *d, const char *fn) {
    if (!d->workspace && !d->workspace_bytes)
        return MG_OK;
    if (!d->workspace)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: workspace_bytes %zu given without a workspace (both 0: the plan "
                        "allocates its own)",
                        fn, d->workspace_bytes);
    /* Written by the plan; workspace_bytes 0 is an empty range whose pointer is still checked. */
    const mg_op_tensor t = {"workspace", d->workspace, d->workspace_bytes, MG_ATTENTION_CARVE_ALIGN,
                            MG_OP_OUT | MG_OP_EMPTY_OK};
    return mg_op_check_tensors(b, fn, &t, 1, -1, -1);
}

/* The device workspace `provider` needs for a plan of `d` and this batch (validated). */
static mg_status workspace_need(mg_backend *b, const mg_attention_provider *provider,
                                const mg_attention_desc *d, const int32_t *qo_indptr,
                                const int32_t *kv_indptr, uint32_t batch_size, size_t *bytes) {
    *bytes = 0;
    if (!provider->workspace_bytes)
        return MG_OK;
    return provider->workspace_bytes(b, d, qo_indptr, kv_indptr, batch_size, bytes);
}

/* What planning needs of every call: a live backend without a sticky fault, a valid desc and
 * a valid batch. */
static mg_status check_plan_inputs(mg_backend *b, const mg_attention_desc *desc,
                                   const int32_t *qo_indptr, const int32_t *kv_indptr,
                                   uint32_t batch_size, const char *fn) {
    mg_status st = mg_op_enter(b, fn);
    if (!st)
        st = mg_backend_check_fault(b);
    if (!st)
        st = check_desc(desc, fn);
    if (!st)
        st = check_batch(desc, qo_indptr, kv_indptr, batch_size, fn);
    return st;
}

mg_status mg_attention_workspace_bytes(mg_backend *b, const mg_attention_desc *desc,
                                       const int32_t *qo_indptr, const int32_t *kv_indptr,
                                       uint32_t batch_size, size_t *bytes) {
    const char *fn = "mg_attention_workspace_bytes";
    if (!bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output pointer", fn);
    *bytes = 0;
    mg_status st = check_plan_inputs(b, desc, qo_indptr, kv_indptr, batch_size, fn);
    if (st)
        return st;
    const mg_op_provider *chosen;
    if ((st = mg_op_choose(b, MG_OP_ATTENTION_RAGGED, desc, fn, &chosen)))
        return st;
    return workspace_need(b, (const mg_attention_provider *)chosen, desc, qo_indptr, kv_indptr,
                          batch_size, bytes);
}

/* Plans the validated batch and, on success, keeps its host indptrs. */
static mg_status plan_batch(mg_attention_plan *p, const int32_t *qo_indptr,
                            const int32_t *kv_indptr, uint32_t batch_size, mg_stream *s,
                            const char *fn) {
    if (batch_size + 1 > p->indptr_capacity) {
        /* The host copies: qo, kv (tokens) and, for paged plans, page indptr and last-page
         * lengths, each of batch_size + 1 entries. */
        int32_t **const arrays[4] = {&p->qo_indptr, &p->kv_indptr, &p->page_indptr,
                                     &p->last_page_len};
        const int count = p->page_size ? 4 : 2;
        int32_t *grown[4] = {0};
        for (int i = 0; i < count; i++)
            if (!(grown[i] = malloc(sizeof(int32_t) * (batch_size + 1)))) {
                for (int j = 0; j < i; j++)
                    free(grown[j]);
                return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory for %u indptrs", fn,
                                batch_size + 1);
            }
        for (int i = 0; i < count; i++) {
            if (p->batch_size)
                memcpy(grown[i], *arrays[i], sizeof(int32_t) * (p->batch_size + 1));
            free(*arrays[i]);
            *arrays[i] = grown[i];
        }
        p->indptr_capacity = batch_size + 1;
    }
    mg_status st = p->provider->plan(p, qo_indptr, kv_indptr, batch_size, s);
    if (st)
        return st; /* the backend cleared p->usable if the device schedule may be half-written */
    memcpy(p->qo_indptr, qo_indptr, sizeof(int32_t) * (batch_size + 1));
    memcpy(p->kv_indptr, kv_indptr, sizeof(int32_t) * (batch_size + 1));
    if (p->page_size) {
        memcpy(p->page_indptr, p->new_page_indptr, sizeof(int32_t) * (batch_size + 1));
        memcpy(p->last_page_len, p->new_last_page_len, sizeof(int32_t) * batch_size);
    }
    p->batch_size = batch_size;
    p->usable = true;
    return MG_OK;
}

mg_status mg_attention_plan_create(mg_backend *b, const mg_attention_desc *desc,
                                   const int32_t *qo_indptr, const int32_t *kv_indptr,
                                   uint32_t batch_size, mg_stream *s, mg_attention_plan **out) {
    const char *fn = "mg_attention_plan_create";
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output pointer", fn);
    *out = NULL;
    mg_status st = check_plan_inputs(b, desc, qo_indptr, kv_indptr, batch_size, fn);
    if (!st)
        st = check_workspace(b, desc, fn);
    if (!st)
        st = check_stream(b, s, fn);
    if (!st)
        st = mg_stream_check_not_capturing(b, s, fn);
    if (st)
        return st;
    const mg_op_provider *chosen;
    if ((st = mg_op_choose(b, MG_OP_ATTENTION_RAGGED, desc, fn, &chosen)))
        return st;
    if (desc->workspace) {
        size_t need;
        if ((st = workspace_need(b, (const mg_attention_provider *)chosen, desc, qo_indptr,
                                 kv_indptr, batch_size, &need)))
            return st;
        if (desc->workspace_bytes < need)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: the caller's workspace has %zu bytes, provider %s needs %zu for "
                            "this batch (mg_attention_workspace_bytes)",
                            fn, desc->workspace_bytes, chosen->name, need);
    }
    mg_attention_plan *p = calloc(1, sizeof *p);
    if (!p)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    p->backend = b;
    p->backend_ctx = mg_backend_context(b);
    p->provider = (const mg_attention_provider *)chosen;
    p->desc = *desc;
    st = plan_batch(p, qo_indptr, kv_indptr, batch_size, s, fn);
    if (st) {
        mg_attention_plan_destroy(p);
        return st;
    }
    mg_op_count_plans(b, MG_OP_ATTENTION_RAGGED, 1);
    *out = p;
    return MG_OK;
}

mg_status mg_attention_plan_update(mg_attention_plan *p, const int32_t *qo_indptr,
                                   const int32_t *kv_indptr, uint32_t batch_size, mg_stream *s) {
    const char *fn = "mg_attention_plan_update";
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL plan", fn);
    mg_status st = check_backend_live(p, fn);
    if (!st && p->page_size)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "%s: a paged plan is updated with mg_paged_attention_plan_update", fn);
    if (!st)
        st = mg_backend_check_fault(p->backend);
    if (!st)
        st = check_batch(&p->desc, qo_indptr, kv_indptr, batch_size, fn);
    if (!st && p->desc.graph_qo_rows && batch_size != p->batch_size)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "%s: a fixed-grid plan keeps its batch_size %u (asked %u): captured "
                      "launches depend on it",
                      fn, p->batch_size, batch_size);
    if (!st)
        st = check_stream(p->backend, s, fn);
    if (!st)
        st = mg_stream_check_not_capturing(p->backend, s, fn);
    if (st)
        return st;
    return plan_batch(p, qo_indptr, kv_indptr, batch_size, s, fn);
}

/* Bytes of a contiguous [rows, heads, head_dim] tensor; MG_ERR_INVALID_ARGUMENT when the
 * product does not fit size_t, so a huge shape can never pass the range checks as a small
 * wrapped span. */
static mg_status tensor_bytes(uint32_t rows, uint32_t heads, uint32_t head_dim,
                              uint32_t element_bytes, const char *what, const char *fn,
                              size_t *out) {
    size_t row_elements;
    if (mg_mul_size(heads, head_dim, &row_elements) &&
        mg_matrix_span_bytes(rows, row_elements, row_elements, element_bytes, out))
        return MG_OK;
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                    "%s: %s of %u rows x %u heads x %u x %u bytes overflows the address space", fn,
                    what, rows, heads, head_dim, element_bytes);
}

/* What every run needs of its plan: a live backend without a sticky fault, the entry point of
 * the plan's kind (ragged or paged), and a usable schedule. */
static mg_status check_run_ready(const mg_attention_plan *p, bool paged, const char *fn) {
    mg_status st = check_backend_live(p, fn);
    if (!st && paged != (p->page_size != 0))
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: a %s plan runs with %s", fn,
                      paged ? "ragged" : "paged",
                      paged ? "mg_attention_run" : "mg_paged_attention_run");
    if (!st)
        st = mg_backend_check_fault(p->backend);
    if (!st && !p->usable)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "%s: the plan's last update failed on the device; update it again first", fn);
    return st;
}

mg_status mg_attention_run(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s) {
    const char *fn = "mg_attention_run";
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL plan", fn);
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL tensors", fn);
    mg_status st = check_run_ready(p, false, fn);
    if (st)
        return st;
    const mg_attention_desc *d = &p->desc;
    const uint32_t qo_total = (uint32_t)p->qo_indptr[p->batch_size];
    const uint32_t kv_total = (uint32_t)p->kv_indptr[p->batch_size];
    if (d->graph_qo_rows) {
        if (t->qo_rows != d->graph_qo_rows || t->kv_rows != d->graph_kv_rows)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: a fixed-grid plan runs on its capacities: qo_rows %u / kv_rows "
                            "%u given, %u / %u planned",
                            fn, t->qo_rows, t->kv_rows, d->graph_qo_rows, d->graph_kv_rows);
    } else if (t->qo_rows != qo_total || t->kv_rows != kv_total) {
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: the indptrs end at %u query and %u key rows, the tensors have "
                        "qo_rows %u and kv_rows %u",
                        fn, qo_total, kv_total, t->qo_rows, t->kv_rows);
    }
    /* Every tensor must fit its buffer: nothing is read or written out of bounds. */
    size_t qo_bytes, kv_bytes, lse_bytes;
    if ((st = tensor_bytes(t->qo_rows, d->num_qo_heads, d->head_dim, 2, "q/o", fn, &qo_bytes)) ||
        (st = tensor_bytes(t->kv_rows, d->num_kv_heads, d->head_dim, 2, "k/v", fn, &kv_bytes)) ||
        (st = tensor_bytes(t->qo_rows, d->num_qo_heads, 1, 4, "lse", fn, &lse_bytes)))
        return st;
    mg_backend *b = p->backend;
    /* o and lse are written while q, k and v are read: they overlap nothing. tensor_bytes
     * refused an overflow, so 0 bytes is an empty batch. */
    const mg_op_tensor tensors[] = {
        {"q", t->q, qo_bytes, 16, MG_OP_IN | MG_OP_EMPTY_OK},
        {"k", t->k, kv_bytes, 16, MG_OP_IN | MG_OP_EMPTY_OK},
        {"v", t->v, kv_bytes, 16, MG_OP_IN | MG_OP_EMPTY_OK},
        {"o", t->o, qo_bytes, 16, MG_OP_OUT | MG_OP_EMPTY_OK},
        {"lse", t->lse, lse_bytes, 4, MG_OP_OUT | MG_OP_OPTIONAL | MG_OP_EMPTY_OK},
    };
    if ((st = mg_op_check_tensors(b, fn, tensors, 5, -1, -1)))
        return st;
    if ((st = check_stream(p->backend, s, fn)))
        return st;
    /* An eager plan's workspaces are replaced when a later update needs more (the old ones
     * are freed), so no graph may keep its launch: only fixed-grid plans are capturable. */
    if (!d->graph_qo_rows &&
        (st = mg_stream_check_not_capturing(
             p->backend, s,
             "mg_attention_run: an eager plan (capture needs a fixed-grid plan: set "
             "graph_qo_rows / graph_kv_rows)")))
        return st;
    if ((st = p->provider->run(p, t, s)))
        return st;
    mg_op_count_call(b, MG_OP_ATTENTION_RAGGED, &p->provider->base, d->workspace != 0);
    return MG_OK;
}

mg_status mg_attention_plan_destroy(mg_attention_plan *p) {
    if (!p)
        return MG_OK;
    if (p->provider)
        p->provider->release(p, backend_live(p));
    free(p->qo_indptr);
    free(p->kv_indptr);
    free(p->page_indptr);
    free(p->last_page_len);
    free(p);
    return MG_OK;
}

mg_status mg_attention_plan_get_info(const mg_attention_plan *p, mg_attention_plan_info *out) {
    if (!p || !out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_attention_plan_get_info: NULL %s",
                        p ? "output" : "plan");
    memset(out, 0, sizeof *out);
    out->batch_size = p->batch_size;
    out->qo_total = (uint32_t)p->qo_indptr[p->batch_size];
    out->kv_total = (uint32_t)p->kv_indptr[p->batch_size];
    p->provider->info(p, out);
    return MG_OK;
}

double mg_attention_plan_flops(const mg_attention_plan *p) {
    if (!p)
        return 0.0;
    double pairs = 0.0;
    for (uint32_t i = 0; i < p->batch_size; i++) {
        double lq = p->qo_indptr[i + 1] - p->qo_indptr[i];
        double lk = p->kv_indptr[i + 1] - p->kv_indptr[i];
        pairs += p->desc.causal ? lq * lk - lq * (lq - 1.0) / 2.0 : lq * lk;
    }
    return 4.0 * p->desc.head_dim * p->desc.num_qo_heads * pairs;
}

/* ------------------------------------------------------------------ paged plans
 * (metrale/ops_kv_cache.h). The page table is checked on the host, each request's token count
 * derived from it, and the result planned like a causal ragged batch of those counts. */

/* The ragged descriptor of a paged one (checked as such, plus the paged fields). */
static mg_status paged_desc(const mg_paged_attention_desc *pd, mg_attention_desc *d,
                            const char *fn) {
    if (!pd)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL descriptor", fn);
    *d = (mg_attention_desc){.num_qo_heads = pd->num_qo_heads,
                             .num_kv_heads = pd->num_kv_heads,
                             .head_dim = pd->head_dim,
                             .causal = true,
                             .window_left = pd->window_left,
                             .sm_scale = pd->sm_scale,
                             .graph_qo_rows = pd->graph_qo_rows,
                             .graph_kv_rows = pd->graph_kv_tokens,
                             .impl = pd->impl};
    mg_status st = check_desc(d, fn);
    if (st)
        return st;
    if (pd->page_size > MG_KV_PAGE_SIZE_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: page_size %u must be in 1..%u (0: %u)", fn,
                        pd->page_size, MG_KV_PAGE_SIZE_MAX, MG_KV_PAGE_SIZE_DEFAULT);
    if (!isfinite(pd->logits_soft_cap) || pd->logits_soft_cap < 0.0f)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: logits_soft_cap %g must be 0 (none) or finite and > 0", fn,
                        (double)pd->logits_soft_cap);
    if (!mg_kv_dtype_bytes(pd->kv_dtype))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: kv_dtype %d must be MG_KV_BF16 (0) or MG_KV_FP8_E4M3 (1)", fn,
                        (int)pd->kv_dtype);
    return MG_OK;
}

/* Checks `table` for a plan of `d` with pages of `page_size` and derives the token indptr
 * (malloc'ed into *kv_tokens; the caller frees it). */
static mg_status paged_batch(const mg_attention_desc *d, uint32_t page_size,
                             const mg_kv_page_table *table, int32_t **kv_tokens, const char *fn) {
    *kv_tokens = NULL;
    if (!table)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL page table", fn);
    if (!table->qo_indptr)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL qo_indptr (the new tokens)", fn);
    /* The pool's size is unknown here (runs check it): the indices are checked against
     * INT32_MAX pages only. */
    const mg_kv_cache_desc cache = {.num_kv_heads = d->num_kv_heads,
                                    .head_dim = d->head_dim % 16 ? 16 : d->head_dim,
                                    .page_size = page_size,
                                    .num_pages = (uint32_t)INT32_MAX};
    mg_status st = mg_kv_page_table_check(&cache, table, fn);
    if (st)
        return st;
    int32_t *kv = malloc(sizeof(int32_t) * ((size_t)table->batch_size + 1));
    if (!kv)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    kv[0] = 0;
    for (uint32_t i = 0; i < table->batch_size; i++) {
        int64_t next = kv[i] + mg_kv_len(table->kv_indptr, table->kv_last_page_len, page_size, i);
        if (next > INT32_MAX) {
            free(kv);
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: the batch holds more than %d cached tokens", fn, INT32_MAX);
        }
        kv[i + 1] = (int32_t)next;
    }
    if ((st = check_batch(d, table->qo_indptr, kv, table->batch_size, fn))) {
        free(kv);
        return st;
    }
    *kv_tokens = kv;
    return MG_OK;
}

static mg_status plan_paged_batch(mg_attention_plan *p, const mg_kv_page_table *table,
                                  const int32_t *kv_tokens, mg_stream *s, const char *fn) {
    p->new_page_indptr = table->kv_indptr;
    p->new_last_page_len = table->kv_last_page_len;
    mg_status st = plan_batch(p, table->qo_indptr, kv_tokens, table->batch_size, s, fn);
    p->new_page_indptr = p->new_last_page_len = NULL;
    return st;
}

/* The caller's workspace bytes `provider` carves for a paged plan of `call` and this batch
 * (validated): 0 for a provider that takes none. */
static mg_status paged_workspace_need(mg_backend *b, const mg_attention_provider *provider,
                                      const mg_paged_attention_call *call, const int32_t *qo_indptr,
                                      const int32_t *kv_tokens, uint32_t batch_size,
                                      size_t *bytes) {
    *bytes = 0;
    if (!provider->paged_workspace_bytes)
        return MG_OK;
    return provider->paged_workspace_bytes(b, call, qo_indptr, kv_tokens, batch_size, bytes);
}

/* What paged planning needs of every call: a live backend without a sticky fault, a valid
 * descriptor (its ragged form in *d) and page table (its token indptr in *kv_tokens, which the
 * caller frees), and the provider the registry chooses for them. */
static mg_status paged_plan_inputs(mg_backend *b, const mg_paged_attention_desc *pd,
                                   const mg_kv_page_table *table, mg_attention_desc *d,
                                   int32_t **kv_tokens, const mg_op_provider **chosen,
                                   const char *fn) {
    *kv_tokens = NULL;
    mg_status st = mg_op_enter(b, fn);
    if (!st)
        st = mg_backend_check_fault(b);
    if (!st)
        st = paged_desc(pd, d, fn);
    if (!st)
        st = paged_batch(d, mg_kv_page_size(pd->page_size), table, kv_tokens, fn);
    if (st)
        return st;
    const mg_paged_attention_call call = {*d, pd->logits_soft_cap, pd->kv_dtype};
    if ((st = mg_op_choose(b, MG_OP_ATTENTION_PAGED, &call, fn, chosen))) {
        free(*kv_tokens);
        *kv_tokens = NULL;
    }
    return st;
}

mg_status mg_paged_attention_workspace_bytes(mg_backend *b, const mg_paged_attention_desc *pd,
                                             const mg_kv_page_table *table, size_t *bytes) {
    const char *fn = "mg_paged_attention_workspace_bytes";
    if (!bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output pointer", fn);
    *bytes = 0;
    mg_attention_desc d;
    int32_t *kv_tokens;
    const mg_op_provider *chosen;
    mg_status st = paged_plan_inputs(b, pd, table, &d, &kv_tokens, &chosen, fn);
    if (st)
        return st;
    const mg_paged_attention_call call = {d, pd->logits_soft_cap, pd->kv_dtype};
    st = paged_workspace_need(b, (const mg_attention_provider *)chosen, &call, table->qo_indptr,
                              kv_tokens, table->batch_size, bytes);
    free(kv_tokens);
    return st;
}

mg_status mg_paged_attention_plan_create(mg_backend *b, const mg_paged_attention_desc *pd,
                                         const mg_kv_page_table *table, mg_stream *s,
                                         mg_attention_plan **out) {
    const char *fn = "mg_paged_attention_plan_create";
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output pointer", fn);
    *out = NULL;
    mg_attention_desc d;
    int32_t *kv_tokens = NULL;
    const mg_op_provider *chosen;
    mg_status st = paged_plan_inputs(b, pd, table, &d, &kv_tokens, &chosen, fn);
    if (!st) {
        d.workspace = pd->workspace;
        d.workspace_bytes = pd->workspace_bytes;
        st = check_workspace(b, &d, fn);
    }
    if (!st)
        st = check_stream(b, s, fn);
    if (!st)
        st = mg_stream_check_not_capturing(b, s, fn);
    const mg_attention_provider *provider = st ? NULL : (const mg_attention_provider *)chosen;
    if (!st && d.workspace) {
        const mg_paged_attention_call call = {d, pd->logits_soft_cap, pd->kv_dtype};
        size_t need;
        if (!(st = paged_workspace_need(b, provider, &call, table->qo_indptr, kv_tokens,
                                        table->batch_size, &need)) &&
            d.workspace_bytes < need)
            st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                          "%s: the caller's workspace has %zu bytes, provider %s needs %zu for "
                          "this page table (mg_paged_attention_workspace_bytes)",
                          fn, d.workspace_bytes, chosen->name, need);
        /* A provider that takes no caller workspace never sees one: it allocates its own. */
        if (!provider->paged_workspace_bytes)
            d.workspace = 0, d.workspace_bytes = 0;
    }
    const uint32_t page_size = st ? 0 : mg_kv_page_size(pd->page_size);
    mg_attention_plan *p = NULL;
    if (!st && !(p = calloc(1, sizeof *p)))
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (!st) {
        p->backend = b;
        p->backend_ctx = mg_backend_context(b);
        p->provider = provider;
        p->desc = d;
        p->page_size = page_size;
        p->logits_soft_cap = pd->logits_soft_cap;
        p->kv_dtype = pd->kv_dtype;
        st = plan_paged_batch(p, table, kv_tokens, s, fn);
    }
    free(kv_tokens);
    if (st) {
        mg_attention_plan_destroy(p);
        return st;
    }
    mg_op_count_plans(b, MG_OP_ATTENTION_PAGED, 1);
    *out = p;
    return MG_OK;
}

mg_status mg_paged_attention_plan_update(mg_attention_plan *p, const mg_kv_page_table *table,
                                         mg_stream *s) {
    const char *fn = "mg_paged_attention_plan_update";
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL plan", fn);
    mg_status st = check_backend_live(p, fn);
    if (!st && !p->page_size)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "%s: a ragged plan is updated with mg_attention_plan_update", fn);
    if (!st)
        st = mg_backend_check_fault(p->backend);
    if (!st && table && p->desc.graph_qo_rows && table->batch_size != p->batch_size)
        st = MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                      "%s: a fixed-grid plan keeps its batch_size %u (asked %u): captured "
                      "launches depend on it",
                      fn, p->batch_size, table->batch_size);
    if (!st)
        st = check_stream(p->backend, s, fn);
    if (!st)
        st = mg_stream_check_not_capturing(p->backend, s, fn);
    int32_t *kv_tokens = NULL;
    if (!st)
        st = paged_batch(&p->desc, p->page_size, table, &kv_tokens, fn);
    if (!st)
        st = plan_paged_batch(p, table, kv_tokens, s, fn);
    free(kv_tokens);
    return st;
}

mg_status mg_paged_attention_run(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                                 mg_stream *s) {
    const char *fn = "mg_paged_attention_run";
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL plan", fn);
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL tensors", fn);
    mg_status st = check_run_ready(p, true, fn);
    if (st)
        return st;
    const mg_attention_desc *d = &p->desc;
    const uint32_t qo_total = (uint32_t)p->qo_indptr[p->batch_size];
    const uint32_t want_rows = d->graph_qo_rows ? d->graph_qo_rows : qo_total;
    if (t->qo_rows != want_rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: qo_rows %u given, the plan needs %u (%s)", fn,
                        t->qo_rows, want_rows,
                        d->graph_qo_rows ? "its fixed-grid capacity" : "its qo_indptr total");
    const uint32_t planned_pages = (uint32_t)p->page_indptr[p->batch_size];
    if (t->num_kv_indices < planned_pages)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: kv_indices has %u entries, the planned batch uses %u", fn,
                        t->num_kv_indices, planned_pages);
    const mg_kv_cache_desc cache = {.num_kv_heads = d->num_kv_heads,
                                    .head_dim = d->head_dim % 16 ? 16 : d->head_dim,
                                    .page_size = p->page_size,
                                    .num_pages = t->num_pages,
                                    .kv_dtype = p->kv_dtype};
    size_t pool_bytes, qo_bytes, lse_bytes;
    if ((st = mg_kv_cache_desc_check(&cache, fn)))
        return st;
    if (!mg_mul_size((size_t)t->num_pages * p->page_size,
                     (size_t)d->num_kv_heads * d->head_dim * mg_kv_dtype_bytes(p->kv_dtype),
                     &pool_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the pool overflows the address space", fn);
    const bool fp8 = p->kv_dtype == MG_KV_FP8_E4M3;
    if (!fp8 && (t->k_scale || t->v_scale))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: k_scale / v_scale are for FP8 pools; pass 0 for BF16", fn);
    if ((st = tensor_bytes(t->qo_rows, d->num_qo_heads, d->head_dim, 2, "q/o", fn, &qo_bytes)) ||
        (st = tensor_bytes(t->qo_rows, d->num_qo_heads, 1, 4, "lse", fn, &lse_bytes)))
        return st;
    mg_backend *b = p->backend;
    /* o and lse are written while q, the pages, the scales and the page indices are read:
     * they overlap nothing. The page indices matter only when the batch has pages; 0 bytes of
     * q, o or lse is an empty batch (tensor_bytes refused an overflow). */
    const mg_op_tensor tensors[] = {
        {"q", t->q, qo_bytes, 16, MG_OP_IN | MG_OP_EMPTY_OK},
        {"o", t->o, qo_bytes, 16, MG_OP_OUT | MG_OP_EMPTY_OK},
        {"k_pages", t->k_pages, pool_bytes, 16, MG_OP_IN},
        {"v_pages", t->v_pages, pool_bytes, 16, MG_OP_IN},
        {"k_scale", t->k_scale, 4ull * d->num_kv_heads, 4, fp8 ? MG_OP_IN : MG_OP_OPTIONAL},
        {"v_scale", t->v_scale, 4ull * d->num_kv_heads, 4, fp8 ? MG_OP_IN : MG_OP_OPTIONAL},
        {"kv_indices", planned_pages ? t->kv_indices : 0, 4ull * t->num_kv_indices, 4,
         planned_pages ? MG_OP_IN : MG_OP_OPTIONAL},
        {"lse", t->lse, lse_bytes, 4, MG_OP_OUT | MG_OP_OPTIONAL | MG_OP_EMPTY_OK},
    };
    if ((st = mg_op_check_tensors(b, fn, tensors, 8, -1, -1)))
        return st;
    if ((st = check_stream(b, s, fn)))
        return st;
    if (!d->graph_qo_rows &&
        (st = mg_stream_check_not_capturing(
             b, s,
             "mg_paged_attention_run: an eager plan (capture needs a fixed-grid plan: set "
             "graph_qo_rows / graph_kv_tokens)")))
        return st;
    if ((st = p->provider->run_paged(p, t, s)))
        return st;
    mg_op_count_call(b, MG_OP_ATTENTION_PAGED, &p->provider->base, false);
    return MG_OK;
}
