#!/usr/bin/env bash
# gpu_forward_table.sh - the forward table of the fused-decode issue in one GPU call, on binaries
# built elsewhere (bin/ of $G/pack.tar.xz, bench/pack.sh): `run --json` of the model-shaped
# presets in every weight format they take, and both PyTorch peers in the same call:
#   PyTorch + CUDA graphs over the same weights (bench/peers/peers_forward.py, batches 1, 8, 64);
#   torch.compile reduce-overhead, the gpt-fast way ($G/h200_compile_decode.py, the project's
#   peer script carried beside the pack; PEER_SHAPES, default "1,512 8,512", or "none").
# Each run's setup time is in its JSON (setup_s): the 30B-A3B NVFP4 setup is one of the targets.
# RUNS overrides the list of "preset batch weights" triples (space-separated, triples joined by
# commas); MLX=1 adds the 8B preset with MLX 4- and 8-bit weights quantized at load at batch 1
# and 8, after `run --compare` of the tiny preset's (batch 1 and 4) against the CPU.
# $OUT gets summary.txt, runs.json, peers_forward.json, peers_compile.txt and logs.tgz.
set -uo pipefail
G=${G:-.gpu-table}
OUT=${OUT:-/tmp/metrale-gpu-table}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start table "forward table with both PyTorch peers"
TAIL=2
default_runs="llama-3-8b 1 bf16,llama-3-8b 8 bf16,llama-3-8b 64 bf16,llama-3-8b 1 fp8,\
llama-3-8b 8 fp8,llama-3-8b 1 nvfp4,llama-3-8b 8 nvfp4,llama-3.2-1b 1 bf16"
[ "${MLX:-0}" = 1 ] && default_runs="$default_runs,llama-3-8b 1 mlx4,llama-3-8b 8 mlx4,\
llama-3-8b 1 mlx8,llama-3-8b 8 mlx8"
# the 30B-A3B runs last: their setup is the slowest part of the call
default_runs="$default_runs,qwen3-30b-a3b 1 bf16,qwen3-30b-a3b 1 nvfp4"
IFS=, read -r -a specs <<< "${RUNS:-$default_runs}"
if [ "${MLX:-0}" = 1 ]; then
  for w in mlx4 mlx8; do
    for b in 1 4; do
      step "compare_tiny_${w}_b$b" timeout 60 "$BIN/metrale-gpu" --backend cuda run --preset tiny \
        --weights "$w" --batch "$b" --steps 8 --compare
    done
  done
  grep -h -E "AGREE|DISAGREE" "$L"/compare_tiny_*.txt >> "$S"
fi
runs=()
run_one() { # run_one PRESET BATCH WEIGHTS
  local name="run_${1}_b${2}_${3}"
  step "$name" timeout "${RUN_TIMEOUT:-150}" "$BIN/metrale-gpu" --backend cuda --json run \
    --preset "$1" --batch "$2" --weights "$3" --steps 64
  runs+=("$name")
  collect_runs "${runs[@]}" > "$OUT/runs.json" # kept current: a timed-out call keeps what ran
}
peers_done=0
for spec in "${specs[@]}"; do
  set -- $spec
  if [ "$1" = qwen3-30b-a3b ] && [ $peers_done = 0 ]; then
    peers_done=1 # the peers before the long 30B setups
    step peers_forward timeout 200 python3 bench/peers/peers_forward.py --out "$OUT/peers_forward.json" \
      --preset llama-3-8b --batches 1,8,64
    if [ -f "$G/h200_compile_decode.py" ] && [ "${PEER_SHAPES:-}" != none ]; then
      step peers_compile timeout 240 python3 "$G/h200_compile_decode.py" ${PEER_SHAPES:-1,512 8,512}
      cp "$L/peers_compile.txt" "$OUT/peers_compile.txt"
    fi
  fi
  run_one "$1" "$2" "$3"
done
print_runs "$OUT/runs.json" kernels_per_step kernels_per_layer kernels_outside_layers setup_s fused_decode | tee -a "$S"
[ -f "$L/peers_compile.txt" ] && tail -n 6 "$L/peers_compile.txt" >> "$S"
tar czf "$OUT/logs.tgz" -C "$L" .
