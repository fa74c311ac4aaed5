#!/usr/bin/env bash
# Makes the reference of the random-model test (ctest fixture random_models_reference): installs
# the pinned wheels of venv_pins.sh into the ignored .venv-model/ (once; shared with setup.sh),
# then runs tests/model/random_models.py into OUT_DIR: the random checkpoints in every form and
# mlx-lm's float32 logits of each. No network is needed after the wheels.
#
# Usage: setup_random.sh OUT_DIR
# When the wheels cannot be had here, writes the reason to OUT_DIR/SKIP and exits 0
# (tests/python_env.sh): the comparison then skips (77) and says why. A failure of the script
# itself once installed is a test failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/model/venv_pins.sh"
out=$1
what=random_models
. "$root/tests/python_env.sh"
reference_venv .venv-model "${MODEL_VENV_PINS[@]}"
"$venv/bin/python" "$root/tests/model/random_models.py" "$out"
echo "random_models reference: files in $out"
