/* attention_reference.c - the reference ragged prefill attention (metrale/ops_attention.h) on the
 * CPU backend: BF16 inputs widened exactly to FP32, FP32 dot products and softmax, output rounded
 * to BF16 once. It defines the op's result; GPU implementations are checked against it.
 *
 * A plan keeps its indptrs in a device buffer of the CPU backend (written on the plan's stream,
 * like the GPU's int workspace), and a run is a launch of the CPU kernel
 * "metrale:attention_ragged_prefill" that reads them there. So a captured run replays the
 * batch of the latest update, exactly as on CUDA. With a caller's workspace (desc.workspace)
 * that buffer is the workspace's first bytes: nothing is allocated, and it never grows. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention_provider.h"
#include "backend_impl.h"
#include "checked_math.h"
#include "cpu_kernels.h"
#include "error.h"
#include "host_parallel.h"
#include "kv_cache_host.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"

#define KERNEL_MODULE "metrale"
#define KERNEL_FUNCTION "attention_ragged_prefill"
#define KERNEL_NAME KERNEL_MODULE ":" KERNEL_FUNCTION
/* Paged plans (metrale/ops_kv_cache.h): the same computation, keys and values read through the
 * page table. */
#define PAGED_FUNCTION "attention_paged_prefill"
#define PAGED_NAME KERNEL_MODULE ":" PAGED_FUNCTION

typedef struct cpu_attention_plan {
    mg_devptr indptrs;         /* qo_indptr then kv_indptr (tokens), batch_size + 1 int32 each;
                                * paged plans then page indptr and last-page lengths */
    uint32_t indptrs_capacity; /* batch_size + 1 the buffer holds per array */
    /* the ragged or the paged kernel, looked up when the plan is made, so that a run (a graph
     * replay included) allocates nothing */
    mg_kernel *kernel;
} cpu_attention_plan;

/* Launch argument indices of the kernel. */
enum {
    ARG_Q,
    ARG_K,
    ARG_V,
    ARG_O,
    ARG_LSE,
    ARG_INDPTRS,
    ARG_BATCH,
    ARG_QO_HEADS,
    ARG_KV_HEADS,
    ARG_HEAD_DIM,
    ARG_CAUSAL,
    ARG_WINDOW_LEFT,
    ARG_SM_SCALE,
    ARG_QO_ROWS,
    ARG_KV_ROWS,
    ARG_HAS_LSE,
    ARG_COUNT
};

/* Four lanes of GCC's and Clang's vector extensions: each lane's operation is the scalar one,
 * so results are the scalar loops' bits on any target. */
