/*
 * model.h - a decoder-only transformer assembled from the library's public ops, with
 * deterministic random weights: what `metrale-gpu run` drives and what the forward-pass tests
 * check. It uses include/metrale/ only, like an engine would.
 *
 *   const mg_fwd_preset *p = mg_fwd_preset_find("tiny");
 *   mg_fwd_config c = mg_fwd_config_default(p);            // batch, prompt length, steps, seed
 *   mg_fwd *m;
 *   mg_fwd_create(backend, &c, &m);                        // weights, arena, KV pages
 *   mg_fwd_prefill(m, s);                                  // every prompt, eager
 *   for (i = 0; i < c.steps; i++) mg_fwd_decode(m, s);     // one token per request
 *   mg_fwd_tokens(m, request)                              // its generated ids
 *   mg_fwd_destroy(m);
 *
 * Layers (Llama-style, no biases): h = embedding[ids]; per layer
 *   a = rmsnorm(h) * attn_norm;  q = a Wqᵀ, [k v] = a Wkvᵀ;  RoPE (rotate-half) on q and k;
 *   k, v appended to the paged KV cache;  o = causal attention over the request's cache;
 *   h += o Woᵀ;  m = rmsnorm(h) * mlp_norm;  [g u] = m Wguᵀ;  h += (silu(g) * u) Wdownᵀ;
 * final = rmsnorm(h[last token of each request]) * final_norm; logits = final W_lmᵀ (FP32);
 * next token = argmax. Every activation is BF16 (the ops' rounding defines it). Checkpoints
 * may add (mg_fwd_preset qkv_bias, qk_norm): q += bq, [k v] += [bk bv] after the products
 * (mg_mlx_add_bias, or the MLX linear's own bias), and q, k = rmsnorm per head * q_norm, k_norm
 * before RoPE (Qwen2, Qwen3).
 *
 * Weights (reproducible in numpy): element `index` (row-major) of tensor `id` is
 *   x = seed * 0x9E3779B97F4A7C15 + (id << 40) + index   (mod 2^64)
 *   z = splitmix64(x)   (x += 0x9E3779B97F4A7C15; z = (x ^ x >> 30) * 0xBF58476D1CE4E5B9;
 *                        z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^= z >> 31)
 *   u = (z >> 40) * 2^-23 - 1   (uniform in [-1, 1))
 *   value = bf16_rne(offset + scale * u) (the product and the sum each rounded to FP32) with
 *   (offset, scale) per kind: norms (1, 0.1), embedding (0, 1), matrices [N, K] (0, 1 / sqrt(K)).
 *   That is mg_fill_uniform_bf16 of metrale/ops_elementwise.h from counter x of index 0: the
 *   BF16 tensors and the BF16 inputs of the NVFP4 quantization are generated on the device
 *   where the backend runs that op (the host generates them otherwise, and always for the FP8
 *   and MLX formats, which quantize on the host).
 * Tensor ids: embedding 0, final norm 1, LM head 2 [vocab, hidden]; layer l: 16 + 8 l + slot,
 * slots attn_norm 0, wq 1 [Hq D, hidden], wkv 2 [2 Hkv D, hidden] (k rows then v rows),
 * wo 3 [hidden, Hq D], mlp_norm 4, w_gate_up 5 [2 I, hidden] (gate rows then up rows),
 * w_down 6 [hidden, I]; MoE presets (E experts of intermediate I, top-k): router 7 [E, hidden]
 * (BF16 always), w_gate_up 5 [E * 2 I, hidden] (expert e's gate rows, then its up rows, at rows
 * e * 2 I ..), w_down 6 [E * hidden, I] (expert e at rows e * hidden ..). Prompt token t of request
 * r: splitmix64-based id mg_fwd_prompt_token(seed, vocab, r, t), lengths
 * mg_fwd_prompt_length(config, r).
 *
 * NVFP4 weights (config weights = MG_FWD_WEIGHTS_NVFP4): each layer matrix (wq, wkv, wo,
 * w_gate_up, w_down) and the LM head is generated as above in BF16, then quantized at load by
 * mg_nvfp4_quantize (metrale/nvfp4.h) with ONE global scale per tensor,
 *   global = amax / (448 * 6) in single precision (mg_nvfp4_global_scale; amax = the largest
 *            |x| of the whole BF16 tensor; gate and up rows of w_gate_up share it),
 * prepared by mg_nvfp4_prepare, and the BF16 copy freed. The layers then run mg_nvfp4_gemm
 * (prefill: mg_nvfp4_gemm_with_workspace) and the MLP runs mg_nvfp4_gemm_gate_up, which
 * writes silu(gate) * up directly (no gate_up activation, no SiLU-mul op). The LM head runs
 * mg_nvfp4_gemm into BF16 logits, then mg_argmax_bf16 (ties, likelier at BF16 precision, go to
 * the lowest id). The embedding and the norms stay BF16.
 *
 * FP8 weights (config weights = MG_FWD_WEIGHTS_FP8): each layer matrix (wq, wkv, wo,
 * w_gate_up, w_down) and the LM head is generated as above in BF16, then quantized at load by
 * mg_fp8_quantize_rowwise (metrale/ops_gemm.h): E4M3 codes with ONE scale per output row
 * (scale = amax of the row / 448 in single precision, 1 for an all-zero row; codes the
 * round-to-nearest-even of x / scale), and the BF16 copy is not kept. Every GEMM input is
 * quantized on the device, per token, by mg_fp8_quantize in MG_FP8_QUANT_ROW mode
 * (metrale/ops_quantize.h: the same rule over each activation row; q and kv share one
 * quantization of the normed input, as do gate and up), then
 *   out[t, j] = bf16((sum over k of e4m3(act)[t, k] e4m3(w)[j, k]) * act_scale[t] * w_scale[j])
 * by mg_gemm_fp8_rowwise (FP32 accumulation; cuBLASLt on CUDA, the reference on the CPU). The
 * MLP keeps the BF16 path's shape: gate_up GEMM (BF16 out), SiLU-mul, quantize, down GEMM. The
 * LM head writes BF16 logits, then mg_argmax_bf16 (ties to the lowest id). The embedding and
 * the norms stay BF16. MoE presets' experts: see below.
 *
 * MoE presets: per layer router logits = m Wrouterᵀ (BF16 GEMM, FP32 logits), mg_moe_topk
 * (softmax renormalized over the k chosen, as Qwen3), mg_moe_sort, the experts' gate_up with
 * SiLU-mul fused, the experts' down, mg_moe_combine (weighted sum, no residual) into the
 * layer's output. With NVFP4 weights the experts run mg_nvfp4_moe_gemm (every expert's weights
 * share the tensor's global scale); with BF16 weights mg_moe_gemm (metrale/ops_moe_gemm.h,
 * CUTLASS's grouped GEMM on CUDA) on w_gate_up / w_down as generated; with FP8 weights
 * mg_moe_gemm's FP8 row-wise kind on the same rows quantized as the dense FP8 matrices (one
 * scale per row), the activation quantized per row by the op. MLX weights run dense presets
 * only.
 *
 * MLX weights (MG_FWD_WEIGHTS_MLX8 / MLX4, dense presets): the layer matrices (wq, wkv, wo,
 * w_gate_up, w_down) come from an MLX affine-quantized checkpoint (metrale/mlx.h; layout in
 * model_mlx.h; tests/mlx/make_checkpoint.py writes the committed ones from the weights above,
 * seed 1), loaded through mg_mlx_linear_load, each with the shape the preset gives it and the
 * bits asked for (else a one-line error). Rows <= 8 (decode) run the MLX GEMVs, the MLP as the
 * gate_up GEMV then the down GEMV fused with silu(g) * u; more rows (prefill) run mg_mlx_gemm
 * (the weights dequantized to BF16, then the BF16 GEMM) and the SiLU-mul op. The embedding, the
 * norms and the LM head stay BF16 from the generator.
 */
