/* attention_cuda.c - ragged prefill attention on the CUDA backend, through the FlashInfer plugin
 * libmetrale_gpu_attention.so (kernels/cuda/flashinfer_ragged_prefill.h).
 *
 * A plan holds a float and an int workspace on the device, sized from each plan (they grow when
 * a later eager plan needs more), and two page-locked mirrors of the int workspace. Planning
 * writes the schedule into one mirror and queues its copy on the stream; the next plan uses the
 * other mirror, and before a mirror is written again the event recorded after its last copy is
 * waited for, so host writes never race a copy in flight. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/flashinfer_ragged_prefill.h"
#include "core/ops_attention_impl.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_plugin.h"
#include "error.h"

#define PLUGIN_FILE "libmetrale_gpu_attention.so"

static struct {
    mg_fi_abi_version_fn abi_version;
    mg_fi_choose_path_fn choose_path;
    mg_fi_workspace_bytes_fn workspace_bytes;
    mg_fi_plan_fn plan;
    mg_fi_run_fn run;
} fi;

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static mg_status plugin_status;
static char plugin_message[512];

static mg_status load_plugin(void) {
    const mg_cuda_plugin_symbol symbols[] = {
        {"mg_fi_abi_version", (void **)&fi.abi_version},
        {"mg_fi_choose_path", (void **)&fi.choose_path},
        {"mg_fi_workspace_bytes", (void **)&fi.workspace_bytes},
        {"mg_fi_plan", (void **)&fi.plan},
        {"mg_fi_run", (void **)&fi.run},
    };
    mg_status st = mg_cuda_plugin_load(PLUGIN_FILE, symbols, sizeof symbols / sizeof symbols[0]);
    if (st)
        return st;
    uint32_t version = fi.abi_version();
    if (version != MG_FI_ABI_VERSION)
        return MG_ERROR(MG_ERR_UNAVAILABLE, "%s has ABI version %u, this library needs %u",
                        PLUGIN_FILE, version, MG_FI_ABI_VERSION);
    return MG_OK;
}

static void load_plugin_once(void) {
    plugin_status = load_plugin();
    if (plugin_status)
        snprintf(plugin_message, sizeof plugin_message, "%s", mg_last_error());
}

/* The plugin is loaded on first use; a failure is remembered and reported on every call. */
static mg_status plugin_ready(void) {
    pthread_once(&plugin_once, load_plugin_once);
    if (plugin_status)
        return MG_ERROR(plugin_status, "ragged attention on CUDA: %s", plugin_message);
    return MG_OK;
}

typedef struct cuda_attention_plan {
    mg_fi_shape shape;
    mg_fi_plan_info info;
    mg_devptr float_workspace, int_workspace;
    size_t float_bytes, int_bytes; /* allocated */
    void *mirror[2];
    size_t mirror_bytes[2];
    mg_event *mirror_copied[2]; /* recorded after the copy out of each mirror */
    bool mirror_in_flight[2];
    int next_mirror;
} cuda_attention_plan;

/* A failed plugin call: CUDA errors go through the backend (which records sticky faults),
 * the plugin's own text is kept. */
static mg_status plugin_failure(mg_cuda_context *ctx, mg_status st, const mg_fi_error *err) {
    if (err->cuda_error >= 700) { /* launch failures and faults: same codes in both APIs */
        st = mg_cuda_result(ctx, (CUresult)err->cuda_error, "FlashInfer attention", __FILE__,
                            __LINE__);
        mg_error_append(" [%s]", err->message);
        return st;
    }
    return MG_ERROR(st, "%s", err->message);
}

static mg_fi_path forced_path(mg_attention_impl impl) {
    return impl == MG_ATTENTION_IMPL_FA2   ? MG_FI_PATH_FA2
           : impl == MG_ATTENTION_IMPL_FA3 ? MG_FI_PATH_FA3
                                           : MG_FI_PATH_NONE;
}

/* Device buffer of at least `bytes`: kept when large enough, else replaced once the stream's
 * earlier work (which may read it) is done. */
