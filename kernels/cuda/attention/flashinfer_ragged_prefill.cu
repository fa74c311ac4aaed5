// flashinfer_ragged_prefill.cu - the C ABI of the attention plugin: path choice, workspace
// sizing, planning and launch of FlashInfer's ragged BF16 prefill (head_dim 64, 128, 256) and of
// its paged attention. The kernels themselves are instantiated in
// flashinfer_ragged_prefill_{fa2,sm90}.cu, one unit per (head_dim, mask), flashinfer_paged_fa2.cu
// (one unit per KV dtype, head_dim, soft cap) and flashinfer_paged_sm90.cu (one unit).
//
// Every entry point catches what FlashInfer throws and turns it, like a failed CUDA call, into a
// status and a message (mg_fi_error); nothing propagates across the C boundary.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include <flashinfer/attention/scheduler.cuh>

#include "flashinfer_ragged_prefill.h"

#define MG_FI_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using metrale_fi::Fa2Params;
using metrale_fi::Fa3PagedParams;
using metrale_fi::Fa3Params;

// FA3's scheduler (PrefillSM90Plan) falls back to one schedule shared by all heads above this
// many tiles per head, a variant this plugin does not instantiate.
constexpr int64_t kFa3MaxWorksPerHead = 4096;

// Query rows per FA3 CTA tile, as FlashInfer's PrefillSM90Plan and getCTATileSize choose them.
int64_t fa3_cta_tile_q(uint32_t head_dim) {
    return head_dim == 64 ? 192 : 128;
}

size_t align16(size_t bytes) {
    return (bytes + 15) & ~size_t(15);
}

// The plugin's own head of the int workspace: device copies of both indptrs and, for paged
// shapes, of kv_last_page_len, each in a slot of this many bytes.
size_t indptr_slot_bytes(uint32_t batch_size) {
    return align16(sizeof(int32_t) * (size_t(batch_size) + 1));
}

size_t indptr_region_bytes(const mg_fi_shape *s) {
    return (s->page_size ? 3 : 2) * indptr_slot_bytes(s->batch_size);
}

// Tokens per unit of kv_indptr: 1 for ragged keys.
uint32_t kv_page_size(const mg_fi_shape *s) {
    return s->page_size ? s->page_size : 1;
}

uint32_t total_qo_rows(const mg_fi_shape *s, const int32_t *qo_indptr) {
    return s->graph_mode ? s->graph_qo_rows : uint32_t(qo_indptr[s->batch_size]);
}

// The row bound FlashInfer's schedule is sized for. Graph mode: the padded capacity, never below
// the batch size (FlashInfer derives the longest request as rows - batch + 1).
uint32_t fa2_planned_rows(const mg_fi_shape *s, const int32_t *qo_indptr) {
    uint32_t rows = total_qo_rows(s, qo_indptr);
    return s->graph_mode && rows < s->batch_size ? s->batch_size : rows;
}

cudaError_t sm_count(int *out) {
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, device);
    return e;
}

// FlashInfer's bound on FA3 work items per head (PrefillSM90Plan's max_num_works_per_head): what
// it compares with kFa3MaxWorksPerHead, and what it sizes graph-mode schedules for.
int64_t fa3_works_bound(const mg_fi_shape *s, const int32_t *qo_indptr) {
    const int64_t tile = fa3_cta_tile_q(s->head_dim);
    return (int64_t(total_qo_rows(s, qo_indptr)) + tile - 1) / tile + s->batch_size - 1;
}

// Work items per head of FA3's scheduler: actual tiles (eager) or the graph-mode bound.
int64_t fa3_works_per_head(const mg_fi_shape *s, const int32_t *qo_indptr) {
    const int64_t tile = fa3_cta_tile_q(s->head_dim);
    if (s->graph_mode)
        return fa3_works_bound(s, qo_indptr);
    int64_t works = 0;
    for (uint32_t i = 0; i < s->batch_size; i++)
        works += (int64_t(qo_indptr[i + 1] - qo_indptr[i]) + tile - 1) / tile;
    return works;
}

// FlashInfer's PrefillSM90Plan allocates eight int arrays (16-byte aligned) and has no size
// query of its own; this is the same arithmetic.
size_t fa3_int_bytes(const mg_fi_shape *s, const int32_t *qo_indptr, int num_sm) {
    size_t works = size_t(fa3_works_per_head(s, qo_indptr)) * s->num_qo_heads;
    return 7 * align16(sizeof(int32_t) * works) + align16(sizeof(int32_t) * (size_t(num_sm) + 1));
}

