#!/usr/bin/env bash
# Ctrl-C: SIGINT means "checkpoint and stop", as SIGTERM and SIGUSR1 do, and a second one aborts at once.
#   1. one process: SIGINT to its process group (what a terminal's Ctrl-C does) mid-epoch: exit 75, last.h5
#      written, a message naming SIGINT and the epoch and step; --resume auto then ends with the val_loss of
#      a run never interrupted.
#   2. mpirun -np 2: SIGINT to mpirun. Open MPI 4.1's mpirun sends the ranks SIGCONT, SIGTERM a second later
#      and SIGKILL a second after that, and returns 1 whatever the ranks exit with (launch/README.md,
#      "Stopping a run"): the ranks must checkpoint within that second and say SIGTERM.
#   3. a second SIGINT while the first is being handled: the process dies of SIGINT (exit 130) without a
#      checkpoint (the time it took is printed, not judged: the missing checkpoint shows it did not finish
#      the step); under mpirun, mpirun exits and no rank is left running.
#   bash tests/cli/ctrl_c_and_resume.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/background_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
enter_scratch_dir_with_data "$ddptrain"
# Job control: each background job in its own process group, with SIGINT not ignored (a shell without job
# control starts background jobs with SIGINT ignored, and ddptrain keeps it so).
set -m
epochs=6

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.txt; do echo "--- $f"; cat "$f"; done
  exit 1
}

# Named kernels: the runs are compared bit for bit, and model.cpu_kernels = auto at one thread per rank goes
# by a measurement of the FMA width that a loaded machine can misjudge in one run and not the other.
args=(--data.path data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs "$epochs"
  --model.cpu_kernels builtin
  --train.straggle_ms 10 --log.progress lines)
last_val_loss() { json_field "$1/metrics.jsonl" val_loss "epoch=$epochs"; }
now() { date +%s.%N; }
seconds_since() { /usr/bin/python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }

# Waits at most 30 s until FILE has a line matching PATTERN.
wait_for_line() {  # file, pattern
  local _
  for _ in $(seq 600); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# 1. One process.
"$ddptrain" --checkpoint.dir ref "${args[@]}" >ref.txt 2>&1 || fail "the uninterrupted run failed"
"$ddptrain" --checkpoint.dir alone "${args[@]}" >alone-1.txt 2>alone-1.err.txt &
job=$!
wait_for_first_epoch alone || fail "alone: no epoch finished"
sleep 0.3  # into the next epoch
kill -INT -- "-$job"
status=0
wait "$job" || status=$?
[ "$status" -eq 75 ] || fail "alone: exit status $status after Ctrl-C, expected 75"
[ -f alone/last.h5 ] || fail "alone: no last.h5"
# A loaded machine may still be ending epoch 1 (evaluation, checkpoint) when the signal comes: then it stops
# at the epoch boundary, and the message names no step.
grep -q "^stopped by SIGINT after epoch [0-9]*\(, step [0-9]* of epoch [0-9]*\)\?: alone/last.h5 holds the progress" \
  alone-1.txt || fail "alone: the stop message does not name SIGINT, the epoch and the step"
grep -q "SIGINT: writing a checkpoint" alone-1.err.txt || fail "alone: no word on stderr that SIGINT was seen"
[ "$(grep -c '"epoch"' alone/metrics.jsonl)" -lt "$epochs" ] || fail "alone: the signal came too late"
"$ddptrain" --checkpoint.dir alone "${args[@]}" --resume auto >alone-2.txt 2>&1 || fail "alone: resume failed"
grep -q "resumed from" alone-2.txt || fail "alone: --resume auto did not resume"
if [ -z "$(last_val_loss ref)" ] || [ "$(last_val_loss alone)" != "$(last_val_loss ref)" ]; then
  fail "alone: final val_loss $(last_val_loss alone) differs from the uninterrupted run's $(last_val_loss ref)"
fi
echo "alone: $(grep '^stopped by' alone-1.txt | cut -d: -f1), exit 75; resumed to the uninterrupted val_loss"

# 2. Under mpirun.
mpirun -np 2 "$ddptrain" --checkpoint.dir np2 "${args[@]}" >np2-1.txt 2>&1 &
job=$!
wait_for_first_epoch np2 || fail "np2: no epoch finished"
sleep 0.3
kill -INT "$job"
status=0
wait "$job" || status=$?
case "$status" in
  1) echo "np2: mpirun returned 1 after Ctrl-C (Open MPI's mpirun after a SIGINT or SIGTERM of its own)" ;;
  75) echo "np2: mpirun returned 75 after Ctrl-C" ;;
  *) fail "np2: mpirun returned $status after Ctrl-C, expected 1 (Open MPI 4.1) or 75" ;;
esac
grep -q "^stopped by SIGTERM after epoch [0-9]*\(, step [0-9]* of epoch [0-9]*\)\?: np2/last.h5 holds" np2-1.txt ||
  fail "np2: no stop message naming SIGTERM (what mpirun sends its ranks)"
[ -f np2/last.h5 ] || fail "np2: no last.h5"
mpirun -np 2 "$ddptrain" --checkpoint.dir np2 "${args[@]}" --resume auto >np2-2.txt 2>&1 || fail "np2: resume failed"
grep -q "resumed from" np2-2.txt || fail "np2: --resume auto did not resume"
[ "$(grep -c '"epoch"' np2/metrics.jsonl)" -eq "$epochs" ] || fail "np2: metrics.jsonl lacks epochs"
echo "np2: $(grep '^stopped by' np2-1.txt | cut -d: -f1), checkpoint written, resumed"

# 3. Ctrl-C twice. Slow steps (0.5 s), so that the first SIGINT is still being handled when the second comes.
slow=(--data.path data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs 2 --train.straggle_ms 500
  --log.progress lines)
"$ddptrain" --checkpoint.dir twice "${slow[@]}" >twice.txt 2>twice.err.txt &
job=$!
wait_for_line twice.txt "^model:" || fail "twice: training did not start"
sleep 0.5
kill -INT -- "-$job"
sleep 0.2
started=$(now)
kill -INT -- "-$job"
status=0
wait "$job" || status=$?
elapsed=$(seconds_since "$started")
[ "$status" -eq 130 ] || fail "twice: exit status $status after a second Ctrl-C, expected 130 (died of SIGINT)"
grep -q "aborting without a checkpoint" twice.err.txt || fail "twice: no word that it aborts"
grep -q "^stopped by" twice.txt && fail "twice: a stop message although it aborted"
[ ! -f twice/last.h5 ] || fail "twice: a checkpoint although it aborted"
echo "twice: died of SIGINT $elapsed s after the second Ctrl-C, no checkpoint"

mpirun -np 2 "$ddptrain" --checkpoint.dir twice-np2 "${slow[@]}" >twice-np2.txt 2>&1 &
job=$!
wait_for_line twice-np2.txt "^model:" || fail "twice-np2: training did not start"
sleep 0.5
kill -INT "$job"
sleep 0.2
started=$(now)
kill -INT "$job"
status=0
wait "$job" || status=$?
elapsed=$(seconds_since "$started")
[ "$status" -ne 0 ] || fail "twice-np2: mpirun reported success"
left=""
for _ in $(seq 50); do  # at most 5 s for the ranks to follow mpirun
  left=$(pgrep -f "checkpoint.dir twice-np2 " || true)
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$left" ]; then
  xargs -r kill -9 <<<"$left" 2>/dev/null || true
  fail "twice-np2: ranks still running 5 s after mpirun ended"
fi
echo "twice-np2: mpirun returned $status $elapsed s after the second Ctrl-C; no rank left"
echo PASS