#ifndef METRALE_MODEL_H
#define METRALE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/arena.h"
#include "metrale/comm.h"
#include "metrale/gpu.h"
#include "metrale/ops_sample.h"
#include "metrale/timing.h"

/* A decoder-only transformer's shape. Dense when experts == 0; MoE when experts >= 2, with
 * `experts_per_token` (top-k) routed experts of `intermediate` each. */
typedef struct mg_model_shape {
    uint32_t hidden;   /* d_model */
    uint32_t heads;    /* query heads */
    uint32_t kv_heads; /* divides heads (GQA) */
    uint32_t head_dim;
    uint32_t intermediate;      /* MLP intermediate size (per expert for MoE) */
    uint32_t experts;           /* 0: dense */
    uint32_t experts_per_token; /* top-k; 0 when dense */
    uint32_t vocab;
} mg_model_shape;

/* Llama 3.1's RoPE scaling (a Hugging Face config's rope_scaling of rope_type "llama3"), run
 * through mg_rope_inv_freq_llama3's frequency table; factor 0: unscaled RoPE. */
typedef struct mg_fwd_rope_llama3 {
    float factor, low_freq_factor, high_freq_factor;
    uint32_t original_max_positions;
} mg_fwd_rope_llama3;

typedef struct mg_fwd_preset {
    const char *name;
    const char *description;
    mg_model_shape shape;
    uint32_t layers;
    float rope_theta, norm_eps;
    /* What the arena may be built for: prompts' total tokens and requests per batch. */
    uint32_t max_batch_tokens, max_batch_size;
    /* Defaults of a run. */
    uint32_t batch, prompt_len, steps;
    /* The longest sequence (prompt + generated) the model was trained for; 0: no limit (the
     * synthetic presets). A run past it is refused. */
    uint32_t context;
    /* Checkpoints only (the synthetic presets have neither): q, k and v projections with a bias
     * added after the product (Qwen2), and an RMSNorm over each q and k head (weights
     * [head_dim], eps norm_eps) between the projection and RoPE (Qwen3). */
    bool qkv_bias, qk_norm;
    mg_fwd_rope_llama3 rope_llama3; /* checkpoints only */
    /* Checkpoints only: llama.cpp's RoPE frequency divisors (a GGUF's rope_freqs.weight, as its
     * converter writes Llama 3.1's scaling), [head_dim / 2] finite and > 0: frequency i is
     * rope_theta^(-2i / head_dim) / rope_freq_factors[i]; NULL: none. Owned by the model. */
    const float *rope_freq_factors;
} mg_fwd_preset;