typedef uint16_t u16x4 __attribute__((vector_size(8)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef float f32x4 __attribute__((vector_size(16)));

/* Softmax attention of one query row of one head over the keys [k_begin, k_end) of its
 * request; `kf`/`vf` hold the request's keys/values of this KV head widened to FP32
 * ([lk][d]); `scores` has room for lk floats. Writes d outputs (FP32) and returns the base-2
 * log-sum-exp (-inf when no key is visible, with zero output). */
static float attend_row(const float *qf, const float *kf, const float *vf, uint32_t d,
                        uint32_t k_begin, uint32_t k_end, float sm_scale, float soft_cap,
                        float *restrict scores, float *restrict out) {
    for (uint32_t c = 0; c < d; c++)
        out[c] = 0.0f;
    if (k_begin >= k_end)
        return -INFINITY;
    float max_score = -INFINITY;
    for (uint32_t j = k_begin; j < k_end; j++) {
        const float *kr = kf + (size_t)j * d;
        float partial[8] = {0};
        for (uint32_t c = 0; c < d; c += 8)
            for (uint32_t u = 0; u < 8; u++)
                partial[u] += qf[c + u] * kr[c + u];
        float dot = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                    ((partial[4] + partial[5]) + (partial[6] + partial[7]));
        scores[j] = dot * sm_scale;
        if (soft_cap > 0.0f) /* c * tanh(s / c): scores bounded by the cap */
            scores[j] = soft_cap * tanhf(scores[j] / soft_cap);
        if (scores[j] > max_score)
            max_score = scores[j];
    }
    /* the weights first, then the values: each out[c] still adds its terms in key order, and
     * the inner loop is one the compiler vectorises */
    float sum = 0.0f;
    for (uint32_t j = k_begin; j < k_end; j++) {
        scores[j] = expf(scores[j] - max_score);
        sum += scores[j];
    }
    for (uint32_t j = k_begin; j < k_end; j++) {
        const float e = scores[j], *vr = vf + (size_t)j * d;
        const f32x4 ev = {e, e, e, e};
        for (uint32_t c = 0; c < d; c += 4) { /* d is a multiple of 8 */
            f32x4 o, v;
            memcpy(&o, out + c, sizeof o);
            memcpy(&v, vr + c, sizeof v);
            o += ev * v;
            memcpy(out + c, &o, sizeof o);
        }
    }
    for (uint32_t c = 0; c < d; c++)
        out[c] /= sum;
    return (max_score + logf(sum)) * (float)M_LOG2E;
}

typedef struct attention_args {
    const uint16_t *q, *k, *v;
    uint16_t *o;
    float *lse;
    const int32_t *qo_indptr, *kv_indptr;
    uint32_t batch, qo_heads, kv_heads, d, causal, qo_rows, kv_rows;
    int32_t window_left;
    float sm_scale;
    /* Paged keys: page_size > 0, keys of request i in pages kv_indices[page_indptr[i]..). */
    const int32_t *page_indptr, *kv_indices;
    uint32_t page_size;
    float soft_cap; /* 0: none */
    /* FP8 E4M3 pools: k and v hold codes, scaled per KV head (k_scale, v_scale). */
    bool kv_fp8;
    const float *k_scale, *v_scale;
} attention_args;

/* The indptrs come from the plan's device buffer, which only the plan writes, but the kernel
 * still refuses anything that would read or write outside the tensors. */
static mg_status check_indptrs(const attention_args *a) {
    for (uint32_t i = 0; i < a->batch; i++)
        if (a->qo_indptr[i + 1] < a->qo_indptr[i] || a->kv_indptr[i + 1] < a->kv_indptr[i])
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: indptrs decrease at %u",
                            KERNEL_NAME, i);
    if (a->qo_indptr[0] != 0 || a->kv_indptr[0] != 0 ||
        (uint32_t)a->qo_indptr[a->batch] > a->qo_rows ||
        (uint32_t)a->kv_indptr[a->batch] > a->kv_rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: indptrs [%d..%d] / [%d..%d] outside %u / %u rows",
                        KERNEL_NAME, a->qo_indptr[0], a->qo_indptr[a->batch], a->kv_indptr[0],
                        a->kv_indptr[a->batch], a->qo_rows, a->kv_rows);
    return MG_OK;
}

/* n BF16 values widened to FP32: the bits moved up, exactly mg_bf16_to_f32 (a loop the
 * compiler vectorises, where a call per element is most of a decode step's attention). */
static void widen_bf16(const uint16_t *x, uint32_t n, float *out) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        u16x4 h;
        memcpy(&h, x + i, sizeof h);
        const u32x4 bits = __builtin_convertvector(h, u32x4) << 16;
        memcpy(out + i, &bits, sizeof bits);
    }
    for (; i < n; i++) {
        const uint32_t bits = (uint32_t)x[i] << 16;
        memcpy(out + i, &bits, sizeof bits);
    }
}

/* One (request, KV head) pair: widens its keys and values once, then attends every query row
 * of the heads of its GQA group. `scratch` holds 2 * lk * d + lk + 2 * d floats. */
