/* gemm_cutlass_cuda.c - the CUTLASS provider of the BF16 GEMM op: Hopper TMA warp-specialized
 * kernels from the CUTLASS plugin (kernels/cuda/cutlass/cutlass_dense.h), beside cuBLASLt.
 *
 * In the automatic choice it takes only the shapes the measured table gives it
 * (gemm_cutlass_table.c), so cuBLASLt runs everything else, and nothing at all while
 * batch-invariant mode is on. Forced by name (mg_op_force_provider(b, MG_OP_GEMM_BF16,
 * "cutlass")) it accepts every BF16 call and runs the table's configuration, or for a shape
 * without a row the default one for its M; a call the kernels cannot take (F32 output; N, K or
 * ldc not a multiple of 8; pointers not 16-byte aligned; CUTLASS's can_implement refusing)
 * runs on cuBLASLt instead. In batch-invariant mode the forced provider runs one configuration
 * for every M, so a row's bits do not depend on the batch.
 *
 * Workspace: the calls share cuBLASLt's (the caller's, or the stream's own), since any call may
 * fall back to it; the kernels themselves need none or little of it, checked per call. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "cuda_plugin.h"
#include "cutlass_dense.h"
#include "cutlass_loader.h"
#include "error.h"
#include "gemm_cublaslt.h"
#include "gemm_cutlass.h"
#include "gemm_cutlass_table.h"
#include "op_state.h"

static mg_cutlass_dense_sm90_fn dense_run;
static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static mg_status plugin_status;
static char plugin_message[512];

static atomic_bool plugin_resolved; /* resolve_plugin has run: skip the once and the error copy */
static atomic_uint_fast64_t kernel_calls, fallback_calls;

static void resolve_plugin(void) {
    const mg_cuda_plugin_symbol symbols[] = {{"mg_cutlass_dense_sm90", (void **)&dense_run}};
    plugin_status =
        mg_cutlass_plugin_resolve("BF16 GEMM on CUTLASS", MG_CUTLASS_UNITS_SM90_DENSE, symbols, 1);
    if (plugin_status)
        snprintf(plugin_message, sizeof plugin_message, "%s", mg_last_error());
    atomic_store_explicit(&plugin_resolved, true, memory_order_release);
}

/* Per backend: the device facts every call needs, read once. */
typedef struct cutlass_state {
    int cc_major, cc_minor, sm_count;
} cutlass_state;

static mg_status cutlass_state_create(mg_backend *b, void **out) {
    mg_device_info info;
    mg_status st = mg_device_get_info(b, &info);
    if (st)
        return st;
    cutlass_state *s = calloc(1, sizeof *s);
    if (!s)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "CUTLASS GEMM state");
    *s = (cutlass_state){info.cc_major, info.cc_minor, info.multiprocessors};
    *out = s;
    return MG_OK;
}

static void cutlass_state_destroy(mg_backend *b, void *state) {
    (void)b;
    free(state);
}

static const mg_op_state_type cutlass_state_type = {
    .name = "CUTLASS GEMM", .create = cutlass_state_create, .destroy = cutlass_state_destroy};

/* The state, created on first use; NULL (error state untouched) when it cannot be. */
static cutlass_state *state_of(mg_backend *b) {
    void *st = mg_op_state_peek(b, &cutlass_state_type);
    if (!st) {
        mg_error_state saved;
        mg_error_save(&saved);
        if (mg_op_state_get(b, &cutlass_state_type, &st) != MG_OK)
            st = NULL;
        mg_error_restore(&saved);
    }
    return st;
}

