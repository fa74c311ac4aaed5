/*
 * metrale/ops_gemm.h - dense GEMMs in BF16 and FP8 E4M3, the FP8 scale layouts and an FP8
 * quantizer.
 *
 * Every GEMM computes
 *
 *     out[M, N] = act[M, K] · weight[N, K]ᵀ
 *
 * row-major, K contiguous in both inputs, `out` row-major with a row pitch of `ldc` elements
 * (ldc >= N), accumulating in FP32. On the CPU backend the result is computed by the reference
 * implementation (FP8 values decoded exactly); on CUDA by cuBLASLt, loaded at first use.
 *
 * Typical use in an engine:
 *
 *   mg_gemm_plan plans[] = {{.kind = MG_GEMM_BF16, .m = 1, .n = 4096, .k = 4096,
 *                            .ldc = 4096, .out_type = MG_DTYPE_BF16}, ...};
 *   mg_gemm_prewarm(b, s, plans, count);                  // before capturing s
 *   mg_graph_begin_capture(s);
 *   mg_gemm_bf16(b, s, 1, 4096, 4096, x, w, y, MG_DTYPE_BF16, 4096);
 *   ...
 *   // fused: RMSNorm of the residual stream, then SiLU(gate) * up of the gate_up projection
 *   mg_gemm_plan p = {.kind = MG_GEMM_BF16, .m = 1, .n = 2 * inter, .k = hidden, .ldc = inter,
 *                     .out_type = MG_DTYPE_BF16,
 *                     .fusion = {MG_GEMM_PROLOGUE_RMSNORM, MG_GEMM_EPILOGUE_SILU_MUL, 1e-5f}};
 *   mg_gemm_tensors t = {.act = residual, .weight = w_gate_up, .out = h,
 *                        .fusion = {.norm_weight = ffn_norm}};
 *   mg_gemm(b, s, &p, &t);     // MG_ERR_UNSUPPORTED where no provider runs the fusion
 *
 * What a caller may rely on:
 *  - Arguments are checked before anything is launched: a bad shape, pitch, dtype, pointer
 *    alignment or scale mode is MG_ERR_INVALID_ARGUMENT (MG_ERR_UNSUPPORTED for a scale pair
 *    cuBLASLt cannot run) with a message naming the argument, and nothing is written.
 *  - out (and a caller's workspace) shares no byte with act, weight or the scales: an
 *    overlapping output is MG_ERR_INVALID_ARGUMENT naming both ("act and out overlap").
 *  - Calls are ordered on `s` (NULL: the backend's default stream) and return before the work
 *    is done (the CPU backend runs its reference kernel when the work is enqueued, or at
 *    replay when captured).
 *  - After the first call of a shape (or mg_gemm_prewarm), a call creates no library object
 *    and allocates nothing, so it may be captured into a graph. On CUDA a shape first seen
 *    while `s` is capturing is MG_ERR_CAPTURING: plan it with mg_gemm_prewarm, outside the
 *    capture. (The CPU backend plans nothing and captures any GEMM.)
 *  - Each stream has its own workspace, so GEMMs on different streams may run concurrently.
 *    A graph captured on stream s uses s's workspace: replay it on s (or on a stream ordered
 *    with s), not concurrently with other GEMMs issued to s.
 *
 * FP8 requirements (cuBLASLt's "TN" FP8 kernels): K and N multiples of 16; act, weight and out
 * 16-byte aligned; ldc * 2 bytes a multiple of 16 (ldc % 8 == 0); out is BF16. Scale vectors
 * are FP32 in device memory, 16-byte aligned (per-tensor scales: 4-byte aligned), so a graph
 * replay reads the scales current at replay time.
 */
#ifndef METRALE_OPS_GEMM_H
#define METRALE_OPS_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "metrale/export.h"
#include "metrale/gpu.h"
#include "metrale/ops.h"
#include "metrale/ops_kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ BF16 */

