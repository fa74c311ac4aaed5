/*
 * model_hf.h - private to src/model: a Hugging Face checkpoint directory (config.json and
 * safetensors, sharded through model.safetensors.index.json or not) as the forward model's
 * architecture and weights; MLX-quantized directories (config.json "quantization") too.
 *
 * Architecture (config.json): architectures[0] LlamaForCausalLM (Llama 2/3, SmolLM2),
 * MistralForCausalLM, Qwen2ForCausalLM (biases on the q, k and v projections),
 * Qwen3ForCausalLM (an RMSNorm over each q and k head) or Qwen3MoeForCausalLM (Qwen3's
 * attention, every layer's MLP a mixture of experts: num_experts or num_local_experts,
 * num_experts_per_tok, moe_intermediate_size, norm_topk_prob true, no dense layers); hidden_size,
 * intermediate_size, num_attention_heads, num_key_value_heads (default: the heads), head_dim
 * (default hidden / heads), num_hidden_layers, rms_norm_eps, vocab_size, tie_word_embeddings
 * (default false), max_position_embeddings; the RoPE theta from rope_parameters.rope_theta
 * (transformers 5) or rope_theta (default 10000; both present must agree). Each size has a range
 * far past any released model and each field a type; a value outside them is a one-line error
 * naming the field. Refused, naming the field or value: another architecture, RoPE scaling of any
 * type but "default" (rope_scaling or rope_parameters: llama3, linear, yarn,
 * ...), attention biases beyond Qwen2's, MLP biases, an activation other than SiLU, partial
 * rotary embeddings, a layer type other than full or sliding attention, a quantization method
 * other than MLX's affine one and NVFP4 (ModelOpt's quant_algo NVFP4, in quantization_config or
 * in hf_quant_config.json alone; compressed-tensors' nvfp4-pack-quantized: model_hf_nvfp4.h). A
 * sliding window that applies (Mistral's sliding_window; Qwen's with use_sliding_window or a
 * "sliding_attention" layer) caps the context at the window: within it attention is full attention,
 * and a longer run is refused.
 *
 * Weights: model.embed_tokens, model.norm, lm_head (absent when tied) and per layer
 * input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
 * each `.weight` in BF16, F16 or F32, converted to BF16 on the host and uploaded (Qwen2's
 * self_attn.{q,k,v}_proj.bias as FP32, Qwen3's self_attn.{q,k}_norm.weight as BF16:
 * model_checkpoint.h's extra tensors; Qwen3-MoE's mlp.gate (the router) and
 * mlp.experts.<e>.{gate,up,down}_proj in place of the MLP, joined into model.h's expert
 * layout; MLX-quantized experts are refused); the rows are
 * in Hugging Face order already (rotate-half RoPE). In an MLX directory the layer matrices are
 * loaded by mg_fwd_mlx_create (model_mlx.h: every one quantized with the config's bits), and a
 * quantized embedding or LM head is dequantized to BF16 on the device (mg_mlx_dequant). In an
 * NVFP4 directory every layer matrix is NVFP4 and the LM head NVFP4 or float, read and prepared
 * by model_hf_nvfp4.h (dense models only; the embedding float). A tensor the network does not
 * use is refused, as a missing one or a wrong shape is.
 */
#ifndef METRALE_MODEL_HF_H
#define METRALE_MODEL_HF_H

#include "model.h"
#include "model_checkpoint.h"

/* The NVFP4 checkpoint conventions (model_hf_nvfp4.h). */
typedef enum mg_fwd_nvfp4_convention {
    MG_FWD_NVFP4_NONE,
    MG_FWD_NVFP4_MODELOPT,           /* quant_method "modelopt", quant_algo "NVFP4" */
    MG_FWD_NVFP4_COMPRESSED_TENSORS, /* quant_method "compressed-tensors", nvfp4-pack-quantized */
} mg_fwd_nvfp4_convention;

/* What config.json says beyond the architecture: a tied LM head, MLX quantization bits (0:
 * none), the NVFP4 convention and whether its linears carry activation scales (W4A4
 * checkpoints; checked, not used: model_hf_nvfp4.h), the architecture's name. */
typedef struct mg_fwd_hf_config {
    bool tied;
    uint32_t bits;
    mg_fwd_nvfp4_convention nvfp4;
    bool nvfp4_input_scales;
    char arch_name[96];
} mg_fwd_hf_config;

/* hf_quant_config.json (ModelOpt's own file, read when config.json names no quantization):
 * its "quantization" object as config.json's ModelOpt quantization_config. Fills out->nvfp4
 * and nvfp4_input_scales only. */
mg_status mg_fwd_hf_quant_config_parse(const char *text, size_t len, const char *path,
                                       mg_fwd_hf_config *out);

/* The text of a config.json (`len` bytes, no terminator needed) as the architecture above:
 * fills *arch's shape, layers, rope_theta, norm_eps, context, max_batch_tokens, qkv_bias and
 * qk_norm, and *out. Any text is accepted or refused with a status and a one-line message
 * naming `path` (mg_error_report); it reads nothing else (model_hf_config.c, fuzzed by
 * tests/fuzz/fuzz_hf_config.c). */
mg_status mg_fwd_hf_config_parse(const char *text, size_t len, const char *path,
                                 mg_fwd_preset *arch, mg_fwd_hf_config *out);

typedef struct mg_fwd_hf mg_fwd_hf;

/* Reads dir/config.json into *arch (name: the directory's base name), opens the safetensors
 * and checks every tensor against the architecture. */
mg_status mg_fwd_hf_open(const char *dir, mg_fwd_preset *arch, char *name, size_t name_size,
                         mg_fwd_hf **out);
void mg_fwd_hf_close(mg_fwd_hf *h);
double mg_fwd_hf_weight_bytes(const mg_fwd_hf *h);
mg_status mg_fwd_hf_load(mg_backend *b, mg_fwd_hf *h, const mg_fwd_preset *arch, mg_devptr *layer_w,
                         mg_devptr *extra, mg_fwd_checkpoint_weights *out);

#endif
