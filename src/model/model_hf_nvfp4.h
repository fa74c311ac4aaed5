/*
 * model_hf_nvfp4.h - private to src/model: the linears of an NVFP4 Hugging Face directory
 * (config.json's quantization_config, or ModelOpt's hf_quant_config.json: model_hf.h), read with
 * the importers of metrale/nvfp4.h and prepared for mg_nvfp4_gemm.
 *
 * Per linear `base` (e.g. model.layers.0.self_attn.q_proj):
 *   ModelOpt            base.weight U8 [N, K/2], base.weight_scale F8_E4M3 [N, K/16],
 *                       base.weight_scale_2 F32 scalar (the global multiplier),
 *                       base.input_scale F32 scalar (W4A4 checkpoints);
 *   compressed-tensors  base.weight_packed U8 [N, K/2], base.weight_scale F8_E4M3 [N, K/16],
 *                       base.weight_global_scale F32 scalar (the global's reciprocal),
 *                       base.input_global_scale F32 scalar (where the config quantizes
 *                       activations).
 * A linear is quantized exactly when base.weight_scale is present; one without it is a float
 * linear (base.weight BF16, F16 or F32: the modules a checkpoint lists in `ignore` /
 * `exclude_modules`, e.g. lm_head), and any other quantization tensor beside it is refused.
 *
 * Semantics: W4A16. The weights are the checkpoint's bits exactly (codes, block scales and the
 * global, nothing requantized); activations stay BF16. The activation scales of a W4A4
 * checkpoint are checked (present where the config says activations are quantized, one
 * finite F32 > 0) but not applied: the runtime does not quantize activations to FP4, so its
 * results are those of the weights alone, not the checkpoint's W4A4 emulation.
 */
#ifndef METRALE_MODEL_HF_NVFP4_H
#define METRALE_MODEL_HF_NVFP4_H

#include <stdbool.h>
#include <stddef.h>

#include "model_hf.h"

#include "metrale/ops_nvfp4.h"
#include "metrale/safetensors.h"

/* Whether the tensor name `name` ends in one of the convention's quantization suffixes
 * (weight_scale, weight_scale_2, input_scale, weight_packed, ...; not `.weight`); if so
 * *base_len is the length of its linear's base name. */
bool mg_fwd_hf_nvfp4_suffix(mg_fwd_nvfp4_convention conv, const char *name, size_t *base_len);

/* Checks linear `base` of [rows, cols]: *quantized says whether it is NVFP4 (then its
 * tensors are checked by the importer, and the input scale as above) or float (then the
 * caller checks base.weight). One-line errors name dir and the tensor. */
mg_status mg_fwd_hf_nvfp4_check(const mg_st_model *st, const char *dir,
                                mg_fwd_nvfp4_convention conv, bool input_scales, const char *base,
                                uint64_t rows, uint64_t cols, bool *quantized);

/* Uploads quantized linear `base` (checked) as one device allocation at out->values: the
 * prepared values, the prepared scales (out->scales) and the FP32 global (out->global_scale),
 * so that freeing out->values frees it all. Adds its bytes to *bytes. On failure out is
 * zeroed and nothing stays allocated. */
mg_status mg_fwd_hf_nvfp4_upload(mg_backend *b, const mg_st_model *st, const char *dir,
                                 mg_fwd_nvfp4_convention conv, const char *base,
                                 mg_nvfp4_weight *out, uint64_t *bytes);

#endif
