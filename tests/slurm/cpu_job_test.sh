#!/usr/bin/env bash
# Submits launch/slurm/cpu_ps.sbatch to a private one-node Slurm (2 CPUs, tests/slurm/local_slurm.sh), once
# with LAUNCHER=srun (PMIx) and once with LAUNCHER=mpirun, on a tiny synthetic dataset, 2 tasks (one worker,
# one parameter server; under mpirun DDPTRAIN_EXTRA_ARGS overrides the script's --comm.backend ps with
# all-reduce, which the log must show), 3 epochs. Each job must end COMPLETED with a run directory holding last.h5, best.h5
# and metrics.jsonl with one line per epoch. Exit 77 (skipped) when not root or Slurm is missing.
#   bash tests/slurm/cpu_job_test.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/slurm/local_slurm.sh
source "$src/tests/slurm/local_slurm.sh"
local_slurm_test_setup

epochs=3
"$ddptrain" prepare synthetic --output "$work/data.h5" --train 2000 --test 400 --vocab 300 --maxlen 20 \
  --seed 3 >/dev/null
args="--data.path $work/data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs $epochs"

declare -A job_of
declare -A backend_of=([srun]=ps [mpirun]=mpi)
for launcher in srun mpirun; do
  # The script's settings come from the environment, which sbatch passes on (--export=ALL).
  job_of[$launcher]=$(cd "$src" && LAUNCHER=$launcher DDPTRAIN=$ddptrain RUN_DIR=$work/run-$launcher \
    DDPTRAIN_EXTRA_ARGS="$args --comm.backend ${backend_of[$launcher]}" sbatch --parsable --export=ALL --job-name="cpu-$launcher" --nodes=1 \
    --ntasks-per-node=2 --cpus-per-task=1 --time=5 --output="$work/job-$launcher.out" launch/slurm/cpu_ps.sbatch)
  echo "submitted job ${job_of[$launcher]} (LAUNCHER=$launcher)"
done

check_job() {  # launcher
  local launcher=$1 id=${job_of[$1]} run=$work/run-$1 state lines file
  state=$(local_slurm_wait_job "$id" 60) || { echo "job $id did not end within 60 s"; return 1; }
  [ "$state" = COMPLETED ] || { echo "job $id ended $state"; return 1; }
  grep -q "2 rank(s)" "$work/job-$launcher.out" || { echo "ddptrain did not start as one job of 2 ranks"; return 1; }
  grep -q "^backend ${backend_of[$launcher]}:" "$work/job-$launcher.out" ||
    { echo "the job did not run backend ${backend_of[$launcher]}"; return 1; }
  for file in last.h5 best.h5 metrics.jsonl config.ini; do
    [ -s "$run/$file" ] || { echo "$run/$file is missing"; return 1; }
  done
  lines=$(grep -c '"epoch"' "$run/metrics.jsonl" || true)
  [ "$lines" -eq "$epochs" ] || { echo "metrics.jsonl has $lines epoch lines, expected $epochs"; return 1; }
  grep -qE "\"epoch\": ?$epochs," "$run/metrics.jsonl" || { echo "epoch $epochs missing from metrics.jsonl"; return 1; }
  echo "job $id COMPLETED, $lines epochs, checkpoints in $run"
}

local_slurm_check_launchers check_job
