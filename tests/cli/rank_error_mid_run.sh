#!/usr/bin/env bash
# A bad input that one rank alone meets after start-up must end the whole job at once with that rank's own
# message, not leave the other ranks waiting in a collective until the watchdog says "no progress". The case
# here: data.validate = false and a token id outside the vocabulary in rows of /train that only rank 1 of 2
# trains on; then in rows of /test that only rank 0 scores, at the end of the run; then in every row, met by
# every rank at once, which must still give one line.
#   bash tests/cli/rank_error_mid_run.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
use_python_with_h5py "editing a dataset needs h5py"
enter_scratch_dir

"$ddptrain" prepare synthetic --output data.h5 --train 2000 --test 400 --vocab 300 --maxlen 20 --seed 3 >/dev/null
# poison SPLIT FIRST LAST: token 300 (vocab 300) in rows [FIRST, LAST).
poison() {
  "$python" - "$@" <<'PY'
import sys, h5py
with h5py.File("data.h5", "r+") as f:
    f[sys.argv[1] + "/x"][int(sys.argv[2]):int(sys.argv[3]), 5] = 300
PY
}

# run NAME: a 2-rank all-reduce job without the start-up scan; comm.timeout_s far above the bound below, so
# only the error itself can end the job in time.
run() {
  local status=0 started
  started=$(date +%s)
  timeout 120 mpirun -np 2 "$ddptrain" --data.path data.h5 --checkpoint.dir "$1" --comm.backend mpi \
    --comm.timeout_s 100 --data.validate false --model.embedding_dim 8 --model.hidden 8 --train.epochs 2 \
    --log.progress lines >"$1-out.txt" 2>"$1-err.txt" || status=$?
  elapsed=$(($(date +%s) - started))
  echo "$1: exit status $status after $elapsed s"
  cat "$1-err.txt"
  [ "$status" -eq 2 ] || fail "$1: exit status $status, expected 2" "$1-out.txt"
  [ "$elapsed" -le 60 ] || fail "$1: took $elapsed s"
  grep -q "ddptrain: error: data.path data.h5: token 300 is outside the vocabulary \[0, 300) (data.validate = false.*(rank $2 on host " \
    "$1-err.txt" || fail "$1: no line names the file, the token and rank $2"
  if grep -q "no progress" "$1-err.txt"; then fail "$1: the watchdog ended it, not the error"; fi
}

# data.validation auto holds the last 10% of /train out: rank 1 trains on rows [900, 1800).
cp data.h5 clean.h5
poison train 1500 1800
run train-error 1

cp clean.h5 data.h5
poison test 0 200
run test-error 0

# Every rank meets a bad token at its first step: still one line (the lowest such rank's), not one per rank.
cp clean.h5 data.h5
poison train 0 2000
status=0
timeout 120 mpirun -np 3 "$ddptrain" --data.path data.h5 --checkpoint.dir all-error --comm.backend mpi \
  --comm.timeout_s 100 --data.validate false --model.embedding_dim 8 --model.hidden 8 --train.epochs 2 \
  >all-error-out.txt 2>all-error-err.txt || status=$?
cat all-error-err.txt
[ "$status" -eq 2 ] || fail "all-error: exit status $status, expected 2" all-error-out.txt
[ "$(grep -c "ddptrain: error: data.path data.h5: token 300" all-error-err.txt)" -eq 1 ] ||
  fail "all-error: not one error line for the job"
echo "PASS"
