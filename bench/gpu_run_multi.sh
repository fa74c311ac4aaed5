#!/usr/bin/env bash
# gpu_run_multi.sh - the two-GPU run (nvidia-h200-x2), separate from gpu_run.sh: the
# communicator tests, `metrale-gpu bench comm` and its torch.distributed peer, and their
# report, on a build carried by bench/carry.sh (same layout as gpu_run.sh: $HERE/bin,
# $HERE/peers). Output in $OUT (default /tmp/metrale-gpu-run-multi): summary.txt,
# results_comm.md and logs.tgz.
#
# NCCL: METRALE_NCCL_PATH when set; else libnccl.so.2 from the loader's path; else the copy
# PyTorch brings (nvidia-nccl-cu* wheel, or torch/lib). The same library serves the peer.
# METRALE_RUN_STEPS picks steps (default "env,tests,bench,peers,report").
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="${METRALE_BIN:-$HERE/bin}"
PEERS="${METRALE_PEERS:-$HERE/peers}"
OUT="${OUT:-/tmp/metrale-gpu-run-multi}"
LOGS="$(mktemp -d /tmp/metrale-multi-logs.XXXXXX)"
SUMMARY="$OUT/summary.txt"
STEPS=",${METRALE_RUN_STEPS:-env,tests,bench,peers,report},"
mkdir -p "$OUT"
: >"$SUMMARY"
FAILED=0

want() { [[ "$STEPS" == *",$1,"* ]]; }

# step NAME TIMEOUT_S COMMAND...: log in $LOGS/NAME.log, one summary line (77 = skipped).
step() {
    local name="$1" limit="$2"
    shift 2
    local t0=$(date +%s) rc verdict="ok"
    echo "=== $name: $*" | tee -a "$LOGS/$name.log"
    timeout --kill-after=10 "$limit" "$@" >>"$LOGS/$name.log" 2>&1
    rc=$?
    [ $rc -eq 77 ] && verdict="SKIPPED"
    [ $rc -ne 0 ] && [ $rc -ne 77 ] && verdict="FAILED (exit $rc)" && FAILED=$((FAILED + 1))
    [ $rc -eq 124 ] && verdict="TIMED OUT after ${limit}s"
    printf '%-28s %-22s %4ss\n' "$name" "$verdict" "$(( $(date +%s) - t0 ))" | tee -a "$SUMMARY"
    tail -n 15 "$LOGS/$name.log"
    return 0
}

if [ -z "${METRALE_NCCL_PATH:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
    METRALE_NCCL_PATH="$(python3 - <<'PY' 2>/dev/null
import glob, os
roots = []
try:
    import nvidia.nccl
    roots += [os.path.join(p, "lib") for p in nvidia.nccl.__path__]
except Exception:
    pass
try:
    import torch
    roots.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
for r in roots:
    hits = sorted(glob.glob(os.path.join(r, "libnccl.so*")))
    if hits:
        print(hits[0]); break
PY
)"
    [ -n "$METRALE_NCCL_PATH" ] && export METRALE_NCCL_PATH
fi

want env && {
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1
    nvidia-smi topo -m 2>&1
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
    echo "METRALE_NCCL_PATH=${METRALE_NCCL_PATH:-(loader path: libnccl.so.2)}"
} >"$LOGS/environment.log" 2>&1
want env && tee -a "$SUMMARY" <"$LOGS/environment.log"

if want tests; then
    for t in test_comm_no_nccl test_comm_cpu test_concurrency_comm_cpu test_tp_mlp_cpu \
        test_cuda_comm test_cuda_comm_dead_peer test_cuda_tp_mlp; do
        step "$t" 300 "$BIN/$t"
    done
    # The dead-peer test once more with NCCL's own diagnostics, for the log.
    NCCL_DEBUG=WARN step test_cuda_comm_dead_peer_debug 120 "$BIN/test_cuda_comm_dead_peer"
fi
want bench && step bench_comm 400 "$BIN/metrale-gpu" --backend cuda bench comm \
    --iters 50 --warmup 10 --json-out "$LOGS/metrale_comm.json"
want peers && PYTHONUNBUFFERED=1 step peers_comm 400 python3 "$PEERS/peers_comm.py" \
    --out "$LOGS/peers_comm.json"
if want report && [ -f "$LOGS/metrale_comm.json" ]; then
    peer=()
    [ -f "$LOGS/peers_comm.json" ] && peer=("$LOGS/peers_comm.json")
    step report 60 python3 "$PEERS/report.py" --metrale "$LOGS/metrale_comm.json" \
        --peers "${peer[@]}" --title "metrale-gpu communicators on two GPUs against torch.distributed" \
        --command "bash gpu_run_multi.sh (bench/gpu_run_multi.sh)" --out "$OUT/results_comm.md"
fi

tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
echo "$FAILED step(s) failed" | tee -a "$SUMMARY"
[ -f "$OUT/results_comm.md" ] && cat "$OUT/results_comm.md"
cat "$SUMMARY"
exit $((FAILED > 0))
