#!/usr/bin/env bash
# A rank of a 3-rank run hangs while alive (SIGSTOP: the launcher sees no death), under all-reduce and under the
# colocated parameter server: the other ranks must end the job within comm.timeout_s plus a margin, with one
# message naming the hung rank, and --resume must then finish the training.
# Before that, the same where a file system freezes: during start-up (a rank stops in the open of data.path)
# and while rank 0 writes the run directory (metrics.jsonl is a FIFO nobody reads); the job must end naming
# what the rank was doing.
#   bash tests/cli/hung_rank.sh path/to/ddptrain source-dir
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/background_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
enter_scratch_dir_with_data "$ddptrain"

stopper=${DDPTRAIN_TEST_STOP_IN_CALL:?the path of the stop_in_call library, as ctest sets it}

# run_to_its_end NAME BOUND COMMAND...: runs the job that must end on its own, with a failure, within BOUND
# seconds (not killed by the timeout); its output is left in NAME-out.txt and NAME-err.txt.
run_to_its_end() {
  local name=$1 bound=$2 started status=0 elapsed
  shift 2
  started=$(date +%s)
  timeout 60 "$@" >"$name-out.txt" 2>"$name-err.txt" || status=$?
  elapsed=$(($(date +%s) - started))
  echo "$name: the job ended after $elapsed s, exit status $status"
  cat "$name-err.txt"
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then echo "FAIL: $name: exit status $status"; exit 1; fi
  [ "$elapsed" -le "$bound" ] || { echo "FAIL: $name: took $elapsed s, bound $bound s"; exit 1; }
}

# Start-up: rank 1 stops itself in the open of data.path, as on a file system that stops answering
# (tests/cli/lib/stop_in_call.c), for every backend (the data is read before one is chosen); rank 0 waits for
# it and must end the job naming the phase.
# A hang, not a duration: the bound is comm.timeout_s plus a margin for a loaded machine.
run_to_its_end frozen 18 mpirun -np 2 -x LD_PRELOAD="$stopper" -x DDPTRAIN_TEST_STOP_IN=H5Fopen \
  -x DDPTRAIN_TEST_STOP_RANK=1 "$ddptrain" --data.path data.h5 --checkpoint.dir frozen-run --comm.timeout_s 3
grep -q "no progress for .* (comm.timeout_s 3) while reading data.path data.h5: rank 1 (host .*) is hung" \
  frozen-err.txt || { echo "FAIL: no message names the phase and the rank"; exit 1; }
[ -z "$(pid_of_rank frozen-run 1)" ] || { echo "FAIL: the stopped rank outlived the job"; exit 1; }

# A job of one rank whose read of data.path never returns: its own watchdog ends it, naming the file and how
# long the thread has been inside HDF5 (a frozen file system, or a damaged file that libhdf5 reads in a loop).
run_to_its_end lone 18 mpirun -np 1 -x LD_PRELOAD="$stopper" -x DDPTRAIN_TEST_STOP_IN=H5Fopen \
  -x DDPTRAIN_TEST_STOP_RANK=0 -x DDPTRAIN_TEST_STOP_HOW=wait "$ddptrain" --data.path data.h5 \
  --checkpoint.dir lone-run --comm.timeout_s 3
grep -q "while reading data.path data.h5: this rank, the job's only one, is stuck; this rank has been inside the HDF5 library reading data.h5 for [0-9.]* s" \
  lone-err.txt || { echo "FAIL: the message does not name the read"; exit 1; }

# A rank stopped as soon as it exists, before MPI_Init returns (whose exchange has no deadline of its own):
# the watchdog runs from before MPI_Init, so the other rank still ends the job. Most runs stop the rank inside
# MPI_Init; one that loses the race stops it in a later start-up phase, which must end the same way.
started=$(date +%s)
timeout 60 mpirun -np 2 "$ddptrain" --data.path data.h5 --checkpoint.dir early-run --comm.timeout_s 3 \
  >early-out.txt 2>early-err.txt &
