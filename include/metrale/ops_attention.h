/*
 * metrale/ops_attention.h - ragged (varlen) BF16 prefill attention: several requests' attention
 * in one launch, delimited by qo_indptr / kv_indptr. CUDA runs FlashInfer's kernels (head_dim
 * 64, 128 or 256; FA2 on sm_80+, the Hopper FA3 path on sm_90a, the faster chosen per plan), and
 * at every other head_dim (a multiple of 8 up to 512) metrale's by-row kernels (provider
 * "kernels": one CTA per query row and head, correct on any shape, not fast); the CPU backend
 * runs the reference (FP32 softmax) that defines the result.
 *
 *   mg_attention_desc d = {.num_qo_heads = 32, .num_kv_heads = 8, .head_dim = 128,
 *                          .causal = true, .window_left = -1, .sm_scale = 0.08838835f};
 *   mg_attention_plan *p;
 *   mg_attention_plan_create(b, &d, qo_indptr, kv_indptr, batch_size, stream, &p); // host arrays
 *   mg_attention_tensors t = {.q = q, .k = k, .v = v, .o = o, .lse = 0,
 *                             .qo_rows = qo_indptr[batch_size], .kv_rows = kv_indptr[batch_size]};
 *   mg_attention_run(p, &t, stream);
 *   mg_attention_plan_update(p, next_qo_indptr, next_kv_indptr, next_batch_size, stream);
 *   mg_attention_run(p, &next_t, stream);
 *   mg_attention_plan_destroy(p);
 *
 * Layout: q and o are [qo_rows, num_qo_heads, head_dim], k and v [kv_rows, num_kv_heads,
 * head_dim], BF16, contiguous (NHD). Request i owns q/o rows [qo_indptr[i], qo_indptr[i+1]) and
 * k/v rows [kv_indptr[i], kv_indptr[i+1]). Query head h reads key/value head
 * h / (num_qo_heads / num_kv_heads) (GQA).
 *
 * Semantics, per request with Lq queries and Lk keys, query j at position p = Lk - Lq + j:
 *   causal (bottom-right aligned): query j sees keys 0..p; requires Lq <= Lk.
 *   window_left = w >= 0 (causal only): query j sees only keys p - w .. p, a window of w + 1.
 *   o = softmax(sm_scale * q k^T over the visible keys) v, accumulated in FP32.
 *   lse (optional, FP32 [qo_rows, num_qo_heads]) = log2(sum over visible keys of
 *   exp(sm_scale * q.k)), FlashInfer's base-2 convention. A query that sees no key (Lk = 0,
 *   without causal) gets o = 0 and lse = -inf.
 *   Requests with Lq = 0 or Lk = 0 are allowed.
 *
 * Plan and run: the plan is built on the host from host copies of the indptrs (validated there:
 * indptr[0] = 0, non-decreasing, Lq <= Lk under causal) and uploaded through a page-locked
 * mirror; it is not capturable. The mirror is double-buffered, so an update never rewrites host
 * memory whose copy is still in flight; updates and runs of one plan must be ordered by the
 * caller (use the same stream). Workspaces are sized from each plan and grow only when a later
 * plan needs more.
 *
 * Caller-owned workspace: set desc.workspace / desc.workspace_bytes to device memory of the
 * plan's backend (16-byte aligned, at least mg_attention_workspace_bytes for the batch it is
 * created with, e.g. a model arena's attention buffer). The plan then carves every device
 * buffer it uses out of that range (16-byte aligned sub-ranges: FlashInfer's float, int and,
 * for fixed-grid plans, staging workspaces; the CPU reference's indptr buffer) and allocates
 * no device memory of its own: after the first plan of a backend (which may look up kernels
 * or load the plugin), create, update and run leave the allocation ledger unchanged. The
 * page-locked host mirrors of the schedule are still allocated by the library (host memory,
 * not ledger allocations; see mg_attention_plan_info.pinned_bytes). The plan writes the range
 * on its stream from create until destroy, so the caller must not use it otherwise meanwhile,
 * and each plan (like each concurrently running op) needs a range of its own. An update whose
 * batch needs more than workspace_bytes returns MG_ERR_INVALID_ARGUMENT naming both sizes,
 * keeps the previous batch and writes nothing: the workspace never grows, and the plan never
 * frees it (destroy leaves it allocated). A zero desc.workspace (and workspace_bytes) keeps
 * the library-owned workspaces described above. Runs of such plans count in
 * mg_op_stats.caller_workspace_calls.
 *
 * CUDA graphs: set graph_qo_rows / graph_kv_rows (the padded capacities of the q/o and k/v
 * buffers) to build the plan in fixed-grid mode. Then mg_attention_run may be captured, and
 * after mg_attention_plan_update with a new batch (same batch_size, totals within the
 * capacities) replaying the graph computes the new batch; rows past a batch's totals are left
 * untouched. Every run of such a plan passes exactly the capacities as qo_rows / kv_rows.
 *
 * Bad arguments return MG_ERR_INVALID_ARGUMENT, naming the problem, and launch nothing; so does
 * an o or lse that shares a byte with q, k, v (the pages, the scales, kv_indices) or each other. A
 * plan no provider of the backend serves (CUDA: FA2 or FA3 demanded where FlashInfer lacks that
 * path or head_dim) returns MG_ERR_UNSUPPORTED at plan creation, naming each provider's reason.
 */
