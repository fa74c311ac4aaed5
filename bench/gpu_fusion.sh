#!/usr/bin/env bash
# gpu_fusion.sh - one GPU call for the fused decode step (the decode GEMV's RMSNorm prologue and
# residual-add / SiLU-mul epilogues, used by the forward pass's decode steps), on binaries built
# elsewhere (bin/ of $G/pack.tar.xz, bench/pack.sh):
#   correctness: `check` (the gemm/fusion_* checks now run on CUDA), test_forward_cuda (the
#   fused step against the CPU in lockstep, graph = eager), tests/run_compare_cuda.sh, `run
#   --compare` of the tiny preset fused at batch 1, 4, 8 and 16 and unfused;
#   speed: `run --json` of llama-3.2-1b and llama-3-8b (BF16 and FP8) fused and --no-fusion, and the
#   torch.compile peer (the project's h200_compile_decode.py, carried as
#   $G/h200_compile_decode.py; PEER_SHAPES, default "1,512 8,512": batch,context pairs, or
#   "none") in the
#   same call;
#   compute-sanitizer memcheck and racecheck on the fusion checks and on a fused tiny run.
# ONLY=speed runs the speed steps alone (the runs and the peer), for a second sample.
# $OUT gets summary.txt, runs.json, peers_compile.json and logs.tgz.
set -uo pipefail
G=${G:-.gpu-fusion}
OUT=${OUT:-/tmp/metrale-gpu-fusion}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start fusion "fused decode step"
TAIL=3
CS="compute-sanitizer --report-api-errors no --error-exitcode 9"
if [ "${ONLY:-}" != speed ]; then
step check timeout 150 "$BIN/metrale-gpu" --backend cuda check
grep -E " (FAIL|fail) |fusion_" "$L/check.txt" | cut -c1-400 >> "$S"
tail -n 1 "$L/check.txt" >> "$S"
step test_forward_cuda timeout 150 "$BIN/test_forward_cuda"
grep -E "^(tiny|small)" "$L/test_forward_cuda.txt" | cut -c1-300 >> "$S"
step run_compare_cuda timeout 150 bash tests/run_compare_cuda.sh "$BIN/metrale-gpu"
for b in 1 4 8 16; do
  step "compare_tiny_b$b" timeout 60 "$BIN/metrale-gpu" --backend cuda run --preset tiny --batch "$b" --steps 8 --compare
done
step compare_tiny_unfused timeout 60 "$BIN/metrale-gpu" --backend cuda run --preset tiny --steps 8 --compare --no-fusion
grep -h -E "AGREE|DISAGREE|decode GEMMs" "$L"/compare_tiny_*.txt >> "$S"
fi
runs=()
for spec in "llama-3.2-1b 1 bf16" "llama-3-8b 1 bf16" "llama-3-8b 8 bf16" "llama-3-8b 16 bf16" \
            "llama-3.2-1b 1 fp8" "llama-3-8b 1 fp8" "llama-3-8b 8 fp8"; do
  set -- $spec
  for fusion in fused unfused; do
    name="run_${1}_b${2}_${3}_${fusion}"
    flag=(); [ "$fusion" = unfused ] && flag=(--no-fusion)
    step "$name" timeout 120 "$BIN/metrale-gpu" --backend cuda --json run --preset "$1" --batch "$2" --weights "$3" --steps 64 "${flag[@]}"
    runs+=("$name")
  done
done
collect_runs "${runs[@]}" > "$OUT/runs.json"
print_runs "$OUT/runs.json" kernels_per_step fused_decode fused_qkv fused_kv_append | tee -a "$S"
if [ "${ONLY:-}" != speed ]; then
step memcheck_fusion timeout 120 $CS --tool memcheck "$BIN/metrale-gpu" --backend cuda check gemm/fusion
step racecheck_fusion timeout 120 $CS --tool racecheck "$BIN/metrale-gpu" --backend cuda check gemm/fusion
step memcheck_run timeout 90 $CS --tool memcheck "$BIN/metrale-gpu" --backend cuda run --preset tiny --batch 3 --steps 4
step memcheck_run_fp8 timeout 90 $CS --tool memcheck "$BIN/metrale-gpu" --backend cuda run --preset tiny --weights fp8 --batch 1 --steps 4
step racecheck_run_fp8 timeout 90 $CS --tool racecheck "$BIN/metrale-gpu" --backend cuda run --preset tiny --weights fp8 --batch 2 --steps 2
step racecheck_run timeout 90 $CS --tool racecheck "$BIN/metrale-gpu" --backend cuda run --preset tiny --batch 3 --steps 2
grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" "$L"/memcheck_*.txt "$L"/racecheck_*.txt >> "$S"
fi
if [ -f "$G/h200_compile_decode.py" ] && [ "${PEER_SHAPES:-}" != none ]; then
  step peers_compile timeout 230 python3 "$G/h200_compile_decode.py" ${PEER_SHAPES:-1,512 8,512}
  tail -n 6 "$L/peers_compile.txt" >> "$S"
  cp "$L/peers_compile.txt" "$OUT/peers_compile.txt"
fi
tar czf "$OUT/logs.tgz" -C "$L" .
