#!/usr/bin/env bash
# gpu_checkpoints.sh - a short correctness call for the checkpoint readers on CUDA, on binaries
# built elsewhere ($G/pack.tar.xz, bench/pack.sh with test_nvfp4_checkpoint and
# test_forward_cuda; the attention and CUTLASS plugins must be in it: a build with
# METRALE_FLASHINFER and METRALE_CUTLASS on) and $G/random_models.tar.xz
# (bench/pack_random_models.sh), in order of what matters most when device time is short:
#   1. test_nvfp4_checkpoint (every valid NVFP4 directory teacher-forced on CUDA against the CPU);
#   2. the random models' forms against mlx-lm's logits on CUDA (tests/model/compare_random.sh);
#   3. `check kv_cache` and `check attention` (the attention providers' order);
#   4. test_forward_cuda.
# $OUT gets summary.txt and logs.tgz.
# Packed from the default build (`make` builds the plugins), the two archives are about 17 and
# 28 MiB; each further test program adds 3-4 MiB, and with the tracked tree (about 8 MiB) the
# device tool's 64 MiB carry is soon reached, so the pack holds only the tests this script runs:
#   bash bench/pack.sh build .gpu-all test_nvfp4_checkpoint test_forward_cuda
#   bash bench/pack_random_models.sh build .gpu-all hf mlx4 mlx8 nvfp4_modelopt nvfp4_ct
set -uo pipefail
G=${G:-.gpu-all}
OUT=${OUT:-/tmp/metrale-gpu-checkpoints}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start checkpoints
TAIL=3
step test_nvfp4_checkpoint timeout 60 "$BIN/test_nvfp4_checkpoint"
mkdir -p /tmp/random_models && tar xJf "$G/random_models.tar.xz" -C /tmp/random_models
step random_models_cuda env PYTHON=python3 timeout 150 bash tests/model/compare_random.sh "$BIN/metrale-gpu" /tmp/random_models cuda
grep -E "^== |largest relative|metrale-gpu failed" "$L/random_models_cuda.txt" | grep -v "^case" | cut -c1-220 >> "$S"
for group in kv_cache attention; do
  step "check_$group" timeout 120 "$BIN/metrale-gpu" --backend cuda check "$group"
  grep -E " FAIL " "$L/check_$group.txt" >> "$S"
  tail -n 1 "$L/check_$group.txt" >> "$S"
done
step test_forward_cuda timeout 120 "$BIN/test_forward_cuda"
tar czf "$OUT/logs.tgz" -C "$L" .
