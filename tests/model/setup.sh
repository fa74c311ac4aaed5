#!/usr/bin/env bash
# Makes the reference of the real-model test (ctest fixture smollm2_reference): fetches
# SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh), installs the pinned mlx, mlx-lm, gguf and
# transformers wheels (venv_pins.sh) from PyPI into the ignored virtual environment .venv-model/
# (once), then runs tests/model/make_reference.py into OUT_DIR.
#
# Usage: setup.sh OUT_DIR [CASES]
# When the model or the wheels cannot be had here (no network, no wheel for this platform),
# writes the reason to OUT_DIR/SKIP and exits 0 (tests/python_env.sh): the comparison then
# skips (77) and says why.
# A failure of the reference itself once installed is a test failure.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/model/venv_pins.sh"
out=$1
cases=${2:-}
what=smollm2
. "$root/tests/python_env.sh"
gguf=$("$root/scripts/fetch_smollm2.sh" 2> "$out/fetch.log") ||
  reference_skip "could not fetch SmolLM2-135M-Instruct (see $out/fetch.log)"
echo "$gguf" > "$out/model_path"
reference_venv .venv-model "${MODEL_VENV_PINS[@]}"
"$venv/bin/python" "$root/tests/model/make_reference.py" "$gguf" "$out" $cases
echo "smollm2 reference: files in $out"