// Whether the FA3 kernels of this head_dim were built (cmake/flashinfer.cmake defines
// METRALE_FI_FA3_HD<d> for each).
bool fa3_built(uint32_t head_dim) {
    switch (head_dim) {
#if METRALE_FI_FA3_HD64
    case 64:
        return true;
#endif
#if METRALE_FI_FA3_HD128
    case 128:
        return true;
#endif
#if METRALE_FI_FA3_HD256
    case 256:
        return true;
#endif
    default:
        return false;
    }
}

// Whether the FA3 paged kernel serves the shape: cmake/flashinfer.cmake builds one
// (flashinfer_paged_sm90.cu, METRALE_FI_FA3_PAGED): BF16 pools, head_dim 128, no soft cap.
bool fa3_paged_built(const mg_fi_shape *s) {
#if METRALE_FI_FA3_PAGED
    return s->head_dim == metrale_fi::kFa3PagedHeadDim && !s->soft_cap && !s->kv_fp8;
#else
    (void)s;
    return false;
#endif
}

// AUTO on paged keys takes FA3 only for prefill-like batches: at least this many query rows per
// request on average (eager: the rows over the requests that have any; fixed grid: the row
// capacity over batch_size). FA3 gives every (request, query head) query tiles of 128 rows of
// their own, while FA2 packs the GQA group's heads into one tile and splits long key ranges over
// CTAs: with a few rows per request (decode, short chunks) FA2 wastes far less. One full FA3
// tile: on the H200 (bench paged_prefill, 2026-12-01) FA3 was 1.4x faster than FA2 at 128 rows
// per request (32 x 128 over 1024 cached) and 1.37x slower at 64 (64 x 64 over 2048).
constexpr int64_t kFa3PagedMinRowsPerRequest = 128;

bool fa3_paged_preferred(const mg_fi_shape *s, const int32_t *qo_indptr) {
    int64_t requests = s->batch_size;
    if (!s->graph_mode) {
        requests = 0;
        for (uint32_t i = 0; i < s->batch_size; i++)
            requests += qo_indptr[i + 1] > qo_indptr[i];
    }
    return int64_t(total_qo_rows(s, qo_indptr)) >= kFa3PagedMinRowsPerRequest * requests;
}

// Why FA3 cannot serve this plan on the current device (nullptr: it can), and the device's
// compute capability as major * 10 + minor. Paged keys need the one FA3 paged kernel built
// (fa3_paged_built), which applies sliding windows and gathers keys through the page table
// (any page size; an empty batch is fine); ragged keys need a Hopper unit of their head_dim, no
// window, and at least one key row for their TMA descriptors.
cudaError_t fa3_unsuitable(const mg_fi_shape *s, const int32_t *qo_indptr, const int32_t *kv_indptr,
                           int32_t *cc_out, const char **why) {
    int device = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (e != cudaSuccess)
        return e;
    *cc_out = major * 10 + minor;
    if (s->page_size && !fa3_paged_built(s))
        *why = METRALE_FI_HAVE_FA3 ? "the Hopper paged kernel is built for BF16 pools at head_dim "
                                     "128 without soft-cap only"
                                   : "the plugin was built without sm_90a";
    else if (!s->page_size && !fa3_built(s->head_dim))
        *why = METRALE_FI_HAVE_FA3 ? "the plugin has no Hopper kernels for this head_dim"
                                   : "the plugin was built without sm_90a";
    else if (major != 9 || minor != 0)
        *why = "the device is not compute capability 9.0";
    else if (!s->page_size && s->window_left >= 0)
        *why = "the Hopper ragged path is built without sliding windows";
    else if (fa3_works_bound(s, qo_indptr) > kFa3MaxWorksPerHead)
        *why = "the batch needs the shared-schedule variant, which is not built";
    else if (!s->page_size && !s->graph_mode && kv_indptr[s->batch_size] == 0)
        *why = "no key rows at all (its TMA descriptors need at least one)";
    else
        *why = nullptr;
    return cudaSuccess;
}

// Raw pointer at a byte offset of FlashInfer's region (FlashInfer's offsets are relative to
// the base it was given).
template <typename T> T *at(void *base, int64_t offset) {
    return reinterpret_cast<T *>(static_cast<char *>(base) + offset);
}

// The FA2 launcher of the shape's mask and window.
template <uint32_t HEAD_DIM>
cudaError_t fa2_launch_masked(const mg_fi_shape *s, Fa2Params &p, uint32_t tile,
                              __nv_bfloat16 *tmp_v, float *tmp_s, cudaStream_t stream) {
    using metrale_fi::fa2_launch;
    const bool window = s->window_left >= 0;
    if (s->causal)
        return window ? fa2_launch<HEAD_DIM, true, true>(p, tile, tmp_v, tmp_s, stream)
                      : fa2_launch<HEAD_DIM, true, false>(p, tile, tmp_v, tmp_s, stream);
    return window ? fa2_launch<HEAD_DIM, false, true>(p, tile, tmp_v, tmp_s, stream)
                  : fa2_launch<HEAD_DIM, false, false>(p, tile, tmp_v, tmp_s, stream);
}

