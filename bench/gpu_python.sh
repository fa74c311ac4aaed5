#!/usr/bin/env bash
# gpu_python.sh - the Python package on a GPU machine, in one call on binaries built elsewhere:
#   1. tests/python with the CPU backend as the tests' backend (test_cuda_torch.py's PyTorch
#      cases included: tensors in and out without a copy, a graph captured from Python);
#   2. test_ops.py, test_model.py and test_cuda_torch.py with METRALE_PY_BACKEND=cuda: every op
#      family on CUDA against NumPy float64, the model layer (Model, generate) on CUDA against
#      the CPU backend;
#   3. bench/python_overhead.py on CUDA and on the CPU: the binding's host cost per GEMM call
#      beside the C call's.
# Layout: $G (default .gpu-python) holds pack.tar.xz (bench/pack.sh: bin/ with libmetrale_gpu.so,
# libmetrale_model.so and the plugins). $OUT gets summary.txt and logs.tgz.
set -uo pipefail
G=${G:-.gpu-python}
OUT=${OUT:-/tmp/metrale-gpu-python}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_start python
TAIL=8
export PYTHONPATH=$PWD/python METRALE_GPU_LIBRARY=$BIN/libmetrale_gpu.so
pytest=(python3 -m pytest -q -rs -p no:cacheprovider)
step pytest_cpu "${pytest[@]}" tests/python
step pytest_cuda env METRALE_PY_BACKEND=cuda "${pytest[@]}" tests/python/test_ops.py \
  tests/python/test_model.py tests/python/test_cuda_torch.py
step overhead_cuda python3 bench/python_overhead.py --library "$BIN/libmetrale_gpu.so" --backend cuda
step overhead_cpu python3 bench/python_overhead.py --library "$BIN/libmetrale_gpu.so"
for f in pytest_cpu pytest_cuda overhead_cuda overhead_cpu; do
  tail -n 6 "$L/$f.txt" >> "$S"
done
tar czf "$OUT/logs.tgz" -C "$L" .
