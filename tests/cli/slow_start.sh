#!/usr/bin/env bash
# Start-up work that outlasts comm.timeout_s but proceeds is no hang. The orthogonal recurrent matrix of a
# large model.hidden takes seconds to draw; under comm.timeout_s 2 the run must still train, on one rank and
# on two (where every rank draws the parameters, rather than waiting silently for rank 0's). Before, the draw
# gave no sign of progress and the watchdog ended the run ("no progress for 2.0 s ... while reading the
# checkpoint to resume, or drawing the initial parameters"). The test proves something only where the
# start-up outlasts the timeout several times over: it takes the smallest of hidden 1536, 2048 and 2560 whose
# run does, so that a fast machine still tests it.
#   bash tests/cli/slow_start.sh path/to/ddptrain
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output data.h5 --train 64 --test 16 --vocab 100 --maxlen 8 --seed 1 \
  >prepare.txt 2>&1 || fail "prepare synthetic failed" prepare.txt
timeout_s=2
# run NAME RANKS HIDDEN: trains; its milliseconds in $millis.
run() {
  local start
  start=$(date +%s%N)
  mpirun -np "$2" "$ddptrain" --data.path data.h5 --model.hidden "$3" --model.embedding_dim 8 \
    --train.batch_size 8 --train.epochs 1 --train.max_steps_per_epoch 1 --comm.timeout_s "$timeout_s" \
    --checkpoint.dir "run-$1" >"$1.txt" 2>&1 || fail "$1: the run did not finish" "$1.txt"
  millis=$((($(date +%s%N) - start) / 1000000))
  grep -q "^Epoch 1/1" "$1.txt" || fail "$1: no epoch line" "$1.txt"
}
hidden=""
for candidate in 1536 2048 2560; do
  run "one-rank-$candidate" 1 "$candidate"
  if [ "$millis" -ge $((3000 * timeout_s)) ]; then
    hidden=$candidate
    break
  fi
  echo "hidden $candidate: $millis ms in all, not three timeouts: a larger model"
done
[ -n "$hidden" ] || fail "even hidden 2560 started within three timeouts: the test proves nothing here"
echo "1 rank, hidden $hidden: trained after a start-up of several timeouts ($millis ms in all)"
run "two-ranks-$hidden" 2 "$hidden"
echo "2 ranks, hidden $hidden: trained ($millis ms in all)"