#if METRALE_FI_HAVE_FA3
// The FA3 launcher of the shape's head_dim and mask; cudaErrorNotSupported for a head_dim
// without Hopper kernels (the path choice never plans one).
cudaError_t fa3_launch_for(const mg_fi_shape *s, Fa3Params &p, cudaStream_t stream) {
    using metrale_fi::fa3_launch;
    switch (s->head_dim) {
#if METRALE_FI_FA3_HD64
    case 64:
        return s->causal ? fa3_launch<64, true>(p, stream) : fa3_launch<64, false>(p, stream);
#endif
#if METRALE_FI_FA3_HD128
    case 128:
        return s->causal ? fa3_launch<128, true>(p, stream) : fa3_launch<128, false>(p, stream);
#endif
#if METRALE_FI_FA3_HD256
    case 256:
        return s->causal ? fa3_launch<256, true>(p, stream) : fa3_launch<256, false>(p, stream);
#endif
    default:
        return cudaErrorNotSupported;
    }
}
#endif

// Points an FA2 params struct (ragged or paged: the schedule members have the same names) at
// the schedule FlashInfer planned into `fi_int`, and the split-KV partials into the float
// workspace (left NULL when the plan did not split).
template <typename Params>
void set_schedule(Params &p, const flashinfer::PrefillPlanInfo &plan, void *fi_int,
                  void *float_workspace, __nv_bfloat16 **tmp_v, float **tmp_s) {
    p.request_indices = at<int32_t>(fi_int, plan.request_indices_offset);
    p.qo_tile_indices = at<int32_t>(fi_int, plan.qo_tile_indices_offset);
    p.kv_tile_indices = at<int32_t>(fi_int, plan.kv_tile_indices_offset);
    p.o_indptr = at<int32_t>(fi_int, plan.o_indptr_offset);
    p.kv_chunk_size_ptr = at<int32_t>(fi_int, plan.kv_chunk_size_ptr_offset);
    if (plan.split_kv) {
        p.merge_indptr = at<int32_t>(fi_int, plan.merge_indptr_offset);
        *tmp_v = at<__nv_bfloat16>(float_workspace, plan.v_offset);
        *tmp_s = at<float>(float_workspace, plan.s_offset);
    }
    p.padded_batch_size = uint32_t(plan.padded_batch_size);
    p.max_total_num_rows = uint32_t(plan.total_num_rows);
    if (plan.enable_cuda_graph) {
        p.block_valid_mask = at<bool>(fi_int, plan.block_valid_mask_offset);
        p.total_num_rows = at<uint32_t>(fi_int, plan.total_num_rows_offset);
    }
}

mg_status run_fa2(const mg_fi_shape *s, const mg_fi_plan_info *info, const mg_fi_run_args *a,
                  cudaStream_t stream, mg_fi_error *err) {
    flashinfer::PrefillPlanInfo plan;
    plan.FromVector(std::vector<int64_t>(info->words, info->words + 15));
    void *region = a->int_workspace;
    void *fi_int = static_cast<char *>(region) + indptr_region_bytes(s);

    Fa2Params p;
    std::memset(&p, 0, sizeof p);
    p.q = static_cast<__nv_bfloat16 *>(a->q);
    p.k = static_cast<__nv_bfloat16 *>(a->k);
    p.v = static_cast<__nv_bfloat16 *>(a->v);
    p.o = static_cast<__nv_bfloat16 *>(a->o);
    p.lse = a->lse;
    p.q_indptr = at<int32_t>(region, 0);
    p.kv_indptr = at<int32_t>(region, int64_t(indptr_slot_bytes(s->batch_size)));
    p.group_size = flashinfer::uint_fastdiv(s->num_qo_heads / s->num_kv_heads);
    p.sm_scale = a->sm_scale;
    p.num_qo_heads = s->num_qo_heads;
    p.num_kv_heads = s->num_kv_heads;
    p.q_stride_n = s->num_qo_heads * s->head_dim;
    p.q_stride_h = s->head_dim;
    p.k_stride_n = p.v_stride_n = s->num_kv_heads * s->head_dim;
    p.k_stride_h = p.v_stride_h = s->head_dim;
    p.window_left = s->window_left;
    __nv_bfloat16 *tmp_v = nullptr;
    float *tmp_s = nullptr;
    set_schedule(p, plan, fi_int, a->float_workspace, &tmp_v, &tmp_s);

    cudaError_t e;
    switch (s->head_dim) {
    case 64:
        e = fa2_launch_masked<64>(s, p, uint32_t(plan.cta_tile_q), tmp_v, tmp_s, stream);
        break;
    case 128:
        e = fa2_launch_masked<128>(s, p, uint32_t(plan.cta_tile_q), tmp_v, tmp_s, stream);
        break;
    case 256:
        e = fa2_launch_masked<256>(s, p, uint32_t(plan.cta_tile_q), tmp_v, tmp_s, stream);
        break;
    default:
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "mg_fi_run: head_dim %u has no FA2 kernels",
                              s->head_dim);
    }
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "flashinfer FA2 BatchPrefillWithRaggedKVCache");
    return MG_OK;
}

