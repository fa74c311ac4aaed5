#!/usr/bin/env bash
# On the GPU machine: the gemm checks on CUDA, `metrale-gpu bench gemm`, the same shapes through
# PyTorch, and the side-by-side table, all in one call. DIR holds metrale-gpu, test_gemm_cpu
# and bench/peers/{peers_gemm,compare_gemm}.py copied from a build made elsewhere.
#   bash gpu_run_gemm.sh DIR [extra bench options]
set -uo pipefail
dir=${1:?usage: gpu_run_gemm.sh DIR [bench options]}
shift
out=${OUT:-/tmp/gemm-run}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
{
  "$dir/test_gemm_cpu" >/dev/null 2>&1; echo "test_gemm_cpu: exit $?"
  "$dir/metrale-gpu" --backend cuda check gemm
  compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/metrale-gpu" --backend cuda check \
    gemm/fp8_scale_transpose; echo "memcheck of the transpose: exit $?"
} 2>&1 | tee "$out/check.txt"
"$dir/metrale-gpu" --backend cuda bench gemm --iters 50 --warmup 10 --json-out "$out/ours.json" "$@" \
  >"$out/bench.txt" 2>&1; echo "bench: exit $?"
python3 "$dir/peers_gemm.py" --out "$out/peers.json" >"$out/peers.log" 2>&1; echo "peers: exit $?"
python3 "$dir/compare_gemm.py" "$out/ours.json" "$out/peers.json" | tee "$out/gemm_table.md"
