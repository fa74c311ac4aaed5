#!/usr/bin/env bash
# Runs the pytest suite of python/metrale_gpu against the library this build made.
# Usage: run.sh LIBRARY ENV_DIR [PYTEST ARGS...]
# LIBRARY: libmetrale_gpu.so of the build (METRALE_GPU_LIBRARY); ENV_DIR: setup.sh's folder.
# Exit 77 (skipped) when setup.sh could not make the environment, with its reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
library=$1
env_dir=$2
shift 2
if [ -f "$env_dir/SKIP" ]; then
  echo "skipped: $(cat "$env_dir/SKIP")"
  exit 77
fi
export METRALE_GPU_LIBRARY=$library
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
cd "$root/tests/python"
exec "$(cat "$env_dir/python")" -m pytest -q -p no:cacheprovider -rs "$@" .