/* act, weight BF16; out BF16 or F32 (out_type). Any M, N, K >= 1; pointers aligned to their
 * element size. */
MG_API mg_status mg_gemm_bf16(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                              mg_devptr act, mg_devptr weight, mg_devptr out, mg_dtype out_type,
                              uint32_t ldc);

/* ------------------------------------------------------------------ FP8 E4M3 -> BF16 */

/* Per-tensor scales: out = (act_fp8 · weight_fp8ᵀ) * act_scale[0] * weight_scale[0]. */
MG_API mg_status mg_gemm_fp8_tensorwise(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                        uint32_t k, mg_devptr act, mg_devptr act_scale,
                                        mg_devptr weight, mg_devptr weight_scale, mg_devptr out,
                                        uint32_t ldc);

/* Row-wise scales: out[t, j] = (act_fp8[t] · weight_fp8[j]) * act_scale[t] * weight_scale[j],
 * act_scale FP32 [M], weight_scale FP32 [N]. */
MG_API mg_status mg_gemm_fp8_rowwise(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                     uint32_t k, mg_devptr act, mg_devptr act_scale,
                                     mg_devptr weight, mg_devptr weight_scale, mg_devptr out,
                                     uint32_t ldc);

/* Block scales along K (DeepSeek-style). For an operand of `rows` rows (M for act, N for
 * weight) and L = ceil(K / 128) K-blocks, the FP32 scale tensors are laid out as cuBLASLt
 * reads them:
 *   MG_FP8_BLOCK_1X128   one scale per row per K-block, K-block-major with rows contiguous:
 *                        [L, rows], index g * rows + r. (A quantizer naturally writes the
 *                        transpose [rows, L]; mg_fp8_act_scales_transpose converts. Passing
 *                        the untransposed layout is not detected and gives 1e-2..1e-1 error.)
 *   MG_FP8_BLOCK_128X128 one scale per 128 rows x 128 K: [ceil(rows / 128), L4], index
 *                        (r / 128) * L4 + g, with L4 = L rounded up to a multiple of 4 (the
 *                        padding columns are never read but must exist). */
typedef enum mg_fp8_block_scale {
    MG_FP8_BLOCK_1X128 = 0,
    MG_FP8_BLOCK_128X128 = 1,
} mg_fp8_block_scale;

/* out[t, j] = sum over K-blocks g of (act_fp8[t, g-block] · weight_fp8[j, g-block]) *
 * act_scale(t, g) * weight_scale(j, g), with the layouts above. M and N multiples of 4 (pad
 * the token count: mg_fp8_act_scales_transpose zero-fills the padding tokens' scales). The
 * pairs (1x128, 1x128), (1x128, 128x128) and (128x128, 1x128) are supported; (128x128,
 * 128x128) is MG_ERR_UNSUPPORTED. */
MG_API mg_status mg_gemm_fp8_blockscaled(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                                         uint32_t k, mg_devptr act, mg_devptr act_scale,
                                         mg_fp8_block_scale act_mode, mg_devptr weight,
                                         mg_devptr weight_scale, mg_fp8_block_scale weight_mode,
                                         mg_devptr out, uint32_t ldc);

/* ------------------------------------------------------------------ FP8 scale layouts */

#define MG_FP8_SCALE_BLOCK 128

/* L = ceil(k / 128): the number of K-blocks. */
MG_API uint32_t mg_fp8_k_blocks(uint32_t k);
/* The token count a block-scaled GEMM runs with: m rounded up to a multiple of 4. */
MG_API uint32_t mg_fp8_rows_padded(uint32_t m);
/* FP32 elements of a block-scale tensor for an operand of `rows` rows (see
 * mg_fp8_block_scale), and the index of row `row`'s scale for K-block `k_block`. */