// The paged FA2 launcher of the shape's KV dtype, head_dim and soft-cap mode: one of the
// (dtype, head_dim, soft cap) units cmake/flashinfer.cmake builds (mg_fi_paged_built), which the
// path choice has already checked; cudaErrorNotSupported for any other.
cudaError_t fa2_paged_launch_for(const mg_fi_shape *s, metrale_fi::PagedParams &p, uint32_t tile,
                                 __nv_bfloat16 *tmp_v, float *tmp_s, cudaStream_t stream) {
    using metrale_fi::fa2_paged_launch;
    switch (s->head_dim) {
    case 64:
        if (!s->soft_cap)
            return fa2_paged_launch<64, false>(p, tile, tmp_v, tmp_s, stream);
        break;
    case 128:
        return s->soft_cap ? fa2_paged_launch<128, true>(p, tile, tmp_v, tmp_s, stream)
                           : fa2_paged_launch<128, false>(p, tile, tmp_v, tmp_s, stream);
    case 256:
        return s->soft_cap ? fa2_paged_launch<256, true>(p, tile, tmp_v, tmp_s, stream)
                           : fa2_paged_launch<256, false>(p, tile, tmp_v, tmp_s, stream);
    }
    return cudaErrorNotSupported;
}

cudaError_t fa2_paged_launch_for(const mg_fi_shape *s, metrale_fi::PagedFp8Params &p, uint32_t tile,
                                 __nv_bfloat16 *tmp_v, float *tmp_s, cudaStream_t stream) {
    if (s->head_dim == 128 && !s->soft_cap)
        return metrale_fi::fa2_paged_fp8_launch<128, false>(p, tile, tmp_v, tmp_s, stream);
    return cudaErrorNotSupported;
}

// Fills FlashInfer's paged params (BF16 or FP8 pools: Params::DTypeKV) and launches.
template <typename Params>
mg_status run_fa2_paged_as(const mg_fi_shape *s, const mg_fi_plan_info *info,
                           const mg_fi_run_args *a, Params &p, cudaStream_t stream,
                           mg_fi_error *err) {
    using DTypeKV = typename Params::DTypeKV;
    flashinfer::PrefillPlanInfo plan;
    plan.FromVector(std::vector<int64_t>(info->words, info->words + 15));
    void *region = a->int_workspace;
    void *fi_int = static_cast<char *>(region) + indptr_region_bytes(s);
    const int64_t slot = int64_t(indptr_slot_bytes(s->batch_size));

    p.q = static_cast<__nv_bfloat16 *>(a->q);
    p.o = static_cast<__nv_bfloat16 *>(a->o);
    p.lse = a->lse;
    p.paged_kv = flashinfer::paged_kv_t<DTypeKV, int32_t>(
        s->num_kv_heads, s->page_size, s->head_dim, s->batch_size, flashinfer::QKVLayout::kNHD,
        static_cast<DTypeKV *>(a->k), static_cast<DTypeKV *>(a->v), a->kv_indices,
        at<int32_t>(region, slot), at<int32_t>(region, 2 * slot));
    p.q_indptr = at<int32_t>(region, 0);
    p.group_size = flashinfer::uint_fastdiv(s->num_qo_heads / s->num_kv_heads);
    p.num_qo_heads = s->num_qo_heads;
    p.q_stride_n = int32_t(s->num_qo_heads * s->head_dim);
    p.q_stride_h = int32_t(s->head_dim);
    p.window_left = s->window_left;
    p.logits_soft_cap = s->soft_cap ? a->logits_soft_cap : 0.0f;
    p.sm_scale = a->sm_scale;
    p.rope_rcp_scale = 1.0f;
    p.rope_rcp_theta = 1.0f;
    __nv_bfloat16 *tmp_v = nullptr;
    float *tmp_s = nullptr;
    set_schedule(p, plan, fi_int, a->float_workspace, &tmp_v, &tmp_s);
    const cudaError_t e =
        fa2_paged_launch_for(s, p, uint32_t(plan.cta_tile_q), tmp_v, tmp_s, stream);
    if (e == cudaErrorNotSupported)
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0,
                              "mg_fi_run: no paged kernels for head_dim %u, soft-cap %u, FP8 %u",
                              s->head_dim, s->soft_cap, s->kv_fp8);
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "flashinfer FA2 BatchPrefillWithPagedKVCache");
    return MG_OK;
}