/* The kernels are sm_90a: they run on compute capability 9.0 exactly. */
static bool cutlass_available(mg_backend *b, char *reason, size_t reason_bytes) {
    if (!atomic_load_explicit(&plugin_resolved, memory_order_acquire)) {
        mg_error_state saved; /* the loader reports through mg_last_error: keep the caller's */
        mg_error_save(&saved);
        pthread_once(&plugin_once, resolve_plugin);
        mg_error_restore(&saved);
    }
    if (plugin_status) {
        snprintf(reason, reason_bytes, "%s", plugin_message);
        return false;
    }
    cutlass_state *st = state_of(b);
    if (!st) {
        snprintf(reason, reason_bytes, "the device's compute capability could not be read");
        return false;
    }
    if (st->cc_major != 9 || st->cc_minor != 0) {
        snprintf(reason, reason_bytes,
                 "the CUTLASS GEMM kernels are built for sm_90a, the device is %d.%d", st->cc_major,
                 st->cc_minor);
        return false;
    }
    return true;
}

static bool forced_here(mg_backend *b) {
    return mg_op_forced(b, MG_OP_GEMM_BF16) == &mg_gemm_cutlass_provider.base;
}

static bool batch_invariant(mg_backend *b) {
    return mg_gemm_cublaslt_provider.batch_invariant(b);
}

/* Whether the kernels can take the call (CUTLASS's can_implement may still refuse). */
static bool kernels_fit(const mg_gemm_plan *p, char *reason, size_t reason_bytes) {
    if (p->out_type != MG_DTYPE_BF16) {
        snprintf(reason, reason_bytes, "the CUTLASS kernels write BF16 only, not %s",
                 mg_dtype_name(p->out_type));
        return false;
    }
    if (!mg_cutlass_dense_fits(p->n, p->k, p->ldc)) {
        snprintf(reason, reason_bytes,
                 "the CUTLASS kernels need N, K and ldc multiples of 8 (N=%u K=%u ldc=%u)", p->n,
                 p->k, p->ldc);
        return false;
    }
    if (p->pointer_alignment && p->pointer_alignment < 16) {
        snprintf(reason, reason_bytes, "the CUTLASS kernels need 16-byte aligned pointers (%u)",
                 p->pointer_alignment);
        return false;
    }
    return true;
}

static bool cutlass_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mg_gemm_plan *p = call;
    if (!mg_gemm_fusion_declared(&mg_gemm_cutlass_provider, p, reason, reason_bytes))
        return false; /* no fused kernels yet */
    if (p->kind != MG_GEMM_BF16) {
        snprintf(reason, reason_bytes, "the CUTLASS provider runs BF16 GEMMs only");
        return false;
    }
    if (forced_here(b))
        return true; /* what the kernels cannot take runs on cuBLASLt */
    if (batch_invariant(b)) {
        snprintf(reason, reason_bytes, "batch-invariant mode keeps every shape on cuBLASLt");
        return false;
    }
    if (!kernels_fit(p, reason, reason_bytes))
        return false;
    if (mg_gemm_cutlass_table_lookup(p->m, p->n, p->k) < 0) {
        snprintf(reason, reason_bytes,
                 "cuBLASLt was measured faster for M=%u N=%u K=%u (gemm_cutlass_table.c)", p->m,
                 p->n, p->k);
        return false;
    }
    return true;
}

/* The default configuration of a shape the table has no row for (forced provider only). */
static int default_config(uint32_t m, bool invariant) {
    if (invariant)
        return MG_CUTLASS_DENSE_COOP_128X128;
    return m <= 64     ? MG_CUTLASS_DENSE_PINGPONG_64X128
           : m >= 2048 ? MG_CUTLASS_DENSE_COOP_128X256
                       : MG_CUTLASS_DENSE_COOP_128X128;
}

static mg_status fall_back(mg_backend *b, mg_stream *s, const mg_gemm_call *call) {
    atomic_fetch_add(&fallback_calls, 1);
    return mg_gemm_cublaslt_provider.run(b, s, call);
}

