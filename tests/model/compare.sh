#!/usr/bin/env bash
# ctest smollm2_vs_mlx_lm: tests/model/compare.py over the fixture's reference, or skip (77)
# with the reason setup.sh recorded.
#   compare.sh METRALE_GPU REF_DIR BACKEND [CASES]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=$1 ref=$2 backend=$3 cases=${4:-0}
if [ -f "$ref/SKIP" ]; then
  echo "skipped: $(cat "$ref/SKIP")"
  exit 77
fi
exec "$root/.venv-model/bin/python" "$root/tests/model/compare.py" "$cli" "$(cat "$ref/model_path")" \
  "$ref" --backend "$backend" --cases "$cases"
