#!/usr/bin/env bash
# run_compare_metal.sh METRALE_GPU - the forward pass on the Metal backend through its test double
# (ctest sets METRALE_METAL_OBJC_LIBRARY and METRALE_METAL_FRAMEWORK): `run --compare` agrees
# with the CPU for the micro preset's MLX 4- and 8-bit checkpoints, BF16 and NVFP4 weights, at
# the default batch (ragged prefill of more than 8 rows: the MLX GEMM's dequant + BF16 GEMM) and
# at one request of 40 tokens; a model that needs an op the backend lacks is refused before
# anything runs, with a message naming the op. The double runs the CPU reference kernels, so
# this checks the host code and the kernels' argument lists, not the MSL arithmetic.
set -u
bin="$1"
# shellcheck source=tests/run_compare_lib.sh
source "$(dirname "$0")/run_compare_lib.sh"
failures=0
for weights in mlx4 mlx8 bf16 nvfp4; do
    for shape in "" "--batch 1 --prompt-len 40 --steps 4"; do
        # shellcheck disable=SC2086
        expect_agree "$bin" metal micro "$weights" $shape
    done
done
# Refused up front: the message names the op the Metal backend has no kernel or provider for.
for refusal in "micro --weights fp8:gemm_fp8" "tiny-moe:moe_gemm"; do
    args=${refusal%%:*}
    op=${refusal##*:}
    # shellcheck disable=SC2086
    out=$("$bin" --backend metal run --preset $args 2>&1)
    rc=$?
    want="the metal backend cannot run op $op"
    if [ $rc -eq 0 ] || ! printf '%s\n' "$out" | grep -q "$want" ||
       printf '%s\n' "$out" | grep -q "prefill:"; then
        echo "FAIL: run --preset $args exited $rc without refusing up front ($want): $out"
        failures=$((failures + 1))
    else
        echo "ok: run --preset $args refused: $(printf '%s\n' "$out" | grep "$want")"
    fi
done
exit $((failures > 0))
