/* gemm_cublaslt.c - the cuBLASLt provider of the GEMM ops, loaded at run time
 * (gemm_cublaslt.h).
 *
 * The project's convention out[M,N] = act[M,K] · weight[N,K]ᵀ (row-major) is, read
 * column-major, D[N,M] = op_T(W) · op_N(act) with W as A (K x N, lda = K), act as B (K x M,
 * ldb = K) and D (N x M, ldd = ldc): the "TN" form cuBLASLt's FP8 kernels require. Hence the
 * weight's scales are A's and the activation's are B's.
 */
#include "gemm_cublaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "cuda_backend.h"
#include "error.h"
#include "op_cache.h"
#include "op_state.h"

/* ------------------------------------------------------------------ the library */

typedef struct cublaslt_api {
    cublasStatus_t (*create)(cublasLtHandle_t *);
    cublasStatus_t (*destroy)(cublasLtHandle_t);
    size_t (*get_version)(void);
    const char *(*status_name)(cublasStatus_t);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *,
                               size_t);
    cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t,
                                    int64_t);
    cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                               const void *, size_t);
    cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                cublasLtMatmulHeuristicResult_t[], int *);
    cublasStatus_t (*algo_check)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                 cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                 cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *,
                                 cublasLtMatmulHeuristicResult_t *);
    cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                             cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,
                             const void *, const void *, cublasLtMatrixLayout_t, void *,
                             cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
                             cudaStream_t);
    cublasStatus_t (*algo_config_get)(const cublasLtMatmulAlgo_t *,
                                      cublasLtMatmulAlgoConfigAttributes_t, void *, size_t,
                                      size_t *);
} cublaslt_api;

static cublaslt_api lt;
static bool lt_loaded;
static char lt_failure[256];
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void load_library(void) {
    const char *path = getenv("METRALE_LIBCUBLASLT");
    if (!path || !*path)
        path = "libcublasLt.so.13";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(lt_failure, sizeof lt_failure, "dlopen %s: %s", path, dlerror());
        return;
    }
    struct {
        void **slot;
        const char *name;
    } symbols[] = {
        {(void **)&lt.create, "cublasLtCreate"},
        {(void **)&lt.destroy, "cublasLtDestroy"},
        {(void **)&lt.get_version, "cublasLtGetVersion"},
        {(void **)&lt.status_name, "cublasLtGetStatusName"},
        {(void **)&lt.status_string, "cublasLtGetStatusString"},
        {(void **)&lt.desc_create, "cublasLtMatmulDescCreate"},
        {(void **)&lt.desc_destroy, "cublasLtMatmulDescDestroy"},
        {(void **)&lt.desc_set, "cublasLtMatmulDescSetAttribute"},
        {(void **)&lt.layout_create, "cublasLtMatrixLayoutCreate"},
        {(void **)&lt.layout_destroy, "cublasLtMatrixLayoutDestroy"},
        {(void **)&lt.pref_create, "cublasLtMatmulPreferenceCreate"},
        {(void **)&lt.pref_destroy, "cublasLtMatmulPreferenceDestroy"},
        {(void **)&lt.pref_set, "cublasLtMatmulPreferenceSetAttribute"},
        {(void **)&lt.heuristic, "cublasLtMatmulAlgoGetHeuristic"},
        {(void **)&lt.algo_check, "cublasLtMatmulAlgoCheck"},
        {(void **)&lt.matmul, "cublasLtMatmul"},
        {(void **)&lt.algo_config_get, "cublasLtMatmulAlgoConfigGetAttribute"},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        *symbols[i].slot = dlsym(lib, symbols[i].name);
        if (!*symbols[i].slot) {
            snprintf(lt_failure, sizeof lt_failure, "%s: symbol %s not found", path,
                     symbols[i].name);
            dlclose(lib);
            return;
        }
    }
    /* Blockwise FP8 scale modes arrived in cuBLAS 12.9. */
    size_t version = lt.get_version();
    if (version < 120900) {
        snprintf(lt_failure, sizeof lt_failure, "%s is version %zu; 12.9 or newer is needed", path,
                 version);
        dlclose(lib);
        return;
    }
    lt_loaded = true; /* the handle stays open for the life of the process */
}

bool mg_cublaslt_available(char *reason, size_t reason_bytes) {
    pthread_once(&lt_once, load_library);
    if (!lt_loaded && reason && reason_bytes)
        snprintf(reason, reason_bytes, "%s", lt_failure);
    return lt_loaded;
}

