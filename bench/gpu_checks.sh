#!/usr/bin/env bash
# gpu_checks.sh - the CUDA side of what the CPU machine cannot run, in one call on binaries built
# elsewhere:
#   1. `metrale-gpu --backend cuda check` (every conformance and op check against the CPU);
#   2. the test programs with CUDA cases: test_sample (the sampler kernel against the CPU
#      reference), test_generate, test_forward_cuda, test_cuda_graph;
#   3. the Python package's tests on CUDA (tests/python, test_cuda_torch.py against PyTorch);
#   4. `run --json` of the llama-3.2-1b and llama-3-8b presets (decode speed, kernels_per_step);
#   5. with random_models.tar.xz (the reference files ctest's random_models_reference_files
#      writes here): the random Llama/Mistral/Qwen2/Qwen3/Qwen3-MoE checkpoints teacher-forced
#      on CUDA against mlx-lm's logits (tests/model/compare_random.sh), and `run --compare`
#      of the tiny presets (tests/run_compare_cuda.sh).
# Layout: $G (default .gpu-all) holds pack.tar.xz (bin/: metrale-gpu, libmetrale_gpu.so, the op
# plugins and the test programs) and whl/ (pytest and numpy wheels, used when the machine's
# Python lacks them). $OUT gets summary.txt, runs.json and logs.tgz. CORRECTNESS_ONLY=1 leaves
# out steps 3 and 4 (for a call with little device time left).
set -uo pipefail
G=${G:-.gpu-all}
OUT=${OUT:-/tmp/metrale-gpu-checks}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start checks
TAIL=4
step check timeout 400 "$BIN/metrale-gpu" --backend cuda check
grep -E " (FAIL|fail) " "$L/check.txt" >> "$S"
tail -n 1 "$L/check.txt" >> "$S"
# GPU_TESTS: the test programs to run (default: these six), each skipped when not packed.
for t in ${GPU_TESTS:-test_sample test_generate test_forward_cuda test_cuda_graph test_kv_cache_cuda test_cuda_mlx}; do
  [ -x "$BIN/$t" ] || { echo "$t: not packed" | tee -a "$S"; continue; }
  step "$t" timeout 300 "$BIN/$t"
done
if [ "${CORRECTNESS_ONLY:-0}" != 1 ]; then
  python3 -c 'import pytest, numpy' 2>/dev/null || \
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$G"/whl/*.whl > "$L/pip.txt" 2>&1
  export PYTHONPATH=/tmp/site:$PWD/python
  step python_tests env METRALE_GPU_LIBRARY="$BIN/libmetrale_gpu.so" python3 -m pytest -q tests/python
  runs=()
  for spec in "llama-3.2-1b bf16 1" "llama-3-8b bf16 1" "llama-3-8b fp8 1" "llama-3-8b bf16 8"; do
    set -- $spec
    name="run_${1}_${2}_b${3}"
    step "$name" "$BIN/metrale-gpu" --backend cuda --json run --preset "$1" --weights "$2" --batch "$3" --steps 64
    runs+=("$name")
  done
  collect_runs "${runs[@]}" > "$OUT/runs.json"
fi
if [ -f "$G/random_models.tar.xz" ]; then
  mkdir -p /tmp/random_models && tar xJf "$G/random_models.tar.xz" -C /tmp/random_models
  step random_models_cuda env PYTHON=python3 bash tests/model/compare_random.sh "$BIN/metrale-gpu" /tmp/random_models cuda
  grep -E "^== |max rel|FAIL|fail" "$L/random_models_cuda.txt" | tail -40 >> "$S"
fi
step run_compare_cuda bash tests/run_compare_cuda.sh "$BIN/metrale-gpu"
tar czf "$OUT/logs.tgz" -C "$L" .
