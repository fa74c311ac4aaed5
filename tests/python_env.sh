# python_env.sh - sourced by the setup scripts of the reference fixtures (tests/mlx/setup.sh,
# tests/tokenizer/setup.sh, tests/model/setup.sh): the SKIP protocol and the pinned virtual
# environments they share.
#
# The sourcing script sets `root` (the repository), `out` (its reference folder, made empty
# here) and `what` (a name for its messages) first. Then:
#   reference_skip REASON         writes REASON to $out/SKIP and exits 0: the C or Python test
#                                 then skips (77) and prints it
#   reference_venv NAME PKG==VER...
#                                 makes sure the ignored $root/NAME/ holds exactly these
#                                 versions (read back through importlib.metadata), creating it
#                                 from PyPI under a lock when it does not: two build folders may
#                                 run fixtures at once, one installs and the other waits; skips
#                                 when python3-venv or the network is missing. Sets $venv.
rm -rf "$out"
mkdir -p "$out"

reference_skip() {
  echo "$1" > "$out/SKIP"
  echo "$what reference: skipped: $1"
  exit 0
}

reference_venv() {
  local name=$1
  shift
  venv="$root/$name"
  command -v python3 >/dev/null || reference_skip "python3 is not installed"
  python3 -c 'import ensurepip, venv' 2>/dev/null || reference_skip "python3-venv is not installed"
  local check="import importlib.metadata as m"
  for pin in "$@"; do
    check="$check; assert m.version('${pin%%==*}') == '${pin#*==}'"
  done
  if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    exec 9>"$venv.lock"
    flock 9
    if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
      echo "$what reference: installing $* into $name/"
      rm -rf "$venv"
      python3 -m venv "$venv" || reference_skip "cannot create a virtual environment"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
          > "$out/pip.log" 2>&1 || reference_skip "pip could not install $* (see $out/pip.log)"
    fi
    flock -u 9
  fi
}