launcher=$!
for _ in $(seq 2000); do
  victim=$(pid_of_rank early-run 1)
  [ -n "$victim" ] && break
  sleep 0.005
done
[ -n "$victim" ] || { echo "FAIL: rank 1 not found"; exit 1; }
kill -s STOP "$victim"
status=0
wait "$launcher" || status=$?
elapsed=$(($(date +%s) - started))
echo "stopped at once: the job ended after $elapsed s, exit status $status"
grep "no progress" early-err.txt || true
kill -9 "$victim" 2>/dev/null || true
victim=""
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { echo "FAIL: exit status $status"; cat early-err.txt; exit 1; }
[ "$elapsed" -le 18 ] || { echo "FAIL: took $elapsed s, bound 18 s (comm.timeout_s 3 + 15)"; exit 1; }
# Inside MPI_Init the ranks cannot yet tell each other which one is missing.
grep -Eq "no progress for .* \(comm.timeout_s 3\) while .*: (a rank|rank 1 \(host .*\)) is hung" early-err.txt ||
  { echo "FAIL: no message says why"; cat early-err.txt; exit 1; }

# A rank stuck after its work is done: rank 1 stops itself on entering MPI_Finalize
# (tests/cli/lib/stop_in_call.c), after the run wrote its checkpoints. Rank 0 then waits in MPI_Finalize,
# which MPI_Abort cannot end: it must leave without MPI after comm.timeout_s, so that the launcher ends the job
# and the stopped rank with it, and the run's files must be whole.
run_to_its_end finalize 18 mpirun -np 2 -x LD_PRELOAD="$stopper" -x DDPTRAIN_TEST_STOP_IN=MPI_Finalize \
  -x DDPTRAIN_TEST_STOP_RANK=1 "$ddptrain" --data.path data.h5 --checkpoint.dir finalize-run --comm.timeout_s 3 \
  --model.embedding_dim 16 --model.hidden 16 --train.epochs 1
[ -z "$(pid_of_rank finalize-run 1)" ] || { echo "FAIL: the stopped rank outlived the job"; exit 1; }
grep -q "no progress for .* (comm.timeout_s 3) while finalizing MPI .*leaving without MPI" finalize-err.txt ||
  { echo "FAIL: no message says why rank 0 left"; exit 1; }
grep -q "^Test (best.h5, epoch 1)" finalize-out.txt || { echo "FAIL: the run did not finish first"; exit 1; }
"$ddptrain" evaluate --checkpoint finalize-run/best.h5 --data data.h5 >/dev/null ||
  { echo "FAIL: the run's checkpoint does not load"; exit 1; }

# Rank 0 blocks appending to metrics.jsonl (its resume line), a FIFO nobody reads, in a run it resumes. One
# rank only: with two, the other rank's watchdog (waiting in the next collective) may end the job before rank
# 0's prints.
frozen_run=(mpirun -np 1 "$ddptrain" --data.path data.h5 --checkpoint.dir frozen-dir --comm.backend mpi
  --comm.timeout_s 3 --model.embedding_dim 16 --model.hidden 16)
timeout 60 "${frozen_run[@]}" --train.epochs 1 >frozen-out.txt 2>frozen-err.txt ||
  { echo "FAIL: the first epoch did not run"; cat frozen-out.txt frozen-err.txt; exit 1; }
rm frozen-dir/metrics.jsonl
mkfifo frozen-dir/metrics.jsonl
status=0
timeout 60 "${frozen_run[@]}" --train.epochs 2 --resume >frozen-out.txt 2>frozen-err.txt || status=$?
cat frozen-err.txt
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { echo "FAIL: exit status $status"; exit 1; }
grep -Eq "\(comm.timeout_s 3\) while writing to checkpoint.dir frozen-dir( \(steps done: [0-9]*\))?: this rank, the job's only one, is stuck" \
  frozen-err.txt || { echo "FAIL: rank 0's message does not name the write"; exit 1; }

