/*
 * flashinfer_ragged_prefill.h - private: the C ABI of the attention plugin
 * (libmetrale_gpu_attention.so, built from kernels/cuda/flashinfer_ragged_prefill*.cu) and, for
 * C++ only, the launchers its translation units share.
 *
 * The plugin wraps FlashInfer's ragged (varlen) BF16 prefill attention, head_dim 64, 128 or 256,
 * through two paths: FA2 (any sm_80+, kernels built for the configured architectures) and the
 * Hopper FA3 path (sm_90a only); and its paged attention: FA2 for every paged shape built, FA3
 * for BF16 pools at head_dim 128 without soft-cap (flashinfer_paged_sm90.cu).
 * src/ops/attention/attention_flashinfer.c loads it with dlopen and calls only the
 * functions below; every one returns an mg_status and fills `err` on failure, never throws and
 * never exits. They use the CUDA runtime, which runs in the device's primary
 * context: the caller makes that context current first (mg_cuda_bind).
 *
 * The int workspace the plugin plans into starts with a region of its own holding device copies
 * of qo_indptr and kv_indptr (batch_size + 1 int32 each), so a run needs no device indptrs from
 * the caller; FlashInfer's schedule follows.
 */
#ifndef METRALE_FLASHINFER_RAGGED_PREFILL_H
#define METRALE_FLASHINFER_RAGGED_PREFILL_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/status.h"
#include "plugin_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct or signature below changes; the loader refuses a mismatch. */
#define MG_FI_ABI_VERSION 4

/* The head_dims the plugin has kernels for: FA2 for each, FA3 for those built for sm_90a
 * (mg_fi_choose_path says when FA3 lacks one). */
