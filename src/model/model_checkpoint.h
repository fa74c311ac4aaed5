/*
 * model_checkpoint.h - private to src/model: the one seam between the forward model and a real
 * checkpoint, whatever its format. mg_fwd_checkpoint_open tells the formats apart (a GGUF file,
 * model_gguf.h; a Hugging Face or MLX directory, model_hf.h), reads the architecture into a
 * preset and checks every tensor; mg_fwd_checkpoint_load then uploads the weights. Errors are
 * one line in mg_last_error, naming the file and what is wrong.
 */
#ifndef METRALE_MODEL_CHECKPOINT_H
#define METRALE_MODEL_CHECKPOINT_H

#include "model.h"
#include "model_mlx.h"

#include "metrale/ops_nvfp4.h"

/* The per-layer tensors beyond the preset's (model.h's qkv_bias and qk_norm), at
 * extra[l * MG_FWD_EXTRA_TENSORS + slot]; 0 where the architecture has none: the q bias
 * (FP32 [heads * head_dim]), the k and v biases joined like wkv (FP32 [2 kv_heads head_dim]),
 * the q and k head norms (BF16 [head_dim]). A bias that the layer's own MLX linear adds (an MLX
 * directory's) is not here. */
enum { MG_FWD_Q_BIAS, MG_FWD_KV_BIAS, MG_FWD_Q_NORM, MG_FWD_K_NORM, MG_FWD_EXTRA_TENSORS };

/* The loaded weights: BF16 device buffers, and the layer matrices either in layer_w (BF16), in
 * *mlx (the MLX path) or in fp4 (an NVFP4 directory: [layers][FP4_SLOTS] of model_internal.h,
 * each weight one allocation at its `values`; the LM head in lm_head_fp4 when quantized, else
 * lm_head). lm_head == embedding when the embedding is tied. */
typedef struct mg_fwd_checkpoint_weights {
    mg_devptr embedding, final_norm, lm_head;
    mg_fwd_mlx *mlx;
    mg_nvfp4_weight *fp4;
    mg_nvfp4_weight lm_head_fp4;
    uint64_t bytes;
} mg_fwd_checkpoint_weights;

typedef struct mg_fwd_checkpoint mg_fwd_checkpoint;

mg_status mg_fwd_checkpoint_open(const char *path, mg_fwd_preset *arch, char *name,
                                 size_t name_size, mg_fwd_checkpoint **out);
void mg_fwd_checkpoint_close(mg_fwd_checkpoint *c);
/* An upper estimate of the device bytes of the weights as loaded. */
double mg_fwd_checkpoint_weight_bytes(const mg_fwd_checkpoint *c, const mg_fwd_preset *arch);
/* Uploads every weight onto `b`: the norms and (float checkpoints) the matrices into
 * layer_w[l * MG_FWD_LAYER_TENSORS + slot], the architecture's extra tensors into `extra`
 * (above; zeroed, [layers * MG_FWD_EXTRA_TENSORS]). On failure *out, layer_w and extra hold
 * only valid buffers, which the caller frees. */
mg_status mg_fwd_checkpoint_load(mg_backend *b, mg_fwd_checkpoint *c, const mg_fwd_preset *arch,
                                 mg_devptr *layer_w, mg_devptr *extra,
                                 mg_fwd_checkpoint_weights *out);

#endif
