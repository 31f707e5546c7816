#!/usr/bin/env bash
# Start-up work that outlasts comm.timeout_s but proceeds is no hang. The orthogonal recurrent matrix of
# model.hidden 1536 takes seconds to draw; under comm.timeout_s 1 the run must still train, on one rank and
# on two (where every rank draws the parameters, rather than waiting silently for rank 0's). Before, the draw
# gave no sign of progress and the watchdog ended the run ("no progress for 1.0 s ... while reading the
# checkpoint to resume, or drawing the initial parameters").
#   bash tests/cli/slow_start.sh path/to/ddptrain
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output data.h5 --train 64 --test 16 --vocab 100 --maxlen 8 --seed 1 \
  >prepare.txt 2>&1 || fail "prepare synthetic failed" prepare.txt
args=(--data.path data.h5 --model.hidden 1536 --model.embedding_dim 8 --train.batch_size 8 --train.epochs 1
  --train.max_steps_per_epoch 1 --comm.timeout_s 1)
for ranks in 1 2; do
  start=$(date +%s%N)
  mpirun -np "$ranks" "$ddptrain" "${args[@]}" --checkpoint.dir "run$ranks" >"train$ranks.txt" 2>&1 ||
    fail "$ranks rank(s): the run did not finish" "train$ranks.txt"
  millis=$((($(date +%s%N) - start) / 1000000))
  grep -q "^Epoch 1/1" "train$ranks.txt" || fail "$ranks rank(s): no epoch line" "train$ranks.txt"
  # The test proves something only where the start-up outlasts the timeout several times over.
  [ "$millis" -ge 3000 ] || fail "$ranks rank(s): the run took only $millis ms: raise model.hidden here so \
that drawing the parameters outlasts comm.timeout_s" "train$ranks.txt"
  echo "$ranks rank(s): trained after a start-up of several timeouts ($millis ms in all)"
done