MG_API size_t mg_fp8_block_scale_count(mg_fp8_block_scale mode, uint32_t rows, uint32_t k);
MG_API size_t mg_fp8_block_scale_index(mg_fp8_block_scale mode, uint32_t rows, uint32_t k,
                                       uint32_t row, uint32_t k_block);

/* The activation-scale transpose: src FP32 [m, L] (index t * L + g, the quantizer's layout)
 * -> dst FP32 [L, m_pad] (index g * m_pad + t, the 1x128 layout cuBLASLt reads), with
 * dst = 0 for the padding tokens m <= t < m_pad. m_pad >= m and a multiple of 4; src and dst
 * 4-byte aligned and not overlapping. Stream-ordered; capture-safe. */
MG_API mg_status mg_fp8_act_scales_transpose(mg_backend *b, mg_stream *s, uint32_t m,
                                             uint32_t m_pad, uint32_t k, mg_devptr src,
                                             mg_devptr dst);

/* ------------------------------------------------------------------ FP8 quantizer (host) */

/* BF16 [rows, cols] row-major (host memory) -> E4M3 codes [rows, cols] and FP32 scales, with
 * value ~= decode(code) * scale. Each scale is amax / 448 over its group's finite values (1
 * for a group with none but zeros); codes are round-to-nearest-even of value / scale,
 * saturating: infinities are clipped to +-448 (0x7e / 0xfe) and never reach the scale, NaN
 * gives the NaN code with its sign (0x7f / 0xff). The scales are written as the GEMMs above
 * read them, except 1x128, which is written in the natural [rows, L] layout (index r * L + g),
 * as a per-token quantizer on a GPU would; transpose it for the GEMM. The device quantizer of
 * metrale/ops_quantize.h computes the same bits on any backend.
 * MG_ERR_INVALID_ARGUMENT for NULL pointers or zero sizes. */
MG_API mg_status mg_fp8_quantize_tensorwise(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                            uint8_t *out, float *scale);
/* scales[rows] */
MG_API mg_status mg_fp8_quantize_rowwise(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                         uint8_t *out, float *scales);
/* scales[rows * L], natural layout r * L + g */
MG_API mg_status mg_fp8_quantize_1x128(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                       uint8_t *out, float *scales);
/* scales[mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, rows, cols)], GEMM layout, padding
 * columns set to 0 */
MG_API mg_status mg_fp8_quantize_128x128(const uint16_t *bf16, uint32_t rows, uint32_t cols,
                                         uint8_t *out, float *scales);

/* ------------------------------------------------------------------ planning and modes */

typedef enum mg_gemm_kind {
    MG_GEMM_BF16 = 0,
    MG_GEMM_FP8_TENSORWISE,
    MG_GEMM_FP8_ROWWISE,
    MG_GEMM_FP8_BLOCKSCALED,
} mg_gemm_kind;
#define MG_GEMM_KIND_COUNT 4 /* kinds are 0 .. MG_GEMM_KIND_COUNT - 1 */

/* What a kind is: the one table the library's messages, the CLI's benches and the checks
 * take their names and operand types from. */
typedef struct mg_gemm_kind_info {
    mg_gemm_kind kind;
    const char *name;     /* short, the bench case names: "bf16", "fp8_tensor", "fp8_row",
                           * "fp8_block" */
    const char *function; /* its entry point above: "mg_gemm_bf16", "mg_gemm_fp8_rowwise", ... */
    mg_dtype input_type;  /* of act and weight: MG_DTYPE_BF16 or MG_DTYPE_FP8_E4M3 */
    mg_op op;             /* the op whose providers run it (metrale/ops.h) */
} mg_gemm_kind_info;

/* The description of `kind`; NULL when `kind` is none of the kinds. */
MG_API const mg_gemm_kind_info *mg_gemm_kind_describe(mg_gemm_kind kind);

