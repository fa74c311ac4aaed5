#!/usr/bin/env bash
# gpu_smollm2.sh - the real model on the GPU, on binaries built elsewhere (bin/ of
# $G/pack.tar.xz, as gpu_pdl.sh): SmolLM2-135M-Instruct (Q4_1 GGUF, scripts/fetch_smollm2.sh),
# carried in pieces since the file is larger than one call's carry ($M/smollm2.gguf.part*, over
# two calls: the machine keeps an earlier call's ignored files while it stays warm), checked
# against the fetch script's sha256; then on the CUDA backend:
#   - teacher-forced against mlx-lm's float32 logits (tests/model/compare.py; the reference
#     cases of smollm2_reference_files carried as $M/ref/);
#   - the chat answer of `make run` (greedy), text and --json;
#   - decode speed (32 prompt tokens, 256 steps, --json) against transformers on the same GPU
#     (bench/peers/smollm2_hf_decode.py; the gguf wheel carried in $M/whl/).
# $OUT gets summary.txt, runs.json, peer_hf.json and logs.tgz.
set -uo pipefail
G=${G:-.gpu-pdl}
M=${M:-.gpu-model}
OUT=${OUT:-/tmp/metrale-gpu-smollm2}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start smollm2
if ! gpu_smollm2_model "$M"; then
  echo "the model's pieces are missing or incomplete ($(ls "$M" 2>&1 | tr '\n' ' '))" | tee -a "$S"
  exit 3
fi
echo "model: sha256 $MODEL_SHA256" | tee -a "$S"
step compare_mlx_lm timeout 300 python3 tests/model/compare.py "$BIN/metrale-gpu" "$MODEL" "$M/ref" --backend cuda
tail -n 3 "$L/compare_mlx_lm.txt" >> "$S"
step chat timeout 120 "$BIN/metrale-gpu" --backend cuda run --model "$MODEL" --chat "What is the capital of France?"
step chat_json timeout 120 "$BIN/metrale-gpu" --backend cuda --json run --model "$MODEL" --chat "What is the capital of France?"
ids=$(python3 -c 'import random; random.seed(1); print(",".join(str(random.randrange(1000, 40000)) for _ in range(32)))')
runs=()
for pdl in 1 0; do
  step "decode_pdl$pdl" env METRALE_PROGRAMMATIC_LAUNCH=$pdl timeout 120 "$BIN/metrale-gpu" --backend cuda --json run --model "$MODEL" --prompt-ids "$ids" --steps 256
  runs+=("decode_pdl$pdl")
done
collect_runs chat_json "${runs[@]}" > "$OUT/runs.json"
print_runs "$OUT/runs.json" kernels_per_step text | tee -a "$S"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$M"/whl/*.whl \
  && step peer_hf env PYTHONPATH=/tmp/site timeout 400 python3 bench/peers/smollm2_hf_decode.py "$MODEL" "$OUT/peer_hf.json" 32 256
tail -n 3 "$L/peer_hf.txt" >> "$S"
tar czf "$OUT/logs.tgz" -C "$L" .
