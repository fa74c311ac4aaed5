#!/usr/bin/env bash
# gpu_pdl.sh - one GPU call for programmatic dependent launch (PDL) in the op layer, on binaries
# built elsewhere (bin/ of $G/pack.tar.xz, as gpu_checks.sh):
#   MODE=checks  the CUDA checks with PDL on (every op kernel launched programmatically):
#                `check`, the CUDA test programs, `run --compare` on the tiny presets in every
#                weight format, compute-sanitizer memcheck and racecheck on a tiny run and on the
#                op checks of the small kernels, and a captured decode step against eager;
#   MODE=speed   the forward passes with PDL on and off (METRALE_PROGRAMMATIC_LAUNCH=0, the same
#                binary), and the PyTorch peers in the same call: CUDA graphs
#                (bench/peers/peers_forward.py) and torch.compile mode="reduce-overhead" (the
#                project's h200_compile_decode.py, carried as $G/h200_compile_decode.py).
# $OUT gets summary.txt, runs.json (speed), peers_*.json and logs.tgz.
set -uo pipefail
G=${G:-.gpu-pdl}
MODE=${MODE:-checks}
OUT=${OUT:-/tmp/metrale-gpu-pdl}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start pdl "mode $MODE"
TAIL=4
CS="compute-sanitizer --report-api-errors no --error-exitcode 9"
if [ "$MODE" = checks ]; then
  step check timeout 300 "$BIN/metrale-gpu" --backend cuda check
  grep -E " (FAIL|fail) " "$L/check.txt" >> "$S"
  tail -n 1 "$L/check.txt" >> "$S"
  for t in test_forward_cuda test_cuda_graph test_kv_cache_cuda test_sample; do
    step "$t" timeout 240 "$BIN/$t"
  done
  step run_compare_cuda timeout 200 bash tests/run_compare_cuda.sh "$BIN/metrale-gpu"
  for w in bf16 fp8 nvfp4 mlx4; do
    step "compare_moe_$w" timeout 60 "$BIN/metrale-gpu" --backend cuda run --preset tiny-moe --weights "$w" --steps 8 --compare
  done
  step memcheck_run timeout 200 $CS --tool memcheck "$BIN/metrale-gpu" --backend cuda run --preset tiny --steps 4
  step racecheck_run timeout 200 $CS --tool racecheck "$BIN/metrale-gpu" --backend cuda run --preset tiny --steps 2
  for g in elementwise activation kv_cache attention; do
    step "memcheck_check_$g" timeout 150 $CS --tool memcheck "$BIN/metrale-gpu" --backend cuda check "$g"
  done
  for g in elementwise kv_cache; do
    step "racecheck_check_$g" timeout 150 $CS --tool racecheck "$BIN/metrale-gpu" --backend cuda check "$g"
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$L"/memcheck_*.txt "$L"/racecheck_*.txt | tail -12 >> "$S"
else
  runs=()
  for spec in "llama-3.2-1b bf16 1" "llama-3-8b bf16 1" "llama-3-8b bf16 8" "llama-3-8b fp8 1" "llama-3-8b nvfp4 1"; do
    set -- $spec
    for pdl in 1 0; do
      name="run_${1}_${2}_b${3}_pdl${pdl}"
      step "$name" env METRALE_PROGRAMMATIC_LAUNCH=$pdl timeout 120 "$BIN/metrale-gpu" --backend cuda --json run --preset "$1" --weights "$2" --batch "$3" --steps 64
      runs+=("$name")
    done
  done
  collect_runs "${runs[@]}" > "$OUT/runs.json"
  print_runs "$OUT/runs.json" kernels_per_step programmatic_launch | tee -a "$S"
  step peers_graphs timeout 200 python3 bench/peers/peers_forward.py --out "$OUT/peers_forward.json" --batches 1,8
  tail -n 6 "$L/peers_graphs.txt" >> "$S"
  if [ -f "$G/h200_compile_decode.py" ]; then
    step peers_compile timeout 280 python3 "$G/h200_compile_decode.py" 1,512 8,512
    tail -n 6 "$L/peers_compile.txt" >> "$S"
  fi
fi
tar czf "$OUT/logs.tgz" -C "$L" .