const mg_fwd_preset *mg_fwd_presets(size_t *count);
/* NULL when there is none. */
const mg_fwd_preset *mg_fwd_preset_find(const char *name);

typedef enum mg_fwd_weights {
    MG_FWD_WEIGHTS_BF16 = 0,
    MG_FWD_WEIGHTS_NVFP4,      /* the layer matrices quantized at load (see above) */
    MG_FWD_WEIGHTS_FP8,        /* E4M3 with per-row scales, activations quantized per token */
    MG_FWD_WEIGHTS_MLX8,       /* the layer matrices from an MLX checkpoint (see below), 8-bit */
    MG_FWD_WEIGHTS_MLX4,       /* the same, 4-bit */
    MG_FWD_WEIGHTS_CHECKPOINT, /* a real checkpoint's own formats (model_checkpoint.h): set by
                                  the model when config.model_path is given */
} mg_fwd_weights;

/* "bf16" / "nvfp4" / "fp8" / "mlx8" / "mlx4"; NULL-safe lookup by name (-1 when unknown). */
const char *mg_fwd_weights_name(mg_fwd_weights w);
int mg_fwd_weights_find(const char *name);

typedef struct mg_fwd_config {
    const mg_fwd_preset *preset;
    uint32_t batch;      /* requests, 1..preset max_batch_size */
    uint32_t prompt_len; /* prompts are about this long (see mg_fwd_prompt_length) */
    uint32_t steps;      /* decode steps after the prefill */
    uint64_t seed;
    bool use_graphs; /* decode steps after the first replay one captured graph (CUDA) */
    mg_fwd_weights weights;
    /* MLX weights only: the checkpoint directory (NULL: the committed one of the preset,
     * tests/mlx/checkpoints/<preset>-mlx<bits>, an error when there is none), and whether its
     * matrices are dequantized to BF16 at load and run by the BF16 path (the reference the
     * MLX ops are compared with). */
    const char *checkpoint;
    bool mlx_dequantized;
    /* A real checkpoint (a GGUF file, model_gguf.h; a Hugging Face or MLX directory,
     * model_hf.h): when set, the architecture and every
     * weight come from it, `preset` and `weights` are ignored (the model's own preset and
     * MG_FWD_WEIGHTS_CHECKPOINT are reported by mg_fwd_get_preset), and `seed` only picks random
     * prompts when prompt_ids is NULL. */
    const char *model_path;
    /* The prompt of every request (token ids < vocab, copied at create); NULL: random prompts
     * of about prompt_len tokens (mg_fwd_prompt_length / mg_fwd_prompt_token). */
    const int32_t *prompt_ids;
    uint32_t prompt_ids_count;
    /* Per-request prompts: when set (with prompt_ids), request r's prompt is the next
     * prompt_lengths[r] (>= 1) ids of prompt_ids after request r - 1's, and prompt_ids_count
     * is their sum (copied at create); NULL: every request's prompt is all of prompt_ids. */
    const uint32_t *prompt_lengths;
    /* Decode without the GEMM fusions (metrale/ops_gemm.h), as the prefill runs: the
     * comparison with the fused step. By default a dense model whose weights are BF16 decodes
     * with the norms, residual adds and SiLU-mul folded into its GEMMs wherever the backend
     * runs those fusions at the batch's size (decided at the first decode step, see
     * mg_fwd_info.fused_decode); on the CPU the two steps agree bit for bit. */
    bool unfused;
} mg_fwd_config;

