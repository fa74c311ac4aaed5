#!/usr/bin/env bash
# gpu_mlx_ab.sh - one GPU call for a change to the MLX decode GEMVs: the changed build's
# correctness, then its speed against a baseline CLI in the same call.
#   correctness: test_cuda_mlx (both CUDA providers forced in turn against the CPU reference,
#   the SiLU-mul epilogue included), `check mlx`, `run --compare` of the tiny preset (weights quantized at
#   load) and of the micro preset (its committed MLX checkpoints) at 4 and 8 bits;
#   speed: `run --json` of the 8B-shaped model with MLX 4/8-bit weights at batch 1 and 8, new
#   and base alternated (twice each at batch 1); `bench mlx` of the decode MLP's two forms
#   (gate_up + silu_gate, gate_up_silu + the plain down GEMV) on the new build;
#   compute-sanitizer memcheck and racecheck on test_cuda_mlx (SANITIZE=0 skips them); last, ncu's
#   sections of two GEMV launches (PROFILE=0 skips them).
# Inputs: $G/pack.tar.xz of the changed build (bench/pack.sh BUILD $G test_cuda_mlx) and
# $G/baseline/metrale-gpu.xz (the baseline build's CLI, stripped; the library is linked into
# it, the plugins come from the pack). $OUT gets summary.txt, runs.json, json.tgz (the bench
# rows' *.metrale.json) and logs.tgz. ROUNDS (default 2) of the batch-1 runs; SANITIZE=memcheck
# runs memcheck alone; PROFILE_CASES picks the ncu launches (bench case:kernel).
set -uo pipefail
G=${G:-.gpu-mlx-ab}
OUT=${OUT:-/tmp/metrale-gpu-mlx-ab}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start mlx-ab "MLX decode GEMVs, changed build against a baseline CLI"
TAIL=3
MG="$BIN/metrale-gpu"
export METRALE_MLX_CHECKPOINTS=${METRALE_MLX_CHECKPOINTS:-$PWD/tests/mlx/checkpoints}
xz -dc "$G/baseline/metrale-gpu.xz" > "$W/metrale-gpu-base" && chmod +x "$W/metrale-gpu-base"
declare -A CLI=([new]="$MG" [base]="$W/metrale-gpu-base")

step test_cuda_mlx timeout 240 "$BIN/test_cuda_mlx"
grep -E "passed|FAIL" "$L/test_cuda_mlx.txt" | head -5 >> "$S"
step check_mlx timeout 120 "$MG" --backend cuda check mlx
grep -E "^mlx/|passed" "$L/check_mlx.txt" | cut -c1-200 >> "$S"
for preset in tiny micro; do
  for w in mlx4 mlx8; do
    for b in 1 8; do
      step "compare_${preset}_${w}_b$b" timeout 60 "$MG" --backend cuda run --preset "$preset" \
        --weights "$w" --batch "$b" --steps 8 --compare
    done
  done
done
grep -h -E "AGREE|DISAGREE" "$L"/compare_*.txt >> "$S"

runs=()
run_one() { # run_one NAME CLI WEIGHTS BATCH
  step "$1" timeout 120 "$2" --backend cuda --json run --preset llama-3-8b --weights "$3" \
    --batch "$4" --steps 64
  runs+=("$1")
  collect_runs "${runs[@]}" > "$OUT/runs.json"
}
for w in mlx4 mlx8; do
  for round in $(seq "${ROUNDS:-2}"); do
    for v in new base; do
      run_one "run_8b_${w}_b1_${v}_$round" "${CLI[$v]}" "$w" 1
    done
  done
  for v in new base; do
    run_one "run_8b_${w}_b8_${v}" "${CLI[$v]}" "$w" 8
  done
done
print_runs "$OUT/runs.json" kernels_per_layer | tee -a "$S"

for only in silu_gate gate_up x4096x14336; do
  step "bench_$only" timeout 120 "$MG" --backend cuda bench mlx --only "$only" \
    --json-out "$OUT/mlx_$only.metrale.json"
  grep -E "^mlx" "$L/bench_$only.txt" | cut -c1-200 >> "$S"
done

if [ "${SANITIZE:-1}" != 0 ]; then
  CS="compute-sanitizer --report-api-errors no --error-exitcode 9"
  step memcheck_mlx timeout 120 $CS --tool memcheck "$BIN/test_cuda_mlx"
  [ "${SANITIZE:-1}" = memcheck ] || step racecheck_mlx timeout 100 $CS --tool racecheck "$BIN/test_cuda_mlx"
  grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$L"/memcheck_*.txt "$L"/racecheck_*.txt >> "$S"
fi
# Where a one-row GEMV's time goes (PROFILE=0 skips): ncu's sections for one launch of the SIMT
# kernel at 4 bits and of the tensor-core one at 8 rows, 14336x4096.
if [ "${PROFILE:-1}" != 0 ] && command -v ncu > /dev/null; then
  for c in ${PROFILE_CASES:-gemv_simt_4bit.1x14336x4096:mlx_gemv gemv_4bit.8x14336x4096:mlx_gemv_mma}; do
    step "ncu_${c%%:*}" timeout 120 ncu --clock-control none -k "regex:^${c##*:}\$" \
      --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
      --section LaunchStats "$MG" --backend cuda bench mlx --only "${c%%:*}"
  done
fi
tar czf "$OUT/logs.tgz" -C "$L" .
(cd "$OUT" && tar czf json.tgz *.metrale.json && rm -f *.metrale.json)
