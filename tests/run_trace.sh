#!/usr/bin/env bash
# run_trace.sh METRALE_GPU DIR - `metrale-gpu run --trace` on the CPU backend with FP8 weights:
# the run succeeds, reports per-op times (text and --json), and the trace file is a Chrome
# trace ({"traceEvents": ...}) naming the prefill and decode lanes and every op of the pass.
set -u
bin="$1"
dir="$2"
mkdir -p "$dir"
trace="$dir/run_trace.json"
rm -f "$trace"
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
out=$("$bin" --backend cpu run --preset tiny --weights fp8 --steps 3 --trace "$trace") ||
    fail "run --trace exited $?"
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q "per-op" || fail "no per-op times in the summary"
[ -s "$trace" ] || fail "no trace written to $trace"
[ "$(head -c 15 "$trace")" = '{"traceEvents":' ] || fail "the trace does not begin with {\"traceEvents\":"
for name in prefill decode embedding rmsnorm fp8_quant qkv_gemm rope_append attention o_gemm \
    gate_up silu_mul down last_rows lm_head argmax; do
    grep -q "\"name\": \"$name\"" "$trace" || fail "the trace lacks a span named $name"
done
json=$("$bin" --backend cpu --json run --preset tiny --steps 2) || fail "run --json exited $?"
printf '%s\n' "$json" | grep -q '"per_op_ms": {"embedding": ' || fail "no per_op_ms object in --json"
exit $((failures > 0))
