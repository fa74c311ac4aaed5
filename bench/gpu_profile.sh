#!/usr/bin/env bash
# gpu_profile.sh - one GPU call: where a decode step's time goes, kernel by kernel, on binaries
# built elsewhere (bin/ of $G/pack.tar.xz, bench/pack.sh).
# For each preset in PRESETS (default "llama-3-8b llama-3.2-1b"), batch 1:
#   `run --json --steps 64`, the graph-replayed step as the user gets it (the reference total);
#   the same run under Nsight Compute (`--steps 3`; each kernel node of the replayed graph
#   timed alone, gpu__time_duration, clocks left as the GPU sets them, caches flushed between
#   kernels as ncu does by default), summarised by bench/ncu_step_summary.py over the last
#   step: per kernel name, the count and the microseconds, and their sum against the replayed
#   step (the difference is what PDL overlap and launch gaps add or hide).
# $OUT gets summary.txt, runs.json, profile_<preset>.csv and logs.tgz.
set -uo pipefail
G=${G:-.gpu-profile}
OUT=${OUT:-/tmp/metrale-gpu-profile}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start profile "decode step, kernel by kernel"
TAIL=3
runs=()
for preset in ${PRESETS:-llama-3-8b llama-3.2-1b}; do
  step "run_$preset" timeout 90 "$BIN/metrale-gpu" --backend cuda --json run --preset "$preset" --steps 64 ${RUN_FLAGS:-}
  runs+=("run_$preset")
  step "ncu_$preset" timeout 240 ncu --metrics gpu__time_duration.sum --clock-control none --print-units base --csv \
    --log-file "$OUT/profile_$preset.csv" "$BIN/metrale-gpu" --backend cuda --json run --preset "$preset" --steps 3 ${RUN_FLAGS:-}
  kernels=$(python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(json.loads(t[t.find("{"):])["kernels_per_step"])' "$L/run_$preset.txt" 2>/dev/null || echo 0)
  python3 bench/ncu_step_summary.py "$OUT/profile_$preset.csv" "$kernels" "$L/run_$preset.txt" | tee -a "$S"
done
collect_runs "${runs[@]}" > "$OUT/runs.json"
tar czf "$OUT/logs.tgz" -C "$L" .
