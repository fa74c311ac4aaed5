#!/usr/bin/env bash
# check_exports.sh NM LIBRARY INCLUDE_DIR - the shared library exports exactly the public API.
#
# Reads the functions declared in INCLUDE_DIR/metrale/*.h (comments and preprocessor lines
# removed, then every file-scope declaration `... name(...)` that is not a typedef or a
# function pointer) and the defined dynamic symbols of LIBRARY (`NM -D --defined-only`), and
# fails when
#  - a defined dynamic symbol does not start with mg_ (the linker's own _init, _fini,
#    __bss_start, _edata and _end are allowed, should the linker add them);
#  - an exported symbol is not a function declared in the public headers;
#  - a function declared in the public headers lacks MG_API (it would be hidden);
#  - a function declared with MG_API is not exported.
set -euo pipefail

nm_tool="${1:?usage: check_exports.sh NM LIBRARY INCLUDE_DIR}"
lib="${2:?usage: check_exports.sh NM LIBRARY INCLUDE_DIR}"
include_dir="${3:?usage: check_exports.sh NM LIBRARY INCLUDE_DIR}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

headers=("$include_dir"/metrale/*.h)
[ -e "${headers[0]}" ] || { echo "no headers in $include_dir/metrale" >&2; exit 1; }

# One line per declared function: "NAME api" or "NAME noapi", then the header it is in.
awk '
function flush(   text, n, i, stmts, s, open_at, prefix, rest, name, api) {
    text = buffer
    buffer = ""
    # Block comments, then line comments.
    while ((i = index(text, "/*")) > 0) {
        rest = substr(text, i + 2)
        n = index(rest, "*/")
        if (n == 0) { text = substr(text, 1, i - 1); break }
        text = substr(text, 1, i - 1) " " substr(rest, n + 2)
    }
    gsub(/\/\/[^\n]*/, "", text)
    # Preprocessor lines, with their continuations.
    n = split(text, lines, "\n")
    text = ""
    continued = 0
    for (i = 1; i <= n; i++) {
        if (continued || lines[i] ~ /^[ \t]*#/) {
            continued = (lines[i] ~ /\\[ \t]*$/)
            continue
        }
        text = text " " lines[i]
    }
    n = split(text, stmts, /[;{}]/)
    for (i = 1; i <= n; i++) {
        s = stmts[i]
        sub(/^[ \t]+/, "", s)
        if (s ~ /^typedef[ \t]/ || (open_at = index(s, "(")) == 0)
            continue
        prefix = substr(s, 1, open_at - 1)
        rest = substr(s, open_at + 1)
        if (rest ~ /^[ \t]*\*/)
            continue                       # a function pointer, not a function
        sub(/[ \t]+$/, "", prefix)
        if (!match(prefix, /[A-Za-z_][A-Za-z0-9_]*$/))
            continue
        name = substr(prefix, RSTART)
        if (name ~ /^(_Alignas|_Alignof|_Static_assert|__attribute__|sizeof)$/)
            continue
        api = (s ~ /(^|[^A-Za-z0-9_])MG_API([^A-Za-z0-9_]|$)/) ? "api" : "noapi"
        print name, api, file
    }
}
FNR == 1 && NR != 1 { flush() }
FNR == 1 { file = FILENAME }
{ buffer = buffer $0 "\n" }
END { flush() }
' "${headers[@]}" | sort > "$work/declared"

"$nm_tool" -D --defined-only "$lib" | awk 'NF >= 2 { name = $NF; sub(/@.*/, "", name); print name }' \
    | sort -u > "$work/exported"

failed=0
fail() {
    echo "FAIL: $*"
    failed=1
}

n_exported=$(wc -l < "$work/exported")
n_declared=$(wc -l < "$work/declared")
if [ "$n_exported" -eq 0 ]; then
    fail "$lib exports no symbol (is it the shared library?)"
fi
if [ "$n_declared" -eq 0 ]; then
    fail "no function declarations found in $include_dir/metrale/*.h"
fi

# Duplicate declarations across headers would make the comparison below ambiguous.
dups=$(awk '{print $1}' "$work/declared" | uniq -d)
[ -z "$dups" ] || fail "declared in more than one header or twice: $(echo $dups)"

while read -r name; do
    case "$name" in
    mg_*) ;;
    _init | _fini | __bss_start | _edata | _end) ;;
    *) fail "exported symbol $name does not start with mg_" ;;
    esac
done < "$work/exported"

awk '{print $1}' "$work/declared" | sort -u > "$work/declared_names"
awk '$2 == "api" {print $1}' "$work/declared" | sort -u > "$work/api_names"
grep '^mg_' "$work/exported" > "$work/exported_mg" || true

while read -r name; do
    fail "exported symbol $name is not a function declared in $include_dir/metrale/*.h"
done < <(comm -23 "$work/exported_mg" "$work/declared_names")

while read -r name api file; do
    [ "$api" = api ] || fail "$name ($file) is declared without MG_API, so it is not exported"
done < "$work/declared"

while read -r name; do
    fail "$name is declared with MG_API but $lib does not export it"
done < <(comm -13 "$work/exported_mg" "$work/api_names")

if [ "$failed" -ne 0 ]; then
    exit 1
fi
echo "ok: $lib exports exactly the $n_exported functions declared with MG_API in" \
     "$include_dir/metrale/*.h"
