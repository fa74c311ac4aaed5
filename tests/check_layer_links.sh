#!/usr/bin/env bash
# check_layer_links.sh NM LOWER_OBJECTS... -- UPPER_OBJECTS... - a layer links nothing above it.
#
# Fails, listing the names, when an object of the lower layer (the core) refers to a symbol that
# an object of the layers above it (the backends, their registry, the ops) defines: the arrows
# of README.md's Layout point down only, and the core reaches a backend only through the driver the
# backend registry hands it (mg_core_backend_open), never by name.
set -euo pipefail

nm_tool="${1:?usage: check_layer_links.sh NM LOWER_OBJECTS... -- UPPER_OBJECTS...}"
shift
lower=() upper=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do lower+=("$1"); shift; done
[ $# -gt 0 ] && shift
upper=("$@")
[ ${#lower[@]} -gt 0 ] && [ ${#upper[@]} -gt 0 ] || { echo "no objects given" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$nm_tool" -u "${lower[@]}" | awk 'NF == 2 && $1 == "U" { print $2 }' | sort -u >"$work/needed"
"$nm_tool" --defined-only "${upper[@]}" | awk 'NF == 3 && $2 ~ /^[TDBRV]$/ { print $3 }' |
    sort -u >"$work/above"
comm -12 "$work/needed" "$work/above" >"$work/wrong"
if [ -s "$work/wrong" ]; then
    echo "the lower layer links names defined above it:" >&2
    sed 's/^/  /' "$work/wrong" >&2
    exit 1
fi
echo "the lower layer links nothing above it ($(wc -l <"$work/needed") names needed)"
