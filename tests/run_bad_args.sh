#!/usr/bin/env bash
# run_bad_args.sh METRALE_GPU - every bad argument of `metrale-gpu run` is refused before any
# output: exit status 1 or 2 (never a crash: a signal exits above 128), nothing on stdout, and
# exactly one line on stderr; refused_naming also wants that line to name the argument and,
# when given, what it accepts.
set -u
bin="$1"
failures=0
passes=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# check NEEDLE1 NEEDLE2 -- ARGS...: NEEDLEs ("" for none) must appear in the stderr line.
check() {
    local need1="$1" need2="$2" rc lines
    shift 3
    "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    lines=$(wc -l <"$tmp/err")
    local err
    err=$(cat "$tmp/err")
    if [ $rc -eq 0 ] || [ $rc -gt 2 ] || [ "$lines" -ne 1 ] || [ -s "$tmp/out" ] ||
        { [ -n "$need1" ] && [[ "$err" != *"$need1"* ]]; } ||
        { [ -n "$need2" ] && [[ "$err" != *"$need2"* ]]; }; then
        echo "FAIL: metrale-gpu $* exited $rc, $(wc -l <"$tmp/out") lines on stdout" \
             "($(head -c 200 "$tmp/out")), $lines on stderr: $err"
        failures=$((failures + 1))
    else
        echo "ok: metrale-gpu $*: $err"
        passes=$((passes + 1))
    fi
}
expect_refused() { check "" "" -- "$@"; }
# refused_naming ARGUMENT ACCEPTED ARGS...
refused_naming() {
    local name="$1" accepted="$2"
    shift 2
    check "$name" "$accepted" -- "$@"
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
expect_refused --backend cpu run --preset tiny --checkpoint /tmp
expect_refused --backend cpu run --preset tiny --weights mlx8 --checkpoint "$(dirname "$0")/mlx/checkpoints/micro-mlx8"
expect_refused --backend cpu run --weights mlx4 --checkpoint "$(dirname "$0")/mlx/checkpoints/micro-mlx8"
# Counts: the argument, the value and the range accepted, whatever the preset.
refused_naming --batch "from 1 to 1048576" --backend cpu run --preset tiny --batch 0
refused_naming --steps "from 0 to 1048576" --backend cpu run --preset tiny --steps -5
refused_naming --prompt-len "from 1 to 1048576" --backend cpu run --preset tiny --prompt-len 0
refused_naming --steps "from 0 to 1048576" --backend cpu run --preset tiny --steps 1048577
refused_naming --batch "from 1 to 1048576" --backend cpu run --preset tiny --batch 2000000
refused_naming --prompt-len "from 1 to 1048576" --backend cpu run --preset tiny --prompt-len 99999999999999999999
refused_naming --steps "from 0 to 1048576" --backend cpu run --preset tiny --steps
refused_naming --seed "unsigned" --backend cpu run --preset tiny --seed -1
refused_naming --seed "unsigned" --backend cpu run --preset tiny --seed 12x
refused_naming --weights "bf16, fp8, nvfp4, mlx8 and mlx4" --backend cpu run --preset tiny --weights int3
refused_naming --weights "bf16" --backend cpu run --preset tiny --weights
refused_naming --preset "" --backend cpu run --preset
# Tensor parallelism: the count, then the model's refusals (tiny's 2 KV heads over 3 ranks; FP8
# weights), still before any output.
refused_naming --tp "from 1 to 64" --backend cpu run --preset tiny --tp 0
refused_naming --tp "from 1 to 64" --backend cpu run --preset tiny --tp 65
refused_naming "kv_heads 2" "by 3" --backend cpu run --preset tiny --tp 3
refused_naming "fp8 weights" "not split" --backend cpu run --preset tiny --weights fp8 --tp 2
# The preset's own limits, checked when the model is made: still the only output.
refused_naming --batch "1..64" --backend cpu run --preset tiny --batch 65
refused_naming "4096 per pass" "" --backend cpu run --preset tiny --prompt-len 5000 --batch 64
# Sampling flags of run --model, refused before the checkpoint is opened.
m=(--backend cpu run --model /nonexistent.gguf --prompt hi)
refused_naming top_p "(0, 1]" "${m[@]}" --top-p 1.5
refused_naming top_p "(0, 1]" "${m[@]}" --top-p 0
refused_naming temperature "> 0" "${m[@]}" --temperature -1
refused_naming min_p "[0, 1]" "${m[@]}" --min-p 2
refused_naming repetition_penalty "> 0" "${m[@]}" --repeat-penalty 0
refused_naming --temperature "number" "${m[@]}" --temperature abc
refused_naming --top-k "0 to" "${m[@]}" --top-k -1
refused_naming --seed "integer" "${m[@]}" --seed -3
refused_naming --repeat-last-n "0 to 4096" "${m[@]}" --repeat-last-n 5000
refused_naming --tp "from 1 to 64" "${m[@]}" --tp 65
refused_naming --tp "from 1 to 64" "${m[@]}" --tp 2x
echo "$passes passed, $failures failed"
exit $((failures > 0))