#define MG_FI_HEAD_DIMS_TEXT "64, 128 and 256"
static inline int mg_fi_head_dim_built(uint32_t head_dim) {
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

/* The paged (FA2, causal) kernels built: one translation unit per (KV dtype, head_dim, soft-cap
 * mode) of cmake/flashinfer.cmake fi_paged_units, which must list the same. */
#define MG_FI_PAGED_KERNELS_TEXT                                                                   \
    "BF16 pools: head_dim 128 and 256 with or without soft-cap, 64 without; FP8 pools: "           \
    "head_dim 128 without soft-cap"
static inline int mg_fi_paged_built(uint32_t head_dim, uint32_t soft_cap, uint32_t kv_fp8) {
    if (kv_fp8)
        return head_dim == 128 && !soft_cap;
    return head_dim == 128 || head_dim == 256 || (head_dim == 64 && !soft_cap);
}

/* A failed call's status comes with an mg_plugin_error (kernels/cuda/common/plugin_error.h). */
typedef mg_plugin_error mg_fi_error;

typedef enum mg_fi_path {
    MG_FI_PATH_NONE = 0, /* nothing to launch: no query rows */
    MG_FI_PATH_FA2 = 1,
    MG_FI_PATH_FA3 = 2,
} mg_fi_path;

/* What a plan is for. Validated by the caller (src/ops/attention/attention.c) before any call. */
typedef struct mg_fi_shape {
    uint32_t num_qo_heads;
    uint32_t num_kv_heads;
    uint32_t head_dim;      /* mg_fi_head_dim_built */
    int32_t window_left;    /* -1: none */
    uint32_t causal;        /* 0 or 1 */
    uint32_t graph_mode;    /* fixed grid: runs may be captured and replayed after re-plans */
    uint32_t graph_qo_rows; /* graph mode: the q/o rows every run passes (padded capacity) */
    uint32_t batch_size;
    mg_fi_path path; /* FA2 or FA3, chosen by mg_fi_choose_path */
    /* 0: ragged keys (kv_indptr counts rows). Else paged keys: kv_indptr counts pages of this
     * many tokens, a plan also takes kv_last_page_len (causal; FA2, or FA3 for the one Hopper
     * paged kernel built: see mg_fi_choose_path). */
    uint32_t page_size;
    uint32_t soft_cap; /* paged: 1 when runs apply a logits soft-cap (its own kernels) */
    uint32_t kv_fp8;   /* paged: 1 for FP8 E4M3 pools with per-head scales (its own kernels) */
} mg_fi_shape;

/* FlashInfer's plan result for one path, kept by the caller between plan and run. */
typedef struct mg_fi_plan_info {
    mg_fi_path path;
    uint32_t batch_size;
    int64_t words[16]; /* the path's plan info, in FlashInfer's own vector form */
} mg_fi_plan_info;

typedef struct mg_fi_run_args {
    void *q, *k, *v, *o; /* BF16, NHD, contiguous: [rows, heads, head_dim] */
    float *lse;          /* [qo rows, num_qo_heads] base-2 log-sum-exp, or NULL */
    uint32_t qo_rows, kv_rows;
    float sm_scale;
    void *float_workspace, *int_workspace;
    /* Paged shapes: k and v are the page pools ([pages][page_size][num_kv_heads][head_dim]),
     * kv_indices the caller's device page ids; logits_soft_cap > 0 when shape.soft_cap. */
    int32_t *kv_indices;
    float logits_soft_cap;
    /* FP8 pools (shape.kv_fp8): FP32 [num_kv_heads] device arrays; a key code stands for
     * code * k_scale[h], a value code for code * v_scale[h]. */
    const float *k_scale, *v_scale;
} mg_fi_run_args;

/* Returns MG_FI_ABI_VERSION of the built plugin. */
typedef uint32_t (*mg_fi_abi_version_fn)(void);
uint32_t mg_fi_abi_version(void);

/* Picks the path for `shape` (its `path` member is ignored) on the current device: FA3 when it
 * was built, the device is compute capability 9.0, no sliding window is asked and the batch
 * suits the Hopper scheduler; FA2 otherwise. Paged keys: FA3 when its paged kernel was built for
 * the shape (BF16 pools, head_dim 128, no soft-cap; any page size, sliding window or not), the
 * device is 9.0, the batch suits the Hopper scheduler and it is prefill-like (at least 128 query
 * rows per request on average: fewer leave FA3's 128-row tiles mostly empty, where FA2 packs the
 * GQA group); FA2 otherwise. MG_FI_PATH_NONE when an eager plan has no query
 * rows (nothing to launch). `forced` (MG_FI_PATH_NONE: automatic) demands one
 * and fails with MG_ERR_UNSUPPORTED when it cannot serve the shape here. */
typedef mg_status (*mg_fi_choose_path_fn)(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                          const int32_t *kv_indptr, mg_fi_path forced,
                                          mg_fi_path *out, mg_fi_error *err);
mg_status mg_fi_choose_path(const mg_fi_shape *shape, const int32_t *qo_indptr,
                            const int32_t *kv_indptr, mg_fi_path forced, mg_fi_path *out,
                            mg_fi_error *err);

/* Bytes of float and int workspace (and of the page-locked mirror, which equals the int
 * workspace) the plan of `shape` with these host indptrs needs. Host only: no device work. */
typedef mg_status (*mg_fi_workspace_bytes_fn)(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                              const int32_t *kv_indptr, size_t *float_bytes,
                                              size_t *int_bytes, mg_fi_error *err);
mg_status mg_fi_workspace_bytes(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                const int32_t *kv_indptr, size_t *float_bytes, size_t *int_bytes,
                                mg_fi_error *err);

/* Builds the schedule on the host into `pinned` (page-locked, int_bytes long): the indptr
 * region (qo_indptr, kv_indptr and, for paged shapes, kv_last_page_len), then FlashInfer's
 * schedule, an image of the whole int workspace. FlashInfer itself always queues a copy of its part
 * on `stream`, into `flashinfer_copy_target` (past the indptr region): the live int workspace, or a
 * scratch buffer of int_bytes when the caller wants to compare the new plan's layout before
 * anything it runs reads changes. The indptr region is copied by mg_fi_upload only. `pinned` must
 * not be rewritten until the copies are done. Not capturable. */
typedef mg_status (*mg_fi_plan_fn)(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                   const int32_t *kv_indptr, const int32_t *kv_last_page_len,
                                   void *float_workspace, size_t float_bytes,
                                   void *flashinfer_copy_target, void *pinned, size_t int_bytes,
                                   void *stream, mg_fi_plan_info *out, mg_fi_error *err);
mg_status mg_fi_plan(const mg_fi_shape *shape, const int32_t *qo_indptr, const int32_t *kv_indptr,
                     const int32_t *kv_last_page_len, void *float_workspace, size_t float_bytes,
                     void *flashinfer_copy_target, void *pinned, size_t int_bytes, void *stream,
                     mg_fi_plan_info *out, mg_fi_error *err);

/* Queues the copy of the image mg_fi_plan built in `pinned` into `int_workspace` on `stream`:
 * the indptr region only (`whole_image` 0: FlashInfer already copied its part there), or all
 * int_bytes (`whole_image` 1: FlashInfer's copy went to a scratch buffer). */
typedef mg_status (*mg_fi_upload_fn)(const mg_fi_shape *shape, void *int_workspace,
                                     const void *pinned, size_t int_bytes, uint32_t whole_image,
                                     void *stream, mg_fi_error *err);
mg_status mg_fi_upload(const mg_fi_shape *shape, void *int_workspace, const void *pinned,
                       size_t int_bytes, uint32_t whole_image, void *stream, mg_fi_error *err);

/* Launches the attention planned in `info` on `stream` (a cudaStream_t / CUstream). Capturable
 * when the shape is in graph mode. */
typedef mg_status (*mg_fi_run_fn)(const mg_fi_shape *shape, const mg_fi_plan_info *info,
                                  const mg_fi_run_args *args, void *stream, mg_fi_error *err);
mg_status mg_fi_run(const mg_fi_shape *shape, const mg_fi_plan_info *info,
                    const mg_fi_run_args *args, void *stream, mg_fi_error *err);

#ifdef __cplusplus
}
#endif

