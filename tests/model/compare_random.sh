#!/usr/bin/env bash
# ctest random_models_vs_reference: tests/model/compare.py on every form of every random model
# that tests/model/random_models.py wrote into REF_DIR (the Hugging Face directory, the GGUF file,
# the MLX directories, each against the reference's logits of the network that form holds), or
# skip (77) with the reason setup_random.sh recorded.
#   compare_random.sh METRALE_GPU REF_DIR BACKEND
# Bounds (compare.py's rule: |ours - reference| <= ABS + REL * the step's largest |logit| for
# every one of our top logits; greedy tokens equal where the reference's margin exceeds that):
# REL 0.04, ABS 0.05. The reference is float32 on the same weights; the runtime rounds every
# activation to BF16 (relative 2^-9) through 2-3 layers, and the F32 model's weights once to
# BF16. Measured on the CPU backend on 2026-12-01 over the 13 forms (20 steps each): largest
# relative error 0.0245 (the F32 Llama, whose weights the runtime rounds), 0.008-0.019 for the
# rest (Qwen3-MoE 0.0185), largest absolute 0.24 on logits up to about 12. REL is SmolLM2's bound (compare.py),
# 1.6 times the largest seen; ABS covers steps whose logits are all small. Each mistake tried
# by hand failed every step of the forms concerned: q/k head norms skipped, biases skipped, the
# GGUF Q/K permutation not undone (llama) or undone where there is none (qwen2, qwen3), the
# nested rope_parameters theta ignored, the experts' top-k weights not renormalized.
# The NVFP4 forms (ModelOpt and compressed-tensors directories of four of the models, every
# layer linear quantized, k and v with different globals) run against the reference on the
# exactly dequantized weights as F32: the runtime decodes the same weights exactly, so the error
# sources are those of the BF16 forms (BF16 activations; no weight rounding at all), and the same
# bounds hold. Measured on the CPU backend on 2026-12-06 (20 steps each): largest relative error
# 0.0166 (Llama, ModelOpt, float LM head), 0.0117 (Mistral, compressed-tensors W4A16, tied),
# 0.0081 (Qwen2, compressed-tensors, NVFP4 LM head), 0.0078 (Qwen3, hf_quant_config.json);
# largest absolute 0.166. Mistakes tried by hand fail every NVFP4 form concerned by 0.30 to 0.84
# relative: v run with k's global (the joined kv weight's single global), compressed-tensors'
# global taken as the multiplier instead of its reciprocal, the unquantized model's logits.
# transformers as the reference (random_models.py --reuse --reference transformers: 5.24.0 on
# PyTorch 2.11.0 in float32 on the CPU, 2026-12-01; too large a download for CI) agreed with
# mlx-lm within 3.5e-5 on every logit of the forms it reads (the HF and decoded GGUF
# directories), so the errors against it are the ones above.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=$1 ref=$2 backend=$3
if [ -f "$ref/SKIP" ]; then
  echo "skipped: $(cat "$ref/SKIP")"
  exit 77
fi
py=${PYTHON:-"$root/.venv-model/bin/python"} # PYTHON: another interpreter (the GPU machine)
status=0 forms=0
for name in $(cat "$ref/models"); do
  for form in $(cat "$ref/$name/forms"); do
    case $form in
      hf) model=$ref/$name/hf expected=$ref/$name/hf ;;
      gguf) model=$ref/$name/gguf/model.gguf expected=$ref/$name/gguf/ref ;;
      mlx* | nvfp4*) model=$ref/$name/$form/model expected=$ref/$name/$form ;;
    esac
    echo "== $name $form: $model against $expected"
    "$py" "$root/tests/model/compare.py" "$cli" "$model" "$expected" --backend "$backend" \
      --rel-bound 0.04 --abs-bound 0.05 || status=1
    forms=$((forms + 1))
  done
done
echo "$forms forms compared"
exit $status
