# shellcheck shell=bash
# Sourced by the CLI tests that start a training run in the background and then act on one of its ranks.
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_test.sh"

# Prints the PID of MPI rank RANK of the run whose checkpoint directory is RUN_DIR, started from this
# directory (nothing if none): other tests running at the same time may use the same RUN_DIR name.
pid_of_rank() {  # run dir, rank
  local pid
  for pid in $(pgrep -f "checkpoint.dir $1 "); do
    [ "$(readlink "/proc/$pid/cwd")" = "$(pwd -P)" ] || continue
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$pid"; fi
  done
}

# Waits at most 30 s for RUN_DIR/metrics.jsonl to hold an epoch; fails if none came.
wait_for_first_epoch() {  # run dir
  local _
  for _ in $(seq 600); do
    [ -s "$1/metrics.jsonl" ] && return 0
    sleep 0.05
  done
  return 1
}

# Makes a scratch directory holding a small synthetic dataset data.h5 and enters it; at exit kills $victim
# (a rank a test stopped, if it still lives) and removes the directory. Lets mpirun run as root and
# oversubscribe.
enter_scratch_dir_with_data() {  # path/to/ddptrain
  work=$(mktemp -d)
  victim=""
  trap 'if [ -n "$victim" ]; then kill -9 "$victim" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  cd "$work" || exit 1
  "$1" prepare synthetic --output data.h5 --train 2000 --test 400 --vocab 300 --maxlen 20 --seed 3 >/dev/null
}

# Starts the command in the array `run` in the background (stdout out.txt, stderr err.txt; checkpoint.dir
# `run`), sends SIGNAL to rank RANK (its PID left in $victim) once an epoch has finished, and waits for the job
# to end. Sets `status` (the job's exit status) and `elapsed` (seconds from the signal to the end); fails the
# test if the job reported success.
# shellcheck disable=SC2154  # run: the caller's command array
signal_rank_and_wait() {  # signal, rank
  "${run[@]}" >out.txt 2>err.txt &
  local launcher=$!
  wait_for_first_epoch run || { echo "FAIL: no epoch finished"; cat err.txt; exit 1; }
  victim=$(pid_of_rank run "$2")
  [ -n "$victim" ] || { echo "FAIL: rank $2 not found"; exit 1; }
  local signalled
  signalled=$(date +%s)
  kill -s "$1" "$victim"
  status=0
  wait "$launcher" || status=$?
  elapsed=$(($(date +%s) - signalled))
  echo "job ended $elapsed s after rank $2 got SIG$1, exit status $status"
  [ "$status" -ne 0 ] || { echo "FAIL: the job reported success"; exit 1; }
}

# Runs `run` again with --resume: it must resume and write epoch EPOCHS to run/metrics.jsonl.
resume_to_the_end() {  # epochs
  "${run[@]}" --resume >resume.txt 2>&1 || { echo "FAIL: --resume failed"; cat resume.txt; exit 1; }
  grep -q "resumed from" resume.txt || { echo "FAIL: did not resume"; cat resume.txt; exit 1; }
  [ -n "$(json_field run/metrics.jsonl epoch "epoch=$1")" ] || { echo "FAIL: epoch $1 missing"; cat run/metrics.jsonl; exit 1; }
}