/* ------------------------------------------------------------------ C++: shared by the .cu files
 */
#if defined(__cplusplus) && defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cutlass/numeric_types.h>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/fastdiv.cuh>

namespace metrale_fi {

/* FlashInfer FA2's ragged-KV params concept: the members its kernels read, nothing else
 * (default variant: no custom mask, no ALiBi, no soft cap, no RoPE). */
struct Fa2Params {
    using DTypeQ = __nv_bfloat16;
    using DTypeKV = __nv_bfloat16;
    using DTypeO = __nv_bfloat16;
    using IdType = int32_t;

    DTypeQ *q;
    DTypeKV *k;
    DTypeKV *v;
    IdType *q_indptr;
    IdType *kv_indptr;
    DTypeO *o;
    float *lse;
    flashinfer::uint_fastdiv group_size;

    double logits_soft_cap;
    double sm_scale;
    double rope_rcp_scale;
    double rope_rcp_theta;

    uint32_t num_qo_heads, num_kv_heads;
    uint32_t q_stride_n, q_stride_h, k_stride_n, k_stride_h, v_stride_n, v_stride_h;
    int32_t window_left;

    IdType *request_indices;
    IdType *qo_tile_indices;
    IdType *kv_tile_indices;
    IdType *merge_indptr;
    IdType *o_indptr;
    IdType *kv_chunk_size_ptr;
    bool *block_valid_mask;
    uint32_t max_total_num_rows;
    uint32_t *total_num_rows;
    uint32_t padded_batch_size;
    bool partition_kv;

    __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t b) const {
        return q_indptr[b + 1] - q_indptr[b];
    }
    __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t b) const {
        return kv_indptr[b + 1] - kv_indptr[b];
    }
};

/* FlashInfer FA3 (Hopper) ragged params concept. Its CuTe kernels take CUTLASS's bfloat16_t
 * (same bits as __nv_bfloat16) to find their GMMA and TMA types. */
struct Fa3Params {
    using DTypeQ = cutlass::bfloat16_t;
    using DTypeKV = cutlass::bfloat16_t;
    using DTypeO = cutlass::bfloat16_t;
    using IdType = int32_t;

    DTypeQ *q_ptr;
    DTypeKV *k_ptr;
    DTypeKV *v_ptr;
    DTypeO *o_ptr;
    float *lse_ptr;

    IdType *qo_tile_indices, *qo_indptr, *kv_indptr, *qo_lens, *kv_lens, *head_indices,
        *work_indptr, *batch_indices;