mg_status run_fa2_paged(const mg_fi_shape *s, const mg_fi_plan_info *info, const mg_fi_run_args *a,
                        cudaStream_t stream, mg_fi_error *err) {
    if (s->kv_fp8) {
        metrale_fi::PagedFp8Params p;
        p.head_k_scale = a->k_scale;
        p.head_v_scale = a->v_scale;
        return run_fa2_paged_as(s, info, a, p, stream, err);
    }
    metrale_fi::PagedParams p;
    return run_fa2_paged_as(s, info, a, p, stream, err);
}

#if METRALE_FI_HAVE_FA3
// Fills what the FA3 params (ragged or paged: the members have the same names) share: tensors,
// FlashInfer's per-head schedule of `info` in the int workspace, strides of q and o, and the
// head counts; the caller sets the key and value layout.
template <typename Params>
void set_fa3_common(const mg_fi_shape *s, const mg_fi_plan_info *info, const mg_fi_run_args *a,
                    Params &p) {
    flashinfer::PrefillPlanSM90Info plan;
    plan.FromVector(std::vector<int64_t>(info->words, info->words + 9));
    void *fi_int = static_cast<char *>(a->int_workspace) + indptr_region_bytes(s);
    std::memset(&p, 0, sizeof p);
    p.q_ptr = static_cast<cutlass::bfloat16_t *>(a->q);
    p.k_ptr = static_cast<cutlass::bfloat16_t *>(a->k);
    p.v_ptr = static_cast<cutlass::bfloat16_t *>(a->v);
    p.o_ptr = static_cast<cutlass::bfloat16_t *>(a->o);
    p.lse_ptr = a->lse;
    p.qo_tile_indices = at<int32_t>(fi_int, plan.qo_tile_indices_offset);
    p.qo_indptr = at<int32_t>(fi_int, plan.qo_indptr_offset);
    p.kv_indptr = at<int32_t>(fi_int, plan.kv_indptr_offset);
    p.qo_lens = at<int32_t>(fi_int, plan.qo_len_offset);
    p.kv_lens = at<int32_t>(fi_int, plan.kv_len_offset);
    p.head_indices = at<int32_t>(fi_int, plan.head_indices_offset);
    p.work_indptr = at<int32_t>(fi_int, plan.work_indptr_offset);
    p.batch_indices = at<int32_t>(fi_int, plan.batch_indices_offset);
    p.additional_params.sm_scale = a->sm_scale;
    p.q_stride_n = p.o_stride_n = int64_t(s->num_qo_heads) * s->head_dim;
    p.q_stride_h = p.o_stride_h = s->head_dim;
    p.k_stride_n = p.v_stride_n = int64_t(s->num_kv_heads) * s->head_dim;
    p.k_stride_h = p.v_stride_h = s->head_dim;
    p.nnz_qo = a->qo_rows;
    p.num_qo_heads = int(s->num_qo_heads);
    p.num_kv_heads = int(s->num_kv_heads);
    p.group_size = int(s->num_qo_heads / s->num_kv_heads);
    p.window_left = s->window_left;
    p.causal = s->causal != 0;
}
#endif

mg_status run_fa3(const mg_fi_shape *s, const mg_fi_plan_info *info, const mg_fi_run_args *a,
                  cudaStream_t stream, mg_fi_error *err) {
#if METRALE_FI_HAVE_FA3
    Fa3Params p;
    set_fa3_common(s, info, a, p);
    p.nnz_kv = a->kv_rows;
    p.head_dim = int(s->head_dim);
    if (!fa3_built(s->head_dim))
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "mg_fi_run: head_dim %u has no FA3 kernels",
                              s->head_dim);
    cudaError_t e = fa3_launch_for(s, p, stream);
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "flashinfer FA3 BatchPrefillWithRaggedKVCache (sm90)");
    return MG_OK;
#else
    (void)s, (void)info, (void)a, (void)stream;
    return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                          "mg_fi_run: the plugin was built without sm_90a");
#endif
}