static mg_status require_library(const char *what) {
    pthread_once(&lt_once, load_library);
    if (!lt_loaded)
        return MG_ERROR(MG_ERR_UNAVAILABLE, "%s: cuBLASLt unavailable: %s", what, lt_failure);
    return MG_OK;
}

/* "cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED (15): the functionality requested is not
 * supported, <context>" */
static mg_status lt_error(cublasStatus_t r, const char *call, const char *context) {
    return MG_ERROR(MG_ERR_DEVICE, "%s: %s (%d): %s, %s", call, lt.status_name(r), (int)r,
                    lt.status_string(r), context);
}

/* ------------------------------------------------------------------ per-backend state */

/* Plan keys are compared bytewise: all members are uint32_t, so there is no padding. M is 0
 * in the key of a batch-invariant algorithm family. */
typedef struct plan_key {
    uint32_t kind, m, n, k, ldc, out_type, act_mode, weight_mode, alignment, batch_invariant;
} plan_key;

typedef struct gemm_plan {
    struct gemm_plan *next;
    plan_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    size_t workspace_bytes;
    /* FP8 scale pointers live in the descriptor: updating them and enqueueing the matmul is
     * one critical section, so concurrent calls of one shape each run with their own scales. */
    pthread_mutex_t launch_lock;
    mg_devptr act_scale, weight_scale;
} gemm_plan;

/* A batch-invariant algorithm family: (N, K, kind, modes, out type, alignment) -> one algo. */
typedef struct algo_family {
    struct algo_family *next;
    plan_key key;
    cublasLtMatmulAlgo_t algo;
} algo_family;

typedef struct stream_workspace {
    struct stream_workspace *next;
    CUstream stream;
    mg_devptr memory;
} stream_workspace;

#define PLAN_BUCKETS 256

typedef struct lt_state {
    mg_backend *backend;
    cublasLtHandle_t handle;
    int cc_major;
    atomic_bool batch_invariant;
    pthread_mutex_t lock; /* plans, families, workspaces */
    gemm_plan *plans[PLAN_BUCKETS];
    algo_family *families;
    stream_workspace *workspaces;
} lt_state;

/* Created on the first GEMM of a backend (op_state.h), with its cuBLASLt handle. */
static mg_status lt_state_create(mg_backend *b, void **out) {
    mg_status status = require_library("mg_gemm");
    mg_cuda_context *ctx;
    mg_device_info info;
    if (status || (status = mg_cuda_bind(b, &ctx)) || (status = mg_device_get_info(b, &info)))
        return status;
    lt_state *st = calloc(1, sizeof *st);
    if (!st)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cuBLASLt state (%zu bytes)", sizeof *st);
    cublasStatus_t r = lt.create(&st->handle);
    if (r != CUBLAS_STATUS_SUCCESS) {
        free(st);
        return lt_error(r, "cublasLtCreate", "mg_gemm");
    }
    st->backend = b;
    st->cc_major = info.cc_major;
    atomic_init(&st->batch_invariant, false);
    pthread_mutex_init(&st->lock, NULL);
    *out = st;
    return MG_OK;
}

static void lt_state_destroy(mg_backend *b, void *state);
static void lt_state_stream_destroyed(mg_backend *b, void *state, mg_stream *s);

static const mg_op_state_type lt_state_type = {
    .name = "cuBLASLt GEMM",
    .create = lt_state_create,
    .destroy = lt_state_destroy,
    .stream_destroyed = lt_state_stream_destroyed,
};

/* The state of `b`; makes the device's context current on this thread. */
static mg_status get_state(mg_backend *b, const char *what, lt_state **out) {
    mg_status status = require_library(what);
    mg_cuda_context *ctx;
    if (status || (status = mg_cuda_bind(b, &ctx)))
        return status;
    return mg_op_state_get(b, &lt_state_type, (void **)out);
}

/* The one workspace per stream serves both GEMM ops; each op's statistics show it. */
static void count_workspace(mg_backend *b, int64_t delta) {
    mg_op_count_workspace(b, MG_OP_GEMM_BF16, delta);
    mg_op_count_workspace(b, MG_OP_GEMM_FP8, delta);
}

