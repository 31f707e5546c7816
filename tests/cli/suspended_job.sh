#!/usr/bin/env bash
# A whole job stopped and continued (Ctrl-Z, `scontrol suspend`: SIGSTOP to every rank, SIGCONT later) for
# longer than comm.timeout_s is no hang: the watchdog and the parameter server's deadlines leave out the time
# the ranks were stopped, and the job trains to its end with exit 0. Under all-reduce (2 ranks), the dedicated
# parameter server in async mode (3 ranks: point-to-point waits with deadlines of their own) and a lone rank.
#   bash tests/cli/suspended_job.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/background_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
enter_scratch_dir_with_data "$ddptrain"
stopped=()
# A failed test must not leave stopped ranks behind.
trap 'for pid in "${stopped[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$work"' EXIT

timeout_s=3
suspend_case() {  # name, ranks, extra ddptrain arguments...
  local name=$1 ranks=$2
  shift 2
  rm -rf run
  mpirun -np "$ranks" "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.timeout_s "$timeout_s" \
    --model.embedding_dim 16 --model.hidden 16 --train.epochs 3 --train.straggle_ms 10 --log.progress lines "$@" \
    >"$name.txt" 2>&1 &
  local launcher=$!
  wait_for_first_epoch run || { echo "FAIL: $name: no epoch finished"; cat "$name.txt"; exit 1; }
  stopped=()
  local rank pid
  for rank in $(seq 0 $((ranks - 1))); do
    pid=$(pid_of_rank run "$rank")
    [ -n "$pid" ] || { echo "FAIL: $name: rank $rank not found"; exit 1; }
    stopped+=("$pid")
  done
  kill -STOP "${stopped[@]}"
  sleep $((2 * timeout_s + 1))
  kill -CONT "${stopped[@]}"
  local status=0
  wait "$launcher" || status=$?
  stopped=()
  [ "$status" -eq 0 ] || { echo "FAIL: $name: exit status $status after the job was stopped and continued"; cat "$name.txt"; exit 1; }
  grep -q "^Epoch 3/3" "$name.txt" || { echo "FAIL: $name: the job did not train to its end"; cat "$name.txt"; exit 1; }
  if grep -q "no progress\|heard nothing" "$name.txt"; then
    echo "FAIL: $name: a stall was reported"
    cat "$name.txt"
    exit 1
  fi
  echo "$name: stopped for $((2 * timeout_s + 1)) s (comm.timeout_s $timeout_s), continued, trained to its end"
}

suspend_case all-reduce 2 --comm.backend mpi
suspend_case ps-dedicated-async 3 --comm.backend ps --comm.ps_servers 1 --comm.ps_mode async
suspend_case lone-rank 1
echo PASS
