#!/usr/bin/env bash
# gpu_python.sh - the Python package on a GPU machine, in one call on binaries built elsewhere:
#   1. tests/python with the CPU backend as the tests' backend (test_cuda_torch.py's PyTorch
#      cases included: tensors in and out without a copy, a graph captured from Python);
#   2. test_ops.py, test_model.py and test_cuda_torch.py with METRALE_PY_BACKEND=cuda (six
#      runs, each with its own random shapes): every op
#      family on CUDA against NumPy float64, the model layer (Model, generate) on CUDA against
#      the CPU backend;
#   3. bench/python_overhead.py on CUDA and on the CPU: the binding's host cost per GEMM call
#      beside the C call's.
# Layout: $G (default .gpu-python) holds pack.tar.xz (bench/pack.sh: bin/ with libmetrale_gpu.so,
# libmetrale_model.so and the plugins). With SmolLM2 carried as gpu_smollm2.sh carries it
# ($M/smollm2.gguf.part*, default M=.gpu-model, over several warm calls, and the reference
# cases of smollm2_reference_files with their case<i>.text.json in $M/ref/), test_model.py's
# SmolLM2 tests run too (METRALE_SMOLLM2_REFERENCE). $OUT gets summary.txt and logs.tgz.
set -uo pipefail
G=${G:-.gpu-python}
M=${M:-.gpu-model}
OUT=${OUT:-/tmp/metrale-gpu-python}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start python
TAIL=8
export PYTHONPATH=$PWD/python METRALE_GPU_LIBRARY=$BIN/libmetrale_gpu.so
pytest=(python3 -m pytest -q -rs -p no:cacheprovider)
if ls "$M"/smollm2.gguf.part* > /dev/null 2>&1; then
  if gpu_smollm2_model "$M" && [ -f "$M/ref/case0.text.json" ]; then
    mkdir -p "$W/smollm2_ref"
    cp "$M"/ref/case* "$W/smollm2_ref/"
    echo "$MODEL" > "$W/smollm2_ref/model_path"
    export METRALE_SMOLLM2_REFERENCE=$W/smollm2_ref
    echo "SmolLM2: sha256 $MODEL_SHA256, reference of $(cat "$M/ref/cases") cases" | tee -a "$S"
  else
    echo "SmolLM2: pieces or reference incomplete; its tests skip" | tee -a "$S"
  fi
fi
step pytest_cpu "${pytest[@]}" tests/python
# six runs, each with its own random shapes: seed$run.txt keeps the seed (METRALE_TEST_SEED
# replays it)
for run in 1 2 3 4 5 6; do
  seed=$(( (RANDOM << 16) | RANDOM ))
  echo "$seed" > "$L/seed$run.txt"
  step pytest_cuda_$run env METRALE_PY_BACKEND=cuda METRALE_TEST_SEED=$seed "${pytest[@]}" \
    tests/python/test_ops.py tests/python/test_model.py tests/python/test_cuda_torch.py
done
step overhead_cuda python3 bench/python_overhead.py --library "$BIN/libmetrale_gpu.so" --backend cuda
step overhead_cpu python3 bench/python_overhead.py --library "$BIN/libmetrale_gpu.so"
for f in pytest_cpu pytest_cuda_1 pytest_cuda_2 pytest_cuda_3 pytest_cuda_4 pytest_cuda_5 pytest_cuda_6 overhead_cuda overhead_cpu; do
  tail -n 6 "$L/$f.txt" >> "$S"
done
tar czf "$OUT/logs.tgz" -C "$L" .
