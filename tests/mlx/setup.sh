#!/usr/bin/env bash
# Makes the MLX reference files of tests/test_mlx_reference.c (ctest fixture mlx_reference):
# installs the pinned mlx + mlx-cpu wheels from PyPI into the ignored virtual environment
# .venv-mlx/ (once), then runs tests/mlx/make_reference.py into OUT_DIR.
#
# Usage: setup.sh OUT_DIR
# When MLX cannot be installed here (no network, no wheel for this platform), writes the
# reason to OUT_DIR/SKIP and exits 0 (tests/python_env.sh): the C test then skips (77) and
# prints it. A failure of MLX itself once installed is a test failure.
set -euo pipefail

MLX_VERSION=0.32.4

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
what=mlx
. "$root/tests/python_env.sh"
reference_venv .venv-mlx "mlx==$MLX_VERSION" "mlx-cpu==$MLX_VERSION"
"$venv/bin/python" "$root/tests/mlx/make_reference.py" "$out"
echo "mlx reference: files in $out"