static void compute_item(const attention_args *a, uint32_t request, uint32_t kvh, float *scratch) {
    const uint32_t d = a->d, group = a->qo_heads / a->kv_heads;
    const uint32_t q0 = (uint32_t)a->qo_indptr[request], k0 = (uint32_t)a->kv_indptr[request];
    const uint32_t lq = (uint32_t)a->qo_indptr[request + 1] - q0;
    const uint32_t lk = (uint32_t)a->kv_indptr[request + 1] - k0;
    float *kf = scratch, *vf = kf + (size_t)lk * d, *scores = vf + (size_t)lk * d;
    float *qf = scores + lk, *out = qf + d;
    for (uint32_t j = 0; j < lk; j++) {
        /* Key j's row: its own row of k/v, or its slot in its page. */
        const size_t key_row =
            a->page_size
                ? (size_t)a->kv_indices[a->page_indptr[request] + j / a->page_size] * a->page_size +
                      j % a->page_size
                : (size_t)(k0 + j);
        const size_t src = (key_row * a->kv_heads + kvh) * d;
        if (a->kv_fp8) { /* the codes, exactly; the scales are applied below */
            for (uint32_t c = 0; c < d; c++) {
                kf[(size_t)j * d + c] = mg_fp8_e4m3_to_f32(((const uint8_t *)a->k)[src + c]);
                vf[(size_t)j * d + c] = mg_fp8_e4m3_to_f32(((const uint8_t *)a->v)[src + c]);
            }
        } else {
            widen_bf16(a->k + src, d, kf + (size_t)j * d);
            widen_bf16(a->v + src, d, vf + (size_t)j * d);
        }
    }
    /* FP8: q.(code * k_scale) = (q.code) * k_scale, folded into the score scale; the output is
     * a convex combination of value codes, times v_scale. */
    const float sm_scale = a->kv_fp8 ? a->sm_scale * a->k_scale[kvh] : a->sm_scale;
    const float out_scale = a->kv_fp8 ? a->v_scale[kvh] : 1.0f;
    for (uint32_t h = kvh * group; h < (kvh + 1) * group; h++)
        for (uint32_t r = 0; r < lq; r++) {
            /* Position of query r among the keys (bottom-right aligned). */
            const int64_t pos = (int64_t)lk - lq + r;
            int64_t end = a->causal ? pos + 1 : (int64_t)lk;
            int64_t begin = a->window_left >= 0 ? pos - a->window_left : 0;
            begin = begin < 0 ? 0 : begin;
            end = end > (int64_t)lk ? (int64_t)lk : end;
            const size_t row = ((size_t)(q0 + r) * a->qo_heads + h) * d;
            widen_bf16(a->q + row, d, qf);
            float lse = attend_row(qf, kf, vf, d, (uint32_t)begin,
                                   end > begin ? (uint32_t)end : (uint32_t)begin, sm_scale,
                                   a->soft_cap, scores, out);
            for (uint32_t c = 0; c < d; c++)
                a->o[row + c] = mg_f32_to_bf16(out[c] * out_scale);
            if (a->lse)
                a->lse[(size_t)(q0 + r) * a->qo_heads + h] = lse;
        }
}

/* Work items (request, KV head) are shared out over the cores by mg_host_parallel_for (its
 * pool, so a decode step's 30-odd calls start no threads): they write disjoint rows and heads,
 * so the result does not depend on the thread count. */
typedef struct work_queue {
    const attention_args *args;
    size_t scratch_floats;
    _Atomic int failed; /* a part could not get scratch memory */
} work_queue;

static void compute_items(void *ctx, size_t first, size_t count) {
    work_queue *w = ctx;
    const attention_args *a = w->args;
    float *scratch = malloc(sizeof(float) * w->scratch_floats);
    if (!scratch) {
        atomic_store(&w->failed, 1);
        return;
    }
    for (size_t i = first; i < first + count; i++)
        compute_item(a, (uint32_t)(i / a->kv_heads), (uint32_t)(i % a->kv_heads), scratch);
    free(scratch);
}

static mg_status compute(const attention_args *a) {
    uint32_t max_lk = 0;
    for (uint32_t i = 0; i < a->batch; i++) {
        uint32_t lk = (uint32_t)(a->kv_indptr[i + 1] - a->kv_indptr[i]);
        max_lk = lk > max_lk ? lk : max_lk;
    }
    /* max_lk * (2 * d + 1) + 2 * d floats; d is any u32 a caller launched with. */
    size_t per_key = 2 * (size_t)a->d + 1, scratch_floats, scratch_bytes;
    if (!mg_mul_size(max_lk, per_key, &scratch_floats) ||
        __builtin_add_overflow(scratch_floats, per_key - 1, &scratch_floats) ||
        !mg_mul_size(scratch_floats, sizeof(float), &scratch_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: scratch for %u keys of head_dim %u overflows the address "
                        "space",
                        KERNEL_NAME, max_lk, a->d);
    work_queue w = {.args = a, .scratch_floats = scratch_floats};
    mg_host_parallel_for((size_t)a->batch * a->kv_heads, 1, compute_items, &w);
    if (atomic_load(&w.failed))
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                        "cpu kernel %s: out of host memory for %zu floats of scratch", KERNEL_NAME,
                        w.scratch_floats);
    return MG_OK;
}

