/*
 * ops_sample.h - the next token of each row of logits: greedy or sampled with temperature,
 * top-k, top-p and min-p, after repetition, presence and frequency penalties, drawn from a
 * counter-based generator keyed by a seed and a step, so a draw is reproducible and does not
 * depend on the batch a row runs in.
 *
 *   mg_sample_desc d = {.rows = B, .vocab = V, .logits_dtype = MG_DTYPE_F32,
 *                       .logits_pitch = P, .history_pitch = H};
 *   size_t ws = mg_sample_workspace_bytes(&d);             // FP32 scratch, caller-owned
 *   mg_sample_params_check(&host_params[r], V, H);         // each row, before uploading
 *   ... mg_copy_h2d(params, host_params, B * sizeof(mg_sample_params)) ...
 *   mg_sample(b, s, &d, logits, params, history, workspace, ws, ids);
 *
 * The parameters live in device memory (one mg_sample_params per row), so a captured graph
 * samples with whatever the caller uploaded before each replay (the step, above all). The CPU
 * reference (src/ops/sample/sample_reference.c) defines the result. Row r, V = vocab:
 *
 *  1. x[i] = logits[r, i] (BF16 widened exactly). A NaN or +inf logit, or parameters that
 *     mg_sample_params_check refuses, make ids[r] MG_SAMPLE_BAD_LOGITS or MG_SAMPLE_BAD_PARAMS
 *     (the device cannot report an error without waiting, so the result says it; parameters
 *     are checked first). -inf is a masked token.
 *  2. Penalties: for every distinct id t among history[r, 0 .. history_len) occurring c times,
 *     y[t] = (x[t] > 0 ? x[t] / repetition_penalty : x[t] * repetition_penalty)
 *            - (presence_penalty + frequency_penalty * c);  y[i] = x[i] elsewhere (FP32, in
 *     this order, no fused multiply-add). The identity parameters (1, 0, 0) leave x unchanged.
 *  3. m = max y. No finite y: ids[r] = MG_SAMPLE_NO_CANDIDATE.
 *  4. temperature 0: ids[r] = the lowest i with y[i] == m (greedy; with no penalties the same
 *     id as mg_argmax_f32). The steps below do not run.
 *  5. z[i] = (y[i] - m) / temperature (<= 0; -inf stays -inf and is never kept).
 *  6. top_k in [1, V): keep z[i] >= the top_k-th largest z (counted with multiplicity), so ties
 *     with it are all kept (as Hugging Face's top-k does); 0 or >= V keeps every finite z.
 *  7. w[i] = expf(z[i]) (the largest is 1). top_p < 1: S = sum of w over the kept; keep
 *     z[i] >= t, where t is the largest kept value v with sum of w over {kept, z >= v} >=
 *     top_p * S (the smallest set of most likely tokens reaching top_p, its boundary's ties
 *     all kept); top_p = 1 keeps everything.
 *  8. min_p > 0: keep w[i] >= min_p (relative to the most likely token, whose w is 1).
 *  9. u = mg_sample_uniform(seed, step); W = sum of w over the kept; ids[r] = the lowest kept i
 *     whose running sum of w over the kept ids <= i (ascending ids) exceeds u * W; where
 *     rounding leaves none, the highest kept id.
 * Sums are FP32 in an order of the backend's choosing (the CPU: ascending ids), so backends
 * may choose differently only where u * W or top_p * S falls within rounding of a boundary
 * (at most about (kept tokens) * 2^-24 of the sum, relative: 6e-6 for 100 kept, 3e-3 for
 * 49152); everything else (penalties, thresholds, the draw) is exact.
 *
 * Backends: the CPU reference, and the CUDA kernel kernels/cuda/sample/sample.cu, which is
 * compiled in the normal build but has not run on a GPU yet; test_sample runs every check
 * above against it where a GPU is present.
 *
 * What a caller may rely on: every argument is checked before anything is launched (a bad
 * shape, pointer, alignment, a buffer too small, an overlap: MG_ERR_INVALID_ARGUMENT naming
 * it); the call is ordered on `s`, allocates nothing and never waits for the device, so it may
 * be captured into a graph; logits, params and history are only read; the same kernel (module
 * "metrale", "sample_rows") runs on every backend that ships it.
 */
