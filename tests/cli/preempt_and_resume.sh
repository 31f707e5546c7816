#!/usr/bin/env bash
# Preemption: a stop signal mid-run makes every rank stop at a step boundary with last.h5 written and exit
# 75; `--resume auto` then finishes the run with the same result as a run never interrupted.
#   1. all-reduce, 2 ranks: SIGTERM to rank 1 alone (the other rank learns it through the agreement), and
#      SIGHUP (a closed terminal) the same way
#   2. the colocated parameter server, 3 ranks: SIGUSR1 to mpirun, which forwards it to every rank
#   3. a dedicated parameter server (rank 2), 3 ranks: SIGTERM to worker rank 1 alone
#   4. the same with SIGTERM to the server alone (not among the ranks that agree: its replies tell them)
#   5. the colocated parameter server in async mode, 2 ranks apart by up to comm.max_staleness steps: SIGTERM
#      to rank 1 alone (async runs are not bit for bit reproducible: the resumed run must finish every epoch)
#   bash tests/cli/preempt_and_resume.sh path/to/ddptrain source-dir
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/background_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
enter_scratch_dir_with_data "$ddptrain"
epochs=8

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.txt; do echo "--- $f"; cat "$f"; done
  exit 1
}

last_val_loss() { json_field "$1/metrics.jsonl" val_loss "epoch=$epochs"; }

run_case() {  # name, ranks, backend, signal, target (mpirun or rankN), [comm.ps_servers], [comm.ps_mode]
  local name=$1 ranks=$2 backend=$3 signal=$4 target=$5 servers=${6:-0} mode=${7:-sync}
  # Named kernels: the runs are compared bit for bit, and model.cpu_kernels = auto at one thread per rank goes
  # by a measurement of the FMA width that a loaded machine can misjudge in one run and not the other.
  local args=(--data.path data.h5 --comm.backend "$backend" --comm.ps_servers "$servers" --comm.ps_mode "$mode"
    --model.cpu_kernels builtin
    --model.embedding_dim 16 --model.hidden 16
    --train.epochs "$epochs" --train.straggle_ms 10 --log.progress lines --resume auto)

  # One uninterrupted run per configuration serves every case of it.
  local ref="ref-$ranks-$backend-$servers"
  if [ ! -d "$ref" ] && [ "$mode" = sync ]; then
    mpirun -np "$ranks" "$ddptrain" --checkpoint.dir "$ref" "${args[@]}" >"$ref.txt" 2>&1 ||
      fail "$name: the uninterrupted run failed"
  fi

  mpirun -np "$ranks" "$ddptrain" --checkpoint.dir "$name" "${args[@]}" >"$name-1.txt" 2>&1 &
  local launcher=$!
  wait_for_first_epoch "$name" || fail "$name: no epoch finished"
  sleep 0.2  # into the next epoch
  if [ "$target" = mpirun ]; then
    kill -s "$signal" "$launcher"
  else
    local victim
    victim=$(pid_of_rank "$name" "${target#rank}")
    [ -n "$victim" ] || fail "$name: $target not found"
    kill -s "$signal" "$victim"
  fi
  local status=0
  wait "$launcher" || status=$?
  [ "$status" -eq 75 ] || fail "$name: exit status $status after SIG$signal, expected 75"
  grep -q "^stopped by SIG$signal after epoch [0-9]*" "$name-1.txt" || fail "$name: no stop message naming SIG$signal"
  local done_epochs
  done_epochs=$(grep -c '"epoch"' "$name/metrics.jsonl")
  [ "$done_epochs" -lt "$epochs" ] || fail "$name: the signal came too late to test anything"
  [ -f "$name/last.h5" ] || fail "$name: no last.h5"

  mpirun -np "$ranks" "$ddptrain" --checkpoint.dir "$name" "${args[@]}" >"$name-2.txt" 2>&1 ||
    fail "$name: the resumed run failed"
  grep -q "resumed from" "$name-2.txt" || fail "$name: --resume auto did not resume"
  [ "$(grep -c '"epoch"' "$name/metrics.jsonl")" -eq "$epochs" ] || fail "$name: metrics.jsonl lacks epochs"
  if [ "$mode" = async ]; then
    echo "$name: stopped after $done_epochs epoch(s) with exit 75, resumed, finished all $epochs epochs"
    return
  fi
  local expected actual
  expected=$(last_val_loss "$ref")
  actual=$(last_val_loss "$name")
  [ -n "$expected" ] && [ "$expected" = "$actual" ] ||
    fail "$name: final val_loss $actual differs from the uninterrupted run's $expected"
  echo "$name: stopped after $done_epochs epoch(s) with exit 75, resumed, final val_loss $actual as uninterrupted"
}

run_case allreduce 2 mpi TERM rank1
run_case allreduce-hangup 2 mpi HUP rank1
run_case ps-colocated 3 ps USR1 mpirun
run_case ps-dedicated 3 ps TERM rank1 1
run_case ps-dedicated-server 3 ps TERM rank2 1
run_case ps-async 2 ps TERM rank1 0 async
