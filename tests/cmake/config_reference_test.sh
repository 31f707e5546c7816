#!/usr/bin/env bash
# launch/CONFIG.md lists every config key with its type, default, allowed values and meaning. Its part from
# the marker line on is what `ddptrain config-reference` prints from engine/config.cpp's key table, and this
# test fails when the two differ: a key added, removed or changed in the code but not in the reference, or
# the other way round.
#   bash tests/cmake/config_reference_test.sh path/to/ddptrain source-dir            check
#   bash tests/cmake/config_reference_test.sh --write path/to/ddptrain source-dir    regenerate the part
set -euo pipefail
write=""
if [ "${1:-}" = --write ]; then
  write=1
  shift
fi
ddptrain=$1
source_dir=$2
reference=$source_dir/launch/CONFIG.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$ddptrain" config-reference >"$work/generated.md"
marker=$(head -n 1 "$work/generated.md")
line=$(grep -n -F -x -- "$marker" "$reference" | head -n 1 | cut -d: -f1 || true)
if [ -n "$write" ]; then
  if [ -n "$line" ]; then
    head -n "$((line - 1))" "$reference" >"$work/new.md"
  else
    cp "$reference" "$work/new.md"
  fi
  cat "$work/generated.md" >>"$work/new.md"
  cp "$work/new.md" "$reference"
  echo "wrote the generated part of $reference"
  exit 0
fi

regenerate="regenerate it with: bash tests/cmake/config_reference_test.sh --write build/ddptrain ."
if [ -z "$line" ]; then
  echo "FAIL: $reference has no line \"$marker\" above the generated reference; $regenerate"
  exit 1
fi
tail -n "+$line" "$reference" >"$work/committed.md"
if ! diff -u --label "launch/CONFIG.md (committed)" --label "ddptrain config-reference (the code)" \
  "$work/committed.md" "$work/generated.md"; then
  echo "FAIL: launch/CONFIG.md differs from engine/config.cpp's key table (above: - the file, + the code);"
  echo "      $regenerate"
  exit 1
fi
keys=$(grep -c '^| `' "$work/generated.md")
echo "launch/CONFIG.md lists the $keys keys of engine/config.cpp, with their types, defaults and ranges"
