#!/usr/bin/env bash
# Line and branch coverage of the library's CPU-side sources (`make coverage`).
#
# Builds the CPU parts with gcov instrumentation in build-coverage/ (no CUDA, no FlashInfer,
# Debug, -O0), runs the whole ctest suite there, then reports with gcovr, pinned below and
# installed from PyPI into the ignored virtual environment .venv-coverage/. The report covers
# the library's sources under src/ (core, the CPU backend, the ops, the checks) and leaves out
# every cuda/ directory, the tests and the tools. It prints a per-file table with lines and
# branches and the totals, and writes:
#   build-coverage/coverage.txt          the same table
#   build-coverage/coverage.json         gcovr's JSON summary (per file and totals)
#   build-coverage/html/index.html       gcovr's HTML report, one page per file
#
# Environment: JOBS (parallel build and test jobs; default nproc), COVERAGE_BUILD (the build
# folder; default build-coverage). Exits non-zero when the build or any test fails; the
# report is still written when tests fail, so a failure can be looked at with its coverage.
set -euo pipefail

GCOVR_VERSION=8.8

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${COVERAGE_BUILD:-build-coverage}
venv=.venv-coverage
jobs=${JOBS:-$(nproc)}

bash scripts/setup.sh

# --- gcovr, pinned, in its own virtual environment
python_can_make_venvs() { python3 -c 'import ensurepip, venv' 2>/dev/null; }
if ! command -v python3 >/dev/null || ! python_can_make_venvs; then
  echo "coverage: installing python3 and python3-venv"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-venv
fi
if [ "$("$venv/bin/gcovr" --version 2>/dev/null | awk 'NR == 1 {print $2}')" != "$GCOVR_VERSION" ]; then
  echo "coverage: installing gcovr==$GCOVR_VERSION into $venv/"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gcovr==$GCOVR_VERSION"
fi

# --- instrumented build
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DMETRALE_COVERAGE=ON \
      -DMETRALE_CUDA=OFF -DMETRALE_FLASHINFER=OFF >/dev/null
cmake --build "$build" -j "$jobs"

# --- every test, from zeroed counters
find "$build" -name '*.gcda' -delete
tests_status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" || tests_status=$?

# --- report: src/ only, no cuda/ directories (the regexes follow the sources wherever they
# move under src/)
mkdir -p "$build/html"
# The CPU attention reference runs some loops more than 2^33 times: real counts, not the gcov
# bug gcovr's suspicious-hits check looks for, so that check is off. Its worker threads also
# race on the (non-atomic) counters, which can leave a few derived branch counts negative;
# gcovr reads those as 0 and warns. -fprofile-update=atomic would make them exact but makes
# the instrumented GEMM and attention references 10 to 20 times slower.
"$venv/bin/gcovr" --root . -j "$jobs" \
    --filter 'src/' --exclude '.*/cuda/.*' \
    --gcov-suspicious-hits-threshold 0 --gcov-ignore-parse-errors negative_hits.warn_once_per_file \
    --json-summary-pretty --json-summary "$build/coverage.json" \
    --html-details "$build/html/index.html" \
    "$build" >/dev/null
"$venv/bin/python" - "$build/coverage.json" <<'EOF' | tee "$build/coverage.txt"
import json, sys

summary = json.load(open(sys.argv[1]))

def percent(covered, total):
    return f"{100.0 * covered / total:5.1f}%" if total else "    -"

def row(name, lc, lt, bc, bt):
    return (f"{name:<44} {lc:>6}/{lt:<6} {percent(lc, lt)}   "
            f"{bc:>6}/{bt:<6} {percent(bc, bt)}")

print(f"{'file':<44} {'lines':>13} {'':>6}   {'branches':>13}")
groups = {}
for f in sorted(summary["files"], key=lambda f: f["filename"]):
    print(row(f["filename"], f["line_covered"], f["line_total"],
              f["branch_covered"], f["branch_total"]))
    group = f["filename"].rsplit("/", 1)[0]
    g = groups.setdefault(group, [0, 0, 0, 0])
    for i, key in enumerate(("line_covered", "line_total", "branch_covered", "branch_total")):
        g[i] += f[key]
print("-" * 86)
for group, (lc, lt, bc, bt) in sorted(groups.items()):
    print(row(group + "/", lc, lt, bc, bt))
print(row("TOTAL", summary["line_covered"], summary["line_total"],
          summary["branch_covered"], summary["branch_total"]))
EOF
echo "coverage: $build/coverage.txt, $build/coverage.json, $build/html/index.html"
exit "$tests_status"