    struct AdditionalParams {
        double sm_scale;
    } additional_params;

    int64_t q_stride_n, k_stride_n, v_stride_n, o_stride_n;
    int64_t q_stride_h, k_stride_h, v_stride_h, o_stride_h;
    int64_t nnz_qo, nnz_kv;

    int head_dim, num_qo_heads, num_kv_heads, group_size, window_left;
    bool causal;
};

/* The kernel launchers, one explicit instantiation per (head_dim, mask, sliding window), built
 * by compiling flashinfer_ragged_prefill_{fa2,sm90}.cu once per (head_dim, mask) so the heavy
 * template instantiations compile in parallel. FA2 launchers dispatch on the plan's CTA_TILE_Q;
 * tmp_v/tmp_s are the split-KV partials (NULL when the plan did not split). */
template <uint32_t HEAD_DIM, bool CAUSAL, bool WINDOW>
cudaError_t fa2_launch(Fa2Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v, float *tmp_s,
                       cudaStream_t stream);

/* FA3 (per-head schedule, no sliding window); instantiated only for the head_dims built for
 * sm_90a (METRALE_FI_FA3_HD<d>). */
template <uint32_t HEAD_DIM, bool CAUSAL> cudaError_t fa3_launch(Fa3Params &p, cudaStream_t stream);

/* FlashInfer FA3 (Hopper) paged prefill params: the ragged ones (their schedule members are the
 * same; k_ptr and v_ptr are the page pools, k/v_stride_n the stride between tokens of a page)
 * plus the page table. (FlashInfer's own hopper BatchPrefillPagedParams shares its name and
 * namespace with the FA2 paged params above, so it cannot be included next to them.) */
struct Fa3PagedParams : Fa3Params {
    IdType *kv_indices;                   /* the caller's page ids; kv_indptr counts pages */
    int64_t k_page_stride, v_page_stride; /* elements between pages */
    int page_size;
};

/* The one FA3 paged kernel built (flashinfer_paged_sm90.cu, sm_90a only: METRALE_FI_FA3_PAGED):
 * BF16 pools, head_dim kFa3PagedHeadDim, causal, no soft cap, per-head schedule, and the
 * sliding window applied at run time: window_left >= 0, or kFa3PagedNoWindow for none. */
constexpr uint32_t kFa3PagedHeadDim = 128;

/* The left window the kernel runs with when the plan has none: no key is ever that far behind
 * its query (a request holds fewer than 2^31 tokens), so nothing is masked, and FlashInfer's
 * window tile bounds (positions minus this, never below -INT32_MAX) cannot overflow. */
constexpr int32_t kFa3PagedNoWindow = INT32_MAX;

cudaError_t fa3_paged_launch(Fa3PagedParams &p, cudaStream_t stream);

/* FlashInfer FA2 paged prefill (causal, runtime sliding window; decode is qo_len 1), one
 * instantiation per (head_dim, soft cap), built from flashinfer_paged_fa2.cu. */
using PagedParams =
    flashinfer::BatchPrefillPagedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int32_t>;
template <uint32_t HEAD_DIM, bool SOFT_CAP>
cudaError_t fa2_paged_launch(PagedParams &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v,
                             float *tmp_s, cudaStream_t stream);

/* FP8 E4M3 pools: FlashInfer's paged params with FP8 keys and values, plus the per-KV-head
 * scales the attention variant of flashinfer_paged_fa2.cu folds into the score scale and the
 * output. (Not named k_scale / v_scale: FlashInfer reads a scalar member v_scale when present.) */
struct PagedFp8Params
    : flashinfer::BatchPrefillPagedParams<__nv_bfloat16, __nv_fp8_e4m3, __nv_bfloat16, int32_t> {
    const float *head_k_scale;
    const float *head_v_scale;
};
template <uint32_t HEAD_DIM, bool SOFT_CAP>
cudaError_t fa2_paged_fp8_launch(PagedFp8Params &p, uint32_t cta_tile_q, __nv_bfloat16 *tmp_v,
                                 float *tmp_s, cudaStream_t stream);

} // namespace metrale_fi
#endif
#endif