static mg_status kernel_attention(const mg_launch *l) {
    static const mg_arg_kind kinds[ARG_COUNT] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_I32,
        MG_ARG_F32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, KERNEL_NAME, kinds, ARG_COUNT);
    if (st)
        return st;
    attention_args a = {
        .batch = mg_launch_get_u32(l, ARG_BATCH),
        .qo_heads = mg_launch_get_u32(l, ARG_QO_HEADS),
        .kv_heads = mg_launch_get_u32(l, ARG_KV_HEADS),
        .d = mg_launch_get_u32(l, ARG_HEAD_DIM),
        .causal = mg_launch_get_u32(l, ARG_CAUSAL),
        .window_left = mg_launch_get_i32(l, ARG_WINDOW_LEFT),
        .sm_scale = mg_launch_get_f32(l, ARG_SM_SCALE),
        .qo_rows = mg_launch_get_u32(l, ARG_QO_ROWS),
        .kv_rows = mg_launch_get_u32(l, ARG_KV_ROWS),
    };
    if (!a.batch || !a.qo_heads || !a.kv_heads || a.qo_heads % a.kv_heads || !a.d || a.d % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: bad shape (batch %u, heads %u/%u, head_dim %u)",
                        KERNEL_NAME, a.batch, a.qo_heads, a.kv_heads, a.d);
    /* The launch arguments are anyone's (the kernel is public): a shape whose spans or
     * scratch do not fit size_t is refused, never wrapped into a small span. */
    size_t q_row, kv_row, q_bytes, kv_bytes, lse_bytes;
    if (!mg_mul_size(a.qo_heads, a.d, &q_row) || !mg_mul_size(a.kv_heads, a.d, &kv_row) ||
        !mg_matrix_span_bytes(a.qo_rows, q_row, q_row, 2, &q_bytes) ||
        !mg_matrix_span_bytes(a.kv_rows, kv_row, kv_row, 2, &kv_bytes) ||
        !mg_matrix_span_bytes(a.qo_rows, a.qo_heads, a.qo_heads, 4, &lse_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: shape overflows the address space (%u / %u rows, heads "
                        "%u/%u, head_dim %u)",
                        KERNEL_NAME, a.qo_rows, a.kv_rows, a.qo_heads, a.kv_heads, a.d);
    void *q, *k, *v, *o, *indptrs, *lse = NULL;
    /* The alignments the GPU kernels' vector loads need. */
    if ((st = mg_cpu_kernel_buffer(l, ARG_Q, q_bytes, 16, KERNEL_NAME, &q)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_K, kv_bytes, 16, KERNEL_NAME, &k)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_V, kv_bytes, 16, KERNEL_NAME, &v)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_O, q_bytes, 16, KERNEL_NAME, &o)) ||
        (st = mg_cpu_kernel_buffer(l, ARG_INDPTRS, 8ull * (a.batch + 1), 4, KERNEL_NAME, &indptrs)))
        return st;
    if (mg_launch_get_u32(l, ARG_HAS_LSE) &&
        (st = mg_cpu_kernel_buffer(l, ARG_LSE, lse_bytes, 4, KERNEL_NAME, &lse)))
        return st;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    a.qo_indptr = indptrs;
    a.kv_indptr = a.qo_indptr + a.batch + 1;
    if ((st = check_indptrs(&a)))
        return st;
    return compute(&a);
}

/* Launch argument indices of the paged kernel. */
enum {
    PARG_Q,
    PARG_K_PAGES,
    PARG_V_PAGES,
    PARG_O,
    PARG_LSE,
    PARG_INDPTRS,
    PARG_KV_INDICES,
    PARG_BATCH,
    PARG_QO_HEADS,
    PARG_KV_HEADS,
    PARG_HEAD_DIM,
    PARG_PAGE_SIZE,
    PARG_NUM_PAGES,
    PARG_NUM_INDICES,
    PARG_WINDOW_LEFT,
    PARG_SM_SCALE,
    PARG_SOFT_CAP,
    PARG_QO_ROWS,
    PARG_HAS_LSE,
    PARG_KV_DTYPE, /* mg_kv_dtype */
    PARG_K_SCALE,  /* FP8: FP32 [kv_heads], else 0 */
    PARG_V_SCALE,
    PARG_COUNT
};

/* The paged kernel checks the whole page table (its indptrs from the plan, the caller's
 * kv_indices) before computing: a bad entry is an error, never a read outside the pools. */
