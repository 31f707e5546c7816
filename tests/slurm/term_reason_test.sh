#!/usr/bin/env bash
# launch/slurm/common.sh's reading of why Slurm sent SIGTERM, with a stand-in squeue: a controller that fails
# to answer at first must not turn a time limit into a cancellation (a job not requeued), and a cancellation
# stays one. The launcher is a sleeping stand-in, which gets SIGUSR1 before the reason is asked for. Then the
# requeue after a preemption, which Slurm answers by ending the run with SIGTERM.
#   bash tests/slurm/term_reason_test.sh source-dir
set -euo pipefail
src=$1
outer_path=$PATH  # the stand-ins go in front of it, in the subshells only
work=$(mktemp -d)
launcher=""
trap 'if [ -n "$launcher" ]; then kill "$launcher" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
mkdir "$work/bin"
# squeue fails $1 times (counted in a file), then prints the reason $2.
cat >"$work/bin/squeue" <<'SH'
#!/usr/bin/env bash
calls=$(($(cat "$SQUEUE_CALLS" 2>/dev/null || echo 0) + 1))
echo "$calls" >"$SQUEUE_CALLS"
[ "$calls" -gt "$SQUEUE_FAILURES" ] || exit 1
echo "$SQUEUE_REASON"
SH
chmod +x "$work/bin/squeue"

# reason FAILURES REASON: prints "requeue" or "no requeue" and how often squeue was asked.
reason() {
  rm -f "$work/calls"
  (
    export PATH="$work/bin:$PATH" SQUEUE_CALLS="$work/calls" SQUEUE_FAILURES=$1 SQUEUE_REASON=$2
    export RUN_DIR=$work LAUNCHER=mpirun SLURM_JOB_ID=7
    # shellcheck source=launch/slurm/common.sh
    source "$src/launch/slurm/common.sh"
    (trap '' USR1 && exec sleep 60) &
    ddp_launcher_pid=$!
    ddp_on_signal TERM >"$work/log.txt"
    kill "$ddp_launcher_pid" 2>/dev/null || true
    if ddp_should_requeue; then echo "requeue $(cat "$work/calls")"; else echo "no requeue $(cat "$work/calls")"; fi
  )
}

check() {  # expected, then reason's arguments
  local got
  got=$(reason "$2" "$3")
  [ "$got" = "$1" ] || { echo "FAIL: squeue failing $2 time(s), then '$3': got '$got', expected '$1'"; cat "$work/log.txt"; exit 1; }
  echo "squeue failing $2 time(s), then '$3': $got"
}
check "requeue 1" 0 TimeLimit
check "requeue 3" 2 TimeLimit
check "no requeue 1" 0 None
check "no requeue 3" 5 TimeLimit  # never answered: not requeued, as after a cancellation
grep -q "forwarding SIGUSR1" "$work/log.txt" || { echo "FAIL: the launcher got no SIGUSR1"; cat "$work/log.txt"; exit 1; }

# The requeue itself ends the run: Slurm sends SIGTERM to every process of the batch step, scontrol too,
# often before its answer arrives. The stand-in scontrol signals the batch shell and itself as Slurm would,
# then answers: the job is requeued, and the shell must say so and exit 0.
cat >"$work/bin/srun" <<'SH'
#!/usr/bin/env bash
exit 75
SH
cat >"$work/bin/scontrol" <<'SH'
#!/usr/bin/env bash
kill -TERM "$PPID" "$$"
sleep 0.2
echo "requeue $*" >"$SCONTROL_LOG"
SH
chmod +x "$work/bin/srun" "$work/bin/scontrol"
touch "$work/config.ini"
cat >"$work/batch.sh" <<'SH'
source "$COMMON"
ddp_train
SH
status=0
env PATH="$work/bin:$outer_path" SCONTROL_LOG="$work/scontrol.txt" RUN_DIR="$work" LAUNCHER=srun SLURM_JOB_ID=7 \
  CONFIG="$work/config.ini" COMMON="$src/launch/slurm/common.sh" bash "$work/batch.sh" \
  >"$work/train.txt" 2>&1 || status=$?
if [ "$status" -ne 0 ] || ! grep -q "requeued job 7" "$work/train.txt" || [ ! -f "$work/scontrol.txt" ]; then
  echo "FAIL: a requeue that Slurm answers with SIGTERM: exit $status"
  cat "$work/train.txt"
  exit 1
fi
echo "a requeue answered with SIGTERM to the batch step: requeued, exit 0"
echo "PASS"
