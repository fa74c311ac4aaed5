/* attention_flashinfer.c - ragged prefill attention on the CUDA backend, through the FlashInfer
 * plugin libmetrale_gpu_attention.so (kernels/cuda/attention/flashinfer_ragged_prefill.h).
 *
 * A plan holds a float and an int workspace on the device, sized from each plan (they grow when
 * a later eager plan needs more), and two page-locked mirrors of the int workspace. Planning
 * writes the schedule into one mirror and queues its copy on the stream; the next plan uses the
 * other mirror, and before a mirror is written again the event recorded after its last copy is
 * waited for, so host writes never race a copy in flight.
 *
 * Workspaces are library-owned ledger allocations (mg_alloc_owned_at): mg_ledger_sweep leaves
 * them to the plan. Growth allocates the new buffers first and frees the old ones only after
 * the plan's stream has drained; it is refused (MG_ERR_CAPTURING) while any stream of the
 * backend captures, like every allocation.
 *
 * A fixed-grid plan also holds a staging int buffer. FlashInfer always queues the copy of a
 * schedule it plans; an update points that copy at the staging buffer, compares the new launch
 * layout with the captured one, and only when they match uploads the mirror into the live int
 * workspace that captured graphs read. A batch the grid cannot serve is refused
 * (MG_ERR_INVALID_ARGUMENT) with the previous batch still planned.
 *
 * With a caller's workspace (desc.workspace) nothing is allocated on the device: the float,
 * int and (fixed-grid) staging workspaces are consecutive 16-byte aligned sub-ranges of it, in
 * that order, each of the size FlashInfer asks for (mg_fi_workspace_bytes). An eager plan
 * re-carves them when a batch needs more than the current sub-ranges (refused when the total
 * would exceed the caller's bytes); stream order makes that safe, since the old sub-ranges are
 * read only by work queued earlier on the plan's stream. A fixed-grid plan keeps the carve of
 * its creation. The page-locked mirrors are still the plan's own host memory. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_provider.h"
#include "backend_impl.h"
#include "cuda_backend.h"
#include "cuda_plugin.h"
#include "error.h"
#include "flashinfer_ragged_prefill.h"

#define PLUGIN_FILE "libmetrale_gpu_attention.so"

static struct {
    mg_fi_abi_version_fn abi_version;
    mg_fi_choose_path_fn choose_path;
    mg_fi_workspace_bytes_fn workspace_bytes;
    mg_fi_plan_fn plan;
    mg_fi_upload_fn upload;
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
        {"mg_fi_upload", (void **)&fi.upload},
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
    mg_devptr int_staging;                        /* fixed-grid plans: FlashInfer's copy target */
    size_t float_bytes, int_bytes, staging_bytes; /* allocated */
    void *mirror[2];
    size_t mirror_bytes[2];
    mg_event *mirror_copied[2]; /* recorded after the copy out of each mirror */
    bool mirror_in_flight[2];
    int next_mirror;
} cuda_attention_plan;

/* A failed plugin call: CUDA errors go through the backend (which records sticky faults),
 * the plugin's own text is kept. */
static mg_status plugin_failure(mg_cuda_context *ctx, mg_status st, const mg_fi_error *err) {
    return mg_cuda_plugin_failure(ctx, st, err->cuda_error, err->message, "FlashInfer attention");
}

static mg_fi_path forced_path(mg_attention_impl impl) {
    return impl == MG_ATTENTION_IMPL_FA2   ? MG_FI_PATH_FA2
           : impl == MG_ATTENTION_IMPL_FA3 ? MG_FI_PATH_FA3
                                           : MG_FI_PATH_NONE;
}

/* Grows the `count` workspaces to at least need[i] bytes. New buffers are allocated first, so
 * a failure (out of memory, or MG_ERR_CAPTURING while a stream captures) changes nothing; the
 * old ones are freed only after stream `s` has finished the work queued on it, which may still
 * read them (updates and runs of a plan share one stream). */
