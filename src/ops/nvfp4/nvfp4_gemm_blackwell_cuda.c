/* nvfp4_gemm_blackwell_cuda.c - the Blackwell provider of the NVFP4 GEMMs (nvfp4_blackwell.h):
 * the CUTLASS plugin's sm_100a / sm_120a entry points, chosen by the device's compute
 * capability. Not verified on hardware (no Blackwell device was available): see README. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "checked_math.h"
#include "cuda_backend.h"
#include "cuda_plugin.h"
#include "cutlass_loader.h"
#include "cutlass_nvfp4.h"
#include "error.h"
#include "metrale/nvfp4.h"
#include "nvfp4_blackwell.h"
#include "op_builtin.h"
#include "op_cache.h"

/* One architecture's entry points. */
typedef struct arch_entry {
    uint32_t unit;
    const char *prefix;
    pthread_once_t once;
    mg_status status;
    char message[512];
    mg_cutlass_nvfp4_workspace_fn gemm_workspace, moe_gemm_workspace;
    mg_cutlass_nvfp4_gemm_fn gemm, moe_gemm;
    mg_cutlass_nvfp4_prepare_fn prepare;
    mg_cutlass_nvfp4_silu_mul_fn silu_mul;
} arch_entry;

static arch_entry sm100 = {.unit = MG_CUTLASS_UNITS_SM100_NVFP4,
                           .prefix = "mg_cutlass_nvfp4_sm100",
                           .once = PTHREAD_ONCE_INIT};
static arch_entry sm120 = {.unit = MG_CUTLASS_UNITS_SM120_NVFP4,
                           .prefix = "mg_cutlass_nvfp4_sm120",
                           .once = PTHREAD_ONCE_INIT};

static void resolve(arch_entry *a) {
    char names[6][64];
    static const char *const suffix[6] = {
        "_gemm_workspace", "_moe_gemm_workspace", "_gemm", "_moe_gemm", "_prepare", "_silu_mul"};
    for (int i = 0; i < 6; i++)
        snprintf(names[i], sizeof names[i], "%s%s", a->prefix, suffix[i]);
    const mg_cuda_plugin_symbol symbols[6] = {
        {names[0], (void **)&a->gemm_workspace}, {names[1], (void **)&a->moe_gemm_workspace},
        {names[2], (void **)&a->gemm},           {names[3], (void **)&a->moe_gemm},
        {names[4], (void **)&a->prepare},        {names[5], (void **)&a->silu_mul},
    };
    a->status = mg_cutlass_plugin_resolve("NVFP4 GEMM on Blackwell", a->unit, symbols, 6);
    if (a->status)
        snprintf(a->message, sizeof a->message, "%s", mg_last_error());
}
static void resolve_sm100(void) {
    resolve(&sm100);
}
static void resolve_sm120(void) {
    resolve(&sm120);
}

/* The architecture of b's device whose kernels the plugin was built with, or NULL. The 'a'
 * cubins run on exactly their compute capability (10.0, 12.0). */
static arch_entry *device_arch(mg_backend *b) {
    if (!b || mg_backend_get_kind(b) != MG_BACKEND_CUDA)
        return NULL;
    mg_device_info info;
    mg_error_state saved;
    mg_error_save(&saved);
    mg_status st = mg_device_get_info(b, &info);
    mg_error_restore(&saved);
    if (st || info.cc_minor != 0)
        return NULL;
    arch_entry *a = info.cc_major == 10 ? &sm100 : info.cc_major == 12 ? &sm120 : NULL;
    if (!a || !(mg_cutlass_plugin_units() & a->unit))
        return NULL;
    return a;
}

/* Resolved entry points of b's architecture, or an error naming why not. */
static mg_status entry_for(mg_backend *b, const char *fn, arch_entry **out) {
    arch_entry *a = device_arch(b);
    if (!a)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: no Blackwell NVFP4 kernels for this device", fn);
    pthread_once(&a->once, a == &sm100 ? resolve_sm100 : resolve_sm120);
    if (a->status)
        return MG_ERROR(a->status, "%s: %s", fn, a->message);
    *out = a;
    return MG_OK;
}

/* The entry points of b's architecture, with its context made current and s's CUstream. */
static mg_status bound(mg_backend *b, mg_stream *s, const char *fn, arch_entry **a,
                       mg_cuda_context **ctx, CUstream *stream) {
    mg_status st = entry_for(b, fn, a);
    if (!st)
        st = mg_cuda_bind(b, ctx);
    if (!st)
        st = mg_cuda_stream(b, s, stream);
    return st;
}

bool mg_nvfp4_blackwell_layout(mg_backend *b, uint32_t n, uint32_t k) {
    return n && n % 128 == 0 && k && k % 32 == 0 && device_arch(b) != NULL;
}

static bool blackwell_available(mg_backend *b, char *reason, size_t reason_bytes) {
    if (!device_arch(b)) {
        snprintf(reason, reason_bytes,
                 "needs a device of compute capability 10.0 or 12.0 and the CUTLASS plugin's "
                 "Blackwell kernels (METRALE_CUTLASS_BLACKWELL)");
        return false;
    }
    return true;
}

static bool blackwell_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mg_nvfp4_gemm_problem *c = call;
    if (!c || !mg_nvfp4_blackwell_layout(b, c->n, c->k)) {
        snprintf(reason, reason_bytes, "needs n a multiple of 128 and k a multiple of 32");
        return false;
    }
    if (c->ldc % 8) {
        snprintf(reason, reason_bytes, "needs ldc a multiple of 8 (16-byte output rows)");
        return false;
    }
    if (c->fusion.prologue != MG_GEMM_PROLOGUE_NONE ||
        c->fusion.epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD) {
        snprintf(reason, reason_bytes, "runs no RMSNorm prologue or residual-add epilogue");
        return false;
    }
    return true;
}

