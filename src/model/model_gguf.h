/*
 * model_gguf.h - private to src/model: a GGUF checkpoint (gguf.h) as the forward model's
 * architecture and weights.
 *
 * Architecture: `general.architecture` "llama" (Llama 2/3, SmolLM2, Mistral-style files that
 * llama.cpp writes as llama), "qwen2" (blk.N.attn_{q,k,v}.bias, loaded as FP32) or "qwen3"
 * (blk.N.attn_{q,k}_norm.weight, per-head norms, loaded as BF16), read from <arch>.block_count,
 * .embedding_length, .feed_forward_length, .attention.head_count, .attention.head_count_kv,
 * .attention.key_length (else embedding_length / head_count), .attention.layer_norm_rms_epsilon,
 * .rope.freq_base (default 10000), .rope.dimension_count (must be the whole head), the
 * vocabulary from token_embd.weight. Refused with a one-line error naming the key or tensor
 * (never approximated): another architecture, RoPE scaling, partial RoPE, experts, bias
 * tensors, any tensor the model would not use, and tensor shapes that disagree with the
 * metadata.
 *
 * Weights:
 *  - token_embd (the embedding; also the LM head when there is no output.weight, as tied
 *    models have), output, and the norms: converted to BF16 at load (F32, F16, BF16 as they
 *    are; Q8_0, Q4_0, Q4_1 dequantized exactly as ggml does, w = d * q (+ m), in FP32, then
 *    rounded to BF16);
 *  - the layer matrices attn_q, attn_k + attn_v (joined: the model's wkv), attn_output,
 *    ffn_gate + ffn_up (joined) and ffn_down, when all are Q4_0, Q4_1 or Q8_0: mapped onto MLX
 *    affine weights with group 32 and FP16 scales and biases without any loss (Q4_1: scale d,
 *    bias m; Q4_0: bias -8 d; Q8_0: 8 bits, codes q + 128, bias -128 d) and run by the MLX ops;
 *    when all are F32, F16 or BF16: BF16, run by the BF16 path. K-quants and the other block
 *    types are refused, naming the tensor and its type.
 *  - llama.cpp's converter permutes the rows of attn_q and attn_k of llama files for its
 *    interleaved RoPE (Hugging Face row h * D/2 + i of a head is GGUF row 2 i + h); the
 *    permutation is undone at load, so the model's rotate-half RoPE applies as in the original
 *    checkpoint. qwen2 and qwen3 files keep Hugging Face's rows (llama.cpp runs them with
 *    rotate-half RoPE) and are loaded as they are. tests/model/random_models.py checks both.
 */
#ifndef METRALE_MODEL_GGUF_MODEL_H
#define METRALE_MODEL_GGUF_MODEL_H

#include "gguf.h"
#include "model.h"
#include "model_checkpoint.h"

/* Fills *arch (name, shape, layers, RoPE theta, norm eps, limits) from the file's metadata and
 * checks every tensor's presence, type and shape against it. */
mg_status mg_fwd_gguf_arch(const mg_gguf *g, const char *path, mg_fwd_preset *arch, char *name,
                           size_t name_size);

/* An upper estimate of the device bytes of the weights as loaded. */
double mg_fwd_gguf_weight_bytes(const mg_gguf *g, const mg_fwd_preset *arch);

/* Loads every weight of `g` (checked by mg_fwd_gguf_arch into `arch`) onto `b`: the norms and
 * (float checkpoints) the matrices into layer_w[l * MG_FWD_LAYER_TENSORS + slot]. On failure
 * the caller frees what was stored (layer_w and *out hold only valid buffers). */
mg_status mg_fwd_gguf_load(mg_backend *b, const mg_gguf *g, const mg_fwd_preset *arch,
                           mg_devptr *layer_w, mg_devptr *extra, mg_fwd_checkpoint_weights *out);

#endif