static mg_status grow_workspaces(mg_attention_plan *p, mg_stream *s, mg_devptr *const buf[],
                                 size_t *const have[], const size_t need[], int count) {
    mg_devptr grown[3] = {0};
    bool replaces = false;
    mg_status st = MG_OK;
    for (int i = 0; i < count && !st; i++) {
        if (need[i] <= *have[i])
            continue;
        st = mg_alloc_owned_at(p->backend, need[i], MG_ALLOC_DEVICE, &grown[i], __FILE__, __LINE__);
        replaces = replaces || *buf[i];
    }
    if (!st && replaces)
        st = mg_stream_synchronize(s ? s : mg_stream_default(p->backend));
    for (int i = 0; i < count; i++) {
        if (!grown[i])
            continue;
        if (st) {
            mg_free(p->backend, grown[i]);
            continue;
        }
        mg_free(p->backend, *buf[i]);
        *buf[i] = grown[i];
        *have[i] = need[i];
    }
    return st;
}

/* The FlashInfer shape of a plan of `d` for a batch of `batch_size` (path still unset). */
static mg_fi_shape shape_of(const mg_attention_desc *d, uint32_t batch_size) {
    return (mg_fi_shape){
        .num_qo_heads = d->num_qo_heads,
        .num_kv_heads = d->num_kv_heads,
        .head_dim = d->head_dim,
        .window_left = d->window_left,
        .causal = d->causal,
        .graph_mode = d->graph_qo_rows != 0,
        .graph_qo_rows = d->graph_qo_rows,
        .batch_size = batch_size,
    };
}

/* The carved bytes (caller's workspace) of float, int and, in graph mode, staging workspaces;
 * false when the sum overflows. */
static bool carved_bytes(const mg_fi_shape *shape, size_t float_bytes, size_t int_bytes,
                         size_t *total) {
    const size_t sizes[3] = {float_bytes, int_bytes, int_bytes};
    return mg_attention_carve_total(sizes, shape->graph_mode ? 3 : 2, total);
}

/* Points the workspaces into the caller's workspace, re-carving when a batch needs more than
 * the current sub-ranges hold. Only pointers and sizes change (nothing is freed, nothing
 * waited for): the caller's stream order keeps earlier queued work on the old sub-ranges
 * ahead of anything planned into the new ones. */
