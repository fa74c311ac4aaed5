#!/usr/bin/env bash
# pack_random_models.sh BUILD_DIR DEST_DIR [FORM...] - DEST_DIR/random_models.tar.xz for
# bench/gpu_checks.sh: the reference files ctest's random_models_reference_files wrote into
# BUILD_DIR/random_models_reference, keeping only the forms named (default: hf and the NVFP4
# forms; e.g. "hf mlx4 mlx8 nvfp4_modelopt nvfp4_ct gguf"), each model's forms list rewritten
# to match, so that tests/model/compare_random.sh compares exactly what was carried. All forms
# together are larger than one device call's carry beside the binaries.
set -euo pipefail
BUILD="${1:?usage: pack_random_models.sh BUILD_DIR DEST_DIR [FORM...]}"
DEST="${2:?usage: pack_random_models.sh BUILD_DIR DEST_DIR [FORM...]}"
shift 2
keep=("$@")
[ ${#keep[@]} -gt 0 ] || keep=(hf nvfp4_modelopt nvfp4_ct)
ref="$BUILD/random_models_reference"
[ -f "$ref/models" ] || { echo "no $ref/models: run ctest -R random_models_reference_files first" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$ref/models" "$stage/"
for name in $(cat "$ref/models"); do
  mkdir -p "$stage/$name"
  forms=()
  for form in $(cat "$ref/$name/forms"); do
    for k in "${keep[@]}"; do
      if [ "$form" = "$k" ]; then
        cp -r "$ref/$name/$form" "$stage/$name/"
        forms+=("$form")
      fi
    done
  done
  echo "${forms[*]}" > "$stage/$name/forms"
done
mkdir -p "$DEST"
tar cJf "$DEST/random_models.tar.xz" -C "$stage" .
du -h "$DEST/random_models.tar.xz"
