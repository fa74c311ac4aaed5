# gpu_steps.sh - sourced by the one-call GPU scripts (gpu_checks.sh, gpu_decode_gemv.sh,
# gpu_pdl.sh, gpu_smollm2.sh): their start, their step runner and the collection of `run --json`
# outputs and their summary lines. The caller sets L (the log folder) and S (the summary file), or has gpu_start set
# them, and optionally TAIL (lines of each log to echo, default 6).

# gpu_start NAME [LINE]: the start of a script on binaries built elsewhere: bin/ of
# $G/pack.tar.xz (bench/pack.sh) unpacked into W=/tmp/metrale-NAME (BIN=$W/bin, also the CUDA
# plugin folder), logs in L=/tmp/metrale-NAME-logs, and S=$OUT/summary.txt begun with the date,
# LINE if given, the GPU and its driver, and the Python and torch versions.
gpu_start() {
    L=/tmp/metrale-$1-logs W=/tmp/metrale-$1
    mkdir -p "$OUT" "$L" "$W"
    tar xJf "$G/pack.tar.xz" -C "$W"
    BIN=$W/bin
    export METRALE_CUDA_PLUGIN_DIR=$BIN PYTHONUNBUFFERED=1
    S="$OUT/summary.txt"
    { date -u; [ -n "${2:-}" ] && echo "$2";
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
      python3 --version; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee "$S"
}

# gpu_smollm2_model DIR: SmolLM2-135M-Instruct put together from the pieces DIR/smollm2.gguf.part*
# (carried over several warm calls: the file is larger than one call's carry) into
# MODEL=$W/SmolLM2-135M-Instruct.Q4_1.gguf; status 1 unless it has scripts/fetch_smollm2.sh's
# sha256 (MODEL_SHA256).
gpu_smollm2_model() {
    MODEL=$W/SmolLM2-135M-Instruct.Q4_1.gguf
    MODEL_SHA256=$(sed -n 's/^gguf_sha256=//p' scripts/fetch_smollm2.sh)
    cat "$1"/smollm2.gguf.part* > "$MODEL" 2>/dev/null
    [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$MODEL_SHA256" ]
}

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

# print_runs FILE [FIELD...]: a line per run of collect_runs' FILE: its name, decode ms per step,
# fraction of the memory-bound limit, FIELD=value for each FIELD given, and an error's start.
print_runs() {
    python3 - "$@" <<'PY'
import json, sys
for k, r in json.load(open(sys.argv[1])).items():
    extra = " ".join(f"{f}={r.get(f)!r}"[:140] for f in sys.argv[2:])
    print(k, r.get("decode_ms_per_step"), "ms per step,", r.get("fraction_of_limit"), "of limit",
          extra, r.get("error", "")[:200])
PY
}