static mg_status ensure_device(mg_attention_plan *p, mg_stream *s, mg_devptr *buf, size_t *have,
                               size_t bytes) {
    if (bytes <= *have)
        return MG_OK;
    mg_devptr grown;
    mg_status st = mg_alloc(p->backend, bytes, &grown);
    if (st)
        return st;
    if (*buf && (st = mg_stream_synchronize(s ? s : mg_stream_default(p->backend)))) {
        mg_free(p->backend, grown);
        return st;
    }
    mg_free(p->backend, *buf);
    *buf = grown;
    *have = bytes;
    return MG_OK;
}

/* The mirror to write next, after its previous copy has completed. */
static mg_status take_mirror(mg_attention_plan *p, cuda_attention_plan *c, size_t bytes,
                             int *which) {
    const int i = c->next_mirror;
    mg_status st = MG_OK;
    if (!c->mirror_copied[i] && (st = mg_event_create(p->backend, &c->mirror_copied[i])))
        return st;
    if (c->mirror_in_flight[i] && (st = mg_event_synchronize(c->mirror_copied[i])))
        return st;
    c->mirror_in_flight[i] = false;
    if (bytes > c->mirror_bytes[i]) {
        void *grown;
        if ((st = mg_host_alloc(p->backend, bytes, &grown)))
            return st;
        mg_host_free(p->backend, c->mirror[i]);
        c->mirror[i] = grown;
        c->mirror_bytes[i] = bytes;
    }
    *which = i;
    return MG_OK;
}

static mg_status cuda_plan(mg_attention_plan *p, const int32_t *qo_indptr, const int32_t *kv_indptr,
                           uint32_t batch_size, mg_stream *s) {
    mg_cuda_context *ctx;
    CUstream stream;
    mg_status st = plugin_ready();
    if (!st)
        st = mg_cuda_bind(p->backend, &ctx);
    if (!st)
        st = mg_cuda_stream(p->backend, s, &stream);
    if (st)
        return st;

    cuda_attention_plan *c = p->impl;
    if (!c) {
        if (!(c = calloc(1, sizeof *c)))
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cuda attention plan: out of host memory");
        p->impl = c;
    }
    const mg_attention_desc *d = &p->desc;
    mg_fi_shape shape = {
        .num_qo_heads = d->num_qo_heads,
        .num_kv_heads = d->num_kv_heads,
        .head_dim = d->head_dim,
        .window_left = d->window_left,
        .causal = d->causal,
        .graph_mode = d->graph_qo_rows != 0,
        .graph_qo_rows = d->graph_qo_rows,
        .batch_size = batch_size,
    };
    mg_fi_error err;
    if (shape.graph_mode && p->batch_size) {
        shape.path = c->shape.path; /* captured launches are of this path */
    } else if ((st = fi.choose_path(&shape, qo_indptr, kv_indptr, forced_path(d->impl), &shape.path,
                                    &err))) {
        return plugin_failure(ctx, st, &err);
    }
    size_t float_bytes, int_bytes;
    if ((st = fi.workspace_bytes(&shape, qo_indptr, kv_indptr, &float_bytes, &int_bytes, &err)))
        return plugin_failure(ctx, st, &err);
    if (shape.graph_mode && p->batch_size &&
        (float_bytes > c->float_bytes || int_bytes > c->int_bytes))
        return MG_ERROR(MG_ERR_INTERNAL,
                        "mg_attention_plan_update: a fixed-grid plan needs %zu + %zu workspace "
                        "bytes, more than the %zu + %zu it was created with",
                        float_bytes, int_bytes, c->float_bytes, c->int_bytes);
    int mirror = 0;
    if ((st = ensure_device(p, s, &c->float_workspace, &c->float_bytes, float_bytes)) ||
        (st = ensure_device(p, s, &c->int_workspace, &c->int_bytes, int_bytes)) ||
        (st = take_mirror(p, c, int_bytes, &mirror)))
        return st;

    mg_fi_plan_info info;
    st = fi.plan(&shape, qo_indptr, kv_indptr, (void *)(uintptr_t)c->float_workspace,
                 c->float_bytes, (void *)(uintptr_t)c->int_workspace, c->mirror[mirror], int_bytes,
                 (void *)stream, &info, &err);
    /* Even a failed plan may have queued its copy: the mirror counts as in flight. */
    mg_status rec = mg_event_record(c->mirror_copied[mirror], s);
    c->mirror_in_flight[mirror] = rec == MG_OK;
    c->next_mirror = mirror ^ 1;
    if (st)
        return plugin_failure(ctx, st, &err);
    if (rec)
        return rec;
    if (shape.graph_mode && p->batch_size && memcmp(info.words, c->info.words, sizeof info.words))
        return MG_ERROR(MG_ERR_INTERNAL,
                        "mg_attention_plan_update: the new batch changed the fixed-grid launch "
                        "layout, which captured graphs depend on");
    c->shape = shape;
    c->info = info;
    return MG_OK;
}