// FA3 over the page pools: the same per-head schedule, whose kv_indptr counts pages; the kernel
// gathers each key and value row through kv_indices.
mg_status run_fa3_paged(const mg_fi_shape *s, const mg_fi_plan_info *info, const mg_fi_run_args *a,
                        cudaStream_t stream, mg_fi_error *err) {
#if METRALE_FI_HAVE_FA3 && METRALE_FI_FA3_PAGED
    if (!fa3_paged_built(s))
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0,
                              "mg_fi_run: no FA3 paged kernel for head_dim %u, soft-cap %u, FP8 %u",
                              s->head_dim, s->soft_cap, s->kv_fp8);
    Fa3PagedParams p;
    set_fa3_common(s, info, a, p);
    p.kv_indices = a->kv_indices;
    p.k_page_stride = p.v_page_stride = int64_t(s->page_size) * s->num_kv_heads * s->head_dim;
    p.page_size = int(s->page_size);
    if (p.window_left < 0)
        p.window_left = metrale_fi::kFa3PagedNoWindow;
    const cudaError_t e = metrale_fi::fa3_paged_launch(p, stream);
    if (e != cudaSuccess)
        return mg_plugin_cuda_fail(err, e, "flashinfer FA3 BatchPrefillWithPagedKVCache (sm90)");
    return MG_OK;
#else
    (void)s, (void)info, (void)a, (void)stream;
    return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                          "mg_fi_run: the plugin was built without the FA3 paged kernel");
#endif
}

} // namespace

MG_FI_EXPORT uint32_t mg_fi_abi_version(void) {
    return MG_FI_ABI_VERSION;
}

MG_FI_EXPORT mg_status mg_fi_choose_path(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                         const int32_t *kv_indptr, mg_fi_path forced,
                                         mg_fi_path *out, mg_fi_error *err) {
    return mg_plugin_guarded("mg_fi_choose_path", "flashinfer", err, [&]() -> mg_status {
        if (!mg_fi_head_dim_built(shape->head_dim))
            return mg_plugin_fail(
                err, MG_ERR_UNSUPPORTED, 0,
                "mg_fi_choose_path: head_dim %u is not built (" MG_FI_HEAD_DIMS_TEXT " are)",
                shape->head_dim);
        if (shape->page_size) {
            if (!mg_fi_paged_built(shape->head_dim, shape->soft_cap, shape->kv_fp8))
                return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0,
                                      "mg_fi_choose_path: no paged kernels for head_dim %u%s%s "
                                      "(built: " MG_FI_PAGED_KERNELS_TEXT ")",
                                      shape->head_dim, shape->soft_cap ? " with soft-cap" : "",
                                      shape->kv_fp8 ? " on FP8 pools" : "");
            /* FA2 serves every built paged shape; FA3 only fa3_paged_built ones. */
            if (forced == MG_FI_PATH_FA2 ||
                (forced == MG_FI_PATH_NONE && !fa3_paged_built(shape))) {
                *out = !shape->graph_mode && qo_indptr[shape->batch_size] == 0 ? MG_FI_PATH_NONE
                                                                               : MG_FI_PATH_FA2;
                return MG_OK;
            }
        }
        if (!shape->graph_mode && qo_indptr[shape->batch_size] == 0 && forced == MG_FI_PATH_NONE) {
            *out = MG_FI_PATH_NONE;
            return MG_OK;
        }
        int32_t cc = 0;
        const char *why = nullptr;
        cudaError_t e = fa3_unsuitable(shape, qo_indptr, kv_indptr, &cc, &why);
        if (e != cudaSuccess)
            return mg_plugin_cuda_fail(err, e, "mg_fi_choose_path: cudaDeviceGetAttribute");
        if (forced == MG_FI_PATH_FA3 && why)
            return mg_plugin_fail(
                err, MG_ERR_UNSUPPORTED, 0,
                "mg_fi_choose_path: the FA3 path cannot serve this plan: %s (sm_%d)", why, (int)cc);
        if (forced == MG_FI_PATH_FA2 && cc < 80)
            return mg_plugin_fail(
                err, MG_ERR_UNSUPPORTED, 0,
                "mg_fi_choose_path: FA2 needs compute capability 8.0+, device is %d.%d",
                (int)cc / 10, (int)cc % 10);
        if (shape->page_size) {
            /* Paged: an empty eager batch launches nothing, whatever the path. */
            const bool fa3 =
                forced == MG_FI_PATH_FA3 || (!why && fa3_paged_preferred(shape, qo_indptr));
            *out = !shape->graph_mode && qo_indptr[shape->batch_size] == 0 ? MG_FI_PATH_NONE
                   : fa3                                                   ? MG_FI_PATH_FA3
                                                                           : MG_FI_PATH_FA2;
            return MG_OK;
        }
        *out = forced != MG_FI_PATH_NONE ? forced : why ? MG_FI_PATH_FA2 : MG_FI_PATH_FA3;
        return MG_OK;
    });
}

