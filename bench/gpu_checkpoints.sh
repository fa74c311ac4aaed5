#!/usr/bin/env bash
# gpu_checkpoints.sh - a short correctness call for the checkpoint readers and the attention
# kernels they need on CUDA, on binaries built elsewhere ($G/pack.tar.xz, bench/pack.sh with
# test_nvfp4_checkpoint, test_kv_cache_cuda and test_forward_cuda; the attention and CUTLASS
# plugins must be in it: a build with METRALE_FLASHINFER and METRALE_CUTLASS on) and
# $G/random_models.tar.xz (bench/pack_random_models.sh), in order of what matters most when
# device time is short:
#   1. test_nvfp4_checkpoint (every valid NVFP4 directory teacher-forced on CUDA against the CPU);
#   2. test_kv_cache_cuda (the paged attention providers, the by-row kernels' head_dims among them);
#   3. `check kv_cache` and `check attention`, automatic, then with the by-row kernels forced
#      (--provider attention_paged=kernels / attention_ragged=kernels) on every shape;
#   4. the random models' forms against mlx-lm's logits on CUDA (tests/model/compare_random.sh);
#   5. compute-sanitizer memcheck of the by-row kernels (`check kv_cache` forced onto them);
#   6. test_forward_cuda.
# $OUT gets summary.txt and logs.tgz.
# Packed from the default build (`make` builds the plugins), the two archives are about 21 and
# 28 MiB; each further test program adds 3-4 MiB, and with the tracked tree (about 8 MiB) the
# device tool's 64 MiB carry is soon reached, so the pack holds only the tests this script runs:
#   bash bench/pack.sh build .gpu-all test_nvfp4_checkpoint test_kv_cache_cuda test_forward_cuda
#   bash bench/pack_random_models.sh build .gpu-all hf mlx4 mlx8 nvfp4_modelopt nvfp4_ct
set -uo pipefail
G=${G:-.gpu-all}
OUT=${OUT:-/tmp/metrale-gpu-checkpoints}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start checkpoints
TAIL=3
MG="$BIN/metrale-gpu"
step test_nvfp4_checkpoint timeout 60 "$BIN/test_nvfp4_checkpoint"
step test_kv_cache_cuda timeout 150 "$BIN/test_kv_cache_cuda"
for group in kv_cache attention; do
  op=attention_paged; [ "$group" = attention ] && op=attention_ragged
  step "check_$group" timeout 60 "$MG" --backend cuda check "$group"
  step "check_${group}_by_row" timeout 90 "$MG" --backend cuda --provider "$op=kernels" check "$group"
  for log in "check_$group" "check_${group}_by_row"; do
    grep -E " FAIL " "$L/$log.txt" | cut -c1-300 >> "$S"
    echo "$log: $(tail -n 1 "$L/$log.txt")" >> "$S"
  done
done
mkdir -p /tmp/random_models && tar xJf "$G/random_models.tar.xz" -C /tmp/random_models
step random_models_cuda env PYTHON=python3 timeout 150 bash tests/model/compare_random.sh "$MG" /tmp/random_models cuda
grep -E "^== |largest relative|metrale-gpu failed" "$L/random_models_cuda.txt" | grep -v "^case" | cut -c1-220 >> "$S"
step memcheck_by_row timeout 100 compute-sanitizer --report-api-errors no --error-exitcode 9 --tool memcheck "$MG" --backend cuda --provider attention_paged=kernels check kv_cache
grep -h "ERROR SUMMARY" "$L/memcheck_by_row.txt" >> "$S"
step test_forward_cuda timeout 60 "$BIN/test_forward_cuda"
tar czf "$OUT/logs.tgz" -C "$L" .
