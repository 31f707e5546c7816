# shellcheck shell=bash
# Sourced by the CLI tests: a scratch directory, the failure and bad-input checks they share, and reading
# metrics.jsonl. Skips go through tests/lib/skip.sh (skip_missing, skip_because).

# shellcheck source=tests/lib/skip.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/skip.sh"

# json_field FILE KEYS [KEY=VALUE...]: values from a JSON-lines file (tests/json_field.py says how).
json_field_script=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/json_field.py
json_field() { python3 "$json_field_script" "$@"; }

# Makes a scratch directory, enters it and removes it at exit. Lets mpirun run as root and oversubscribe, and
# keeps each rank's BLAS to one thread.
enter_scratch_dir() {
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OPENBLAS_NUM_THREADS=1
  cd "$work" || exit 1
}

# fail MESSAGE [FILE...]: prints the message and the files, and ends the test.
fail() {
  echo "FAIL: $1"
  shift
  for f in "$@"; do [ -f "$f" ] && cat "$f"; done
  exit 1
}

# expect_user_error WHAT MENTION COMMAND...: the command must exit 2 with one line on stderr holding MENTION
# (left in bad_out.txt and bad_err.txt).
expect_user_error() {
  local what=$1 mention=$2
  shift 2
  local status=0
  "$@" >bad_out.txt 2>bad_err.txt || status=$?
  [ "$status" -eq 2 ] || fail "$what: exit status $status, expected 2" bad_out.txt bad_err.txt
  [ "$(wc -l <bad_err.txt)" -eq 1 ] || fail "$what: not one line on stderr" bad_err.txt
  grep -qF -- "$mention" bad_err.txt || fail "$what: '$mention' not in the message" bad_err.txt
}

# use_python_with_h5py WHY: sets $python to a Python 3 that imports h5py: the python3 on PATH (a GPU node's
# h5py may live in another Python than the system's), else Debian's /usr/bin/python3 (where python3-h5py
# installs it); else the test is skipped (tests/lib/skip.sh), saying which Pythons lacked it and what for.
use_python_with_h5py() {
  local why=$1 candidate
  local without_h5py=()
  for candidate in "$(command -v python3 || true)" /usr/bin/python3; do
    if [ -z "$candidate" ] || [ ! -x "$candidate" ]; then continue; fi
    if "$candidate" -c "import h5py" 2>/dev/null; then
      # shellcheck disable=SC2034  # read by the sourcing test
      python=$candidate
      return 0
    fi
    without_h5py+=("$candidate")
  done
  skip_missing python3-h5py "$why (no h5py in: ${without_h5py[*]:-no python3 found})"
}