MG_FI_EXPORT mg_status mg_fi_workspace_bytes(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                             const int32_t *kv_indptr, size_t *float_bytes,
                                             size_t *int_bytes, mg_fi_error *err) {
    return mg_plugin_guarded("mg_fi_workspace_bytes", "flashinfer", err, [&]() -> mg_status {
        *float_bytes = 0;
        *int_bytes = indptr_region_bytes(shape);
        if (shape->path == MG_FI_PATH_FA3) {
            int num_sm = 0;
            cudaError_t e = sm_count(&num_sm);
            if (e != cudaSuccess)
                return mg_plugin_cuda_fail(err, e, "mg_fi_workspace_bytes: cudaDeviceGetAttribute");
            *int_bytes += fa3_int_bytes(shape, qo_indptr, num_sm);
            return MG_OK;
        }
        if (shape->path != MG_FI_PATH_FA2)
            return MG_OK;
        size_t fi_float = 0, fi_int = 0;
        cudaError_t e = flashinfer::PrefillPlanWorkspaceSize<int32_t>(
            fi_float, fi_int, const_cast<int32_t *>(qo_indptr), const_cast<int32_t *>(kv_indptr),
            fa2_planned_rows(shape, qo_indptr), shape->batch_size, shape->num_qo_heads,
            shape->num_kv_heads, shape->head_dim, shape->head_dim, kv_page_size(shape),
            shape->graph_mode != 0, /*sizeof_dtype_o=*/2, shape->window_left,
            /*fixed_split_size=*/-1, /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
            /*uniform_q_len=*/0, /*fixed_uniform_q_len=*/false, /*stream=*/nullptr);
        if (e != cudaSuccess)
            return mg_plugin_cuda_fail(err, e, "flashinfer PrefillPlanWorkspaceSize");
        *float_bytes = fi_float;
        *int_bytes += fi_int;
        return MG_OK;
    });
}

MG_FI_EXPORT mg_status mg_fi_plan(const mg_fi_shape *shape, const int32_t *qo_indptr,
                                  const int32_t *kv_indptr, const int32_t *kv_last_page_len,
                                  void *float_workspace, size_t float_bytes,
                                  void *flashinfer_copy_target, void *pinned, size_t int_bytes,
                                  void *stream, mg_fi_plan_info *out, mg_fi_error *err) {
    return mg_plugin_guarded("mg_fi_plan", "flashinfer", err, [&]() -> mg_status {
        std::memset(out, 0, sizeof *out);
        out->path = shape->path;
        out->batch_size = shape->batch_size;
        if (shape->path == MG_FI_PATH_NONE)
            return MG_OK;
        const cudaStream_t s = static_cast<cudaStream_t>(stream);
        const size_t region = indptr_region_bytes(shape);
        const size_t indptr_bytes = sizeof(int32_t) * (size_t(shape->batch_size) + 1);
        std::memcpy(pinned, qo_indptr, indptr_bytes);
        const size_t slot = indptr_slot_bytes(shape->batch_size);
        std::memcpy(static_cast<char *>(pinned) + slot, kv_indptr, indptr_bytes);
        if (shape->page_size) {
            if (!kv_last_page_len)
                return mg_plugin_fail(err, MG_ERR_INTERNAL, 0,
                                      "mg_fi_plan: paged shape without "
                                      "kv_last_page_len");
            std::memcpy(static_cast<char *>(pinned) + 2 * slot, kv_last_page_len,
                        sizeof(int32_t) * shape->batch_size);
        }
        void *fi_int = static_cast<char *>(flashinfer_copy_target) + region;
        void *fi_pinned = static_cast<char *>(pinned) + region;
        int32_t *qo = const_cast<int32_t *>(qo_indptr), *kv = const_cast<int32_t *>(kv_indptr);
        cudaError_t e;
        if (shape->path == MG_FI_PATH_FA2) {
            flashinfer::PrefillPlanInfo plan;
            e = flashinfer::PrefillPlan<int32_t>(
                float_workspace, float_bytes, fi_int, fi_pinned, int_bytes - region, plan, qo, kv,
                fa2_planned_rows(shape, qo_indptr), shape->batch_size, shape->num_qo_heads,
                shape->num_kv_heads, shape->head_dim, shape->head_dim, kv_page_size(shape),
                shape->graph_mode != 0, /*sizeof_dtype_o=*/2, shape->window_left,
                /*fixed_split_size=*/-1, /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
                /*uniform_q_len=*/0, /*fixed_uniform_q_len=*/false, s);
            if (e != cudaSuccess)
                return mg_plugin_cuda_fail(err, e, "flashinfer PrefillPlan");
            std::vector<int64_t> words = plan.ToVector();
            std::copy(words.begin(), words.end(), out->words);
        } else {
#if METRALE_FI_HAVE_FA3
            // Tokens per request: kv_indptr counts rows, or pages of which the last holds
            // kv_last_page_len tokens (a request without pages holds none).
            std::vector<int32_t> kv_len(shape->batch_size);
            for (uint32_t i = 0; i < shape->batch_size; i++) {
                const int32_t units = kv_indptr[i + 1] - kv_indptr[i];
                kv_len[i] = !shape->page_size ? units
                            : units == 0
                                ? 0
                                : (units - 1) * int32_t(shape->page_size) + kv_last_page_len[i];
            }
            flashinfer::PrefillPlanSM90Info plan;
            e = flashinfer::PrefillSM90Plan<int32_t>(
                float_workspace, float_bytes, fi_int, fi_pinned, int_bytes - region, plan, qo, kv,
                kv_len.data(), total_qo_rows(shape, qo_indptr), shape->batch_size,
                shape->num_qo_heads, shape->num_kv_heads, shape->head_dim, shape->head_dim,
                kv_page_size(shape), shape->causal != 0, shape->graph_mode != 0,
                /*sizeof_dtype_o=*/2, s);
            if (e != cudaSuccess)
                return mg_plugin_cuda_fail(err, e, "flashinfer PrefillSM90Plan");
            if (plan.same_schedule_for_all_heads)
                return mg_plugin_fail(
                    err, MG_ERR_INTERNAL, 0,
                    "mg_fi_plan: FA3 chose the shared-schedule variant, which is not built");
            std::vector<int64_t> words = plan.ToVector();
            std::copy(words.begin(), words.end(), out->words);
#else
            return mg_plugin_fail(err, MG_ERR_UNSUPPORTED, 0, "mg_fi_plan: the plugin was built without sm_90a");
#endif
        }
        return MG_OK;
    });
}