#ifndef METRALE_OPS_ATTENTION_H
#define METRALE_OPS_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_attention_plan mg_attention_plan;

/* Which implementation runs on CUDA (the CPU backend always runs its reference). */
typedef enum mg_attention_impl {
    MG_ATTENTION_IMPL_AUTO = 0, /* the fastest that can serve the plan on this device */
    MG_ATTENTION_IMPL_FA2 = 1,  /* FlashInfer FA2 templates */
    MG_ATTENTION_IMPL_FA3 = 2,  /* FlashInfer Hopper path; MG_ERR_UNSUPPORTED where it cannot run
                                 * (no sm_90a device, a sliding window, or a head_dim it was not
                                 * built for) */
} mg_attention_impl;

/* "auto", "fa2", "fa3". */
MG_API const char *mg_attention_impl_name(mg_attention_impl impl);

typedef struct mg_attention_desc {
    uint32_t num_qo_heads;  /* 0 < Hq <= 1024 */
    uint32_t num_kv_heads;  /* Hkv > 0, divides Hq */
    uint32_t head_dim;      /* any multiple of 8 up to 512 (CUDA: fast at 64, 128, 256) */
    bool causal;            /* bottom-right aligned */
    int32_t window_left;    /* -1: no window; else >= 0, and only with causal (see above) */
    float sm_scale;         /* finite, > 0; usually 1 / sqrt(head_dim) */
    uint32_t graph_qo_rows; /* 0: eager plans; > 0: fixed-grid mode, q/o capacity in rows */
    uint32_t graph_kv_rows; /* fixed-grid mode: k/v capacity in rows (> 0) */
    mg_attention_impl impl;
    /* Caller-owned device workspace (see above), or 0 (and workspace_bytes 0): the plan
     * allocates its own. Not owned by the plan: never grown, never freed by it. */
    mg_devptr workspace;
    size_t workspace_bytes;
} mg_attention_desc;

typedef struct mg_attention_tensors {
    mg_devptr q, k, v, o; /* BF16, 16-byte aligned */
    mg_devptr lse;        /* FP32, 4-byte aligned, or 0 for none */
    uint32_t qo_rows;     /* rows of q and o: the plan's qo total (fixed-grid: the capacity) */
    uint32_t kv_rows;     /* rows of k and v: the plan's kv total (fixed-grid: the capacity) */
} mg_attention_tensors;

/* The device workspace bytes a plan of `desc` created with this batch uses, which a caller
 * passes as desc->workspace_bytes (at least) when it supplies the workspace: every device
 * buffer of the plan with the sub-ranges' 16-byte alignment included. For a fixed-grid plan it
 * is all the plan ever uses (its updates never need more than it was created with, or are
 * refused either way); an eager plan's later batches may need more, so query the largest batch
 * expected, or pass more. The answer depends on the backend, the provider chosen for `desc`
 * (and its path on CUDA) and the batch; desc->workspace and workspace_bytes are ignored.
 * Validates like mg_attention_plan_create (MG_ERR_INVALID_ARGUMENT, MG_ERR_UNSUPPORTED);
 * host-only: creates and launches nothing on the device. */
