#!/usr/bin/env bash
# check_model_exports.sh NM LIBRARY SOURCE_DIR - libmetrale_model.so exports exactly the model
# layer's C API: the names in src/model/exports.map, which are every function declared at the
# start of a line in src/model/{model,generate,tokenizer,chat}.h (static inline ones excepted)
# and text_gguf.h's mg_gguf_text_open, and nothing else.
set -euo pipefail
nm_tool=${1:?usage: check_model_exports.sh NM LIBRARY SOURCE_DIR}
lib=${2:?usage: check_model_exports.sh NM LIBRARY SOURCE_DIR}
src=${3:?usage: check_model_exports.sh NM LIBRARY SOURCE_DIR}/src/model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sed -n 's/^ *\(mg_[a-z0-9_]*\);$/\1/p' "$src/exports.map" | sort > "$work/map"
{
  for h in model generate tokenizer chat; do
    grep -v '^static inline' "$src/$h.h" | grep -oE '^[a-z0-9_ ]*[ *]mg_[a-z0-9_]+\(' |
      sed -E 's/.*(mg_[a-z0-9_]+)\($/\1/'
  done
  echo mg_gguf_text_open
} | sort -u > "$work/declared"
"$nm_tool" -D --defined-only "$lib" | awk 'NF >= 2 { n = $NF; sub(/@.*/, "", n); print n }' |
  grep -v -x -E '_init|_fini|__bss_start|_edata|_end' | sort -u > "$work/exported"

status=0
report() {
  if [ -s "$2" ]; then
    echo "FAIL: $1: $(tr '\n' ' ' < "$2")"
    status=1
  fi
}
comm -23 "$work/declared" "$work/map" > "$work/a"; report "declared but not in exports.map" "$work/a"
comm -13 "$work/declared" "$work/map" > "$work/b"; report "in exports.map but not declared" "$work/b"
comm -23 "$work/map" "$work/exported" > "$work/c"; report "in exports.map but not exported" "$work/c"
comm -13 "$work/map" "$work/exported" > "$work/d"; report "exported but not in exports.map" "$work/d"
[ "$status" -eq 0 ] && echo "ok: $lib exports exactly the $(wc -l < "$work/map") functions of the model layer's headers"
exit $status