static mg_status kernel_attention_paged(const mg_launch *l) {
    static const mg_arg_kind kinds[PARG_COUNT] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_I32,    MG_ARG_F32,    MG_ARG_F32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_BUFFER, MG_ARG_BUFFER};
    mg_status st = mg_cpu_kernel_check_args(l, PAGED_NAME, kinds, PARG_COUNT);
    if (st)
        return st;
    attention_args a = {
        .batch = mg_launch_get_u32(l, PARG_BATCH),
        .qo_heads = mg_launch_get_u32(l, PARG_QO_HEADS),
        .kv_heads = mg_launch_get_u32(l, PARG_KV_HEADS),
        .d = mg_launch_get_u32(l, PARG_HEAD_DIM),
        .causal = 1,
        .window_left = mg_launch_get_i32(l, PARG_WINDOW_LEFT),
        .sm_scale = mg_launch_get_f32(l, PARG_SM_SCALE),
        .soft_cap = mg_launch_get_f32(l, PARG_SOFT_CAP),
        .qo_rows = mg_launch_get_u32(l, PARG_QO_ROWS),
        .page_size = mg_launch_get_u32(l, PARG_PAGE_SIZE),
    };
    const uint32_t num_pages = mg_launch_get_u32(l, PARG_NUM_PAGES);
    const uint32_t num_indices = mg_launch_get_u32(l, PARG_NUM_INDICES);
    const uint32_t kv_dtype = mg_launch_get_u32(l, PARG_KV_DTYPE);
    const size_t elem_bytes = mg_kv_dtype_bytes((mg_kv_dtype)kv_dtype);
    a.kv_fp8 = kv_dtype == MG_KV_FP8_E4M3;
    if (!a.batch || a.batch > MG_KV_MAX_BATCH || !a.qo_heads || !a.kv_heads ||
        a.qo_heads % a.kv_heads || !a.d || a.d % 8 || a.d > MG_KV_MAX_HEAD_DIM || !a.page_size ||
        a.page_size > MG_KV_PAGE_SIZE_MAX || !num_pages || num_pages > (uint32_t)INT32_MAX ||
        !elem_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: bad shape (batch %u, heads %u/%u, head_dim %u, page_size "
                        "%u, %u pages)",
                        PAGED_NAME, a.batch, a.qo_heads, a.kv_heads, a.d, a.page_size, num_pages);
    size_t q_row, pool_elems, q_bytes, pool_bytes, lse_bytes;
    if (!mg_mul_size(a.qo_heads, a.d, &q_row) ||
        !mg_mul_size((size_t)a.kv_heads * a.d * a.page_size, num_pages, &pool_elems) ||
        !mg_mul_size(pool_elems, elem_bytes, &pool_bytes) ||
        !mg_matrix_span_bytes(a.qo_rows, q_row, q_row, 2, &q_bytes) ||
        !mg_matrix_span_bytes(a.qo_rows, a.qo_heads, a.qo_heads, 4, &lse_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: shape overflows the address space",
                        PAGED_NAME);
    void *q, *k, *v, *o, *indptrs, *indices = NULL, *lse = NULL;
    const size_t entries = (size_t)a.batch + 1;
    if ((st = mg_cpu_kernel_buffer(l, PARG_Q, q_bytes, 16, PAGED_NAME, &q)) ||
        (st = mg_cpu_kernel_buffer(l, PARG_K_PAGES, pool_bytes, 16, PAGED_NAME, &k)) ||
        (st = mg_cpu_kernel_buffer(l, PARG_V_PAGES, pool_bytes, 16, PAGED_NAME, &v)) ||
        (st = mg_cpu_kernel_buffer(l, PARG_O, q_bytes, 16, PAGED_NAME, &o)) ||
        (st = mg_cpu_kernel_buffer(l, PARG_INDPTRS, 16ull * entries, 4, PAGED_NAME, &indptrs)) ||
        (num_indices && (st = mg_cpu_kernel_buffer(l, PARG_KV_INDICES, 4ull * num_indices, 4,
                                                   PAGED_NAME, &indices))))
        return st;
    if (mg_launch_get_u32(l, PARG_HAS_LSE) &&
        (st = mg_cpu_kernel_buffer(l, PARG_LSE, lse_bytes, 4, PAGED_NAME, &lse)))
        return st;
    void *k_scale = NULL, *v_scale = NULL;
    if (a.kv_fp8 &&
        ((st = mg_cpu_kernel_buffer(l, PARG_K_SCALE, 4ull * a.kv_heads, 4, PAGED_NAME, &k_scale)) ||
         (st = mg_cpu_kernel_buffer(l, PARG_V_SCALE, 4ull * a.kv_heads, 4, PAGED_NAME, &v_scale))))
        return st;
    a.k_scale = k_scale, a.v_scale = v_scale;
    for (uint32_t h = 0; a.kv_fp8 && h < a.kv_heads; h++)
        if (!isfinite(a.k_scale[h]) || !(a.k_scale[h] > 0.0f) || !isfinite(a.v_scale[h]) ||
            !(a.v_scale[h] > 0.0f))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "cpu kernel %s: k_scale[%u] = %g / v_scale[%u] = %g must be finite "
                            "and > 0",
                            PAGED_NAME, h, (double)a.k_scale[h], h, (double)a.v_scale[h]);
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    a.qo_indptr = indptrs;
    a.kv_indptr = a.qo_indptr + entries;
    a.page_indptr = a.kv_indptr + entries;
    a.kv_indices = indices;
    const int32_t *last_page_len = a.page_indptr + entries;
    const mg_kv_cache_desc cache = {.num_kv_heads = a.kv_heads,
                                    .head_dim = a.d % 16 ? 16 : a.d,
                                    .page_size = a.page_size,
                                    .num_pages = num_pages};
    const mg_kv_page_table table = {a.batch, a.qo_indptr, a.page_indptr, indices, last_page_len};
    if ((uint32_t)a.page_indptr[a.batch] > num_indices)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: the page table uses %d kv_indices, %u given", PAGED_NAME,
                        a.page_indptr[a.batch], num_indices);
    if ((st = mg_kv_page_table_check(&cache, &table, "cpu kernel " PAGED_NAME)))
        return st;
    for (uint32_t i = 0; i < a.batch; i++)
        if (a.kv_indptr[i + 1] - a.kv_indptr[i] !=
            mg_kv_len(a.page_indptr, last_page_len, a.page_size, i))
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "cpu kernel %s: token counts disagree with the page table at %u",
                            PAGED_NAME, i);
    a.kv_rows = (uint32_t)a.kv_indptr[a.batch]; /* only bounds the indptr check */
    if ((st = check_indptrs(&a)))
        return st;
    return compute(&a);
}

