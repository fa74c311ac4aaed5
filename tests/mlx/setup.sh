#!/usr/bin/env bash
# Makes the MLX reference files of tests/test_mlx_reference.c (ctest fixture mlx_reference):
# installs the pinned mlx + mlx-cpu wheels from PyPI into the ignored virtual environment
# .venv-mlx/ (once), then runs tests/mlx/make_reference.py into OUT_DIR.
#
# Usage: setup.sh OUT_DIR
# When MLX cannot be installed here (no network, no wheel for this platform), writes the
# reason to OUT_DIR/SKIP and exits 0: the C test then skips (77) and prints it. A failure of
# MLX itself once installed is a test failure.
set -euo pipefail

MLX_VERSION=0.32.4

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
venv="$root/.venv-mlx"
rm -rf "$out"
mkdir -p "$out"

skip() {
  echo "$1" > "$out/SKIP"
  echo "mlx reference: skipped: $1"
  exit 0
}

command -v python3 >/dev/null || skip "python3 is not installed"
python3 -c 'import ensurepip, venv' 2>/dev/null || skip "python3-venv is not installed"
have() { "$venv/bin/python" -c "import mlx.core, importlib.metadata as m; assert m.version('mlx') == '$MLX_VERSION'" 2>/dev/null; }
if ! have; then
  # Two build folders may run this at once: one installs, the other waits.
  exec 9>"$root/.venv-mlx.lock"
  flock 9
  if ! have; then
    echo "mlx reference: installing mlx==$MLX_VERSION mlx-cpu==$MLX_VERSION into .venv-mlx/"
    rm -rf "$venv"
    python3 -m venv "$venv" || skip "cannot create a virtual environment"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "mlx==$MLX_VERSION" "mlx-cpu==$MLX_VERSION" > "$out/pip.log" 2>&1 ||
      skip "pip could not install mlx==$MLX_VERSION (see $out/pip.log)"
  fi
  flock -u 9
fi
"$venv/bin/python" "$root/tests/mlx/make_reference.py" "$out"
echo "mlx reference: files in $out"
