#!/usr/bin/env bash
# cpu_llama_cpp.sh - SmolLM2-135M-Instruct on this machine's CPU: llama.cpp (the pinned
# llama-cpp-python, built from its PyPI source into the ignored .venv-llama-cpp/, once) beside
# `metrale-gpu --backend cpu run --model` in the same run, on the same GGUF file and prompt.
#
#   bench/cpu_llama_cpp.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, bench/results/cpu-smollm2)
#
# Writes OUT_DIR/llama_cpp.json (bench/peers/peers_llama_cpp.py) and OUT_DIR/metrale.json
# (run --json), and prints both speeds with their ratio. The first run compiles llama.cpp
# (several minutes on 2 cores).
set -euo pipefail
LLAMA_CPP_PYTHON_VERSION=0.3.36
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/results/cpu-smollm2}
venv=$root/.venv-llama-cpp
mkdir -p "$out"
model=$(bash "$root/scripts/fetch_smollm2.sh")
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('llama-cpp-python') == '$LLAMA_CPP_PYTHON_VERSION'" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  # native CPU flags for the machine it runs on, as llama.cpp's own default build does
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
fi
question="What is the capital of France?"
"$build/metrale-gpu" --backend cpu --json run --model "$model" --chat "$question" --max-tokens 64 > "$out/metrale.json"
ids=$("$venv/bin/python" -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" "$out/metrale.json")
"$venv/bin/python" "$root/bench/peers/peers_llama_cpp.py" "$model" "$ids" --json-out "$out/llama_cpp.json"
"$build/metrale-gpu" --backend cpu --json run --model "$model" --prompt-ids "$ids" --steps 63 > "$out/metrale_steps.json"
"$venv/bin/python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
m = json.load(open(f"{out}/metrale_steps.json"))
l = json.load(open(f"{out}/llama_cpp.json"))
print(f"metrale-gpu cpu: prefill {m['prefill_tokens_per_s']:.1f} tokens/s, decode {m['decode_tokens_per_s']:.1f} tokens/s")
print(f"llama.cpp     : prefill {l['prefill_tokens_per_s']:.1f} tokens/s, decode {l['decode_tokens_per_s']:.1f} tokens/s")
print(f"ratio (ours / llama.cpp): prefill {m['prefill_tokens_per_s'] / l['prefill_tokens_per_s']:.2f}, "
      f"decode {m['decode_tokens_per_s'] / l['decode_tokens_per_s']:.2f}")
PY
