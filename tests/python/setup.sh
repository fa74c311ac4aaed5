#!/usr/bin/env bash
# Makes the pinned virtual environment of the Python binding's tests (ctest fixture
# python_env): numpy and pytest from PyPI into the ignored .venv-python/ (once, under a lock;
# tests/python_env.sh), then writes OUT_DIR/python, the interpreter run.sh uses.
#
# Usage: setup.sh OUT_DIR
# Without python3-venv or the network it writes the reason to OUT_DIR/SKIP and exits 0: the
# pytest run then skips (77) and says why.
set -euo pipefail

NUMPY_VERSION=2.4.6
PYTEST_VERSION=9.2.0

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
what=python
. "$root/tests/python_env.sh"
reference_venv .venv-python "numpy==$NUMPY_VERSION" "pytest==$PYTEST_VERSION"
echo "$venv/bin/python" > "$out/python"
echo "python reference: $venv/bin/python"