MG_FI_EXPORT mg_status mg_fi_upload(const mg_fi_shape *shape, void *int_workspace,
                                    const void *pinned, size_t int_bytes, uint32_t whole_image,
                                    void *stream, mg_fi_error *err) {
    return mg_plugin_guarded("mg_fi_upload", "flashinfer", err, [&]() -> mg_status {
        if (shape->path == MG_FI_PATH_NONE)
            return MG_OK;
        const size_t region = indptr_region_bytes(shape);
        const size_t bytes = whole_image ? int_bytes : region;
        if (bytes < region || bytes > int_bytes)
            return mg_plugin_fail(
                err, MG_ERR_INTERNAL, 0,
                "mg_fi_upload: %zu bytes to copy, the image has %zu (indptrs %zu)", bytes,
                int_bytes, region);
        cudaError_t e = cudaMemcpyAsync(int_workspace, pinned, bytes, cudaMemcpyHostToDevice,
                                        static_cast<cudaStream_t>(stream));
        if (e != cudaSuccess)
            return mg_plugin_cuda_fail(err, e, "mg_fi_upload: cudaMemcpyAsync of the schedule");
        return MG_OK;
    });
}

MG_FI_EXPORT mg_status mg_fi_run(const mg_fi_shape *shape, const mg_fi_plan_info *info,
                                 const mg_fi_run_args *args, void *stream, mg_fi_error *err) {
    return mg_plugin_guarded("mg_fi_run", "flashinfer", err, [&]() -> mg_status {
        if (info->path != shape->path || info->batch_size != shape->batch_size)
            return mg_plugin_fail(
                err, MG_ERR_INTERNAL, 0,
                "mg_fi_run: plan info (path %d, batch %u) does not match the shape "
                "(path %d, batch %u)",
                (int)info->path, info->batch_size, (int)shape->path, shape->batch_size);
        const cudaStream_t s = static_cast<cudaStream_t>(stream);
        switch (info->path) {
        case MG_FI_PATH_NONE:
            return MG_OK;
        case MG_FI_PATH_FA2:
            return shape->page_size ? run_fa2_paged(shape, info, args, s, err)
                                    : run_fa2(shape, info, args, s, err);
        case MG_FI_PATH_FA3:
            return shape->page_size ? run_fa3_paged(shape, info, args, s, err)
                                    : run_fa3(shape, info, args, s, err);
        }
        return mg_plugin_fail(err, MG_ERR_INTERNAL, 0, "mg_fi_run: unknown path %d",
                              (int)info->path);
    });
}
