#!/usr/bin/env bash
# No raw MPI outside comm/: engine/, models/ and io/ reach MPI through comm/ (comm::HostGroup for
# collectives, comm/mpi_session.h for MPI's start and end), so that every collective has one implementation
# and the order of the ranks' collectives can be read off comm/'s interfaces. A call in a comment is no call.
#   bash tests/cmake/no_raw_mpi_test.sh SOURCE_DIR
# The one exception is the fatal path in engine/base/errors.cpp, below comm/ in the layers: it ends the job
# with MPI_Abort wherever an error strikes, and asks MPI whether it runs and which rank this is to say so.
set -uo pipefail
source=$(cd "${1:?usage: no_raw_mpi_test.sh SOURCE_DIR}" && pwd)
cd "$source" || exit 1

allowed=(
  "engine/base/errors.cpp MPI_Initialized"
  "engine/base/errors.cpp MPI_Finalized"
  "engine/base/errors.cpp MPI_Comm_rank"
  "engine/base/errors.cpp MPI_Abort"
)

# shellcheck disable=SC2016 # an awk program in single quotes, not a shell expansion
found=$(find engine models io -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
  sort -z | xargs -0 awk '
    {
      line = $0
      sub(/\/\/.*/, "", line)  # the comment after the code
      while (match(line, /MPI_[A-Z][a-z_]*\(/)) {
        print FILENAME " " substr(line, RSTART, RLENGTH - 1) " " FNR
        line = substr(line, RSTART + RLENGTH)
      }
    }')

failures=0
while read -r file call line; do
  [ -n "$file" ] || continue
  ok=0
  for entry in "${allowed[@]}"; do
    [ "$entry" = "$file $call" ] && ok=1
  done
  if [ "$ok" = 0 ]; then
    echo "FAIL: $file:$line: $call( outside comm/ (use comm::HostGroup or comm/mpi_session.h)"
    failures=$((failures + 1))
  fi
done <<<"$found"

if [ "$failures" -gt 0 ]; then
  echo "$failures raw MPI call(s) outside comm/"
  exit 1
fi
echo "ok: no raw MPI call in engine/, models/ or io/ but the fatal path's ($(grep -c . <<<"$found") allowed)"
