#!/usr/bin/env bash
# Makes the reference files of tests/test_tokenizer.c (ctest fixture tokenizer_reference) or,
# with `chat`, of tests/test_chat.c (fixture chat_reference): installs the pinned Hugging Face
# `tokenizers`, `gguf` and `jinja2` packages from PyPI into the ignored virtual environment
# .venv-text/ (once), fetches SmolLM2's GGUF (scripts/fetch_smollm2.sh), then runs
# tests/tokenizer/make_reference.py (or make_chat_reference.py) into OUT_DIR.
#
# Usage: setup.sh OUT_DIR [chat]
# When the packages or the model cannot be had here (no network, no python3-venv), writes the
# reason to OUT_DIR/SKIP and exits 0 (tests/python_env.sh): the C test then skips (77) and
# prints it. A failure of
# the reference script once the packages are installed is a test failure.
set -euo pipefail

TOKENIZERS_VERSION=0.23.3
GGUF_VERSION=0.19.0
# jinja2 as transformers renders chat templates with it (3.1.6 is the oldest it accepts);
# MarkupSafe is jinja2's one dependency, pinned so the environment is the same everywhere.
JINJA2_VERSION=3.1.6
MARKUPSAFE_VERSION=3.0.4

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
what=${2:-tokenizer}
. "$root/tests/python_env.sh"
reference_venv .venv-text "tokenizers==$TOKENIZERS_VERSION" "gguf==$GGUF_VERSION" \
  "jinja2==$JINJA2_VERSION" "markupsafe==$MARKUPSAFE_VERSION"
gguf_file=$(bash "$root/scripts/fetch_smollm2.sh" 2> "$out/fetch.log") ||
  reference_skip "could not fetch SmolLM2's GGUF (see $out/fetch.log)"
if [ "$what" = chat ]; then
  "$venv/bin/python" "$root/tests/tokenizer/make_chat_reference.py" "$gguf_file" \
      "$root/tests/tokenizer/chat_templates" "$out"
else
  "$venv/bin/python" "$root/tests/tokenizer/make_reference.py" "$gguf_file" "$out"
fi
echo "$what reference: files in $out"
