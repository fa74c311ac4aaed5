#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian 12 machine, by package name and version.
# Idempotent and quiet when everything is already there.
set -euo pipefail

need=()
command -v cc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v pkg-config >/dev/null || need+=(pkg-config) # the install test's pkg-config consumer
# jsmn: the JSON parser of the safetensors and config.json readers (header-only).
[ -f /usr/include/jsmn.h ] || need+=("libjsmn-dev=1.1.0-2")
# clang with libFuzzer: the fuzz smoke test of those readers (cmake/mlx_tests.cmake).
if ! command -v clang-14 >/dev/null || [ ! -f /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then
  need+=("clang-14=1:14.0.6-12" "libclang-rt-14-dev=1:14.0.6-12")
fi
# clang-format: `make lint` checks every C, C++ and CUDA file against .clang-format with it.
command -v clang-format-14 >/dev/null || need+=("clang-format-14=1:14.0.6-12")
# python3 with venv: tests/mlx/setup.sh installs the pinned mlx wheels, MLX being the reference
# of the MLX ops.
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=("python3-venv=3.11.2-1+b1")
if ! command -v cmake >/dev/null; then
  need+=("cmake=3.25.1-1")
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

cmake_version=$(cmake --version | head -1 | awk '{print $3}')
if [ "$(printf '%s\n3.25\n' "$cmake_version" | sort -V | head -1)" != "3.25" ]; then
  echo "setup: cmake >= 3.25 required, found $cmake_version" >&2
  exit 1
fi