static mg_status cutlass_gemm(mg_backend *b, mg_stream *s, const mg_gemm_call *call) {
    const mg_gemm_plan *p = &call->plan;
    const char *pinned = NULL; /* env: a configuration pinned for the benchmark */
    int config = mg_gemm_cutlass_table_lookup(p->m, p->n, p->k);
    bool forced = forced_here(b);
    if (forced) {
        pinned = getenv(MG_GEMM_CUTLASS_CONFIG_ENV);
        if (pinned && *pinned) {
            if ((config = mg_gemm_cutlass_config_parse(pinned)) < 0)
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                                "mg_gemm_bf16: %s=%s is not a CUTLASS configuration (%s, %s, %s)",
                                MG_GEMM_CUTLASS_CONFIG_ENV, pinned, mg_gemm_cutlass_config_name(0),
                                mg_gemm_cutlass_config_name(1), mg_gemm_cutlass_config_name(2));
        } else {
            pinned = NULL;
            bool invariant = batch_invariant(b);
            if (config < 0 || invariant)
                config = default_config(p->m, invariant);
        }
    }
    char reason[160];
    if (config < 0 || !kernels_fit(p, reason, sizeof reason)) {
        if (pinned)
            return MG_ERROR(MG_ERR_UNSUPPORTED, "mg_gemm_bf16: CUTLASS %s: %s", pinned, reason);
        return fall_back(b, s, call);
    }
    cutlass_state *st = state_of(b);
    mg_cuda_context *ctx;
    CUstream stream;
    mg_status status;
    if (!st)
        return MG_ERROR(MG_ERR_INTERNAL, "mg_gemm_bf16: CUTLASS state unavailable");
    if ((status = mg_cuda_bind(b, &ctx)) || (status = mg_cuda_stream(b, s, &stream)))
        return status;
    mg_cutlass_dense_args args = {.config = (uint32_t)config,
                                  .m = p->m,
                                  .n = p->n,
                                  .k = p->k,
                                  .ldc = p->ldc,
                                  .act = (const void *)(uintptr_t)call->t.act,
                                  .weight = (const void *)(uintptr_t)call->t.weight,
                                  .out = (void *)(uintptr_t)call->t.out,
                                  .workspace = (void *)(uintptr_t)call->t.workspace,
                                  .workspace_bytes = call->t.workspace_bytes,
                                  .sm_count = st->sm_count};
    if (!args.workspace) {
        mg_devptr w;
        if ((status = mg_cublaslt_stream_workspace(b, s, &w)))
            return status;
        args.workspace = (void *)(uintptr_t)w;
        args.workspace_bytes = MG_CUBLASLT_WORKSPACE_BYTES;
    }
    mg_plugin_error err;
    status = dense_run(&args, (void *)stream, &err);
    if (status == MG_ERR_UNSUPPORTED && !err.cuda_error) {
        if (pinned)
            return MG_ERROR(MG_ERR_UNSUPPORTED, "mg_gemm_bf16: %s", err.message);
        return fall_back(b, s, call);
    }
    if (status)
        return mg_cuda_plugin_failure(ctx, status, err.cuda_error, err.message,
                                      "BF16 GEMM on CUTLASS");
    atomic_fetch_add(&kernel_calls, 1);
    return MG_OK;
}

/* cuBLASLt plans the shape (for a fallback) and gives the stream the shared workspace. */
static mg_status cutlass_prewarm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans,
                                 size_t count) {
    return mg_gemm_cublaslt_provider.prewarm(b, s, plans, count);
}

static size_t cutlass_workspace_bytes(mg_backend *b) {
    (void)b;
    return MG_CUBLASLT_WORKSPACE_BYTES;
}

void mg_gemm_cutlass_counts(uint64_t *kernels, uint64_t *fallbacks) {
    if (kernels)
        *kernels = atomic_load(&kernel_calls);
    if (fallbacks)
        *fallbacks = atomic_load(&fallback_calls);
}

const mg_gemm_provider mg_gemm_cutlass_provider = {
    .base = {.name = "cutlass",
             .backend = MG_BACKEND_CUDA,
             .available = cutlass_available,
             .supports = cutlass_supports},
    .run = cutlass_gemm,
    .prewarm = cutlass_prewarm,
    .workspace_bytes = cutlass_workspace_bytes,
};