#ifndef METRALE_OPS_SAMPLE_H
#define METRALE_OPS_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ids[r] when row r cannot be sampled (step 1 and 3 above). */
#define MG_SAMPLE_BAD_LOGITS (-1)
#define MG_SAMPLE_BAD_PARAMS (-2)
#define MG_SAMPLE_NO_CANDIDATE (-3)

/* The longest penalty history a row may have (history_pitch). */
#define MG_SAMPLE_MAX_HISTORY 4096u
/* |presence_penalty| and |frequency_penalty| at most this. */
#define MG_SAMPLE_MAX_ADDITIVE_PENALTY 1000.0f

/* One row's parameters, in device memory: 48 bytes, 8-byte aligned, no padding. */
typedef struct mg_sample_params {
    uint64_t seed;            /* the generator's key: a request's own seed */
    uint64_t step;            /* the generator's counter: e.g. the index of the token drawn */
    float temperature;        /* 0: greedy; else finite and > 0 */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off */
    float repetition_penalty; /* finite, > 0; 1: off */
    float presence_penalty;   /* finite, |p| <= MG_SAMPLE_MAX_ADDITIVE_PENALTY; 0: off */
    float frequency_penalty;  /* the same; 0: off */
    uint32_t top_k;           /* 0 or >= vocab: off */
    uint32_t history_len;     /* ids of the row's history to penalise, <= history_pitch */
} mg_sample_params;

/* Parameters that change nothing: greedy, no filter, no penalty. */
MG_API mg_sample_params mg_sample_params_greedy(void);

typedef struct mg_sample_desc {
    uint32_t rows;          /* >= 1 */
    uint32_t vocab;         /* >= 1, < 2^31 */
    mg_dtype logits_dtype;  /* MG_DTYPE_F32 (4-byte aligned) or MG_DTYPE_BF16 (2-byte) */
    uint32_t logits_pitch;  /* elements between rows; 0: vocab */
    uint32_t history_pitch; /* int32 ids per history row, <= MG_SAMPLE_MAX_HISTORY; 0: none
                               (history may then be 0 and every history_len must be 0) */
} mg_sample_desc;

/* The workspace mg_sample needs: rows * 2 * (vocab rounded up to 4) FP32 values (a row's
 * processed logits and room to order them); 0 for a bad desc. */
MG_API size_t mg_sample_workspace_bytes(const mg_sample_desc *d);

/* Whether one row's parameters are in range (above); MG_ERR_INVALID_ARGUMENT naming the
 * first that is not otherwise. Host memory; the check the device repeats (step 1). */
MG_API mg_status mg_sample_params_check(const mg_sample_params *p, uint32_t vocab,
                                        uint32_t history_pitch);

/* logits: [rows, pitch] of logits_dtype; params: mg_sample_params [rows]; history: int32
 * [rows, history_pitch] (ids of each row's recent tokens, any order, each in [0, vocab) or the
 * row gives MG_SAMPLE_BAD_PARAMS); workspace: workspace_bytes >= mg_sample_workspace_bytes,
 * 16-byte aligned, overwritten; ids: int32 [rows], the chosen ids or the codes above. No
 * output overlaps an input. */
MG_API mg_status mg_sample(mg_backend *b, mg_stream *s, const mg_sample_desc *d, mg_devptr logits,
                           mg_devptr params, mg_devptr history, mg_devptr workspace,
                           size_t workspace_bytes, mg_devptr ids);

/* The uniform in [0, 1) that step 9 uses for (seed, step): Philox4x32-10 with key = seed
 * (low word first) and counter = (step low, step high, 0, 0), the first output word's top 24
 * bits times 2^-24. Exposed so that tests and callers can reproduce a draw on the host. */
MG_API float mg_sample_uniform(uint64_t seed, uint64_t step);

/* Philox4x32-10 itself (the generator above): out = the block of counter ctr under key. */
MG_API void mg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#ifdef __cplusplus
}
#endif
#endif