bound=5
# The all-reduce backend and the colocated parameter server in sync mode (collectives: the watchdog watches the
# steps), with 3 ranks: the two that wait must agree on one message that names rank 1, the one they wait for
# (comm/stall_census.h), not each print their own.
for backend in mpi ps; do
  echo "== comm.backend = $backend"
  rm -rf run
  run=(mpirun -np 3 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend "$backend"
    --comm.ps_servers 0 --comm.timeout_s "$bound" --model.embedding_dim 16 --model.hidden 16 --train.epochs 8
    --train.straggle_ms 20 --log.progress lines)

  signal_rank_and_wait STOP 1
  [ "$elapsed" -le $((bound + 15)) ] || { echo "FAIL: $backend: took $elapsed s, bound $bound s"; exit 1; }
  cat err.txt
  grep -q "no progress for .* (comm.timeout_s $bound) while .* (steps done: [0-9]*): rank 1 (host .*) is hung, lost or slower than the timeout: it did not answer the stalled ranks 0, 2 within" \
    err.txt || {
    echo "FAIL: $backend: no message names rank 1 as the one the others wait for:"
    cat err.txt
    exit 1
  }
  [ "$(grep -c "no progress for" err.txt)" -eq 1 ] || { echo "FAIL: $backend: not one message"; exit 1; }
  kill -9 "$victim" 2>/dev/null || true
  victim=""
  resume_to_the_end 8
done

# The colocated parameter server in async mode: its point-to-point waits have deadlines of their own, and a
# server that hears nothing names the rank, and it alone (rank 0's own worker, waiting on rank 1's server or
# with rank 1 in the stop-signal agreement, is not blamed).
echo "== comm.backend = ps, async"
rm -rf run
run=(mpirun -np 2 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend ps --comm.ps_servers 0
  --comm.ps_mode async --comm.timeout_s "$bound" --model.embedding_dim 16 --model.hidden 16 --train.epochs 8
  --train.straggle_ms 20 --log.progress lines)
signal_rank_and_wait STOP 1
[ "$elapsed" -le $((2 * bound + 15)) ] || { echo "FAIL: async: took $elapsed s, bound 2 x $bound s"; exit 1; }
cat err.txt
# Stopped between two runs of steps, rank 1 leaves rank 0 in the collective that sets up the next run's
# exchange: there the stall census names it.
grep -Eq "heard nothing from (worker|parameter server) rank 1 |: rank 1 \(host .*\) is hung" err.txt ||
  { echo "FAIL: async: no message names rank 1, and rank 1 alone"; exit 1; }
kill -9 "$victim" 2>/dev/null || true
victim=""
resume_to_the_end 8

# Three ranks, the last one a straggler (async mode's use): stopped rank 1 holds the straggler's worker waiting
# for its server while the fast worker 0 waits for a held reply. The servers ask each other and name rank 1,
# not the straggler whose worker fell silent waiting for it.
echo "== comm.backend = ps, async, 3 ranks, a straggler waiting for a stopped rank"
rm -rf run
run=(mpirun -np 3 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend ps --comm.ps_servers 0
  --comm.ps_mode async --comm.timeout_s "$bound" --model.embedding_dim 16 --model.hidden 16 --train.epochs 8
  --train.straggle_ms 20 --log.progress lines)
signal_rank_and_wait STOP 1
[ "$elapsed" -le $((2 * bound + 15)) ] || { echo "FAIL: straggler: took $elapsed s, bound 2 x $bound s"; exit 1; }
cat err.txt
grep -Eq "heard nothing from parameter server ranks? ([0-9]+, )*1[ ,]|: rank 1 \(host .*\) is hung" err.txt ||
  { echo "FAIL: straggler: no message names rank 1"; exit 1; }