/* ------------------------------------------------------------------ fusion
 *
 * A GEMM may fold the small op before it (a prologue) and the one after it (an epilogue) into
 * the call. Each fusion is defined as the composition of the unfused library calls named
 * below, on the same operands, with every intermediate rounded to BF16 exactly as those calls
 * round it; the CPU reference computes that composition (so a fused and an unfused CPU run
 * agree bit for bit), a device kernel must match it within the tolerance of the ops composed.
 *
 *   prologue MG_GEMM_PROLOGUE_RMSNORM: act is the un-normed residual stream, BF16 [M, K]
 *       (also for the FP8 kinds), read and never written. The GEMM's input is
 *           BF16:    x = mg_rmsnorm_bf16(act, add = 0, norm_weight, eps)      [M, K]
 *           FP8 row: x = mg_fp8_quantize_rowwise(that x), act_scale = its row scales, so
 *                    act_scale is computed, not passed (leave it 0)
 *       norm_weight BF16 [K], eps > 0 and finite.
 *   epilogue MG_GEMM_EPILOGUE_RESIDUAL_ADD: y = the GEMM's BF16 output [M, N], then
 *       out[t, j] = bf16(y[t, j] + residual[t, j]) (the residual add of mg_rmsnorm_bf16's
 *       `add`), residual BF16 [M, N] with row pitch ldc: either exactly out (the residual
 *       stream updated in place) or sharing no byte with it.
 *   epilogue MG_GEMM_EPILOGUE_SILU_MUL: the weight rows [0, N/2) are the gate and [N/2, N) the
 *       up projection (the layout of a fused gate_up matrix, as the model stores it); y is the
 *       GEMM's BF16 output [M, N] and out = mg_silu_mul_bf16(y, cols = N/2) is BF16 [M, N/2]
 *       with row pitch ldc >= N/2. N even.
 *   epilogue MG_GEMM_EPILOGUE_ARGMAX: the LM head; y = the GEMM's output [M, N] (BF16, or F32
 *       when out_type is F32), and argmax_ids[t] = mg_argmax of row t (the lowest j with y
 *       maximal; NaN never wins), int32 [M]; `out` receives y as without the epilogue.
 *   epilogue MG_GEMM_EPILOGUE_KV_APPEND: the fused QKV projection of M new tokens. Each row of
 *       y = out (BF16, row pitch ldc, a multiple of 8) is [q | k | v], Hq = kv_append->
 *       num_qo_heads query heads then the cache's Hkv key and Hkv value heads of head_dim D, so
 *       N = (Hq + 2 Hkv) D. Then mg_kv_append(kv_cache, args) runs with *kv_append, except
 *       that the op sets num_tokens = M, k = out + Hq D, v = out + (Hq + Hkv) D, strides ldc,
 *       and q = out when kv_append->rope (RoPE rotates q in place in out and k as it is
 *       written; without rope q is left as computed): leave those fields 0. The token's page
 *       and slot come from the page table in *kv_append, as for mg_kv_append; every check of
 *       mg_kv_append applies before anything is launched (its messages name mg_kv_append).
 *
 * What a caller may rely on:
 *  - The zero value (both kinds NONE, every fusion tensor 0) is the plain GEMM; a plan or
 *    tensors struct initialised as before this field existed runs as before.
 *  - A fusion is run whole by one provider or refused: the front chooses a provider that
 *    declares the requested prologue and epilogue for the kind; when none does the call is
 *    MG_ERR_UNSUPPORTED naming the fusion, the kind and the backend's providers' reasons.
 *    Nothing is launched then: a fusion is never run partly or silently dropped. Today the
 *    CPU reference runs every fusion (any prologue with any epilogue) of MG_GEMM_BF16 and
 *    MG_GEMM_FP8_ROWWISE; on CUDA the decode GEMV runs the RMSNorm prologue with no
 *    epilogue, residual add, SiLU-mul or KV append (into BF16 pools: an FP8 pool is refused
 *    at the call), for MG_GEMM_BF16 with M <= 16, K % 8 == 0, and for MG_GEMM_FP8_ROWWISE
 *    (its RMSNorm prologue at M = 1 in the automatic choice, up to M x (K + 16) <= 40 KiB when
 *    the provider is forced), act, weight, out and norm_weight 16-byte aligned, outside
 *    batch-invariant mode (the argmax epilogue and per-tensor FP8 fusions are refused
 *    there); the CPU fast BF16 providers
 *    run none, and the other kinds have no fusion (MG_ERR_UNSUPPORTED). NVFP4 weights take the
 *    same fusion descriptors through mg_nvfp4_gemm_fused (metrale/ops_nvfp4.h).
 *  - On the CPU backend a fused call's outputs equal the composition's bit for bit; a device
 *    kernel will match it within the tolerance of the ops composed (its sums may run in
 *    another order), and argmax may then pick the other side of a near-tie.
 *  - A fusion tensor the kinds need but missing, one given that they do not use, a bad eps,
 *    an odd N for SILU_MUL, a fusion on another kind, or out (or argmax_ids) overlapping act,
 *    weight, norm_weight or residual (other than a residual that is exactly out):
 *    MG_ERR_INVALID_ARGUMENT naming it, nothing launched.
 *  - mg_gemm_prewarm takes the fusion kinds from the plans (their tensors are not read), so a
 *    fusion no provider can run is refused there too, before a capture. */