static void destroy_plan(gemm_plan *p) {
    if (p->a)
        lt.layout_destroy(p->a);
    if (p->b)
        lt.layout_destroy(p->b);
    if (p->d)
        lt.layout_destroy(p->d);
    if (p->desc)
        lt.desc_destroy(p->desc);
    pthread_mutex_destroy(&p->launch_lock);
    free(p);
}

/* At backend close: the plans and the handle. The workspaces are op-cache scratch, freed
 * by the op cache after this. */
static void lt_state_destroy(mg_backend *b, void *state) {
    lt_state *st = state;
    for (int i = 0; i < PLAN_BUCKETS; i++)
        for (gemm_plan *p = st->plans[i], *next; p; p = next) {
            next = p->next;
            destroy_plan(p);
        }
    for (algo_family *f = st->families, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    for (stream_workspace *w = st->workspaces, *next; w; w = next) {
        next = w->next; /* the memory is op-cache scratch, freed by the op cache */
        count_workspace(b, -(int64_t)MG_CUBLASLT_WORKSPACE_BYTES);
        free(w);
    }
    mg_cuda_context *ctx;
    if (mg_cuda_bind(b, &ctx) == MG_OK)
        lt.destroy(st->handle);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* Forgets the workspace record of stream `s`; the memory is stream-private op-cache scratch,
 * freed by the op cache with the stream. */
static void lt_state_stream_destroyed(mg_backend *b, void *state, mg_stream *s) {
    lt_state *st = state;
    CUstream stream;
    if (!s || mg_cuda_stream(b, s, &stream) != MG_OK)
        return;
    pthread_mutex_lock(&st->lock);
    for (stream_workspace **link = &st->workspaces; *link; link = &(*link)->next) {
        if ((*link)->stream == stream) {
            stream_workspace *w = *link;
            *link = w->next;
            free(w);
            count_workspace(b, -(int64_t)MG_CUBLASLT_WORKSPACE_BYTES);
            break;
        }
    }
    pthread_mutex_unlock(&st->lock);
}

static mg_status cublaslt_set_batch_invariant(mg_backend *b, bool enabled) {
    lt_state *st;
    mg_status status = get_state(b, "mg_gemm_set_batch_invariant", &st);
    if (status)
        return status;
    atomic_store(&st->batch_invariant, enabled);
    return MG_OK;
}

static bool cublaslt_batch_invariant(mg_backend *b) {
    lt_state *st = mg_op_state_peek(b, &lt_state_type);
    return st && atomic_load(&st->batch_invariant);
}

/* ------------------------------------------------------------------ plans */

static plan_key key_of(const mg_gemm_plan *p, bool batch_invariant) {
    bool blocked = p->kind == MG_GEMM_FP8_BLOCKSCALED;
    plan_key key = {
        .kind = (uint32_t)p->kind,
        .m = p->m,
        .n = p->n,
        .k = p->k,
        .ldc = p->ldc,
        .out_type = (uint32_t)p->out_type,
        .act_mode = blocked ? (uint32_t)p->act_mode : 0,
        .weight_mode = blocked ? (uint32_t)p->weight_mode : 0,
        .alignment = p->pointer_alignment ? p->pointer_alignment : 16,
        .batch_invariant = batch_invariant,
    };
    return key;
}

static uint32_t key_hash(const plan_key *key) {
    const uint32_t *w = (const uint32_t *)key;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof *key / sizeof *w; i++)
        h = (h ^ w[i]) * 16777619u;
    return h % PLAN_BUCKETS;
}

static gemm_plan *lookup_plan(lt_state *st, const plan_key *key) {
    for (gemm_plan *p = st->plans[key_hash(key)]; p; p = p->next)
        if (!memcmp(&p->key, key, sizeof *key))
            return p;
    return NULL;
}

static const char *kind_text(uint32_t kind) {
    static const char *names[] = {"bf16", "fp8 tensorwise", "fp8 rowwise", "fp8 blockscaled"};
    return kind < 4 ? names[kind] : "?";
}

/* "bf16 GEMM M=1 N=4096 K=4096 ldc=4096 out bf16" for messages. */
static void describe(const plan_key *key, char *buf, size_t bytes) {
    snprintf(buf, bytes, "%s GEMM M=%u N=%u K=%u ldc=%u out %s align %u%s", kind_text(key->kind),
             key->m, key->n, key->k, key->ldc, mg_dtype_name((mg_dtype)key->out_type),
             key->alignment, key->batch_invariant ? " batch-invariant" : "");
}

static cublasLtMatmulMatrixScale_t block_scale_mode(uint32_t mode) {
    return mode == MG_FP8_BLOCK_1X128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                      : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

/* What a plan is made with: the stream, its workspace and the call's scale pointers (zero in
 * mg_gemm_prewarm). Vector and block scale modes need scale pointers in the descriptor before
 * the heuristic accepts it (CUBLAS_STATUS_INVALID_VALUE otherwise); without the call's, the
 * workspace stands in (device memory, 16-byte aligned) until a call sets its own. */
typedef struct plan_io {
    mg_stream *s;
    mg_devptr workspace;
    mg_devptr act_scale, weight_scale;
} plan_io;

/* Creates the descriptor and layouts of `key` (with `m` rows) into p. */
static mg_status create_objects(const plan_key *key, uint32_t m, const plan_io *io, gemm_plan *p,
                                const char *ctx) {
    bool fp8 = key->kind != MG_GEMM_BF16;
    cudaDataType in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cudaDataType out = key->out_type == MG_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t r;
    if ((r = lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)))
        return lt_error(r, "cublasLtMatmulDescCreate", ctx);
    cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    if ((r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa)) ||
        (r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb)))
        return lt_error(r, "cublasLtMatmulDescSetAttribute(TRANS)", ctx);
    if (key->kind == MG_GEMM_FP8_ROWWISE || key->kind == MG_GEMM_FP8_BLOCKSCALED) {
        int32_t a_mode, b_mode;
        if (key->kind == MG_GEMM_FP8_ROWWISE) {
            a_mode = b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        } else {
            a_mode = block_scale_mode(key->weight_mode);
            b_mode = block_scale_mode(key->act_mode);
        }
        if ((r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode)) ||
            (r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode)))
            return lt_error(r, "cublasLtMatmulDescSetAttribute(SCALE_MODE)", ctx);
    }
    if (fp8) {
        p->weight_scale = io->weight_scale ? io->weight_scale : io->workspace;
        p->act_scale = io->act_scale ? io->act_scale : io->workspace;
        void *a_scale = (void *)(uintptr_t)p->weight_scale,
             *b_scale = (void *)(uintptr_t)p->act_scale;
        if ((r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                             sizeof a_scale)) ||
            (r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                             sizeof b_scale)))
            return lt_error(r, "cublasLtMatmulDescSetAttribute(SCALE_POINTER)", ctx);
    }
    if ((r = lt.layout_create(&p->a, in, key->k, key->n, key->k)) ||
        (r = lt.layout_create(&p->b, in, key->k, m, key->k)) ||
        (r = lt.layout_create(&p->d, out, key->n, m, key->ldc)))
        return lt_error(r, "cublasLtMatrixLayoutCreate", ctx);
    return MG_OK;
}

