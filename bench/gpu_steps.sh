# gpu_steps.sh - sourced by the one-call GPU scripts (gpu_checks.sh, gpu_decode_gemv.sh): their
# step runner and the collection of `run --json` outputs. The caller sets L (the log folder), S
# (the summary file) and optionally TAIL (lines of each log to echo, default 6).

# step NAME COMMAND...: runs COMMAND, log in $L/NAME.txt, exit status and time in the summary.
step() {
    local name=$1; shift
    local t0=$(date +%s)
    "$@" > "$L/$name.txt" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$S"
    tail -n "${TAIL:-6}" "$L/$name.txt"
}

# collect_runs NAME...: one JSON object on stdout keyed by step name, each the `run --json`
# object its log holds (without the token list), or {"error": the log's tail}.
collect_runs() {
    python3 - "$L" "$@" <<'PY'
import json, sys
out = {}
for name in sys.argv[2:]:
    text = open(f"{sys.argv[1]}/{name}.txt").read()
    start = text.find("{")
    try:
        row = json.loads(text[start:]) if start >= 0 else {"error": text[-400:]}
        row.pop("tokens", None)
        out[name] = row
    except ValueError:
        out[name] = {"error": text[-400:]}
json.dump(out, sys.stdout, indent=1)
PY
}