mg_fwd_config mg_fwd_config_default(const mg_fwd_preset *p);

/* Request r's prompt length: prompt_lengths[r] when set, prompt_ids_count when the config has
 * prompt ids, else
 * prompt_len - prompt_len / 4 + (r * 37) % (prompt_len / 2 + 1), at least 1: a ragged batch
 * around prompt_len. */
uint32_t mg_fwd_prompt_length(const mg_fwd_config *c, uint32_t r);
int32_t mg_fwd_prompt_token(uint64_t seed, uint32_t vocab, uint32_t r, uint32_t t);

/* Weight generation (see above). */
#define MG_FWD_TENSOR_EMBEDDING 0u
#define MG_FWD_TENSOR_FINAL_NORM 1u
#define MG_FWD_TENSOR_LM_HEAD 2u
enum {
    MG_FWD_ATTN_NORM,
    MG_FWD_WQ,
    MG_FWD_WKV,
    MG_FWD_WO,
    MG_FWD_MLP_NORM,
    MG_FWD_W_GATE_UP,
    MG_FWD_W_DOWN,
    MG_FWD_ROUTER,
    MG_FWD_LAYER_TENSORS
};
static inline uint32_t mg_fwd_layer_tensor(uint32_t layer, uint32_t slot) {
    return 16u + 8u * layer + slot;
}
/* Fills out[0..count) with elements first .. first + count - 1 of tensor `id`: element i is
 * mg_uniform_bf16_host's (metrale/ops_elementwise.h) value i of counter
 * mg_fwd_weight_counter(seed, id), which mg_fill_uniform_bf16 makes on a device. */
uint64_t mg_fwd_weight_counter(uint64_t seed, uint32_t id);
void mg_fwd_weight_fill(uint64_t seed, uint32_t id, float offset, float scale, uint64_t first,
                        size_t count, uint16_t *out);
/* The (offset, scale) of a tensor whose rows have `k` elements (see above) and the tensor's
 * shape; MG_ERR_INVALID_ARGUMENT for an unknown id (the router of a dense model included). */
mg_status mg_fwd_tensor_shape(const mg_model_shape *shape, uint32_t layers, uint32_t id,
                              uint32_t *rows, uint32_t *cols, float *offset, float *scale);

typedef struct mg_fwd mg_fwd;

/* Checks the config (a one-line message in mg_last_error for each bad value: batch beyond
 * the preset's arena, a backend without an op the model needs, MoE presets with MLX weights),
 * then generates and uploads the weights, builds the arena and the KV cache. */
mg_status mg_fwd_create(mg_backend *b, const mg_fwd_config *c, mg_fwd **out);
/* Destroys a model (a tensor-parallel one of mg_fwd_create_tp with all its ranks). NULL: no-op. */
void mg_fwd_destroy(mg_fwd *m);