/* Enqueues p's matmul on `stream`: D = W^T-op x act with alpha 1 and beta 0, so C is D. */
static cublasStatus_t launch(lt_state *st, const gemm_plan *p, mg_devptr act, mg_devptr weight,
                             mg_devptr out, mg_devptr workspace, CUstream stream) {
    static const float one = 1.0f, zero = 0.0f;
    void *d = (void *)(uintptr_t)out;
    return lt.matmul(st->handle, p->desc, &one, (const void *)(uintptr_t)weight, p->a,
                     (const void *)(uintptr_t)act, p->b, &zero, d, p->d, d, p->d, &p->algo,
                     (void *)(uintptr_t)workspace, p->workspace_bytes, (cudaStream_t)stream);
}

/* The heuristic's first choice for p's objects (as PyTorch takes it). Batch-invariant plans
 * exclude split-K reductions, whose partition could depend on M. */
static mg_status choose_algo(lt_state *st, const plan_key *key, gemm_plan *p, const char *ctx) {
    cublasLtMatmulPreference_t pref;
    cublasStatus_t r = lt.pref_create(&pref);
    if (r)
        return lt_error(r, "cublasLtMatmulPreferenceCreate", ctx);
    uint64_t workspace = MG_CUBLASLT_WORKSPACE_BYTES;
    uint32_t align = key->alignment;
    if (!(r = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                          sizeof workspace)) &&
        !(r = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                          sizeof align)) &&
        !(r = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align,
                          sizeof align)) &&
        !(r = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align,
                          sizeof align)) &&
        !(r = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align,
                          sizeof align))) {
        if (key->batch_invariant) {
            uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
            r = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none);
        }
    }
    if (r) {
        lt.pref_destroy(pref);
        return lt_error(r, "cublasLtMatmulPreferenceSetAttribute", ctx);
    }
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    r = lt.heuristic(st->handle, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    lt.pref_destroy(pref);
    if (r)
        return lt_error(r, "cublasLtMatmulAlgoGetHeuristic", ctx);
    if (found == 0)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "cublasLtMatmulAlgoGetHeuristic: no algorithm for %s",
                        ctx);
    p->algo = result.algo;
    p->workspace_bytes = result.workspaceSize;
    return MG_OK;
}