typedef enum mg_gemm_prologue {
    MG_GEMM_PROLOGUE_NONE = 0,
    MG_GEMM_PROLOGUE_RMSNORM = 1,
} mg_gemm_prologue;
#define MG_GEMM_PROLOGUE_COUNT 2

typedef enum mg_gemm_epilogue {
    MG_GEMM_EPILOGUE_NONE = 0,
    MG_GEMM_EPILOGUE_RESIDUAL_ADD = 1,
    MG_GEMM_EPILOGUE_SILU_MUL = 2,
    MG_GEMM_EPILOGUE_ARGMAX = 3,
    MG_GEMM_EPILOGUE_KV_APPEND = 4,
} mg_gemm_epilogue;
#define MG_GEMM_EPILOGUE_COUNT 5

/* What to fuse: the kinds and their scalars. Part of the plan, because the provider choice and
 * the planning depend on it. */
typedef struct mg_gemm_fusion {
    mg_gemm_prologue prologue;
    mg_gemm_epilogue epilogue;
    float eps; /* RMSNORM: > 0 and finite; otherwise ignored */
} mg_gemm_fusion;

/* The fusion's operands (device memory), 0 where the fusion has none. */
typedef struct mg_gemm_fusion_tensors {
    mg_devptr norm_weight; /* RMSNORM: BF16 [K] */
    mg_devptr residual;    /* RESIDUAL_ADD: BF16 [M, N], row pitch ldc */
    mg_devptr argmax_ids;  /* ARGMAX: int32 [M] */
    /* KV_APPEND: host structs, read during the call only */
    const mg_kv_cache_desc *kv_cache;
    const mg_kv_append_args *kv_append;
} mg_gemm_fusion_tensors;

/* "none", "rmsnorm" / "residual_add", "silu_mul", "argmax", "kv_append"; NULL for a value out
 * of range. */
MG_API const char *mg_gemm_prologue_name(mg_gemm_prologue p);
MG_API const char *mg_gemm_epilogue_name(mg_gemm_epilogue e);

/* One GEMM shape to plan ahead of a capture. */
typedef struct mg_gemm_plan {
    mg_gemm_kind kind;
    uint32_t m, n, k;
    uint32_t ldc;
    mg_dtype out_type;           /* BF16 or F32 for MG_GEMM_BF16; BF16 for FP8 */
    mg_fp8_block_scale act_mode; /* MG_GEMM_FP8_BLOCKSCALED only */
    mg_fp8_block_scale weight_mode;
    /* The least alignment, in bytes, of the act, weight and out pointers the calls will pass
     * (and norm_weight's with the RMSNorm prologue; 0 means 16, the alignment of
     * allocations). A call whose pointers are less aligned is a different plan. */
    uint32_t pointer_alignment;
    /* Appended: zero is no fusion (see "fusion" above). With SILU_MUL, out has N/2 columns. */
    mg_gemm_fusion fusion;
} mg_gemm_plan;

