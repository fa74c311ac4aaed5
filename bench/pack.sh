#!/usr/bin/env bash
# pack.sh BUILD_DIR DEST_DIR [TEST...] - what a one-call GPU script (gpu_checks.sh, gpu_pdl.sh)
# unpacks: DEST_DIR/pack.tar.xz holding bin/ with the metrale-gpu CLI, the library and its op
# plugins, and the named test programs of BUILD_DIR (default: every test_* with a CUDA case),
# stripped of debug information to fit the device tool's 64 MiB carry.
set -euo pipefail
BUILD="${1:?usage: pack.sh BUILD_DIR DEST_DIR [TEST...]}"
DEST="${2:?usage: pack.sh BUILD_DIR DEST_DIR [TEST...]}"
shift 2
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_forward_cuda test_cuda_graph test_kv_cache_cuda test_sample
                                 test_generate test_cuda_mlx)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$DEST"
cp "$BUILD/metrale-gpu" "$BUILD"/lib*.so "$stage/bin/"
for t in "${tests[@]}"; do
    [ -x "$BUILD/$t" ] && cp "$BUILD/$t" "$stage/bin/"
done
strip --strip-debug "$stage"/bin/*
# A program linked here against libmetrale_gpu.so (bench/python_overhead.py's) needs it by its
# SONAME: a link of that name beside the copy.
soname=$(readelf -d "$stage/bin/libmetrale_gpu.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -z "$soname" ] || ln -s libmetrale_gpu.so "$stage/bin/$soname"
tar cJf "$DEST/pack.tar.xz" -C "$stage" bin
du -h "$DEST/pack.tar.xz"
