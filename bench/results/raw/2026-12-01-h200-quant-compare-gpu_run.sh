#!/bin/bash
# The quantized --compare defect (issue 22 item 5): new and old metrale-gpu on the shapes of the
# report, test_forward_cuda, and the nvfp4_format checks on CUDA. Logs under $OUT.
set -u
H=$(cd "$(dirname "$0")" && pwd)
cd "$H" && tar xJf pack.tar.xz
B=$H/bin
export METRALE_MLX_CHECKPOINTS=$H/mlx_checkpoints
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; } > "$OUT/environment.log" 2>&1
shapes=("--batch 4 --prompt-len 64" "--batch 8 --prompt-len 32")
{
for w in nvfp4 fp8; do for sh in "" "--batch 1 --prompt-len 200"; do
  echo "=== OLD bin/metrale-gpu-old --backend cuda run --preset tiny --weights $w $sh --compare"
  timeout 60 $B/metrale-gpu-old --backend cuda run --preset tiny --weights $w $sh --compare 2>&1 | grep -E "compare|request 0|rror"
  echo "rc=${PIPESTATUS[0]}"
done; done
for w in nvfp4 fp8 bf16; do for sh in "${shapes[@]}"; do
  echo "=== bin/metrale-gpu --backend cuda run --preset tiny --weights $w $sh --compare"
  timeout 60 $B/metrale-gpu --backend cuda run --preset tiny --weights $w $sh --compare 2>&1 | grep -E "compare|request 0|rror"
  echo "rc=${PIPESTATUS[0]}"
done; done
for w in nvfp4 fp8 bf16; do
  echo "=== bin/metrale-gpu --backend cuda --json run --preset tiny-moe --weights $w --compare"
  timeout 60 $B/metrale-gpu --backend cuda --json run --preset tiny-moe --weights $w --compare 2>&1 | grep -oE '"compare_agree.*|rror.*'
  echo "rc=${PIPESTATUS[0]}"
done
} > "$OUT/compare.log" 2>&1
( timeout 200 bash "$H/run_compare_cuda.sh" $B/metrale-gpu; echo "rc=$?" ) > "$OUT/run_compare_cuda.log" 2>&1
( timeout 60 $B/metrale-gpu --backend cuda check nvfp4_format; echo "rc=$?" ) > "$OUT/check_nvfp4_format.log" 2>&1
( timeout 240 $B/test_forward_cuda; echo "rc=$?" ) > "$OUT/test_forward_cuda.log" 2>&1
cat "$OUT/compare.log" "$OUT/run_compare_cuda.log"; tail -3 "$OUT/check_nvfp4_format.log"; grep -vE "^ok|passed$" "$OUT/test_forward_cuda.log" | tail -20
