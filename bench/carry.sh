#!/usr/bin/env bash
# carry.sh BUILD_DIR DEST_DIR - copies what bench/gpu_run.sh needs onto the GPU machine into
# DEST_DIR: the metrale-gpu CLI, the test programs and the op plugins of BUILD_DIR (bin/), the run script,
# the peers and report scripts (peers/), and a cubin of the test kernels built here for the
# module test (nvcc -cubin; skipped without nvcc). Then run there: bash DEST_DIR/gpu_run.sh
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:?usage: carry.sh BUILD_DIR DEST_DIR}"
DEST="${2:?usage: carry.sh BUILD_DIR DEST_DIR}"
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/peers"
for f in "$BUILD"/metrale-gpu "$BUILD"/test_* "$BUILD"/lib*.so; do
    [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$DEST/bin/"
done
cp "$REPO/bench/gpu_run.sh" "$REPO/bench/gpu_run_multi.sh" "$DEST/"
# The MLX reference files test_mlx_reference reads (made by ctest's mlx_reference_files here:
# the GPU machine cannot install MLX).
[ -f "$BUILD/mlx_reference/layers.txt" ] && cp -r "$BUILD/mlx_reference" "$DEST/"
# The committed MLX checkpoints (check mlx/checkpoint, run --weights mlx8|mlx4).
cp -r "$REPO/tests/mlx/checkpoints" "$DEST/mlx_checkpoints"
cp "$REPO"/bench/peers/*.py "$DEST/peers/"
if command -v nvcc >/dev/null && [ -f "$REPO/kernels/cuda/test_kernels.cu" ]; then
    nvcc -cubin -O3 -arch=sm_90a -o "$DEST/test_kernels.sm_90a.cubin" \
        "$REPO/kernels/cuda/test_kernels.cu"
fi
du -sh "$DEST"