/* Batch-invariant mode: the family's algorithm (chosen once, at the reference M), checked
 * at this plan's M. Called with st->lock held. */
static mg_status invariant_algo(lt_state *st, const plan_key *key, const plan_io *io, gemm_plan *p,
                                const char *ctx) {
    plan_key family_key = *key;
    family_key.m = 0;
    algo_family *f = st->families;
    while (f && memcmp(&f->key, &family_key, sizeof family_key))
        f = f->next;
    if (!f) {
        gemm_plan reference = {0};
        mg_status status =
            create_objects(key, MG_CUBLASLT_INVARIANT_REFERENCE_M, io, &reference, ctx);
        if (!status)
            status = choose_algo(st, key, &reference, ctx);
        cublasLtMatmulAlgo_t algo = reference.algo;
        if (reference.a)
            lt.layout_destroy(reference.a);
        if (reference.b)
            lt.layout_destroy(reference.b);
        if (reference.d)
            lt.layout_destroy(reference.d);
        if (reference.desc)
            lt.desc_destroy(reference.desc);
        if (status)
            return status;
        if (!(f = calloc(1, sizeof *f)))
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "batch-invariant algorithm for %s", ctx);
        f->key = family_key;
        f->algo = algo;
        f->next = st->families;
        st->families = f;
    }
    cublasLtMatmulHeuristicResult_t result;
    cublasStatus_t r =
        lt.algo_check(st->handle, p->desc, p->a, p->b, p->d, p->d, &f->algo, &result);
    if (r != CUBLAS_STATUS_SUCCESS)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "batch-invariant mode: the algorithm chosen at M=%u cannot run %s: "
                        "cublasLtMatmulAlgoCheck: %s (%d)",
                        MG_CUBLASLT_INVARIANT_REFERENCE_M, ctx, lt.status_name(r), (int)r);
    if (result.workspaceSize > MG_CUBLASLT_WORKSPACE_BYTES)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "batch-invariant mode: the algorithm needs %zu workspace bytes for %s",
                        result.workspaceSize, ctx);
    p->algo = f->algo;
    p->workspace_bytes = result.workspaceSize;
    return MG_OK;
}

/* METRALE_DEBUG_GEMM=1: the algorithm chosen for the first plan of each (kind, M, N, K),
 * on stderr. */
