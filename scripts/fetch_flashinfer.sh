#!/usr/bin/env bash
# Fetches the FlashInfer, CUTLASS and CCCL headers the attention kernels compile against, from
# the PyPI wheel flashinfer-python at one pinned version, verified by its sha256, and unpacks
# only the header trees into an ignored folder. Nothing fetched here is ever committed.
#
#   scripts/fetch_flashinfer.sh [DEST]      (default DEST: <repo>/third_party)
#
# Result: DEST/flashinfer-python-<version>/{include,cutlass/include,cutlass/tools/util/include,
# cccl/libcudacxx/include,cccl/cub,cccl/thrust} and a stamp file naming the verified sha256.
# Idempotent: a complete tree with the right stamp is left alone (no network).
# Needs python3 with pip (both in the Debian 12 image).
# Offline: set METRALE_FLASHINFER_WHEEL=/path/to/the/wheel; its sha256 is still checked.
set -euo pipefail

version=0.7.4
sha256=a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32
wheel=flashinfer_python-${version}-py3-none-any.whl

root=$(cd "$(dirname "$0")/.." && pwd)
dest_root=${1:-$root/third_party}
dest=$dest_root/flashinfer-python-$version
stamp=$dest/.fetched-sha256

fail() {
  echo "fetch_flashinfer: $*" >&2
  exit 1
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sha256" ]; then
  exit 0
fi
command -v python3 >/dev/null || fail "python3 is required to fetch and unpack the wheel"

mkdir -p "$dest_root"
work=$(mktemp -d "$dest_root/.fetch-flashinfer.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -n "${METRALE_FLASHINFER_WHEEL:-}" ]; then
  [ -f "$METRALE_FLASHINFER_WHEEL" ] || fail "METRALE_FLASHINFER_WHEEL=$METRALE_FLASHINFER_WHEEL is not a file"
  cp "$METRALE_FLASHINFER_WHEEL" "$work/$wheel"
else
  echo "fetch_flashinfer: downloading flashinfer-python==$version (about 100 MB)"
  python3 -m pip --version >/dev/null 2>&1 ||
    fail "python3 -m pip is missing (Debian: apt-get install python3-pip), or set" \
         "METRALE_FLASHINFER_WHEEL=/path/to/$wheel"
  python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
      --dest "$work" "flashinfer-python==$version" >"$work/pip.log" 2>&1 || {
    tail -n 5 "$work/pip.log" >&2
    fail "could not download flashinfer-python==$version from PyPI (offline?). Fetch the wheel" \
         "elsewhere and set METRALE_FLASHINFER_WHEEL=/path/to/$wheel, or configure with" \
         "-DMETRALE_FLASHINFER=OFF to build without the attention kernels."
  }
  [ -f "$work/$wheel" ] || fail "pip did not produce $wheel"
fi

# Verify and unpack with Python alone (unzip and sha256sum may be missing on a bare image).
python3 - "$work/$wheel" "$sha256" "$work/tree" <<'PY' || fail "unpacking $wheel failed"
import hashlib, os, sys, zipfile

wheel, want, out = sys.argv[1], sys.argv[2], sys.argv[3]
h = hashlib.sha256()
with open(wheel, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
if h.hexdigest() != want:
    sys.exit(f"fetch_flashinfer: sha256 mismatch for {wheel}: got {h.hexdigest()}, pinned {want}")

# Header trees only: FlashInfer's own headers, CUTLASS/CuTe (+ its util headers, which
# flashinfer/cutlass_utils.cuh includes) and the CCCL it was built against.
keep = ("include/", "cutlass/include/", "cutlass/tools/util/include/",
        "cccl/libcudacxx/include/", "cccl/cub/", "cccl/thrust/")
prefix = "flashinfer/data/"
count = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if info.is_dir() or not name.startswith(prefix):
            continue
        rel = name[len(prefix):]
        if not rel.startswith(keep) or ".." in rel.split("/"):
            continue
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            dst.write(src.read())
        count += 1
if count == 0:
    sys.exit("fetch_flashinfer: the wheel holds no headers under flashinfer/data/")
print(f"fetch_flashinfer: unpacked {count} header files")
PY

[ -f "$work/tree/include/flashinfer/attention/prefill.cuh" ] ||
  fail "the wheel lacks include/flashinfer/attention/prefill.cuh: layout changed?"
rm -rf "$dest"
mv "$work/tree" "$dest"
echo "$sha256" >"$stamp"
echo "fetch_flashinfer: headers of flashinfer-python $version in $dest"
