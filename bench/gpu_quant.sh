#!/usr/bin/env bash
# gpu_quant.sh - one GPU call for the quantized GEMMs at 1 to 512 tokens (NVFP4's two kernel
# families: up to 16 tokens per group, and the tile family from 17), on binaries built elsewhere
# (bin/ of $G/pack.tar.xz, bench/pack.sh BUILD $G test_nvfp4_gemm test_nvfp4_moe_cuda):
#   correctness: test_nvfp4_gemm (every M of the issue's list against float64, graph replay =
#   eager), test_nvfp4_moe_cuda, `check nvfp4_gemm`, `run --compare` of the tiny preset with
#   NVFP4 weights at batch 1, 4, 24 and 40 (prefills of 54-540 tokens, decode M of 24 and 40),
#   compute-sanitizer memcheck and racecheck on `check nvfp4_gemm`;
#   speed: `bench nvfp4` dense at M 1-512 (our kernels forced beside the automatic choice from
#   128 rows), the small-tile family forced at 17-64 rows (METRALE_NVFP4_TILE=16) for the
#   crossover, the grouped cases, and bench/peers/peers_nvfp4.py (torch BF16, int4, grouped)
#   in the same call; `run --json` of the 8B-shaped model with NVFP4 weights at batch 32 and 64,
#   automatic and with the small-tile family forced.
# M (default 1,16,17,32,64,128,256,512) sets the dense token counts; ONLY=speed skips the
# correctness steps, ONLY=correctness runs only them (SANITIZE=0: without compute-sanitizer;
# COMPARE_BATCHES: the `run --compare` batches, default "1 4 24 40"); SWEEP="R,G ..." also
# times the tile family with each CTA shape forced (METRALE_NVFP4_TILE_SHAPE) at SWEEP_M tokens. $OUT gets summary.txt, nvfp4*.metrale.json, nvfp4.peers.json, logs.tgz.
set -uo pipefail
G=${G:-.gpu-quant}
OUT=${OUT:-/tmp/metrale-gpu-quant}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start quant "quantized GEMMs, 1 to 512 tokens"
TAIL=4
M=${M:-1,16,17,32,64,128,256,512}
MG="$BIN/metrale-gpu"
CS="compute-sanitizer --report-api-errors no --error-exitcode 9"
if [ "${ONLY:-}" != speed ]; then
  step test_nvfp4_gemm timeout 240 "$BIN/test_nvfp4_gemm"
  step test_nvfp4_moe_cuda timeout 120 "$BIN/test_nvfp4_moe_cuda"
  step check_nvfp4 timeout 120 "$MG" --backend cuda check nvfp4_gemm
  grep -E " (FAIL|fail) |passed" "$L/check_nvfp4.txt" | cut -c1-300 >> "$S"
  for b in ${COMPARE_BATCHES:-1 4 24 40}; do
    step "compare_tiny_nvfp4_b$b" timeout 90 "$MG" --backend cuda run --preset tiny --weights nvfp4 --batch "$b" --steps 8 --compare
  done
  grep -h -E "AGREE|DISAGREE" "$L"/compare_tiny_*.txt >> "$S"
  if [ "${SANITIZE:-1}" != 0 ]; then
    step memcheck_nvfp4 timeout 150 $CS --tool memcheck "$MG" --backend cuda check nvfp4_gemm
    step racecheck_nvfp4 timeout 150 $CS --tool racecheck "$MG" --backend cuda check nvfp4_gemm
    grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY" "$L"/memcheck_*.txt "$L"/racecheck_*.txt >> "$S"
  fi
fi
if [ "${ONLY:-}" = correctness ]; then
  tar czf "$OUT/logs.tgz" -C "$L" .
  exit 0
fi
step bench_dense timeout 200 "$MG" --backend cuda bench nvfp4 --only dense --m "$M" --json-out "$OUT/nvfp4_dense.metrale.json"
grep -E "^\|? *nvfp4|dense" "$L/bench_dense.txt" | cut -c1-200 >> "$S"
step bench_dense_small_tile env METRALE_NVFP4_TILE=16 timeout 120 "$MG" --backend cuda bench nvfp4 --only dense --m 17,32,64 --suffix _t16 --json-out "$OUT/nvfp4_dense_t16.metrale.json"
grep -E "dense" "$L/bench_dense_small_tile.txt" | cut -c1-200 >> "$S"
# The tile family's CTA shapes forced one by one (rows per CTA, K groups), for the choice's rule.
if [ -n "${SWEEP:-}" ]; then
  for shape in $SWEEP; do
    step "sweep_${shape/,/_}" env METRALE_NVFP4_TILE_SHAPE="$shape" timeout 60 "$MG" --backend cuda bench nvfp4 --only dense --m "${SWEEP_M:-17,32,64,128,256}" --suffix "_${shape/,/_}" --json-out "$OUT/nvfp4_sweep_${shape/,/_}.metrale.json"
    grep -E "dense" "$L/sweep_${shape/,/_}.txt" | awk '{print $2, $3, $8}' | tr '\n' ' ' >> "$S"; echo >> "$S"
  done
fi
step bench_moe timeout 200 "$MG" --backend cuda bench nvfp4 --only moe --json-out "$OUT/nvfp4_moe.metrale.json"
grep -E "moe" "$L/bench_moe.txt" | cut -c1-200 >> "$S"
# The 8B-shaped model's NVFP4 decode step at batch 32 and 64 (its GEMMs at M = 32, 64), with the
# automatic choice and with the small-tile family forced.
runs=()
for b in 32 64; do
  for fam in auto t16; do
    name="run_8b_nvfp4_b${b}_${fam}"
    envs=(); [ "$fam" = t16 ] && envs=(METRALE_NVFP4_TILE=16)
    step "$name" env "${envs[@]}" timeout 120 "$MG" --backend cuda --json run --preset llama-3-8b --weights nvfp4 --batch "$b" --prompt-len 32 --steps 32
    runs+=("$name")
  done
done
collect_runs "${runs[@]}" > "$OUT/runs.json"
print_runs "$OUT/runs.json" | tee -a "$S"
step peers_nvfp4 timeout 240 python3 bench/peers/peers_nvfp4.py --out "$OUT/nvfp4.peers.json" --m "$M"
tail -n 40 "$L/peers_nvfp4.txt" >> "$S"
tar czf "$OUT/logs.tgz" -C "$L" . && (cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