MG_API mg_status mg_attention_workspace_bytes(mg_backend *b, const mg_attention_desc *desc,
                                              const int32_t *qo_indptr, const int32_t *kv_indptr,
                                              uint32_t batch_size, size_t *bytes);

/* Validates `desc` and the host indptrs (batch_size + 1 entries each, batch_size >= 1),
 * allocates the plan's workspaces (or carves them out of desc->workspace, which must then be a
 * 16-byte aligned range inside one live allocation of `b` holding at least
 * mg_attention_workspace_bytes: else MG_ERR_INVALID_ARGUMENT naming the sizes) and uploads its
 * schedule on stream `s` (NULL: default).
 * Not allowed while `s` is capturing (MG_ERR_CAPTURING). The indptr arrays may be reused as
 * soon as this returns. */
MG_API mg_status mg_attention_plan_create(mg_backend *b, const mg_attention_desc *desc,
                                          const int32_t *qo_indptr, const int32_t *kv_indptr,
                                          uint32_t batch_size, mg_stream *s,
                                          mg_attention_plan **out);

/* Re-plans for a new batch on stream `s`, growing the workspaces when needed (which waits for
 * `s`; refused with MG_ERR_CAPTURING while any stream of the backend captures; a plan in a
 * caller's workspace never grows: a batch needing more than desc.workspace_bytes returns
 * MG_ERR_INVALID_ARGUMENT, the plan keeping its previous batch). Fixed-grid
 * plans keep their batch_size, launch layout and workspaces, so a captured run replays the new
 * batch; a batch that would need another layout or more workspace returns
 * MG_ERR_INVALID_ARGUMENT before anything is uploaded. On failure the plan keeps its previous
 * batch, except when a device error interrupted the upload of the new schedule, which leaves
 * it unusable until an update succeeds. */
MG_API mg_status mg_attention_plan_update(mg_attention_plan *p, const int32_t *qo_indptr,
                                          const int32_t *kv_indptr, uint32_t batch_size,
                                          mg_stream *s);

/* Launches the planned attention on `s` (NULL: default stream of the plan's backend).
 * Asynchronous; capturable for fixed-grid plans only: an eager plan on a capturing stream
 * returns MG_ERR_CAPTURING (a later update may free the workspaces a graph would keep). */
MG_API mg_status mg_attention_run(mg_attention_plan *p, const mg_attention_tensors *t,
                                  mg_stream *s);

/* Waits only for the plan's own uploads; the caller must make sure no run of `p` is still
 * executing or will be replayed (a captured graph keeps using its workspaces). NULL is a
 * no-op. A caller's workspace is left allocated (the caller frees it, after this). A plan may
 * outlive its backend: mg_backend_close already released the plan's device and pinned memory, so
 * destroy then frees only the plan's host memory, and every other call on the plan returns
 * MG_ERR_INVALID_ARGUMENT. Destroy plans before closing their backend where possible (a backend
 * opened later at the same address cannot always be told apart). */
MG_API mg_status mg_attention_plan_destroy(mg_attention_plan *p);

typedef struct mg_attention_plan_info {
    mg_attention_impl impl; /* what runs: FlashInfer's FA2 or FA3 on CUDA; AUTO on the CPU
                             * backend and for a paged plan of the "split_kv_decode" provider */
    uint32_t batch_size;
    uint32_t qo_total, kv_total; /* the planned batch's indptr ends */
    uint64_t workspace_bytes;    /* device workspaces held (float + int); with a caller's
                                  * workspace, the bytes of it in use (float + int) */
    uint64_t pinned_bytes;       /* page-locked mirrors held (both) */
} mg_attention_plan_info;

MG_API mg_status mg_attention_plan_get_info(const mg_attention_plan *p,
                                            mg_attention_plan_info *out);

/* FLOPs of the planned batch as attention FLOPs are usually counted (4 * D * Hq * visible pairs;
 * causal without a window: Lq * Lk - Lq * (Lq - 1) / 2 pairs per request). */
MG_API double mg_attention_plan_flops(const mg_attention_plan *p);

#ifdef __cplusplus
}
#endif
#endif
