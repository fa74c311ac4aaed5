#!/usr/bin/env bash
# ctest smollm2_tp_cpu: tests/model/compare_tp.py on SmolLM2-135M-Instruct (tensor parallelism
# over 3 CPU devices against one, teacher-forced), or skip (77) when the checkpoint cannot be
# had here (scripts/fetch_smollm2.sh: no network and no copy in .models/).
#   compare_tp.sh METRALE_GPU BACKEND
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=$1 backend=$2
if ! model=$("$root/scripts/fetch_smollm2.sh" 2>/dev/null); then
  echo "skipped: SmolLM2-135M-Instruct could not be fetched (scripts/fetch_smollm2.sh)"
  exit 77
fi
exec python3 "$root/tests/model/compare_tp.py" "$cli" "$model" --backend "$backend" --tp 3