static void report_plan(const plan_key *key, const gemm_plan *p, const char *ctx) {
    static atomic_int debug_gemm = -1;
    if (!mg_diag_env_enabled("METRALE_DEBUG_GEMM", &debug_gemm) ||
        !mg_gate_first_shape(kind_text(key->kind), key->m, key->n, key->k))
        return;
    int algo_id = -1;
    uint32_t tile = 0, stages = 0;
    int32_t split_k = 0;
    size_t written;
    lt.algo_config_get(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof algo_id, &written);
    lt.algo_config_get(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
    lt.algo_config_get(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
    lt.algo_config_get(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k,
                       &written);
    fprintf(stderr,
            "metrale: cuBLASLt plan for %s: algorithm %d, tile %u, stages %u, split-K %d, "
            "%zu workspace bytes\n",
            ctx, algo_id, tile, stages, split_k, p->workspace_bytes);
}

/* Finds or creates the plan of `key`. A miss while `s` is capturing is MG_ERR_CAPTURING. */
static mg_status get_plan(lt_state *st, const plan_io *io, const plan_key *key, gemm_plan **out) {
    pthread_mutex_lock(&st->lock);
    gemm_plan *p = lookup_plan(st, key);
    if (p) {
        pthread_mutex_unlock(&st->lock);
        *out = p;
        return MG_OK;
    }
    char ctx[160];
    describe(key, ctx, sizeof ctx);
    mg_status status = mg_stream_check_not_capturing(st->backend, io->s, "GEMM planning");
    if (status) {
        pthread_mutex_unlock(&st->lock);
        return MG_ERROR(MG_ERR_CAPTURING,
                        "%s is not planned and its stream is capturing: call mg_gemm_prewarm "
                        "for this shape before the capture",
                        ctx);
    }
    if (key->kind != MG_GEMM_BF16 && st->cc_major < 9) {
        pthread_mutex_unlock(&st->lock);
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: FP8 GEMMs need compute capability 9.0 or newer, device has %d.x", ctx,
                        st->cc_major);
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        pthread_mutex_unlock(&st->lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "plan for %s", ctx);
    }
    pthread_mutex_init(&p->launch_lock, NULL);
    p->key = *key;
    status = create_objects(key, key->m, io, p, ctx);
    if (!status)
        status = key->batch_invariant ? invariant_algo(st, key, io, p, ctx)
                                      : choose_algo(st, key, p, ctx);
    if (status) {
        destroy_plan(p);
        pthread_mutex_unlock(&st->lock);
        return status;
    }
    uint32_t bucket = key_hash(key);
    p->next = st->plans[bucket];
    st->plans[bucket] = p;
    pthread_mutex_unlock(&st->lock);
    mg_op_count_plans(st->backend, key->kind == MG_GEMM_BF16 ? MG_OP_GEMM_BF16 : MG_OP_GEMM_FP8, 1);
    report_plan(key, p, ctx);
    *out = p;
    return MG_OK;
}

/* The workspace of `stream`: op-cache scratch private to the stream under a per-stream tag
 * (the op cache frees it when the stream is destroyed, or for the default stream when the
 * backend closes), remembered here so a steady-state call does no tag lookup. */
static mg_status get_workspace(lt_state *st, mg_stream *s, CUstream stream, mg_devptr *out) {
    pthread_mutex_lock(&st->lock);
    stream_workspace *w = st->workspaces;
    while (w && w->stream != stream)
        w = w->next;
    if (w) {
        *out = w->memory;
        pthread_mutex_unlock(&st->lock);
        return MG_OK;
    }
    mg_status status = mg_stream_check_not_capturing(st->backend, s, "GEMM workspace");
    if (status) {
        pthread_mutex_unlock(&st->lock);
        return MG_ERROR(MG_ERR_CAPTURING,
                        "the stream is capturing and has no GEMM workspace yet: call "
                        "mg_gemm_prewarm on this stream before the capture");
    }
    w = calloc(1, sizeof *w);
    if (!w) {
        pthread_mutex_unlock(&st->lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "GEMM workspace record");
    }
    char tag[64];
    snprintf(tag, sizeof tag, "cublaslt workspace %p", (void *)stream);
    mg_op_cache *cache = mg_backend_op_cache(st->backend);
    status =
        cache ? mg_op_cache_stream_scratch(cache, tag, MG_CUBLASLT_WORKSPACE_BYTES, s, &w->memory)
              : MG_ERROR(MG_ERR_INTERNAL, "GEMM workspace: backend has no op cache");
    if (status) {
        free(w);
        pthread_mutex_unlock(&st->lock);
        mg_error_append(" (cuBLASLt workspace of a stream)");
        return status;
    }
    w->stream = stream;
    w->next = st->workspaces;
    st->workspaces = w;
    *out = w->memory;
    pthread_mutex_unlock(&st->lock);
    count_workspace(st->backend, (int64_t)MG_CUBLASLT_WORKSPACE_BYTES);
    return MG_OK;
}

/* ------------------------------------------------------------------ entry points */

static mg_status cublaslt_gemm(mg_backend *b, mg_stream *s, const mg_gemm_call *call) {
    lt_state *st;
    mg_status status = get_state(b, "mg_gemm", &st);
    if (status)
        return status;
    plan_io io = {.s = s, .act_scale = call->t.act_scale, .weight_scale = call->t.weight_scale};
    CUstream stream;
    if ((status = mg_cuda_stream(b, s, &stream)))
        return status;
    /* A caller's workspace (checked by the front to hold MG_CUBLASLT_WORKSPACE_BYTES) spares
     * the stream its own. */
    io.workspace = call->t.workspace;
    if (!io.workspace && (status = get_workspace(st, s, stream, &io.workspace)))
        return status;
    plan_key key = key_of(&call->plan, atomic_load(&st->batch_invariant));
    gemm_plan *p;
    if ((status = get_plan(st, &io, &key, &p)))
        return status;

    bool fp8 = key.kind != MG_GEMM_BF16;
    cublasStatus_t r = CUBLAS_STATUS_SUCCESS;
    if (fp8) {
        pthread_mutex_lock(&p->launch_lock);
        void *a_scale = (void *)(uintptr_t)call->t.weight_scale;
        void *b_scale = (void *)(uintptr_t)call->t.act_scale;
        if (p->weight_scale != call->t.weight_scale)
            r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                            sizeof a_scale);
        if (!r && p->act_scale != call->t.act_scale)
            r = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                            sizeof b_scale);
        if (r) {
            p->weight_scale = p->act_scale = 0; /* unknown now: set both next time */
            pthread_mutex_unlock(&p->launch_lock);
            return lt_error(r, "cublasLtMatmulDescSetAttribute(SCALE_POINTER)", "mg_gemm");
        }
        p->weight_scale = call->t.weight_scale;
        p->act_scale = call->t.act_scale;
    }
    r = launch(st, p, call->t.act, call->t.weight, call->t.out, io.workspace, stream);
    if (fp8)
        pthread_mutex_unlock(&p->launch_lock);
    if (r) {
        char ctx[160];
        describe(&key, ctx, sizeof ctx);
        return lt_error(r, "cublasLtMatmul", ctx);
    }
    return MG_OK;
}

