#!/usr/bin/env bash
# gpu_mlx.sh - one GPU call for the MLX affine-quantized ops, on binaries built elsewhere (bin/
# of $G/pack.tar.xz, bench/pack.sh BUILD $G test_cuda_mlx):
#   correctness: test_cuda_mlx (both CUDA providers forced in turn against the CPU reference,
#   and the automatic choice), `check mlx`, `run --compare` of the micro preset on its
#   committed MLX checkpoints (mlx4, mlx8) at batch 1 and 8 (decode GEMVs at M = 1 and 8),
#   compute-sanitizer memcheck on test_cuda_mlx and racecheck on `check mlx`;
#   speed: `bench mlx` (the tensor-core GEMVs beside the SIMT ones forced, the GEMM path) and,
#   unless NO_PEERS=1, bench/peers/peers_mlx.py in the same call.
# ONLY=speed skips the correctness steps. $OUT gets summary.txt, mlx.metrale.json,
# mlx.peers.json, logs.tgz.
set -uo pipefail
G=${G:-.gpu-mlx}
OUT=${OUT:-/tmp/metrale-gpu-mlx}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start mlx "MLX affine GEMVs on tensor cores"
TAIL=4
MG="$BIN/metrale-gpu"
export METRALE_MLX_CHECKPOINTS=${METRALE_MLX_CHECKPOINTS:-$PWD/tests/mlx/checkpoints}
CS="compute-sanitizer --report-api-errors no --error-exitcode 9"
if [ "${ONLY:-}" != speed ]; then
  step test_cuda_mlx timeout 240 "$BIN/test_cuda_mlx"
  step check_mlx timeout 120 "$MG" --backend cuda check mlx
  grep -E " (FAIL|fail) |passed" "$L/check_mlx.txt" | cut -c1-300 >> "$S"
  for w in mlx4 mlx8; do
    for b in 1 8; do
      step "compare_micro_${w}_b$b" timeout 90 "$MG" --backend cuda run --preset micro --weights "$w" --batch "$b" --steps 8 --compare
    done
  done
  grep -h -E "AGREE|DISAGREE" "$L"/compare_micro_*.txt >> "$S"
  step memcheck_mlx timeout 200 $CS --tool memcheck "$BIN/test_cuda_mlx"
  step racecheck_mlx timeout 150 $CS --tool racecheck "$MG" --backend cuda check mlx
  grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" "$L"/memcheck_*.txt "$L"/racecheck_*.txt >> "$S"
  # racecheck reports hazards inside cuBLASLt's own GEMM kernels (nvjet_*, the GEMM path):
  # those apart, what is left is ours.
  echo "racecheck hazards outside cuBLASLt: $(grep -h "Race reported" "$L"/racecheck_*.txt | grep -vc nvjet)" >> "$S"
fi
step bench_mlx timeout 240 "$MG" --backend cuda bench mlx --json-out "$OUT/mlx.metrale.json"
grep -E "gemv|silu|gate_up|gemm" "$L/bench_mlx.txt" | cut -c1-200 >> "$S"
[ "${NO_PEERS:-}" = 1 ] || step peers_mlx timeout 240 python3 bench/peers/peers_mlx.py --out "$OUT/mlx.peers.json"
tar czf "$OUT/logs.tgz" -C "$L" .
