#!/usr/bin/env bash
# Makes the reference of the real-model test (ctest fixture smollm2_reference): fetches
# SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh), installs the pinned mlx, mlx-lm and gguf
# wheels from PyPI into the ignored virtual environment .venv-model/ (once), then runs
# tests/model/make_reference.py into OUT_DIR.
#
# Usage: setup.sh OUT_DIR [CASES]
# When the model or the wheels cannot be had here (no network, no wheel for this platform),
# writes the reason to OUT_DIR/SKIP and exits 0: the comparison then skips (77) and says why.
# A failure of the reference itself once installed is a test failure.
set -euo pipefail

MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
GGUF_VERSION=0.19.0

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
cases=${2:-}
venv="$root/.venv-model"
rm -rf "$out"
mkdir -p "$out"

skip() {
  echo "$1" > "$out/SKIP"
  echo "smollm2 reference: skipped: $1"
  exit 0
}

command -v python3 >/dev/null || skip "python3 is not installed"
python3 -c 'import ensurepip, venv' 2>/dev/null || skip "python3-venv is not installed"
gguf=$("$root/scripts/fetch_smollm2.sh" 2> "$out/fetch.log") ||
  skip "could not fetch SmolLM2-135M-Instruct (see $out/fetch.log)"
echo "$gguf" > "$out/model_path"
have() {
  "$venv/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m
assert m.version("mlx") == "$MLX_VERSION" and m.version("mlx-lm") == "$MLX_LM_VERSION"
assert m.version("gguf") == "$GGUF_VERSION"
import mlx.core, mlx_lm, gguf
PY
}
if ! have; then
  exec 9>"$root/.venv-model.lock"
  flock 9
  if ! have; then
    echo "smollm2 reference: installing mlx==$MLX_VERSION mlx-lm==$MLX_LM_VERSION gguf==$GGUF_VERSION into .venv-model/"
    rm -rf "$venv"
    python3 -m venv "$venv" || skip "cannot create a virtual environment"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "mlx==$MLX_VERSION" "mlx-cpu==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" \
        "gguf==$GGUF_VERSION" > "$out/pip.log" 2>&1 ||
      skip "pip could not install the reference's wheels (see $out/pip.log)"
  fi
  flock -u 9
fi
"$venv/bin/python" "$root/tests/model/make_reference.py" "$gguf" "$out" $cases
echo "smollm2 reference: files in $out"
