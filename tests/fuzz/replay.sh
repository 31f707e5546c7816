#!/usr/bin/env bash
# replay.sh FUZZER SOURCE_DIR NAME: runs FUZZER once on every committed input of target NAME (its seed corpus
# and its regressions), without fuzzing. Fails on the first input that crashes, leaks or trips a sanitizer.
set -euo pipefail
fuzzer=$1 source=$2 name=$3
dirs=()
for dir in "$source/corpus/$name" "$source/regressions/$name"; do
  [[ -d $dir ]] && dirs+=("$dir")
done
if ((${#dirs[@]} == 0)); then
  echo "$name: no committed inputs under $source/corpus or $source/regressions" >&2
  exit 1
fi
# -runs=0 executes each input of the folders once and exits.
exec "$fuzzer" -runs=0 -detect_leaks=1 -rss_limit_mb=2048 -timeout=30 "${dirs[@]}"
