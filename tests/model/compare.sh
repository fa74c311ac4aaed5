#!/usr/bin/env bash
# ctest smollm2_vs_mlx_lm: tests/model/compare.py over the fixture's reference for the three
# forms of the network (the GGUF file, the Hugging Face BF16 directory, the MLX 4-bit directory
# against mlx-lm's run of that quantized model), or skip (77) with the reason setup.sh recorded.
#   compare.sh METRALE_GPU REF_DIR BACKEND [CASES]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=$1 ref=$2 backend=$3 cases=${4:-0}
if [ -f "$ref/SKIP" ]; then
  echo "skipped: $(cat "$ref/SKIP")"
  exit 77
fi
py="$root/.venv-model/bin/python"
status=0
for form in "$(cat "$ref/model_path")|$ref" "$ref/hf_bf16|$ref" "$ref/mlx4/model|$ref/mlx4"; do
  model=${form%%|*} expected=${form#*|}
  echo "== $model against $expected"
  "$py" "$root/tests/model/compare.py" "$cli" "$model" "$expected" --backend "$backend" \
    --cases "$cases" || status=1
done
exit $status
