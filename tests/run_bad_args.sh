#!/usr/bin/env bash
# run_bad_args.sh METRALE_GPU - every bad argument of `metrale-gpu run` gives a one-line error
# on stderr and a non-zero exit (1 or 2), never a crash (a signal exits above 128).
set -u
bin="$1"
failures=0
expect_refused() {
    local err rc
    err=$("$bin" "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -gt 2 ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || [ -z "$err" ]; then
        echo "FAIL: metrale-gpu $* exited $rc with: $err"
        failures=$((failures + 1))
    else
        echo "ok: metrale-gpu $*: $err"
    fi
}
expect_refused --backend cpu run --preset no-such-preset
expect_refused --backend cpu run --preset tiny-moe --weights mlx8
expect_refused --backend cpu run --preset tiny --trace /nonexistent-directory/trace.json
expect_refused --backend cpu run --preset tiny --trace
expect_refused --backend cpu run --preset tiny-moe --weights mlx4 --checkpoint /nonexistent
expect_refused --backend cpu run --preset tiny --weights int3
expect_refused --backend cpu run --preset tiny --batch 100000
expect_refused --backend cpu run --preset tiny --batch 65
expect_refused --backend cpu run --preset tiny --batch 0
expect_refused --backend cpu run --preset tiny --batch
expect_refused --backend cpu run --preset tiny --steps -3
expect_refused --backend cpu run --preset tiny --prompt-len 5000 --batch 64
expect_refused --backend cpu run --preset qwen3-30b-a3b
# The memory check counts the KV cache: 64 requests of 100k tokens need about 840 GB of it.
expect_refused --backend cpu run --preset llama-3-8b --batch 64 --prompt-len 120 --steps 100000
expect_refused --backend cpu run --bogus
expect_refused --backend metal run --preset tiny
expect_refused --backend cpu run --weights mlx8 --checkpoint /nonexistent/checkpoint
expect_refused --backend cpu run --weights mlx4 --checkpoint
expect_refused --backend cpu run --preset tiny --weights mlx8
expect_refused --backend cpu run --preset tiny --checkpoint /tmp
expect_refused --backend cpu run --preset tiny --weights mlx8 --checkpoint "$(dirname "$0")/mlx/checkpoints/micro-mlx8"
expect_refused --backend cpu run --weights mlx4 --checkpoint "$(dirname "$0")/mlx/checkpoints/micro-mlx8"
exit $((failures > 0))