/* ------------------------------------------------------------------ tensor parallelism
 * The model split over `n` devices by a column-parallel / row-parallel split. Rank r of n holds:
 *  - KV heads [r Hkv/n, (r+1) Hkv/n) and the query heads that share them: its rows of wq and of
 *    wkv (k rows, then v rows; column-parallel), its KV pages (the cache of its KV heads only)
 *    and its columns of wo (row-parallel);
 *  - intermediate features [r I/n, (r+1) I/n): its gate and up rows of w_gate_up (gate, then up)
 *    and its columns of w_down;
 *  - its vocabulary rows of the LM head: V split evenly, the first V % n ranks one row more
 *    (rank r: floor(V / n) + (r < V % n) rows from r floor(V / n) + min(r, V % n));
 *  - the embedding and the norms whole.
 * A pass runs each layer on every rank with that rank's weights; after the output and the down
 * projections the ranks' partial sums (BF16) are summed by an all-reduce (metrale/comm.h, BF16,
 * in place), so every rank holds the same residual stream. The LM head computes each rank's FP32
 * logits slice, an all-gather assembles the whole row on every rank, and the argmax (or the
 * sampler, mg_fwd_set_sampling) runs on it there: every rank draws the same tokens.
 *
 * Refused at create, with a one-line message naming the field or the format:
 *  - MG_ERR_INVALID_ARGUMENT: n outside 1..MG_COMM_MAX_RANKS; n not dividing the model's
 *    heads, kv_heads or intermediate size (e.g. 9 query / 3 KV heads split over 3 ranks, not
 *    2); a vocabulary smaller than n (V >= n is the whole rule: every rank then holds a row);
 *  - MG_ERR_UNSUPPORTED: mixture-of-experts models; weight formats whose quantization would
 *    change when split (NVFP4's per-tensor and FP8's per-row scales: the wo and w_down
 *    columns); MLX-quantized wo / w_down (o_proj, down_proj) whose quantization groups a
 *    rank's columns would cut (each rank's share of the input features must be whole groups)
 *    or that have a bias (it would be added once per rank). These two come after the
 *    checkpoint's matrices loaded (before any is cut, everything freed): each matrix's group
 *    size (config.json's quantization, which may differ per layer; a GGUF's block type) and its
 *    bias (a tensor of the checkpoint) are read as it loads. The others come before anything
 *    loads.
 * BF16 weights (presets, checkpoints, MLX dequantized) and MLX-quantized ones (presets'
 * checkpoints, real checkpoints whose matrices load as MLX, e.g. a GGUF's Q4_1) are split;
 * cutting MLX rows or whole groups is exact, so a rank's share dequantizes to the same values.
 * Differences from the one-device run: the decode steps run unfused (mg_fwd_config.unfused:
 * the fused residual epilogues assume whole rows of wo and w_down); each row-parallel output
 * is the BF16 sum of n BF16-rounded partial products instead of one rounding of the whole dot
 * product, so logits agree within a few BF16 roundings per layer, not bit for bit (the tests
 * state the bound). The weights are loaded whole on each device, then cut: a rank's peak
 * memory is the whole model's weights before it settles on its share.
 *
 * mg_fwd_create_tp: one process driving every rank. It creates a communicator over `backends`
 * (mg_comm_create_local: one kind, distinct devices) and one rank per backend, and returns
 * rank 0 as the model: every call of this header takes it as a one-device model. The
 * communicator's timeout is mg_comm_options' default: the environment variable
 * METRALE_COMM_TIMEOUT_MS (milliseconds) when set at create, else 60 s. It bounds each wait of
 * a collective or of the end of a pass for the slowest peer, so it covers the peers' compute
 * between two collectives (a layer's, the LM head's) as well as a dead peer: on slow devices or
 * huge layers set it higher before mg_fwd_create_tp (e.g. setenv, or in the shell), or use
 * mg_fwd_create_rank on a communicator made with mg_comm_options.timeout_ms.
 * A pass (mg_fwd_prefill / mg_fwd_decode) runs rank 0 on the calling thread and stream `s` (of
 * backends[0]) and every other rank on a thread and a stream of its own, and returns once
 * every rank finished; the first failing rank's error is the one reported. After each pass the
 * ranks' tokens are compared: a disagreement is MG_ERR_INTERNAL, never a silent result.
 * Any failure that can leave the ranks out of step stops the model: a pass failing on any rank
 * (after its checks: not a decode past the planned steps, say), ranks that disagree, or
 * mg_fwd_force_tokens / mg_fwd_set_sampling failing on some rank once their arguments were
 * accepted (an allocation, a copy). Then every communicator is aborted and every later pass,
 * mg_fwd_force_tokens and mg_fwd_set_sampling fails at once with MG_ERR_DEVICE saying why: the
 * model is only good for mg_fwd_destroy, and never returns tokens of ranks out of step.
 * mg_fwd_tokens, mg_fwd_logits (whole rows) and mg_fwd_final_hidden read rank 0's;
 * mg_fwd_force_tokens and mg_fwd_set_sampling apply to every rank; mg_fwd_set_timing
 * records rank 0's ops (its collectives' waits included); mg_fwd_get_info reports rank 0's
 * share (weights, KV pool, arena). n == 1 is mg_fwd_create on backends[0].
 *
 * mg_fwd_create_rank: one rank per process (or per thread) on the caller's communicator (its
 * size the number of ranks, its rank the share): the caller drives every rank concurrently and
 * makes the same calls with the same config on each (comm.h's rule); each rank's tokens and
 * logits are its own copy of the same values. A NULL comm is mg_fwd_create. The communicator
 * must outlive the model. A rank whose pass fails once started (or whose mg_fwd_force_tokens
 * / mg_fwd_set_sampling fails after its checks) aborts its communicator and is stopped as
 * above; its peers' pending or next collective then fails with MG_ERR_DEVICE at once (comm.h:
 * an aborted communicator) instead of waiting out the timeout, which stops them too. A peer
 * that hangs or dies without aborting is seen only when the timeout runs out. */
