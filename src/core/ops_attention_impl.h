/*
 * ops_attention_impl.h - private: the attention plan object and what each backend implements
 * for metrale/ops_attention.h. src/core/ops_attention.c validates every argument, then
 * dispatches by backend kind; a backend receives only validated plans, indptrs and tensors.
 */
#ifndef METRALE_OPS_ATTENTION_IMPL_H
#define METRALE_OPS_ATTENTION_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "metrale/ops_attention.h"

typedef struct mg_attention_backend_ops mg_attention_backend_ops;

struct mg_attention_plan {
    mg_backend *backend; /* dangles once the backend is closed: see backend_live */
    void *backend_ctx;   /* the backend's context at creation, to tell a closed backend apart */
    const mg_attention_backend_ops *ops;
    mg_attention_desc desc;
    /* The planned batch: host copies of its indptrs (batch_size + 1 entries each). */
    uint32_t batch_size;
    int32_t *qo_indptr, *kv_indptr;
    uint32_t indptr_capacity; /* entries allocated in each array */
    bool usable;              /* false once a failed plan may have half-written the device
                               * schedule; true again after the next successful plan */
    void *impl;               /* the backend's state */
};

struct mg_attention_backend_ops {
    /* Plans `qo_indptr` / `kv_indptr` (validated; batch_size + 1 entries) for `p`, whose
     * batch fields still describe the previous plan (batch_size 0 before the first). On
     * failure the backend keeps its previous state where it can; where a copy into the device
     * schedule the runs read may have started, it sets p->usable = false (whatever the
     * status), so runs are refused until a plan succeeds. */
    mg_status (*plan)(mg_attention_plan *p, const int32_t *qo_indptr, const int32_t *kv_indptr,
                      uint32_t batch_size, mg_stream *s);
    mg_status (*run)(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s);
    /* Frees the backend's state. `backend_live` false: the backend was closed, which already
     * released the plan's device memory, events, kernels and pinned memory; only host memory
     * may be freed then (no call on the dead backend). */
    void (*release)(mg_attention_plan *p, bool backend_live);
    /* Fills impl, workspace_bytes and pinned_bytes. */
    void (*info)(const mg_attention_plan *p, mg_attention_plan_info *out);
    /* The backend's own limits on a descriptor that passed the common checks (e.g. the head_dims
     * it has kernels for), run before anything is planned; NULL means none. Returns
     * MG_ERR_UNSUPPORTED naming `fn` and the limit. */
    mg_status (*check_desc)(const mg_attention_desc *d, const char *fn);
    /* Whether the op can run on `b` (e.g. its kernel library loads and the device is new
     * enough); NULL means always. Answers MG_CAP_OP_ATTENTION_RAGGED. */
    bool (*available)(mg_backend *b);
};

/* mg_backend_supports(b, MG_CAP_OP_ATTENTION_RAGGED). */
bool mg_attention_supports(mg_backend *b);

extern const mg_attention_backend_ops mg_cpu_attention_ops;
#ifdef METRALE_HAVE_CUDA
extern const mg_attention_backend_ops mg_cuda_attention_ops;
#endif

#endif