static void register_kernels(void) {
    if (!mg_cpu_kernel_register(KERNEL_MODULE, KERNEL_FUNCTION, kernel_attention))
        mg_cpu_kernel_register(KERNEL_MODULE, PAGED_FUNCTION, kernel_attention_paged);
}

/* The provider serves the ragged and the paged op, so the registry calls this twice. */
static void register_cpu_kernels(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}

/* Host arrays in a plan's indptr buffer: 2 for ragged plans, 4 for paged ones. */
static size_t indptr_arrays(const mg_attention_plan *p) {
    return p->page_size ? 4 : 2;
}

/* The device bytes of an indptr buffer of `arrays` arrays (carved size: a caller's
 * workspace). */
static size_t indptrs_bytes(size_t arrays, uint32_t batch_size) {
    return mg_attention_carve_size(arrays * sizeof(int32_t) * ((size_t)batch_size + 1));
}

static mg_status cpu_plan(mg_attention_plan *p, const int32_t *qo_indptr, const int32_t *kv_indptr,
                          uint32_t batch_size, mg_stream *s) {
    cpu_attention_plan *c = p->impl;
    if (!c) {
        if (!(c = calloc(1, sizeof *c)))
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu attention plan: out of host memory");
        mg_status st = mg_kernel_lookup(
            p->backend, KERNEL_MODULE, p->page_size ? PAGED_FUNCTION : KERNEL_FUNCTION, &c->kernel);
        if (st) {
            free(c);
            return st;
        }
        p->impl = c;
    }
    const size_t entries = (size_t)batch_size + 1;
    if (p->desc.workspace) {
        const size_t need = indptrs_bytes(indptr_arrays(p), batch_size);
        if (need > p->desc.workspace_bytes)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: this batch of %u requests needs %zu workspace bytes, the "
                            "caller's workspace has %zu (it never grows; the plan keeps its "
                            "previous batch)",
                            mg_attention_plan_fn(p), batch_size, need, p->desc.workspace_bytes);
        c->indptrs = p->desc.workspace;
        if (entries > c->indptrs_capacity)
            c->indptrs_capacity = (uint32_t)entries;
    } else if (entries > c->indptrs_capacity) {
        /* Owned by the plan (mg_ledger_sweep leaves it alone). The old buffer is freed only
         * after stream `s` has finished the work queued on it, which may still read it
         * (updates and runs of a plan share one stream, as FlashInfer's plans require; on the
         * CPU the stream has already run it). Eager plans are never captured, so no graph
         * reads it either (fixed-grid plans never grow). */
        mg_devptr grown;
        mg_status st = mg_alloc_owned_at(p->backend, indptr_arrays(p) * sizeof(int32_t) * entries,
                                         MG_ALLOC_DEVICE, &grown, __FILE__, __LINE__);
        if (st)
            return st;
        if (c->indptrs && (st = mg_stream_synchronize(s ? s : mg_stream_default(p->backend)))) {
            mg_free(p->backend, grown);
            return st;
        }
        mg_free(p->backend, c->indptrs);
        c->indptrs = grown;
        c->indptrs_capacity = (uint32_t)entries;
    }
    mg_status st =
        mg_copy_h2d_async(p->backend, c->indptrs, qo_indptr, sizeof(int32_t) * entries, s);
    if (!st && (st = mg_copy_h2d_async(p->backend, c->indptrs + sizeof(int32_t) * entries,
                                       kv_indptr, sizeof(int32_t) * entries, s)))
        p->usable = false; /* the new qo_indptr landed next to the old kv_indptr */
    /* Paged plans: the page table's arrays follow, at the offsets the paged kernel reads
     * (batch_size + 1 entries apart). */
    if (!st && p->page_size &&
        ((st = mg_copy_h2d_async(p->backend, c->indptrs + 2 * sizeof(int32_t) * entries,
                                 p->new_page_indptr, sizeof(int32_t) * entries, s)) ||
         (st = mg_copy_h2d_async(p->backend, c->indptrs + 3 * sizeof(int32_t) * entries,
                                 p->new_last_page_len, sizeof(int32_t) * (entries - 1), s))))
        p->usable = false;
    return st;
}

