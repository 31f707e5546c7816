#!/usr/bin/env bash
# A rank that dies (kill -9) inside a Slurm job must end the job, not leave the other ranks waiting until the
# time limit. launch/slurm/cpu_ps.sbatch on a private one-node Slurm (tests/slurm/local_slurm.sh), 2 tasks,
# once with LAUNCHER=srun and once with LAUNCHER=mpirun: once the first epoch is written one ddptrain process
# is killed; the job must end FAILED within 30 s, not be requeued (only exit 75 requeues), the job output must
# say that a task was killed, and the checkpoint of the first epoch must still be there for --resume. Exit 77
# (skipped) when not root or Slurm is missing.
#   bash tests/slurm/lost_rank_test.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/slurm/local_slurm.sh
source "$src/tests/slurm/local_slurm.sh"
local_slurm_test_setup

"$ddptrain" prepare synthetic --output "$work/data.h5" --train 2000 --test 400 --vocab 300 --maxlen 20 \
  --seed 3 >/dev/null
args="--data.path $work/data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs 100000"

# The pid of one ddptrain process (not srun or mpirun) training into RUN_DIR; other tests may run beside.
job_rank_process() {  # run-dir
  local pid
  for pid in $(pgrep -x ddptrain); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--checkpoint.dir $1 "; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

lose_a_rank() {  # launcher
  local launcher=$1 run=$work/run-$1 out=$work/job-$1.out id victim state waited start
  id=$(cd "$src" && LAUNCHER=$launcher DDPTRAIN=$ddptrain RUN_DIR=$run DDPTRAIN_EXTRA_ARGS=$args \
    sbatch --parsable --export=ALL --job-name="lost-$launcher" --nodes=1 --ntasks-per-node=2 \
    --cpus-per-task=1 --time=5 --output="$out" launch/slurm/cpu_ps.sbatch)
  for ((waited = 0; waited < 300; ++waited)); do  # 60 s for the job to start and write its first epoch
    [ -s "$run/last.h5" ] && grep -qE '"epoch": ?1,' "$run/metrics.jsonl" 2>/dev/null && break
    sleep 0.2
  done
  [ -s "$run/last.h5" ] || { echo "job $id wrote no first epoch within 60 s"; return 1; }
  victim=$(job_rank_process "$run") || { echo "no ddptrain process of job $id to kill"; return 1; }
  kill -9 "$victim"
  start=$(date +%s)
  state=$(local_slurm_wait_job "$id" 30) || { echo "job $id still running 30 s after a rank was killed"; return 1; }
  [ "$state" = FAILED ] || { echo "job $id ended $state, expected FAILED"; return 1; }
  scontrol show job "$id" | grep -q 'Restarts=0' || { echo "job $id was requeued"; return 1; }
  grep -qE 'Killed|signal 9' "$out" || { echo "the job output does not say a task was killed"; return 1; }
  [ -s "$run/last.h5" ] || { echo "$run/last.h5 is gone"; return 1; }
  echo "job $id ended $state $(($(date +%s) - start)) s after rank process $victim was killed"
}

local_slurm_check_launchers lose_a_rank
