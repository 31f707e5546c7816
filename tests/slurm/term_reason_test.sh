#!/usr/bin/env bash
# launch/slurm/common.sh's reading of why Slurm sent SIGTERM, with a stand-in squeue: a controller that fails
# to answer at first must not turn a time limit into a cancellation (a job not requeued), and a cancellation
# stays one. The launcher is a sleeping stand-in, which gets SIGUSR1 before the reason is asked for.
#   bash tests/slurm/term_reason_test.sh source-dir
set -euo pipefail
src=$1
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
echo "PASS"