mg_status mg_fwd_create_tp(mg_backend *const *backends, int n, const mg_fwd_config *c,
                           mg_fwd **out);
mg_status mg_fwd_create_rank(mg_backend *b, mg_comm *comm, const mg_fwd_config *c, mg_fwd **out);

/* Every prompt through the model in one ragged pass, eager; appends each request's first
 * generated token. */
mg_status mg_fwd_prefill(mg_fwd *m, mg_stream *s);
/* One token for every request; the first call runs eagerly, later ones (with use_graphs)
 * replay a graph captured at the second call, except while a timing object is attached
 * (mg_fwd_set_timing: eager). Waits for the step to finish. */
mg_status mg_fwd_decode(mg_fwd *m, mg_stream *s);
/* The architecture the model runs: the config's preset, or the checkpoint's (model_path), with
 * its weight format. Valid while the model lives. */
const mg_fwd_preset *mg_fwd_get_preset(const mg_fwd *m, mg_fwd_weights *weights);

/* Per-op timing spans. With `t` attached, every pass records, in `t`, a lane span around the
 * whole pass (lane "prefill" or "decode", step number = the pass's index: 0 for the prefill,
 * then 1, 2, ...) and, inside it, one kernel span per op of each layer, recorded on the pass's
 * stream and named by the op: embedding, rmsnorm, fp8_quant (FP8 weights: the activation
 * quantizer), qkv_gemm (q and kv projections), qkv_bias and qk_norm (checkpoints that
 * have them), rope_append, attention, o_gemm, gate_up
 * (NVFP4: fused with SiLU-mul), silu_mul, down, moe_router, moe_topk, moe_sort, moe_gate_up,
 * moe_down, moe_combine, last_rows, lm_head, argmax; tensor-parallel models add all_reduce
 * (after o_gemm and down) and logits_gather (the LM head's all-gather). Kernel spans need `t` at
 * level MG_TELEMETRY_KERNEL with kernel_span_every 1 (the model arms each pass as one step). Spans
 * cannot live in a graph, so while `t` is attached every decode step runs eagerly (never replays
 * nor captures the graph); detach (NULL) to go back to graph replays. The timing object must
 * outlive its attachment. Fails only when `t` has no room for the two lanes (then nothing is
 * attached). */
mg_status mg_fwd_set_timing(mg_fwd *m, mg_timing *t);

/* Tokens generated so far for request r (the prefill's first, then one per decode step). */
const int32_t *mg_fwd_tokens(const mg_fwd *m, uint32_t r, uint32_t *count);
/* The final-normed hidden state of each request's last token after the latest pass:
 * BF16 [batch, hidden] copied to host memory. */
mg_status mg_fwd_final_hidden(mg_fwd *m, uint16_t *out);

/* The logits of each request's last token after the latest pass: FP32 [batch, vocab] copied to
 * host memory (the NVFP4 and FP8 LM heads' BF16 logits widened exactly), the values argmax
 * chose the latest tokens from. */
mg_status mg_fwd_logits(mg_fwd *m, float *out);
/* Replaces every request's latest token (ids[batch], each in [0, vocab)) with ids: the input of
 * the next decode step and the last entry of mg_fwd_tokens. It lets a run follow another run's
 * greedy choices, so that two backends can be compared step by step on the same inputs even
 * where a near-tie made them choose differently. Needs a pass to have run; a captured decode
 * graph stays valid (it reads the ids from device memory). */