/* The ragged kernel's launch (argument list above) on `grid` x `block`; the CPU kernel ignores
 * the shape. */
static mg_status launch_ragged(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s,
                               mg_dim3 grid, mg_dim3 block) {
    const cpu_attention_plan *c = p->impl;
    const mg_attention_desc *d = &p->desc;
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, t->q);
    mg_launch_arg_ptr(&l, t->k);
    mg_launch_arg_ptr(&l, t->v);
    mg_launch_arg_ptr(&l, t->o);
    mg_launch_arg_ptr(&l, t->lse);
    mg_launch_arg_ptr(&l, c->indptrs);
    mg_launch_arg_u32(&l, p->batch_size);
    mg_launch_arg_u32(&l, d->num_qo_heads);
    mg_launch_arg_u32(&l, d->num_kv_heads);
    mg_launch_arg_u32(&l, d->head_dim);
    mg_launch_arg_u32(&l, d->causal);
    mg_launch_arg_i32(&l, d->window_left);
    mg_launch_arg_f32(&l, d->sm_scale);
    mg_launch_arg_u32(&l, t->qo_rows);
    mg_launch_arg_u32(&l, t->kv_rows);
    mg_launch_arg_u32(&l, t->lse != 0);
    return mg_launch_run(p->backend, c->kernel, s, &l);
}

/* The paged kernel's launch (argument list above), likewise. */
static mg_status launch_paged(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                              mg_stream *s, mg_dim3 grid, mg_dim3 block) {
    const cpu_attention_plan *c = p->impl;
    const mg_attention_desc *d = &p->desc;
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, t->q);
    mg_launch_arg_ptr(&l, t->k_pages);
    mg_launch_arg_ptr(&l, t->v_pages);
    mg_launch_arg_ptr(&l, t->o);
    mg_launch_arg_ptr(&l, t->lse);
    mg_launch_arg_ptr(&l, c->indptrs);
    mg_launch_arg_ptr(&l, t->kv_indices);
    mg_launch_arg_u32(&l, p->batch_size);
    mg_launch_arg_u32(&l, d->num_qo_heads);
    mg_launch_arg_u32(&l, d->num_kv_heads);
    mg_launch_arg_u32(&l, d->head_dim);
    mg_launch_arg_u32(&l, p->page_size);
    mg_launch_arg_u32(&l, t->num_pages);
    mg_launch_arg_u32(&l, t->num_kv_indices);
    mg_launch_arg_i32(&l, d->window_left);
    mg_launch_arg_f32(&l, d->sm_scale);
    mg_launch_arg_f32(&l, p->logits_soft_cap);
    mg_launch_arg_u32(&l, t->qo_rows);
    mg_launch_arg_u32(&l, t->lse != 0);
    mg_launch_arg_u32(&l, (uint32_t)p->kv_dtype);
    mg_launch_arg_ptr(&l, t->k_scale);
    mg_launch_arg_ptr(&l, t->v_scale);
    return mg_launch_run(p->backend, c->kernel, s, &l);
}

static const mg_dim3 one_thread = {1, 1, 1};

static mg_status cpu_run(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s) {
    return launch_ragged(p, t, s, one_thread, one_thread);
}

static mg_status cpu_run_paged(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                               mg_stream *s) {
    return launch_paged(p, t, s, one_thread, one_thread);
}

static void cpu_release(mg_attention_plan *p, bool backend_live) {
    cpu_attention_plan *c = p->impl;
    if (!c)
        return;
    if (backend_live) {
        if (!p->desc.workspace) /* a caller's workspace stays the caller's */
            mg_free(p->backend, c->indptrs);
        mg_kernel_release(c->kernel);
    }
    free(c);
    p->impl = NULL;
}

