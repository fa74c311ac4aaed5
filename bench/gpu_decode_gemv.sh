#!/usr/bin/env bash
# gpu_decode_gemv.sh - the decode GEMV (src/ops/gemm/gemm_decode_gemv_cuda.c) on the GPU machine, in
# one call, on binaries built elsewhere:
#   1. the GEMM checks against the CPU reference (`check gemm`: the forced decode GEMV on
#      awkward shapes, graph replay and rows alone bit-equal, and every other GEMM check with the
#      automatic choice now taking the decode GEMV at small M);
#   2. compute-sanitizer memcheck and racecheck on the decode-GEMV checks;
#   3. `bench gemm_decode` (decode GEMV vs cuBLASLt vs auto) and its PyTorch peer in the same
#      call (bench/peers/peers_gemm_decode.py);
#   4. the Llama-3-8B-shaped forward pass, BF16 and FP8 at batch 1 and 8, with the automatic
#      choice and with cuBLASLt forced (the build before the decode GEMV), and `run --compare`
#      of the tiny preset in FP8 and BF16 on the shapes of the fixed compare defect.
# Layout: $G/bin (default .gpu-gemv/bin: metrale-gpu and the op plugins). $OUT gets
# summary.txt, the bench and peer JSON, the run JSON and logs.tgz. QUICK=1 keeps steps 1-3 with
# M in {1, 16} and leaves out the peer and step 4.
set -uo pipefail
G=${G:-.gpu-gemv}
BIN=$G/bin
OUT=${OUT:-/tmp/metrale-gpu-gemv}
L=/tmp/metrale-gemv-logs
mkdir -p "$OUT" "$L"
S="$OUT/summary.txt"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } | tee "$S"
TAIL=8
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
MG="$BIN/metrale-gpu"
step check_gemm "$MG" --backend cuda check gemm
grep -E "^gemm/" "$L/check_gemm.txt" >> "$S"
step memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 "$MG" --backend cuda check decode_gemv
step racecheck compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 3 "$MG" --backend cuda check decode_gemv_fp8_rowwise
if [ "${QUICK:-0}" = 1 ]; then
  step bench_gemm_decode "$MG" --backend cuda bench gemm_decode --m 1,16 --json-out "$OUT/gemm_decode.metrale.json"
  tar czf "$OUT/logs.tgz" -C "$L" .
  exit 0
fi
step bench_gemm_decode "$MG" --backend cuda bench gemm_decode --json-out "$OUT/gemm_decode.metrale.json"
step peers_gemm_decode python3 bench/peers/peers_gemm_decode.py --out "$OUT/gemm_decode.peers.json"
runs=()
for w in bf16 fp8; do
  for bsz in 1 8; do
    step "run_${w}_b${bsz}_auto" "$MG" --backend cuda --json run --preset llama-3-8b --weights "$w" --batch "$bsz" --steps 64
    step "run_${w}_b${bsz}_cublaslt" "$MG" --backend cuda --json --provider gemm_bf16=cublaslt --provider gemm_fp8=cublaslt run --preset llama-3-8b --weights "$w" --batch "$bsz" --steps 64
    runs+=("run_${w}_b${bsz}_auto" "run_${w}_b${bsz}_cublaslt")
  done
done
collect_runs "${runs[@]}" > "$OUT/runs.json"
for w in fp8 bf16; do
  step "compare_tiny_${w}_default" "$MG" --backend cuda run --preset tiny --weights "$w" --compare
  step "compare_tiny_${w}_b1_p200" "$MG" --backend cuda run --preset tiny --weights "$w" --batch 1 --prompt-len 200 --compare
  step "compare_tiny_${w}_b2_p5" "$MG" --backend cuda run --preset tiny --weights "$w" --batch 2 --prompt-len 5 --compare
done
tar czf "$OUT/logs.tgz" -C "$L" .