mg_status mg_fwd_force_tokens(mg_fwd *m, const int32_t *ids);

/* Sampled decoding (metrale/ops_sample.h) instead of greedy argmax: every later pass ends with
 * mg_sample over the logits, whose ids replace argmax's (the next step's input and the
 * history's entry). params[batch]: each request's seed, temperature, filters and penalties,
 * checked here (a one-line message naming the request and the parameter); their step and
 * history_len are the model's: step = the index of the token the pass draws (0 for the
 * prefill's), history = the request's last penalty_last_n (<= MG_SAMPLE_MAX_HISTORY) tokens,
 * prompt included. So a request's draws depend on its seed and tokens only, not on the batch.
 * A captured decode graph includes the sampler and samples with the step uploaded before each
 * replay (turning sampling on or off drops the graph; the next decode captures again). NULL
 * params: greedy argmax again. Allocates the sampler's device buffers here, never in a pass.
 * A pass whose row cannot be sampled (NaN or +inf logits, every logit -inf) fails with a
 * message naming the request. On CUDA this runs the sampler's CUDA kernel, not yet run on a
 * GPU (metrale/ops_sample.h); greedy runs without penalties never call this and keep argmax. */
mg_status mg_fwd_set_sampling(mg_fwd *m, const mg_sample_params *params, uint32_t penalty_last_n);

typedef struct mg_fwd_info {
    uint64_t weight_bytes; /* all weights as stored (NVFP4: prepared values + scales;
                              FP8: codes + row scales) */
    /* weights read by one decode step: all but the embedding (dense); MoE: the dense part and
     * the expected distinct experts of batch * k uniform picks, E (1 - (1 - k/E)^batch) */
    uint64_t decode_weight_bytes;
    uint64_t kv_pool_bytes;   /* KV cache of every layer */
    uint64_t decode_kv_bytes; /* KV bytes read by the latest decode step */
    uint64_t prompt_tokens;   /* the prefill's tokens */
    mg_arena_summary arena;   /* unpacked (sum_bytes) vs packed (arena_bytes) */
    uint32_t graph_steps;     /* decode steps that replayed the graph */
    /* the captured decode step: kernel launches (library kernels included) and all work
     * items of one replay; 0 before the capture or where the backend cannot count them */
    uint32_t graph_kernels, graph_nodes;
    /* the decode steps run the fused GEMMs (mg_fwd_config.unfused); false before the first */
    bool fused_decode;
    /* ... and at batch 1 the q and kv projections are one GEMV (their matrices joined) */
    bool fused_qkv;
    /* ... and that GEMV also applies RoPE and appends the key and value to the cache */
    bool fused_kv_append;
    /* tensor parallelism: the ranks the model is split over (1: one device) and the rank
     * these numbers are of (mg_fwd_create_tp: 0) */
    uint32_t tp_ranks, tp_rank;
    /* the captured decode step's kernels outside the layers (embedding, final norm, LM head,
     * argmax or sampling) and in its first layer, counted from two more captures of the step
     * cut to no layer and to one (never launched); the layers are alike, so graph_kernels is
     * graph_outside_kernels + layers * graph_layer_kernels. 0 where graph_kernels is, and for
     * a tensor-parallel model. */
    uint32_t graph_outside_kernels, graph_layer_kernels;
} mg_fwd_info;

void mg_fwd_get_info(const mg_fwd *m, mg_fwd_info *out);

/* The arena plan mg_fwd_create would build for `c` on `b` (model_plan.c's table: every buffer
 * of a pass, its size, its lifetime in steps of the pass), without loading anything, for
 * printing (`metrale-gpu arena`) and checks. Presets only (a config with model_path has no
 * architecture before mg_fwd_create opens it: MG_ERR_INVALID_ARGUMENT). The caller destroys
 * *out. */
mg_status mg_fwd_plan_for_config(mg_backend *b, const mg_fwd_config *c, mg_arena_plan **out);
/* The name of step `step` of the pass that plan lifetimes count in (model_plan.h), or NULL
 * past the last; `moe` picks the MoE layer's steps. */
const char *mg_fwd_plan_step_name(uint32_t step, bool moe);

#endif
