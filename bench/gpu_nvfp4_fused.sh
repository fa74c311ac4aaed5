#!/usr/bin/env bash
# gpu_nvfp4_fused.sh - one GPU call for the NVFP4 fused GEMMs (mg_nvfp4_gemm_fused: the
# small-tile kernels with the RMSNorm prologue and the residual-add epilogue), on binaries built
# elsewhere (bin/ of $G/pack.tar.xz: bench/pack.sh BUILD $G test_nvfp4_gemm test_forward_cuda
# test_nvfp4_moe_cuda):
#   correctness: test_nvfp4_gemm (the fused calls against float64, graph replay = eager),
#   test_forward_cuda, test_nvfp4_moe_cuda, `run --compare` of the tiny preset with NVFP4 weights
#   at batch 1, 4 and 16 against the CPU, compute-sanitizer memcheck and racecheck of a tiny run;
#   speed: `run --json` of the 8B-shaped model with NVFP4 weights at batch 1 and 8 (twice each),
#   and `bench nvfp4 --only dense` at M 1, 8, 16, alternated with the CLIs of VARIANTS (below)
#   when given. (The model's decode step ran mg_nvfp4_gemm_fused in the builds measured in
#   bench/results/2026-12-07-h100-nvfp4-fused.md, with `--no-fusion` runs beside them; it was
#   slower, and the model no longer fuses NVFP4 layers.)
# $OUT gets summary.txt, runs.json, bench JSON and logs.tgz.
set -uo pipefail
G=${G:-.gpu-quant}
OUT=${OUT:-/tmp/metrale-gpu-nvfp4-fused}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start nvfp4-fused "NVFP4 fused GEMMs"
TAIL=3
MG="$BIN/metrale-gpu"
CS="compute-sanitizer --report-api-errors no --error-exitcode 9"
step test_nvfp4_gemm timeout 240 "$BIN/test_nvfp4_gemm"
step test_forward_cuda timeout 240 "$BIN/test_forward_cuda"
grep -E "nvfp4" "$L/test_forward_cuda.txt" | cut -c1-260 >> "$S"
step test_nvfp4_moe_cuda timeout 120 "$BIN/test_nvfp4_moe_cuda"
for b in 1 4 16; do
  step "compare_tiny_nvfp4_b$b" timeout 90 "$MG" --backend cuda run --preset tiny --weights nvfp4 --batch "$b" --steps 8 --compare
done
grep -h -E "AGREE|DISAGREE|fused" "$L"/compare_tiny_*.txt | cut -c1-200 >> "$S"
if [ "${SANITIZE:-1}" != 0 ]; then
  for tool in memcheck racecheck; do
    step "${tool}_fused" timeout 150 $CS --tool "$tool" "$MG" --backend cuda run --preset tiny --weights nvfp4 --batch 3 --steps 4
  done
  grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" "$L"/memcheck_*.txt "$L"/racecheck_*.txt >> "$S"
fi
runs=()
for round in 1 2; do
  for batch in 1 8; do
    name="run_8b_b${batch}_$round"
    step "$name" timeout 120 "$MG" --backend cuda --json run --preset llama-3-8b --weights nvfp4 --batch "$batch" --prompt-len 32 --steps 64
    runs+=("$name")
  done
done
collect_runs "${runs[@]}" > "$OUT/runs.json"
print_runs "$OUT/runs.json" kernels_per_step fused_decode | tee -a "$S"
# Other CLIs of the same kernels with the dependents released at another point ($G/NAME/
# metrale-gpu.xz for each NAME of VARIANTS, e.g. "v2 v3"), benched alternately with this build.
declare -A CLI=([new]="$MG")
for v in ${VARIANTS:-}; do
  [ -f "$G/$v/metrale-gpu.xz" ] && xz -dc "$G/$v/metrale-gpu.xz" > "$W/metrale-gpu-$v" && chmod +x "$W/metrale-gpu-$v" && CLI[$v]="$W/metrale-gpu-$v"
done
vruns=()
for round in 1 2; do
  for v in new ${VARIANTS:-}; do
    [ -n "${CLI[$v]:-}" ] || continue
    step "bench_${v}_$round" timeout 120 "${CLI[$v]}" --backend cuda bench nvfp4 --only dense --m 1,8,16 --json-out "$OUT/nvfp4_dense_${v}_$round.metrale.json"
    grep -E "dense" "$L/bench_${v}_$round.txt" | cut -c1-160 >> "$S"
    if [ -n "${VARIANTS:-}" ]; then
      step "run_8b_b1_unfused_${v}_$round" timeout 120 "${CLI[$v]}" --backend cuda --json run --preset llama-3-8b --weights nvfp4 --batch 1 --prompt-len 32 --steps 64 --no-fusion
      vruns+=("run_8b_b1_unfused_${v}_$round")
    fi
  done
done
if [ ${#vruns[@]} -gt 0 ]; then
  collect_runs "${vruns[@]}" > "$OUT/variant_runs.json"
  print_runs "$OUT/variant_runs.json" | tee -a "$S"
fi
tar czf "$OUT/logs.tgz" -C "$L" .
