#!/usr/bin/env bash
# `make python-install-test`: what a fresh machine does with the package. Builds and installs
# the repository with `pip install .` into a new virtual environment (build-python-install/),
# then imports metrale_gpu there, outside the source tree, and runs a GEMM and a generation of
# the tiny preset on the CPU backend.
# Extra pip arguments pass through, e.g. --config-settings=cmake.define.METRALE_CUDA=OFF for a
# CPU-only build (minutes instead of the CUDA kernels' compile).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/build-python-install"
rm -rf "$dir/venv"
mkdir -p "$dir"
python3 -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check "numpy==2.4.6"
"$dir/venv/bin/python" -m pip install --disable-pip-version-check "$@" "$root"
cd "$dir"
env -u METRALE_GPU_LIBRARY "$dir/venv/bin/python" - <<'PY'
import numpy as np
import metrale_gpu as mg
print("metrale_gpu", mg.__version__, "from", mg.library_path)
assert "site-packages" in mg.library_path
b = mg.Backend("cpu")
a = mg.numerics.bf16_from_f32(np.random.default_rng(1).standard_normal((3, 40), dtype=np.float32))
w = mg.numerics.bf16_from_f32(np.random.default_rng(2).standard_normal((24, 40), dtype=np.float32))
out = np.full((3, 24), np.nan, np.float32)
mg.gemm_bf16(b, None, 3, 24, 40, a, w, out, mg.DTYPE_F32, 24)
want = mg.numerics.bf16_to_f32(a).astype(float) @ mg.numerics.bf16_to_f32(w).astype(float).T
assert np.allclose(out, want, rtol=1e-5, atol=1e-5)
# the model layer's library is installed beside it: a synthetic preset generates
assert "site-packages" in str(mg.model_library_path())
out = mg.generate(b, [[1, 2, 3]], preset="tiny", max_tokens=3)
assert len(out[0].tokens) == 3, out
print("cuda:", mg.backend_probe_kind("cuda"))
print("python-install-test: ok")
PY
