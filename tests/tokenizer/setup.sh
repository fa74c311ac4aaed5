#!/usr/bin/env bash
# Makes the reference files of tests/test_tokenizer.c (ctest fixture tokenizer_reference) or,
# with `chat`, of tests/test_chat.c (fixture chat_reference): installs the pinned Hugging Face
# `tokenizers`, `gguf` and `jinja2` packages from PyPI into the ignored virtual environment
# .venv-text/ (once), fetches SmolLM2's GGUF (scripts/fetch_smollm2.sh), then runs
# tests/tokenizer/make_reference.py (or make_chat_reference.py) into OUT_DIR.
#
# Usage: setup.sh OUT_DIR [chat]
# When the packages or the model cannot be had here (no network, no python3-venv), writes the
# reason to OUT_DIR/SKIP and exits 0: the C test then skips (77) and prints it. A failure of
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
venv="$root/.venv-text"
rm -rf "$out"
mkdir -p "$out"

skip() {
  echo "$1" > "$out/SKIP"
  echo "$what reference: skipped: $1"
  exit 0
}

command -v python3 >/dev/null || skip "python3 is not installed"
python3 -c 'import ensurepip, venv' 2>/dev/null || skip "python3-venv is not installed"
have() {
  "$venv/bin/python" -c "import tokenizers, gguf, jinja2, importlib.metadata as m; \
assert m.version('tokenizers') == '$TOKENIZERS_VERSION' and m.version('gguf') == '$GGUF_VERSION'; \
assert m.version('jinja2') == '$JINJA2_VERSION' and m.version('markupsafe') == '$MARKUPSAFE_VERSION'" 2>/dev/null
}
if ! have; then
  # Two build folders may run this at once: one installs, the other waits.
  exec 9>"$root/.venv-text.lock"
  flock 9
  if ! have; then
    echo "$what reference: installing tokenizers==$TOKENIZERS_VERSION gguf==$GGUF_VERSION jinja2==$JINJA2_VERSION into .venv-text/"
    rm -rf "$venv"
    python3 -m venv "$venv" || skip "cannot create a virtual environment"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "tokenizers==$TOKENIZERS_VERSION" "gguf==$GGUF_VERSION" "jinja2==$JINJA2_VERSION" \
        "markupsafe==$MARKUPSAFE_VERSION" > "$out/pip.log" 2>&1 ||
      skip "pip could not install tokenizers==$TOKENIZERS_VERSION gguf==$GGUF_VERSION jinja2==$JINJA2_VERSION (see $out/pip.log)"
  fi
  flock -u 9
fi
gguf_file=$(bash "$root/scripts/fetch_smollm2.sh" 2> "$out/fetch.log") ||
  skip "could not fetch SmolLM2's GGUF (see $out/fetch.log)"
if [ "$what" = chat ]; then
  "$venv/bin/python" "$root/tests/tokenizer/make_chat_reference.py" "$gguf_file" \
      "$root/tests/tokenizer/chat_templates" "$out"
else
  "$venv/bin/python" "$root/tests/tokenizer/make_reference.py" "$gguf_file" "$out"
fi
echo "$what reference: files in $out"
