# shellcheck shell=bash
# run_compare_lib.sh - sourced by tests/run_compare_cuda.sh and tests/run_compare_metal.sh:
# expect_agree BIN BACKEND PRESET WEIGHTS [RUN ARGS...] runs `BIN --backend BACKEND run --preset
# PRESET --weights WEIGHTS ARGS --compare`, prints "ok: ..." with its compare line when it exits
# 0 and says AGREE, else "FAIL: ..." and adds one to $failures.
expect_agree() {
    local bin=$1 backend=$2 preset=$3 weights=$4 out rc line
    shift 4
    out=$("$bin" --backend "$backend" run --preset "$preset" --weights "$weights" "$@" --compare 2>&1)
    rc=$?
    line=$(printf '%s\n' "$out" | grep "^  compare")
    if [ $rc -ne 0 ] || ! printf '%s\n' "$line" | grep -q "AGREE:"; then
        echo "FAIL: run --weights $weights $* --compare exited $rc: ${line:-$out}"
        failures=$((failures + 1))
    else
        echo "ok: run --weights $weights $* --compare:${line#  compare}"
    fi
}
