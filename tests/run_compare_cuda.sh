#!/usr/bin/env bash
# run_compare_cuda.sh METRALE_GPU - `metrale-gpu run --compare` on CUDA agrees with the CPU for
# the tiny preset's quantized weights on the shapes where comparing free-running greedy runs
# reported a disagreement (NVFP4 and FP8: the default batch 4, and batch 1 with prompts ~200),
# and on two that always agreed. Skipped (77) without a usable CUDA device.
set -u
bin="$1"
# shellcheck source=tests/run_compare_lib.sh
source "$(dirname "$0")/run_compare_lib.sh"
if ! "$bin" --backend cuda info >/dev/null 2>&1 ||
   "$bin" --backend cuda run --preset tiny --steps 0 2>&1 | grep -q "cannot open the cuda backend"; then
    echo "skipped: no usable CUDA device"
    exit 77
fi
failures=0
for weights in nvfp4 fp8 bf16; do
    for shape in "" "--batch 1 --prompt-len 200" "--batch 5 --prompt-len 64" "--batch 1 --prompt-len 16"; do
        # shellcheck disable=SC2086
        expect_agree "$bin" cuda tiny "$weights" $shape
    done
done
exit $((failures > 0))