static mg_status cuda_run(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s) {
    cuda_attention_plan *c = p->impl;
    mg_cuda_context *ctx;
    mg_status st = mg_cuda_bind(p->backend, &ctx);
    CUstream stream;
    if (!st)
        st = mg_cuda_stream(p->backend, s, &stream);
    if (st)
        return st;
    const mg_fi_run_args args = {
        .q = (void *)(uintptr_t)t->q,
        .k = (void *)(uintptr_t)t->k,
        .v = (void *)(uintptr_t)t->v,
        .o = (void *)(uintptr_t)t->o,
        .lse = (float *)(uintptr_t)t->lse,
        .qo_rows = t->qo_rows,
        .kv_rows = t->kv_rows,
        .sm_scale = p->desc.sm_scale,
        .float_workspace = (void *)(uintptr_t)c->float_workspace,
        .int_workspace = (void *)(uintptr_t)c->int_workspace,
    };
    mg_fi_error err;
    if ((st = fi.run(&c->shape, &c->info, &args, (void *)stream, &err)))
        return plugin_failure(ctx, st, &err);
    return MG_OK;
}

static void cuda_release(mg_attention_plan *p, bool backend_live) {
    cuda_attention_plan *c = p->impl;
    if (!c)
        return;
    for (int i = 0; backend_live && i < 2; i++) {
        if (c->mirror_in_flight[i])
            mg_event_synchronize(c->mirror_copied[i]);
        mg_event_destroy(c->mirror_copied[i]);
        mg_host_free(p->backend, c->mirror[i]);
    }
    if (backend_live) {
        mg_free(p->backend, c->float_workspace);
        mg_free(p->backend, c->int_workspace);
    }
    free(c);
    p->impl = NULL;
}

static void cuda_info(const mg_attention_plan *p, mg_attention_plan_info *out) {
    const cuda_attention_plan *c = p->impl;
    if (!c)
        return;
    out->impl = c->shape.path == MG_FI_PATH_FA3   ? MG_ATTENTION_IMPL_FA3
                : c->shape.path == MG_FI_PATH_FA2 ? MG_ATTENTION_IMPL_FA2
                                                  : MG_ATTENTION_IMPL_AUTO;
    out->workspace_bytes = c->float_bytes + c->int_bytes;
    out->pinned_bytes = c->mirror_bytes[0] + c->mirror_bytes[1];
}

/* The plugin has kernels for a few head_dims only; the CPU reference takes any. */
static mg_status cuda_check_desc(const mg_attention_desc *d, const char *fn) {
    if (!mg_fi_head_dim_built(d->head_dim))
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: head_dim %u has no CUDA kernels (FlashInfer's are built for "
                        "head_dim " MG_FI_HEAD_DIMS_TEXT ")",
                        fn, d->head_dim);
    return MG_OK;
}

/* FlashInfer's FA2 kernels need sm_80 or newer; the plugin must load. */
static bool cuda_available(mg_backend *b) {
    mg_device_info info;
    return plugin_ready() == MG_OK && mg_device_get_info(b, &info) == MG_OK &&
           info.cc_major >= 8;
}

const mg_attention_backend_ops mg_cuda_attention_ops = {
    .plan = cuda_plan,
    .run = cuda_run,
    .release = cuda_release,
    .info = cuda_info,
    .check_desc = cuda_check_desc,
    .available = cuda_available,
};
