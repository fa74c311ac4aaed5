#!/usr/bin/env bash
# lint.sh - what `make lint` checks (and `make test` with it):
#   1. every tracked C, C++ and CUDA file is clean against .clang-format (clang-format 14, the
#      Debian 12 package scripts/setup.sh installs);
#   2. every repository path a source file, script or document names exists: tokens that start
#      with one of the tree's top folders (src/, include/, kernels/, tests/, tools/, bench/,
#      scripts/, cmake/, docs/, python/) and end in a file name or "/"; bare file names (name.c,
#      name.h, name.cu, ...) in the comments of C and CUDA files, and bare upper-case document
#      names (README.md) anywhere, which must be some tracked file's name.
# `lint.sh --paths` checks 2 only.
# Prints each problem as FILE: message and exits 1 when there is any. Results under
# bench/results/ (records of past runs, naming paths as they were) and fuzz corpora are not
# checked for paths.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0

FORMAT=${CLANG_FORMAT:-clang-format-14}
if [ "${1:-}" = --paths ]; then
    :
elif ! command -v "$FORMAT" >/dev/null; then
    echo "lint: $FORMAT not found (scripts/setup.sh installs clang-format-14)" >&2
    exit 1
fi
mapfile -t sources < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fuzz/corpus')
[ "${1:-}" = --paths ] && sources=()
unclean=()
for f in "${sources[@]}"; do
    "$FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || unclean+=("$f")
done
for f in "${unclean[@]}"; do
    echo "$f: not formatted as .clang-format says (run: $FORMAT -i $f)"
    status=1
done

python3 - <<'EOF' || status=1
import os, re, subprocess, sys

files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
names = {os.path.basename(f) for f in files}
text_ext = (".c", ".h", ".cu", ".cuh", ".md", ".sh", ".cmake", ".py", ".txt", ".toml")
# Paths that are not ours to have: third-party headers found at build time.
foreign = ("include/flashinfer/", "include/cutlass/", "include/cute/")
# A path ends in a file name with an extension, or in "/" (a folder); a pattern (with *, {, <,
# $) is not checked.
path_re = re.compile(r"(?<![\w/.$-])((?:src|include|kernels|tests|tools|bench|scripts|cmake|docs|python)"
                     r"/[A-Za-z0-9_./+*{}<>$-]*)")
name_re = re.compile(r"(?<![\w/.<\"'-])([A-Za-z][A-Za-z0-9_]*\.(?:c|h|cu|cuh))\b")
# A project document named without a folder (an upper-case name such as README.md) must be a
# tracked file's name too, wherever it is named; lower-case ones are outputs of scripts.
doc_re = re.compile(r"(?<![\w/.<\"'-])([A-Z][A-Z0-9_-]*\.md)\b")
bad = 0
for f in files:
    if not (f.endswith(text_ext) or os.path.basename(f) in ("Makefile", "CMakeLists.txt")):
        continue
    if f.startswith("bench/results/") or "/corpus" in f:
        continue
    try:
        lines = open(f, encoding="utf-8").read().splitlines()
    except (UnicodeDecodeError, FileNotFoundError):
        continue
    code = f.endswith((".c", ".h", ".cu", ".cuh"))
    for number, line in enumerate(lines, 1):
        for m in path_re.finditer(line):
            p = m.group(1).rstrip(".")
            last = p.rstrip("/").rsplit("/", 1)[-1]
            if any(c in p for c in "*{}<>$") or not ("." in last or p.endswith("/")):
                continue
            if p.startswith(foreign) or os.path.exists(p):
                continue
            print(f"{f}:{number}: names {p}, which does not exist")
            bad += 1
        for m in doc_re.finditer(line):
            if m.group(1) not in names:
                print(f"{f}:{number}: names {m.group(1)}, which is no file of the tree")
                bad += 1
        stripped = line.lstrip()
        comment = stripped.startswith(("//", "/*", "*")) or "/*" in line or "//" in line
        if code and comment and not stripped.startswith("#include"):
            for m in name_re.finditer(line):
                if m.group(1) not in names:
                    print(f"{f}:{number}: names {m.group(1)}, which is no file of the tree")
                    bad += 1
sys.exit(1 if bad else 0)
EOF
exit $status