mg_status mg_cublaslt_stream_workspace(mg_backend *b, mg_stream *s, mg_devptr *out) {
    lt_state *st;
    CUstream stream;
    mg_status status = get_state(b, "mg_gemm", &st);
    if (status || (status = mg_cuda_stream(b, s, &stream)))
        return status;
    return get_workspace(st, s, stream, out);
}

static mg_status cublaslt_prewarm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans,
                                  size_t count) {
    lt_state *st;
    mg_status status = get_state(b, "mg_gemm_prewarm", &st);
    if (status)
        return status;
    plan_io io = {.s = s};
    CUstream stream;
    if ((status = mg_cuda_stream(b, s, &stream)) ||
        (status = get_workspace(st, s, stream, &io.workspace)))
        return status;
    bool invariant = atomic_load(&st->batch_invariant);
    for (size_t i = 0; i < count; i++) {
        plan_key key = key_of(&plans[i], invariant);
        gemm_plan *p;
        if ((status = get_plan(st, &io, &key, &p))) {
            mg_error_append(" (mg_gemm_prewarm: plan %zu)", i);
            return status;
        }
    }
    return MG_OK;
}

/* ------------------------------------------------------------------ the provider */

static bool cublaslt_available(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
    return mg_cublaslt_available(reason, reason_bytes);
}

/* FP8 E4M3 matmuls need Hopper (compute capability 9.0) or newer. */
static bool cublaslt_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mg_gemm_plan *plan = call;
    /* No fusion yet: the epilogues of cuBLASLt do not compose ours. */
    if (!mg_gemm_fusion_declared(&mg_gemm_cublaslt_provider, plan, reason, reason_bytes))
        return false;
    if (plan->kind == MG_GEMM_BF16)
        return true;
    lt_state *st = mg_op_state_peek(b, &lt_state_type);
    int cc_major = st ? st->cc_major : 0;
    if (!st) { /* before the backend's first GEMM: ask the device, keeping the caller's error */
        mg_error_state saved;
        mg_error_save(&saved);
        mg_device_info info;
        if (mg_device_get_info(b, &info) == MG_OK)
            cc_major = info.cc_major;
        mg_error_restore(&saved);
    }
    if (cc_major < 9) {
        snprintf(reason, reason_bytes,
                 "FP8 GEMMs need compute capability 9.0 or newer, the device has %d.x", cc_major);
        return false;
    }
    return true;
}

static size_t cublaslt_workspace_bytes(mg_backend *b) {
    (void)b;
    return MG_CUBLASLT_WORKSPACE_BYTES;
}

const mg_gemm_provider mg_gemm_cublaslt_provider = {
    .base = {.name = "cublaslt",
             .backend = MG_BACKEND_CUDA,
             .available = cublaslt_available,
             .supports = cublaslt_supports},
    .run = cublaslt_gemm,
    .prewarm = cublaslt_prewarm,
    .workspace_bytes = cublaslt_workspace_bytes,
    .set_batch_invariant = cublaslt_set_batch_invariant,
    .batch_invariant = cublaslt_batch_invariant,
};
