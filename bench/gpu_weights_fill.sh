#!/usr/bin/env bash
# gpu_weights_fill.sh - one GPU call (or part of one) for the synthetic weights made on the
# device (mg_fill_uniform_bf16, mg_amax_bf16): test_fill_cuda (every value against the host's
# definition), `run --compare` of the tiny presets in BF16 and NVFP4 (the CPU reference
# generates the same weights on the host side of its backend), and the setup time of the large
# presets: 8B BF16 and NVFP4, 30B-A3B BF16 and NVFP4 (`run --json`, setup_s).
# Inputs: $G/pack.tar.xz (bench/pack.sh BUILD $G test_fill_cuda ...). $OUT gets summary.txt
# (appended when another script began it) and setup_runs.json.
set -uo pipefail
G=${G:-.gpu-fill}
OUT=${OUT:-/tmp/metrale-gpu-fill}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start fill "synthetic weights generated on the device"
TAIL=3
MG="$BIN/metrale-gpu"
step test_fill_cuda timeout 60 "$BIN/test_fill_cuda"
for preset in tiny tiny-moe; do
  for w in bf16 nvfp4; do
    step "compare_${preset}_$w" timeout 60 "$MG" --backend cuda run --preset "$preset" \
      --weights "$w" --steps 8 --compare
  done
done
grep -h -E "AGREE|DISAGREE" "$L"/compare_*.txt >> "$S"
runs=()
for spec in "llama-3-8b bf16" "llama-3-8b nvfp4" "qwen3-30b-a3b nvfp4" "qwen3-30b-a3b bf16"; do
  set -- $spec
  name="setup_${1}_$2"
  step "$name" timeout 120 "$MG" --backend cuda --json run --preset "$1" --weights "$2" --steps 16
  runs+=("$name")
  collect_runs "${runs[@]}" > "$OUT/setup_runs.json"
done
print_runs "$OUT/setup_runs.json" setup_s | tee -a "$S"
tar czf "$OUT/fill_logs.tgz" -C "$L" .
