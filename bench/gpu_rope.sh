#!/usr/bin/env bash
# gpu_rope.sh - one GPU call for the RoPE frequency table (Llama 3.1's scaled RoPE) on binaries
# built elsewhere (bin/ of $G/pack.tar.xz: bench/pack.sh BUILD $G test_kv_cache_cuda
# test_forward_cuda test_nvfp4_gemm), with tests/model/random_models.py's llama31_scaled model
# and its mlx-lm reference carried as $G/ref (random_models.py OUT --only llama31_scaled):
#   test_kv_cache_cuda (the append with the table against float64, BF16 and FP8 pools),
#   `check kv_cache` and `check gemm/fusion` (the decode GEMV's KV-append epilogue with the
#   table at odd M against the CPU composition), test_forward_cuda, tests/run_compare_cuda.sh,
#   the llama31_scaled model on CUDA against mlx-lm (tests/model/compare_random.sh), and
#   compute-sanitizer memcheck on the fusion checks. $OUT gets summary.txt and logs.tgz.
set -uo pipefail
G=${G:-.gpu-rope}
OUT=${OUT:-/tmp/metrale-gpu-rope}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start rope "RoPE frequency table (Llama 3.1 scaling)"
TAIL=3
MG="$BIN/metrale-gpu"
step test_kv_cache_cuda timeout 200 "$BIN/test_kv_cache_cuda"
step check_kv timeout 150 "$MG" --backend cuda check kv_cache
step check_fusion timeout 150 "$MG" --backend cuda check gemm/fusion
grep -h -E " (FAIL|fail) |passed" "$L"/check_*.txt | cut -c1-300 >> "$S"
step test_forward_cuda timeout 200 "$BIN/test_forward_cuda"
step run_compare_cuda timeout 150 bash tests/run_compare_cuda.sh "$MG"
step llama31_vs_mlx_lm timeout 150 env PYTHON=python3 bash tests/model/compare_random.sh "$MG" "$G/ref" cuda
grep -E "passed|forms compared|largest" "$L/llama31_vs_mlx_lm.txt" | cut -c1-300 >> "$S"
step test_nvfp4_gemm timeout 200 "$BIN/test_nvfp4_gemm"
step memcheck_fusion timeout 150 compute-sanitizer --report-api-errors no --error-exitcode 9 --tool memcheck "$MG" --backend cuda check gemm/fusion_rmsnorm_kv_append
grep -h -E "ERROR SUMMARY" "$L"/memcheck_*.txt >> "$S"
tar czf "$OUT/logs.tgz" -C "$L" .