static void cpu_info(const mg_attention_plan *p, mg_attention_plan_info *out) {
    const cpu_attention_plan *c = p->impl;
    out->impl = MG_ATTENTION_IMPL_AUTO;
    out->workspace_bytes = !c ? 0
                           : p->desc.workspace
                               ? indptrs_bytes(indptr_arrays(p), p->batch_size)
                               : indptr_arrays(p) * sizeof(int32_t) * c->indptrs_capacity;
}

static mg_status cpu_workspace_bytes(mg_backend *b, const mg_attention_desc *d,
                                     const int32_t *qo_indptr, const int32_t *kv_indptr,
                                     uint32_t batch_size, size_t *bytes) {
    (void)b, (void)d, (void)qo_indptr, (void)kv_indptr;
    *bytes = indptrs_bytes(2, batch_size);
    return MG_OK;
}

/* Paged plans keep the page table's indptr and last-page lengths beside the two indptrs. */
static mg_status cpu_paged_workspace_bytes(mg_backend *b, const mg_paged_attention_call *call,
                                           const int32_t *qo_indptr, const int32_t *kv_indptr,
                                           uint32_t batch_size, size_t *bytes) {
    (void)b, (void)call, (void)qo_indptr, (void)kv_indptr;
    *bytes = indptrs_bytes(4, batch_size);
    return MG_OK;
}

const mg_attention_provider mg_attention_reference_provider = {
    .base = {.name = "reference",
             .backend = MG_BACKEND_CPU,
             /* no kernels field: a plan looks its kernel up itself (above), so that a lookup
              * out of host memory reports that instead of making the provider unavailable */
             .register_cpu_kernels = register_cpu_kernels},
    .plan = cpu_plan,
    .run = cpu_run,
    .run_paged = cpu_run_paged,
    .release = cpu_release,
    .info = cpu_info,
    .workspace_bytes = cpu_workspace_bytes,
    .paged_workspace_bytes = cpu_paged_workspace_bytes,
};

/* ------------------------------------------------------------------ "kernels"
 *
 * The same plans, kernels and argument lists on any backend that ships the two kernels by name
 * (Metal: kernels/metal/attention.metal; CUDA: kernels/cuda/attention/attention_by_row.cu, for
 * the head_dims FlashInfer and the split-KV kernels are not built for): the plan keeps its indptrs
 * in a buffer of that backend and looks the kernel up there; a run launches one threadgroup of
 * KERNELS_THREADS threads per query row and head (grid x: rows, y: heads), the shape the device
 * kernels are written for. They come after "reference", so the CPU backend runs them only when
 * forced. */
#define KERNELS_THREADS 128u

static mg_dim3 kernels_grid(uint32_t qo_rows, uint32_t qo_heads) {
    return (mg_dim3){qo_rows ? qo_rows : 1, qo_heads, 1};
}

static mg_status kernels_run(mg_attention_plan *p, const mg_attention_tensors *t, mg_stream *s) {
    return launch_ragged(p, t, s, kernels_grid(t->qo_rows, p->desc.num_qo_heads),
                         (mg_dim3){KERNELS_THREADS, 1, 1});
}

static mg_status kernels_run_paged(mg_attention_plan *p, const mg_paged_attention_tensors *t,
                                   mg_stream *s) {
    return launch_paged(p, t, s, kernels_grid(t->qo_rows, p->desc.num_qo_heads),
                        (mg_dim3){KERNELS_THREADS, 1, 1});
}

/* On CUDA a plan that demands FA2 or FA3 is never served by these kernels; elsewhere the
 * request means nothing, as on the CPU. The ragged and the paged op's calls both start with the
 * validated descriptor. */
static bool kernels_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    return mg_backend_get_kind(b) != MG_BACKEND_CUDA ||
           mg_attention_impl_open(call, reason, reason_bytes);
}

const mg_attention_provider mg_attention_kernels_provider = {
    .base =
        MG_OP_KERNELS_PROVIDER_SUPPORTS(register_cpu_kernels, kernels_supports, KERNEL_FUNCTION),
    .plan = cpu_plan,
    .run = kernels_run,
    .release = cpu_release,
    .info = cpu_info,
    .workspace_bytes = cpu_workspace_bytes,
};

const mg_attention_provider mg_attention_kernels_paged_provider = {
    .base = MG_OP_KERNELS_PROVIDER_SUPPORTS(register_cpu_kernels, kernels_supports, PAGED_FUNCTION),
    .plan = cpu_plan,
    .run_paged = kernels_run_paged,
    .release = cpu_release,
    .info = cpu_info,
    .paged_workspace_bytes = cpu_paged_workspace_bytes,
};