/* The operands of one GEMM call (mg_gemm). Scales are used by the FP8 kinds only (layouts
 * above). `workspace`, when not 0, is device memory of `workspace_bytes` (16-byte aligned, at
 * least mg_gemm_workspace_bytes) that the call uses instead of the stream's own workspace,
 * so a model whose arena holds it allocates nothing afterwards. Calls that may overlap (other
 * streams, concurrent graph replays) need workspaces of their own. */
typedef struct mg_gemm_tensors {
    mg_devptr act, weight, out;
    mg_devptr act_scale, weight_scale;
    mg_devptr workspace;
    size_t workspace_bytes;
    /* Appended: the operands of plan.fusion; all 0 without a fusion. */
    mg_gemm_fusion_tensors fusion;
} mg_gemm_tensors;

/* The one GEMM entry point: `plan` says what (kind, shape, output type, block modes; its
 * pointer_alignment is ignored: the pointers give it), `t` the operands. mg_gemm_bf16 and the
 * mg_gemm_fp8_* calls above are this with the library-owned workspace. */
MG_API mg_status mg_gemm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plan,
                         const mg_gemm_tensors *t);

/* The workspace bytes a call of `plan` on `b` needs from a caller who supplies one: 32 MiB with
 * cuBLASLt, 0 on the CPU reference. Host-only; creates nothing. */
MG_API mg_status mg_gemm_workspace_bytes(mg_backend *b, const mg_gemm_plan *plan, size_t *bytes);

/* FP32 elements of the activation's (act = true) or the weight's scale tensor that a GEMM of
 * this plan reads: 1 per tensor, M or N row-wise, mg_fp8_block_scale_count for block modes;
 * 0 for BF16. */
MG_API size_t mg_gemm_scale_count(const mg_gemm_plan *plan, bool act);

/* Quantizes a BF16 operand [rows, plan->k] on the host into what a GEMM of this FP8 plan reads
 * for the activation (act = true) or the weight: codes[rows * k] and the scales that
 * mg_gemm_scale_count counts (the quantizer above that the kind and its block mode name; a
 * 1x128 activation's scales in the natural [rows, L] layout, which the GEMM transposes when
 * told act_rows_natural). MG_ERR_INVALID_ARGUMENT for a BF16 plan, which quantizes nothing. */
MG_API mg_status mg_gemm_quantize_operand(const mg_gemm_plan *plan, bool act, const uint16_t *bf16,
                                          uint32_t rows, uint8_t *codes, float *scales);

/* Plans every shape and gives stream `s` its workspace, so later calls of these shapes on
 * `s` create nothing and may be captured. Blocking host work (library heuristics); does not
 * launch. Not while `s` is capturing (MG_ERR_CAPTURING). The CPU backend checks the plans
 * and does nothing else. */
MG_API mg_status mg_gemm_prewarm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans,
                                 size_t count);

/* Batch-invariant mode (off by default): one algorithm per (N, K, kind, scale modes, output
 * type), chosen once, and checked to run at each call's M, so the bits of an output row do not
 * depend on how many rows the batch has. Slower for some M. A shape whose algorithm cannot run
 * at some M fails with MG_ERR_UNSUPPORTED. Applies to calls made after it; the CPU reference
 * is batch-invariant always. */
MG_API mg_status mg_gemm_set_batch_invariant(mg_backend *b, bool enabled);
MG_API bool mg_gemm_batch_invariant(mg_backend *b);

#ifdef __cplusplus
}
#endif
#endif
