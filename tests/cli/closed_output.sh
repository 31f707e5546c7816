#!/usr/bin/env bash
# A lone rank whose output goes away (`ddptrain ... | head`, a `| tee` whose session closed) stops as on any
# other stop signal: SIGPIPE checkpoints mid-epoch and exits 75, saying so on stderr (stdout leads nowhere),
# and `--resume auto` ends with the val_loss of a run never interrupted. Where SIGPIPE is ignored by whoever
# started it, it stays ignored: the run trains to its end, its lines lost, exit 0.
#   bash tests/cli/closed_output.sh path/to/ddptrain source-dir
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/background_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
enter_scratch_dir_with_data "$ddptrain"
epochs=3

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.txt; do echo "--- $f"; cat "$f"; done
  exit 1
}

# Named kernels: the runs are compared bit for bit, and model.cpu_kernels = auto at one thread per rank goes
# by a measurement of the FMA width that a loaded machine can misjudge in one run and not the other.
train() {  # checkpoint.dir, extra arguments...
  local dir=$1
  shift
  "$ddptrain" --data.path data.h5 --checkpoint.dir "$dir" --model.embedding_dim 16 --model.hidden 16 \
    --train.epochs "$epochs" --train.straggle_ms 5 --log.progress lines --log.interval 5 \
    --model.cpu_kernels builtin "$@"
}

train ref >ref.txt 2>&1 || fail "the uninterrupted run failed"

# The reader takes the start lines and a few progress lines, then goes; the next line meets a closed pipe.
set +o pipefail
train piped 2>piped-err.txt | head -n 12 >piped.txt
status=${PIPESTATUS[0]}
set -o pipefail
[ "$status" -eq 75 ] || fail "exit status $status after the output closed, expected 75"
grep -q "^stopped by SIGPIPE .*: piped/last.h5 holds the progress" piped-err.txt ||
  fail "no stop message naming SIGPIPE on stderr"
[ -f piped/last.h5 ] || fail "no last.h5"
done_epochs=$(grep -sc '"epoch"' piped/metrics.jsonl || true)
done_epochs=${done_epochs:-0}
[ "$done_epochs" -lt "$epochs" ] || fail "the stop came too late to test anything"
train piped --resume auto >resumed.txt 2>&1 || fail "the resumed run failed"
grep -q "resumed from" resumed.txt || fail "--resume auto did not resume"
expected=$(json_field ref/metrics.jsonl val_loss "epoch=$epochs")
actual=$(json_field piped/metrics.jsonl val_loss "epoch=$epochs")
[ -n "$expected" ] && [ "$expected" = "$actual" ] ||
  fail "final val_loss $actual differs from the uninterrupted run's $expected"
echo "output closed: stopped with exit 75 and last.h5, resumed, final val_loss $actual as uninterrupted"

# SIGPIPE ignored by the parent (as some launchers do): writes fail quietly and the run finishes.
set +o pipefail
(trap '' PIPE && exec "$ddptrain" --data.path data.h5 --checkpoint.dir ignored --model.embedding_dim 16 \
  --model.hidden 16 --train.epochs "$epochs" --log.progress lines --log.interval 5 2>ignored-err.txt) |
  head -n 3 >ignored.txt
status=${PIPESTATUS[0]}
set -o pipefail
[ "$status" -eq 0 ] || fail "exit status $status with SIGPIPE ignored, expected 0"
[ -n "$(json_field ignored/metrics.jsonl val_loss "epoch=$epochs")" ] || fail "the run with SIGPIPE ignored did not finish"
echo "SIGPIPE ignored: the run finished with exit 0"
