#!/usr/bin/env bash
# Preemption under a real Slurm (tests/slurm/local_slurm.sh): launch/slurm/cpu_ps.sbatch trains 4 epochs on 2
# tasks, slowed so that it is still running after its first epoch; then the test sends what
# #SBATCH --signal=B:USR1@120 sends, `scancel --signal=USR1 --batch JOB`. Once with LAUNCHER=srun (PMIx), once
# with LAUNCHER=mpirun. Checks: ddptrain checkpointed and exited 75, the script requeued the job, the job ran
# twice (Restarts=1), its second run resumed from the checkpoint and the job ended COMPLETED; metrics.jsonl
# has each of the 4 epochs exactly once, and the final parameters equal those of an uninterrupted run.
# Last, a plain `scancel JOB` (SIGTERM) mid-run: ddptrain still checkpoints, but the job stays CANCELLED and
# is not requeued. Exit 77 (skipped) when not root or Slurm is missing.
#   bash tests/slurm/preempt_test.sh path/to/ddptrain source-dir
#
# A requeued job waits (Reason=BeginTime) until the credential of its first run has expired: AuthInfo
# cred_expire, 120 s by default, 10 s in the local Slurm. Forcing an earlier start (`scontrol update
# JobId=.. StartTime=now`) does not help: slurmd then refuses the batch job ("Job credential revoked") and the
# job FAILS, so the test waits.
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/slurm/local_slurm.sh
source "$src/tests/slurm/local_slurm.sh"
local_slurm_test_setup


epochs=4
"$ddptrain" prepare synthetic --output "$work/data.h5" --train 2000 --test 400 --vocab 300 --maxlen 20 \
  --seed 3 >/dev/null
# Named kernels: the reference and the preempted run are compared bit for bit, and model.cpu_kernels = auto
# measures the core, which another job's load can sway.
args="--data.path $work/data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs $epochs --model.cpu_kernels builtin"

# The same training without interruption (plain mpirun, no slowdown): its epochs and final parameters.
read -r -a arg_list <<<"$args"
mpirun -np 2 "$ddptrain" --config "$src/launch/configs/imdb.ini" --checkpoint.dir "$work/reference" \
  --device cpu --comm.backend ps --comm.ps_servers 1 --log.progress lines "${arg_list[@]}" \
  >"$work/reference.out" 2>&1 || { cat "$work/reference.out"; fail "the uninterrupted reference run failed"; }
reference_lines=$(grep -c '"epoch"' "$work/reference/metrics.jsonl" || true)
[ "$reference_lines" -eq "$epochs" ] || fail "the uninterrupted run has $reference_lines epochs, expected $epochs"
h5dump -m %.9g -d /params "$work/reference/last.h5" | tail -n +2 >"$work/reference_params.txt"

# Submits the slowed job (62 steps of at least 25 ms: an epoch takes 1.5 s or more, so a signal after the
# first epoch arrives in the middle of the run); sets job_id once its first epoch has ended.
job_id=""
submit_slow_job() {  # launcher, run directory
  local id
  id=$(cd "$src" && LAUNCHER=$1 DDPTRAIN=$ddptrain RUN_DIR=$2 \
    DDPTRAIN_EXTRA_ARGS="$args --train.straggle_ms 25" sbatch --parsable --export=ALL \
    --job-name="preempt-$1" --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=5 \
    --output="$out" launch/slurm/cpu_ps.sbatch) || fail "sbatch failed"
  for _ in $(seq 300); do  # at most 60 s until the first epoch ends
    grep -q "^Epoch 1/$epochs" "$out" 2>/dev/null && break
    sleep 0.2
  done
  grep -q "^Epoch 1/$epochs" "$out" || fail "no epoch finished within 60 s (state $(local_slurm_job_state "$id"))"
  job_id=$id
}

preempt_and_check() {  # launcher
  local launcher=$1
  local run=$work/run-$launcher
  out=$work/job-$launcher.out
  submit_slow_job "$launcher" "$run"
  local id=$job_id
  scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id failed"
  echo "sent SIGUSR1 to the batch shell of job $id (LAUNCHER=$launcher) after epoch 1"

  local state restarts
  state=$(local_slurm_wait_job "$id" 90) || fail "job $id did not end within 90 s"
  [ "$state" = COMPLETED ] || fail "job $id ended $state"
  restarts=$(local_slurm_job_restarts "$id")
  [ "$restarts" = 1 ] || fail "Restarts=$restarts, expected 1 (one requeue)"

  local_slurm_check_preemption_log "$out" "$launcher" "$id" "$run"
  # The stop came before the last epoch: epoch $epochs ends in the second run only.
  if sed -n '/run 2 on/q;p' "$out" | grep -q "^Epoch $epochs/$epochs"; then
    fail "the first run finished all epochs: no preemption"
  fi

  local_slurm_check_resumed_run "$run" "$epochs" "$work/reference_params.txt"
  echo "ok (LAUNCHER=$launcher): job $id checkpointed, exited 75, was requeued once, resumed and COMPLETED" \
    "$epochs epochs with the parameters of an uninterrupted run"
}

expect_log() {  # pattern, what it shows
  grep -q -- "$1" "$out" || fail "the job output lacks $2 ('$1')"
}

cancel_and_check() {
  local run=$work/run-cancel
  out=$work/job-cancel.out
  submit_slow_job srun "$run"
  local id=$job_id state restarts
  scancel "$id" || fail "scancel $id failed"
  echo "cancelled job $id after epoch 1"
  state=$(local_slurm_wait_job "$id" 60) || fail "job $id did not end within 60 s"
  [ "$state" = CANCELLED ] || fail "the cancelled job $id ended $state"
  restarts=$(local_slurm_job_restarts "$id")
  [ "$restarts" = 0 ] || fail "the cancelled job $id was requeued (Restarts=$restarts)"
  expect_log "batch shell received SIGTERM" "the cancel's SIGTERM reaching the batch shell"
  expect_log "not requeued" "the decision not to requeue"
  [ -s "$run/last.h5" ] || fail "no checkpoint after the cancel"
  echo "ok: the cancelled job $id checkpointed and stayed CANCELLED"
}

preempt_and_check srun
preempt_and_check mpirun
cancel_and_check