static mg_status carve_workspaces(mg_attention_plan *p, cuda_attention_plan *c,
                                  const mg_fi_shape *shape, size_t float_bytes, size_t int_bytes) {
    const bool carved = c->int_workspace != 0;
    if (carved && float_bytes <= c->float_bytes && int_bytes <= c->int_bytes &&
        (!shape->graph_mode || int_bytes <= c->staging_bytes))
        return MG_OK;
    size_t total;
    if (!carved_bytes(shape, float_bytes, int_bytes, &total) || total > p->desc.workspace_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: this batch needs %zu float + %zu int workspace bytes (%zu carved), "
                        "more than the caller's workspace of %zu bytes (it never grows; the "
                        "plan keeps its previous batch)",
                        mg_attention_plan_fn(p), float_bytes, int_bytes,
                        carved_bytes(shape, float_bytes, int_bytes, &total) ? total : SIZE_MAX,
                        p->desc.workspace_bytes);
    const mg_devptr base = p->desc.workspace;
    const size_t int_offset = mg_attention_carve_size(float_bytes);
    c->float_workspace = float_bytes ? base : 0; /* as unallocated on the library path */
    c->int_workspace = base + int_offset;
    c->int_staging = shape->graph_mode ? base + int_offset + mg_attention_carve_size(int_bytes) : 0;
    c->float_bytes = float_bytes;
    c->int_bytes = int_bytes;
    c->staging_bytes = shape->graph_mode ? int_bytes : 0;
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

/* Puts back the caller-workspace carve of `before` (workspace pointers and sizes only). */
static void restore_carve(cuda_attention_plan *c, const cuda_attention_plan *before) {
    c->float_workspace = before->float_workspace;
    c->int_workspace = before->int_workspace;
    c->int_staging = before->int_staging;
    c->float_bytes = before->float_bytes;
    c->int_bytes = before->int_bytes;
    c->staging_bytes = before->staging_bytes;
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
    mg_fi_shape shape = shape_of(d, batch_size);
    /* Paged plans: FlashInfer schedules pages (kv_indptr of the page table) and uploads the
     * last-page lengths with the indptrs. */
    shape.page_size = p->page_size;
    shape.soft_cap = p->logits_soft_cap > 0.0f;
    shape.kv_fp8 = p->kv_dtype == MG_KV_FP8_E4M3;
    const int32_t *kv_units = p->page_size ? p->new_page_indptr : kv_indptr;
    /* An update of a fixed-grid plan: captured graphs read its workspaces and launch layout. */
    const bool fixed_update = shape.graph_mode && p->batch_size;
    mg_fi_error err;
    if (fixed_update) {
        shape.path = c->shape.path; /* captured launches are of this path */
    } else if ((st = fi.choose_path(&shape, qo_indptr, kv_units, forced_path(d->impl), &shape.path,
                                    &err))) {
        return plugin_failure(ctx, st, &err);
    }
    size_t float_bytes, int_bytes;
    if ((st = fi.workspace_bytes(&shape, qo_indptr, kv_units, &float_bytes, &int_bytes, &err)))
        return plugin_failure(ctx, st, &err);
    if (fixed_update && (float_bytes > c->float_bytes || int_bytes > c->int_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_attention_plan_update: this batch needs %zu float + %zu int workspace "
                        "bytes, more than the %zu + %zu of the fixed-grid plan (a fixed grid "
                        "never grows; the plan keeps its previous batch)",
                        float_bytes, int_bytes, c->float_bytes, c->int_bytes);
    /* A caller's workspace: the carve before this plan, restored when it fails. */
    const cuda_attention_plan carve_before = *c;
    if (!fixed_update && d->workspace) {
        if ((st = carve_workspaces(p, c, &shape, float_bytes, int_bytes)))
            return st;
    } else if (!fixed_update) {
        mg_devptr *const bufs[3] = {&c->float_workspace, &c->int_workspace, &c->int_staging};
        size_t *const have[3] = {&c->float_bytes, &c->int_bytes, &c->staging_bytes};
        const size_t need[3] = {float_bytes, int_bytes, int_bytes};
        if ((st = grow_workspaces(p, s, bufs, have, need, shape.graph_mode ? 3 : 2)))
            return st;
    }
    int mirror = 0;
    if ((st = take_mirror(p, c, int_bytes, &mirror))) {
        if (d->workspace)
            restore_carve(c, &carve_before);
        return st;
    }

    /* Planned on the host into the mirror; FlashInfer's own copy of its part goes to the
     * staging buffer on an update, to the live workspace otherwise. */
    mg_fi_plan_info info;
    const mg_devptr copy_target = fixed_update ? c->int_staging : c->int_workspace;
    st = fi.plan(&shape, qo_indptr, kv_units, p->page_size ? p->new_last_page_len : NULL,
                 (void *)(uintptr_t)c->float_workspace, c->float_bytes,
                 (void *)(uintptr_t)copy_target, c->mirror[mirror], int_bytes, (void *)stream,
                 &info, &err);
    const bool layout_changed =
        !st && fixed_update && memcmp(info.words, c->info.words, sizeof info.words);
    mg_status up = MG_OK;
    if (!st && !layout_changed)
        up = fi.upload(&shape, (void *)(uintptr_t)c->int_workspace, c->mirror[mirror], int_bytes,
                       fixed_update, (void *)stream, &err);
    /* Even a failed plan may have queued copies out of the mirror: it counts as in flight. */
    mg_status rec = mg_event_record(c->mirror_copied[mirror], s);
    c->mirror_in_flight[mirror] = rec == MG_OK;
    c->next_mirror = mirror ^ 1;
    if ((st || layout_changed || up) && d->workspace)
        restore_carve(c, &carve_before);
    if (st) {
        /* An eager plan's FlashInfer copy targets the live workspace: unless the failure is
         * one raised before any copy (bad input, missing memory), the schedule may be mixed. */
        if (!fixed_update && st != MG_ERR_INVALID_ARGUMENT && st != MG_ERR_UNSUPPORTED &&
            st != MG_ERR_OUT_OF_MEMORY)
            p->usable = false;
        return plugin_failure(ctx, st, &err);
    }
    if (layout_changed)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_attention_plan_update: this batch changes the fixed-grid launch "
                        "layout (%s path) that captured graphs depend on; nothing was uploaded "
                        "and the plan keeps its previous batch",
                        shape.path == MG_FI_PATH_FA3 ? "FA3" : "FA2");
    if (up) {
        p->usable = false; /* part of the new schedule may have landed */
        return plugin_failure(ctx, up, &err);
    }
    if (rec)
        return rec;
    c->shape = shape;
    c->info = info;
    return MG_OK;
}

/* Launches the plan's schedule with `args` (the tensors of a ragged or a paged run). */
static mg_status launch_planned(mg_attention_plan *p, const mg_fi_run_args *args, mg_stream *s) {
    cuda_attention_plan *c = p->impl;
    mg_cuda_context *ctx;
    mg_status st = mg_cuda_bind(p->backend, &ctx);
    CUstream stream;
    if (!st)
        st = mg_cuda_stream(p->backend, s, &stream);
    if (st)
        return st;
    mg_fi_run_args a = *args;
    a.sm_scale = p->desc.sm_scale;
    a.float_workspace = (void *)(uintptr_t)c->float_workspace;
    a.int_workspace = (void *)(uintptr_t)c->int_workspace;
    mg_fi_error err;
    if ((st = fi.run(&c->shape, &c->info, &a, (void *)stream, &err)))
        return plugin_failure(ctx, st, &err);
    return MG_OK;
}

static mg_status cuda_run(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s) {
    const mg_fi_run_args args = {
        .q = (void *)(uintptr_t)t->q,
        .k = (void *)(uintptr_t)t->k,
        .v = (void *)(uintptr_t)t->v,
        .o = (void *)(uintptr_t)t->o,
        .lse = (float *)(uintptr_t)t->lse,
        .qo_rows = t->qo_rows,
        .kv_rows = t->kv_rows,
    };
    return launch_planned(p, &args, s);
}

static mg_status cuda_run_paged(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                                mg_stream *s) {
    const mg_fi_run_args args = {
        .q = (void *)(uintptr_t)t->q,
        .k = (void *)(uintptr_t)t->k_pages,
        .v = (void *)(uintptr_t)t->v_pages,
        .o = (void *)(uintptr_t)t->o,
        .lse = (float *)(uintptr_t)t->lse,
        .qo_rows = t->qo_rows,
        .kv_rows = (uint32_t)p->kv_indptr[p->batch_size],
        .kv_indices = (int32_t *)(uintptr_t)t->kv_indices,
        .logits_soft_cap = p->logits_soft_cap,
        .k_scale = (const float *)(uintptr_t)t->k_scale,
        .v_scale = (const float *)(uintptr_t)t->v_scale,
    };
    return launch_planned(p, &args, s);
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
    if (backend_live && !p->desc.workspace) { /* a caller's workspace stays the caller's */
        mg_free(p->backend, c->float_workspace);
        mg_free(p->backend, c->int_workspace);
        mg_free(p->backend, c->int_staging);
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

/* What cuda_plan would carve for a new plan of `d` with this batch: the path it would choose,
 * then FlashInfer's float and int bytes for it (host-only sizing in the plugin). */
static mg_status flashinfer_workspace_bytes(mg_backend *b, const mg_attention_desc *d,
                                            const int32_t *qo_indptr, const int32_t *kv_indptr,
                                            uint32_t batch_size, size_t *bytes) {
    mg_cuda_context *ctx;
    mg_status st = plugin_ready();
    if (!st)
        st = mg_cuda_bind(b, &ctx);
    if (st)
        return st;
    mg_fi_shape shape = shape_of(d, batch_size);
    mg_fi_error err;
    size_t float_bytes, int_bytes;
    if ((st = fi.choose_path(&shape, qo_indptr, kv_indptr, forced_path(d->impl), &shape.path,
                             &err)) ||
        (st = fi.workspace_bytes(&shape, qo_indptr, kv_indptr, &float_bytes, &int_bytes, &err)))
        return plugin_failure(ctx, st, &err);
    if (!carved_bytes(&shape, float_bytes, int_bytes, bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_attention_workspace_bytes: %zu float + %zu int workspace bytes "
                        "overflow the address space",
                        float_bytes, int_bytes);
    return MG_OK;
}

/* The plugin has kernels for a few head_dims only; the CPU reference takes any. */
static bool flashinfer_supports(mg_backend *b, const void *call, char *reason,
                                size_t reason_bytes) {
    (void)b;
    const mg_attention_desc *d = call;
    if (mg_fi_head_dim_built(d->head_dim))
        return true;
    snprintf(
        reason, reason_bytes,
        "head_dim %u has no CUDA kernels (FlashInfer's are built for head_dim " MG_FI_HEAD_DIMS_TEXT
        ")",
        d->head_dim);
    return false;
}

/* FlashInfer's FA2 kernels need sm_80 or newer; the plugin must load. Answers without
 * touching the caller's error message. */
static bool flashinfer_available(mg_backend *b, char *reason, size_t reason_bytes) {
    mg_error_state saved;
    mg_error_save(&saved);
    mg_device_info info;
    bool ok = true;
    if (plugin_ready() != MG_OK) {
        snprintf(reason, reason_bytes, "the attention plugin did not load: %s", mg_last_error());
        ok = false;
    } else if (mg_device_get_info(b, &info) != MG_OK || info.cc_major < 8) {
        snprintf(reason, reason_bytes, "FlashInfer needs compute capability 8.0 or newer");
        ok = false;
    }
    mg_error_restore(&saved);
    return ok;
}

const mg_attention_provider mg_attention_flashinfer_provider = {
    .base = {.name = "flashinfer",
             .backend = MG_BACKEND_CUDA,
             .available = flashinfer_available,
             .supports = flashinfer_supports},
    .plan = cuda_plan,
    .run = cuda_run,
    .release = cuda_release,
    .info = cuda_info,
    .workspace_bytes = flashinfer_workspace_bytes,
};

/* Paged kernels are built for fewer shapes (each one costs CI compile time). */
static bool flashinfer_paged_supports(mg_backend *b, const void *call, char *reason,
                                      size_t reason_bytes) {
    (void)b;
    const mg_paged_attention_call *c = call;
    const bool soft_cap = c->logits_soft_cap > 0.0f, fp8 = c->kv_dtype == MG_KV_FP8_E4M3;
    if (mg_fi_paged_built(c->desc.head_dim, soft_cap, fp8))
        return true;
    snprintf(reason, reason_bytes,
             "head_dim %u%s%s has no paged CUDA kernels (built: " MG_FI_PAGED_KERNELS_TEXT ")",
             c->desc.head_dim, soft_cap ? " with soft-cap" : "", fp8 ? " on FP8 pools" : "");
    return false;
}

const mg_attention_provider mg_attention_flashinfer_paged_provider = {
    .base = {.name = "flashinfer",
             .backend = MG_BACKEND_CUDA,
             .available = flashinfer_available,
             .supports = flashinfer_paged_supports},
    .plan = cuda_plan,
    .run_paged = cuda_run_paged,
    .release = cuda_release,
    .info = cuda_info,
};
