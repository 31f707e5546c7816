#!/usr/bin/env bash
# The time limit itself, under a real Slurm (tests/slurm/local_slurm.sh): launch/slurm/cpu_ps.sbatch without
# its `#SBATCH --signal` line (as a site that leaves it out runs it), with --time=1 and a training that
# needs longer. At the limit Slurm sends SIGTERM to every process of the job: the batch shell, the launcher
# and the ranks. Measured with slurm-wlm 22.05 and Open MPI 4.1: srun passes its tasks' exit code 75 on,
# while mpirun, signalled itself, returns 1 whatever its ranks exit with (and SIGKILLs them 2 s later), so
# launch/slurm/common.sh also takes a last.h5 written after the signal as a stop with a checkpoint. Checks,
# once with LAUNCHER=srun and once with LAUNCHER=mpirun: the job was requeued at least once, ended COMPLETED,
# metrics.jsonl has each epoch exactly once and the final parameters equal those of an uninterrupted run.
# The two jobs run side by side (--oversubscribe).
# Exit 77 (skipped) when not root or Slurm is missing.
#   bash tests/slurm/time_limit_test.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/slurm/local_slurm.sh
source "$src/tests/slurm/local_slurm.sh"
local_slurm_test_setup

# 31 steps (validated on /test, so all 1000 rows train) of at least 50 ms: about 1.7 s an epoch, so 60 epochs outlast a 1-minute limit (which Slurm
# enforces 0 to 30 s late) and the rest fits in the next run's minute.
epochs=60
"$ddptrain" prepare synthetic --output "$work/data.h5" --train 1000 --test 200 --vocab 300 --maxlen 20 \
  --seed 3 >/dev/null
# Named kernels: the reference and the preempted run are compared bit for bit, and model.cpu_kernels = auto
# measures the core, which another job's load can sway.
args="--data.path $work/data.h5 --data.validation test --model.embedding_dim 16 --model.hidden 16 --train.epochs $epochs --model.cpu_kernels builtin"
sed '/^#SBATCH --signal/d' "$src/launch/slurm/cpu_ps.sbatch" >"$work/no_signal.sbatch"

read -r -a arg_list <<<"$args"
mpirun -np 2 "$ddptrain" --config "$src/launch/configs/imdb.ini" --checkpoint.dir "$work/reference" \
  --device cpu --comm.backend ps --comm.ps_servers 1 --log.progress lines "${arg_list[@]}" \
  >"$work/reference.out" 2>&1 || { cat "$work/reference.out"; fail "the uninterrupted reference run failed"; }
h5dump -m %.9g -d /params "$work/reference/last.h5" | tail -n +2 >"$work/reference_params.txt"

expect_log() {  # pattern, what it shows
  grep -q -- "$1" "$out" || fail "the job output lacks $2 ('$1')"
}

# Submits the job of LAUNCHER; prints its id. --oversubscribe lets the two launchers' jobs share the node's
# two cores (the partition allows it on request; other tests' jobs do not ask), so that they run side by side.
submit() {  # launcher
  local launcher=$1
  (cd "$src" && LAUNCHER=$launcher DDPTRAIN=$ddptrain RUN_DIR=$work/run-$launcher DDPTRAIN_ROOT=$src \
    DDPTRAIN_EXTRA_ARGS="$args --train.straggle_ms 50" sbatch --parsable --export=ALL \
    --job-name="time-limit-$launcher" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=1 \
    --oversubscribe --output="$work/job-$launcher.out" "$work/no_signal.sbatch") || fail "sbatch failed"
}

check_job() {  # launcher id
  local launcher=$1 id=$2 state restarts
  local run=$work/run-$launcher
  out=$work/job-$launcher.out
  state=$(local_slurm_wait_job "$id" 300) || fail "job $id did not end within 300 s"
  [ "$state" = COMPLETED ] || fail "job $id ended $state"
  restarts=$(local_slurm_job_restarts "$id")
  [ "$restarts" -ge 1 ] || fail "Restarts=$restarts: the job was not requeued at its time limit"
  expect_log "batch shell received SIGTERM (Slurm's reason: TimeLimit)" "the time limit's SIGTERM"
  if [ "$launcher" = mpirun ]; then
    expect_log "mpirun exited with 1, but ddptrain wrote $run/last.h5 after SIGTERM" \
      "the checkpoint taken as the stop although mpirun returned 1"
  else
    expect_log "ddptrain stopped for preemption (exit 75)" "srun passing exit 75 on"
  fi
  expect_log "requeued job $id" "the requeue"
  expect_log "run 2 on .*resuming from $run/last.h5" "a second run that resumes"
  local_slurm_check_resumed_run "$run" "$epochs" "$work/reference_params.txt"
  echo "ok (LAUNCHER=$launcher): job $id hit its time limit, checkpointed, was requeued $restarts time(s)," \
    "resumed and COMPLETED $epochs epochs with the parameters of an uninterrupted run"
}

srun_job=$(submit srun)
mpirun_job=$(submit mpirun)
check_job srun "$srun_job"
check_job mpirun "$mpirun_job"