if grep -q "heard nothing from worker rank 2 " err.txt; then echo "FAIL: straggler: the straggler is blamed"; exit 1; fi
kill -9 "$victim" 2>/dev/null || true
victim=""

# Rank 1 stopped on entering the collective that sets up a run of steps' exchange (its third MPI_Comm_idup:
# the second run's): that collective cannot say who is missing, so its deadline leaves the naming to the
# stall census, which names rank 1.
echo "== comm.backend = ps, async, a rank stopped as a run of steps begins"
rm -rf run
run_to_its_end run-start $((bound + 15)) mpirun -np 2 -x LD_PRELOAD="$stopper" -x DDPTRAIN_TEST_STOP_IN=MPI_Comm_idup \
  -x DDPTRAIN_TEST_STOP_RANK=1 -x DDPTRAIN_TEST_STOP_AFTER=2 "$ddptrain" --data.path data.h5 --checkpoint.dir run \
  --comm.backend ps --comm.ps_servers 0 --comm.ps_mode async --comm.timeout_s "$bound" --model.embedding_dim 16 \
  --model.hidden 16 --train.epochs 8
grep -q "rank 1 (host .*) is hung, lost or slower than the timeout" run-start-err.txt ||
  { echo "FAIL: run start: rank 1 is not named"; exit 1; }
[ -z "$(pid_of_rank run 1)" ] || { echo "FAIL: the stopped rank outlived the job"; exit 1; }

# Two dedicated servers (ranks 2 and 3), server rank 3 stopped: the workers wait for it and name it; the other
# server, hearing from no worker, must not blame them first.
echo "== comm.backend = ps, two dedicated servers"
rm -rf run
run=(mpirun -np 4 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend ps --comm.ps_servers 2
  --comm.timeout_s "$bound" --model.embedding_dim 16 --model.hidden 16 --train.epochs 8 --train.straggle_ms 20
  --log.progress lines)
signal_rank_and_wait STOP 3
[ "$elapsed" -le $((2 * bound + 15)) ] || { echo "FAIL: servers: took $elapsed s, bound 2 x $bound s"; exit 1; }
cat err.txt
grep -q "heard nothing from parameter server rank 3 " err.txt || { echo "FAIL: servers: rank 3 is not named"; exit 1; }
if grep -q "heard nothing from worker ranks 0, 1 " err.txt; then echo "FAIL: servers: the workers are blamed"; exit 1; fi
kill -9 "$victim" 2>/dev/null || true
victim=""

# The same, where rank 3 stops after replying to worker 0 and before worker 1 (its 30th reply to rank 1): worker
# 0 then pushes its next step to server 2 and worker 1 does not, since it waits for rank 3. Server 2 must not
# blame worker 1, but ask server 3 and name it.
echo "== comm.backend = ps, two dedicated servers, one stopped between its replies"
rm -rf run
run_to_its_end between $((bound + 15)) mpirun -np 4 -x LD_PRELOAD="$stopper" -x DDPTRAIN_TEST_STOP_IN=MPI_Isend \
  -x DDPTRAIN_TEST_STOP_RANK=3 -x DDPTRAIN_TEST_STOP_DEST=1 -x DDPTRAIN_TEST_STOP_AFTER=30 "$ddptrain" \
  --data.path data.h5 --checkpoint.dir run --comm.backend ps --comm.ps_servers 2 --comm.timeout_s "$bound" \
  --model.embedding_dim 16 --model.hidden 16 --train.epochs 8
grep -q "parameter server (rank 2) heard nothing from parameter server rank 3 within .* s of asking, while worker rank 1 fell silent" \
  between-err.txt || { echo "FAIL: between replies: server 2 does not name rank 3"; exit 1; }
if grep -q "heard nothing from worker rank" between-err.txt; then echo "FAIL: between replies: a worker is blamed"; exit 1; fi
[ -z "$(pid_of_rank run 3)" ] || { echo "FAIL: the stopped rank outlived the job"; exit 1; }
echo "PASS"
