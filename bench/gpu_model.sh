#!/usr/bin/env bash
# gpu_model.sh - the real model (SmolLM2-135M-Instruct, GGUF) on the GPU machine, in one call:
#   1. the chat answer and its speed (`run --model --chat`, text and --json);
#   2. a fixed-length greedy run for decode speed (--steps 127: no early end-of-sequence stop);
#   3. teacher-forced logits of the CUDA and CPU backends against the mlx-lm reference made in
#      CI (tests/model/make_reference.py), and of the CUDA backend against transformers on the
#      GPU in float32 and bfloat16 (tests/model/transformers_reference.py);
#   4. the transformers peer's decode speed, eager and static cache + torch.compile
#      (bench/peers/peers_smollm2.py).
# $OUT gets summary.txt, run_*.json, peers_smollm2.json and logs.tgz (every step's log).
# Layout it expects under the repository root ($Q, default .gpu-quick): bin/ (metrale-gpu and
# its op plugins), model/part.* (the GGUF in pieces: one call cannot carry all 98 MB; their
# concatenation is checked by sha256), ref/ (the reference case files), and the gguf wheel in
# .whl/, and optionally tests.tar.xz (test programs). Logs and JSON in $OUT.
set -uo pipefail
Q=${Q:-.gpu-quick}
OUT=${OUT:-/tmp/metrale-gpu-model}
L=/tmp/metrale-model-logs
mkdir -p "$OUT" "$L"
M=/tmp/smollm2.gguf
cat "$Q"/model/part.* > "$M"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $M" | sha256sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
BIN=$Q/bin
S="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } | tee "$S"
step() { # step NAME COMMAND...: output in $OUT/NAME.txt, its exit status in the summary
    local name=$1; shift
    local t0=$(date +%s)
    "$@" > "$L/$name.txt" 2>&1
    echo "$name: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$S"
    tail -n 6 "$L/$name.txt"
}
Q0=$(sed -n 's/^prompt //p' "$Q/ref/case0.txt")
step chat_cuda "$BIN/metrale-gpu" --backend cuda run --model "$M" --chat "What is the capital of France?"
step run_chat_cuda_json "$BIN/metrale-gpu" --backend cuda --json run --model "$M" --chat "What is the capital of France?"
step run_steps_cuda_json "$BIN/metrale-gpu" --backend cuda --json run --model "$M" --prompt-ids "$Q0" --steps 127
step run_steps_cpu_json "$BIN/metrale-gpu" --backend cpu --json run --model "$M" --prompt-ids "$Q0" --steps 32
step compare_cuda_vs_mlx_lm python3 tests/model/compare.py "$BIN/metrale-gpu" "$M" "$Q/ref" --backend cuda
step compare_cpu_vs_mlx_lm python3 tests/model/compare.py "$BIN/metrale-gpu" "$M" "$Q/ref" --backend cpu
step transformers_f32 python3 tests/model/transformers_reference.py "$M" "$Q/ref" /tmp/tf32 --dtype float32
step compare_cuda_vs_transformers_f32 python3 tests/model/compare.py "$BIN/metrale-gpu" "$M" /tmp/tf32 --backend cuda
step compare_cuda_hf_f32_dir_vs_mlx_lm python3 tests/model/compare.py "$BIN/metrale-gpu" /tmp/tf32/hf "$Q/ref" --backend cuda
step transformers_bf16 python3 tests/model/transformers_reference.py "$M" "$Q/ref" /tmp/tfbf16 --dtype bfloat16
cp -r /tmp/tf32/hf /tmp/tfbf16/ 2>/dev/null
step compare_cuda_vs_transformers_bf16 python3 tests/model/compare.py "$BIN/metrale-gpu" "$M" /tmp/tfbf16 --backend cuda
step peers_smollm2 python3 bench/peers/peers_smollm2.py /tmp/tf32/hf "$Q0" --new 128 --json-out "$OUT/peers_smollm2.json"
# at most 8 files come back: the summary, three run JSONs, the peer's JSON and every log
# the CUDA tests of the forward pass (carried as tests.tar.xz: test_forward_cuda, test_forward_mlx)
if [ -f "$Q/tests.tar.xz" ]; then
  mkdir -p /tmp/tests && tar xJf "$Q/tests.tar.xz" -C /tmp/tests
  for t in /tmp/tests/*; do cp "$t" "$BIN/"; done
  step test_forward_cuda "$BIN/test_forward_cuda"
  step test_forward_mlx env METRALE_MLX_CHECKPOINTS="$PWD/tests/mlx/checkpoints" "$BIN/test_forward_mlx"
  step run_compare_cuda bash tests/run_compare_cuda.sh "$BIN/metrale-gpu"
fi
for f in run_chat_cuda run_steps_cuda run_steps_cpu; do cp "$L/${f}_json.txt" "$OUT/$f.json"; done
tar czf "$OUT/logs.tgz" -C "$L" .
