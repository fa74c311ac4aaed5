#!/usr/bin/env bash
# gpu_nvfp4_ab.sh - one GPU call for a change to the NVFP4 decode GEMMs: the changed build's
# correctness (bench/gpu_quant.sh's steps, ONLY=correctness: test_nvfp4_gemm,
# test_nvfp4_moe_cuda, `check nvfp4_gemm`, `run --compare` of the tiny preset, memcheck and
# racecheck), then its speed against a baseline CLI in the same call, alternated so that clocks
# and neighbours affect both alike:
#   `bench nvfp4 --only dense --m $M` twice each (new, base, new, base), once each with
#   programmatic dependent launch off; `run --json` of the 8B-shaped model with NVFP4 weights at
#   batch 1 twice each.
# Inputs: $G/pack.tar.xz of the changed build (bench/pack.sh BUILD $G test_nvfp4_gemm
# test_nvfp4_moe_cuda) and $G/baseline/metrale-gpu.xz (the baseline build's CLI, stripped; the
# library is linked into it, the plugins come from the pack). $OUT gets summary.txt,
# correctness/, json.tgz (*.metrale.json, runs.json) and logs.tgz. SANITIZE=0 and
# COMPARE_BATCHES pass to gpu_quant.sh (a shorter call when device time is short).
set -uo pipefail
G=${G:-.gpu-quant}
OUT=${OUT:-/tmp/metrale-gpu-nvfp4-ab}
M=${M:-1,8,16}
mkdir -p "$OUT/correctness"
OUT="$OUT/correctness" ONLY=correctness G="$G" bash "$(dirname "${BASH_SOURCE[0]}")/gpu_quant.sh"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start nvfp4-ab "NVFP4 decode GEMMs, changed build against a baseline CLI"
TAIL=2
xz -dc "$G/baseline/metrale-gpu.xz" > "$W/metrale-gpu-base" && chmod +x "$W/metrale-gpu-base"
declare -A CLI=([new]="$BIN/metrale-gpu" [base]="$W/metrale-gpu-base")
for round in 1 2; do
  for v in new base; do
    step "bench_${v}_$round" timeout 120 "${CLI[$v]}" --backend cuda bench nvfp4 --only dense --m "$M" --json-out "$OUT/${v}_$round.metrale.json"
    grep -E "dense" "$L/bench_${v}_$round.txt" | cut -c1-160 >> "$S"
  done
done
for v in new base; do
  step "bench_${v}_nopdl" env METRALE_PROGRAMMATIC_LAUNCH=0 timeout 120 "${CLI[$v]}" --backend cuda bench nvfp4 --only dense --m "$M" --json-out "$OUT/${v}_nopdl.metrale.json"
  grep -E "dense" "$L/bench_${v}_nopdl.txt" | cut -c1-160 >> "$S"
done
runs=()
for round in 1 2; do
  for v in new base; do
    name="run_8b_b1_${v}_$round"
    step "$name" timeout 120 "${CLI[$v]}" --backend cuda --json run --preset llama-3-8b --weights nvfp4 --batch 1 --prompt-len 32 --steps 64
    runs+=("$name")
  done
done
collect_runs "${runs[@]}" > "$OUT/runs.json"
print_runs "$OUT/runs.json" | tee -a "$S"
tar czf "$OUT/logs.tgz" -C "$L" .
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