mg_status mg_nvfp4_blackwell_prepare(mg_backend *b, mg_stream *s, const char *fn, uint32_t n,
                                     uint32_t k, uint32_t experts, mg_devptr codes,
                                     mg_devptr scales, mg_devptr prepared_values,
                                     mg_devptr prepared_scales) {
    arch_entry *a;
    mg_cuda_context *ctx;
    CUstream stream;
    mg_status st = bound(b, s, fn, &a, &ctx, &stream);
    if (st)
        return st;
    mg_plugin_error err;
    st = a->prepare((const void *)(uintptr_t)codes, (const void *)(uintptr_t)scales, n, k, experts,
                    (void *)(uintptr_t)prepared_values, mg_nvfp4_prepared_value_bytes(n, k),
                    (void *)(uintptr_t)prepared_scales, mg_nvfp4_prepared_scale_bytes(n, k),
                    (void *)stream, &err);
    return st ? mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, fn) : MG_OK;
}

mg_status mg_nvfp4_blackwell_gemm(mg_backend *b, mg_stream *s, const mg_nvfp4_gemm_problem *c) {
    arch_entry *a;
    mg_cuda_context *ctx;
    CUstream stream;
    mg_status st = bound(b, s, c->fn, &a, &ctx, &stream);
    if (st)
        return st;
    const bool grouped = c->op == MG_OP_NVFP4_MOE_GEMM;
    mg_cutlass_nvfp4_args args = {
        .rows = c->rows,
        .n = c->n,
        .k = c->k,
        .experts = c->experts,
        .act_rows = c->act_rows,
        .act_pitch = c->act_pitch,
        .ldc = c->ldc,
        .act = (const void *)(uintptr_t)c->act,
        .sorted_token_ids = (const int32_t *)(uintptr_t)c->token_ids,
        .expert_offsets = (const int32_t *)(uintptr_t)c->offsets,
        .w_codes_stride = mg_nvfp4_prepared_value_bytes(c->n, c->k),
        .w_scales_stride = mg_nvfp4_prepared_scale_bytes(c->n, c->k),
    };
    mg_cutlass_nvfp4_workspace_fn workspace_fn =
        grouped ? a->moe_gemm_workspace : a->gemm_workspace;
    mg_cutlass_nvfp4_gemm_fn gemm_fn = grouped ? a->moe_gemm : a->gemm;
    mg_plugin_error err;
    /* gate_up: both products into the workspace (rows x n, pitch n), then silu(gate) * up. */
    const mg_nvfp4_weight *weights[2] = {&c->w, c->up};
    args.w_codes = (const void *)(uintptr_t)c->w.values;
    args.w_scales = (const void *)(uintptr_t)c->w.scales;
    args.w_global = (const float *)(uintptr_t)c->w.global_scale;
    args.out = (void *)(uintptr_t)c->out; /* the query checks it; gate_up writes elsewhere */
    if (c->up)
        args.ldc = c->n;
    size_t gemm_bytes, product_bytes = 0, total;
    if ((st = workspace_fn(&args, &gemm_bytes, &err)))
        return mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, c->fn);
    gemm_bytes = (gemm_bytes + 255) / 256 * 256;
    if (c->up && !mg_mul_size((size_t)c->rows * c->n, 2, &product_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: gate_up products overflow", c->fn);
    product_bytes = (product_bytes + 255) / 256 * 256;
    if (product_bytes > (SIZE_MAX - gemm_bytes) / 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: workspace overflows", c->fn);
    total = gemm_bytes + 2 * product_bytes;
    mg_op_cache *cache = mg_backend_live_op_cache(b); /* the front entered */
    mg_devptr ws;
    if ((st = mg_op_cache_stream_scratch(cache, "nvfp4 cutlass workspace", total, s, &ws))) {
        mg_error_append(" (the Blackwell NVFP4 GEMM's workspace: make one call of this shape "
                        "before capturing)");
        return st;
    }
    args.workspace = (void *)(uintptr_t)ws;
    args.workspace_bytes = gemm_bytes;
    for (int i = 0; i < (c->up ? 2 : 1); i++) {
        args.w_codes = (const void *)(uintptr_t)weights[i]->values;
        args.w_scales = (const void *)(uintptr_t)weights[i]->scales;
        args.w_global = (const float *)(uintptr_t)weights[i]->global_scale;
        args.out =
            (void *)(uintptr_t)(c->up ? ws + gemm_bytes + (size_t)i * product_bytes : c->out);
        if ((st = gemm_fn(&args, (void *)stream, &err)))
            return mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, c->fn);
    }
    if (c->up) {
        const mg_devptr gate = ws + gemm_bytes, up = gate + product_bytes;
        st = a->silu_mul((const void *)(uintptr_t)gate, (const void *)(uintptr_t)up, c->n,
                         (void *)(uintptr_t)c->out, c->ldc, c->rows, c->n, (void *)stream, &err);
        if (st)
            return mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, c->fn);
    }
    return MG_OK;
}

const mg_nvfp4_provider mg_nvfp4_blackwell_provider = {
    .base = {.name = "cutlass_blackwell",
             .backend = MG_BACKEND_CUDA,
             .available = blackwell_available,
             .supports = blackwell_supports},
    .blackwell_layout = true,
    .run = mg_nvfp4_blackwell_gemm,
};
