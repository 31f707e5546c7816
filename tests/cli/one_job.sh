#!/usr/bin/env bash
# Every rank must be given one job: ranks started with other settings (a per-node config file or
# DDPTRAIN_EXTRA_ARGS) or other data end the job at start-up with one line naming the rank, its host, the key
# and both values, exit 2. Before, another learning rate trained replicas that silently diverged (exit 0),
# another model.hidden died in MPI_ERR_TRUNCATE under comm.backend mpi and in SIGABRT under the parameter
# server, and another data file of the same shapes trained each rank on other rows (exit 0); another backend
# is refused alike. Settings a node may set for itself (train.threads, comm.timeout_s, data.path to a copy of
# the same file) still train.
#   bash tests/cli/one_job.sh path/to/ddptrain
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

for seed in 1 2; do
  "$ddptrain" prepare synthetic --output "data$seed.h5" --train 96 --test 32 --vocab 200 --maxlen 12 \
    --seed "$seed" >prepare.txt 2>&1 || fail "prepare synthetic failed" prepare.txt
done
cp data1.h5 copy1.h5
common=(--model.embedding_dim 8 --model.hidden 8 --train.batch_size 8 --train.epochs 1 --train.threads 1
  --log.progress lines)

# two_ranks NAME 'RANK 0 ARGS' 'RANK 1 ARGS': a 2-rank job whose ranks get other arguments; its exit status
# in NAME.status, its output in NAME.out and NAME.err.
two_ranks() {
  local name=$1 status=0
  local -a zero one
  read -r -a zero <<<"$2"
  read -r -a one <<<"$3"
  mpirun -np 1 "$ddptrain" "${common[@]}" --checkpoint.dir "run-$name" "${zero[@]}" : \
    -np 1 "$ddptrain" "${common[@]}" --checkpoint.dir "run-$name" "${one[@]}" >"$name.out" 2>"$name.err" ||
    status=$?
  echo "$status" >"$name.status"
}

# refused NAME MENTION: the job exited 2 with one error line that holds MENTION.
refused() {
  local name=$1 mention=$2
  [ "$(cat "$name.status")" -eq 2 ] || fail "$name: exit status $(cat "$name.status"), expected 2" "$name.out" "$name.err"
  [ "$(grep -c '^ddptrain: error:' "$name.err")" -eq 1 ] || fail "$name: not one error line" "$name.err"
  grep -qF -- "$mention" "$name.err" || fail "$name: '$mention' not in the error" "$name.err"
}

two_ranks rate "--data.path data1.h5 --comm.backend mpi" "--data.path data1.h5 --comm.backend mpi --train.learning_rate 0.5"
refused rate "the ranks were not given one job: rank 1 (host $(hostname)) has train.learning_rate = 0.5, rank 0"

two_ranks hidden_ps "--data.path data1.h5 --comm.backend ps --comm.ps_servers 0" \
  "--data.path data1.h5 --comm.backend ps --comm.ps_servers 0 --model.hidden 16"
refused hidden_ps "has model.hidden = 16, rank 0"

two_ranks backend "--data.path data1.h5 --comm.backend mpi" "--data.path data1.h5 --comm.backend ps"
refused backend "has comm.backend = ps, rank 0"

# A timeline on one rank only: its barrier and gather would wait for the other (hung until the watchdog).
two_ranks timeline "--data.path data1.h5 --log.timeline trace.json" "--data.path data1.h5"
refused timeline "has log.timeline = , rank 0"

two_ranks data "--data.path data1.h5" "--data.path data2.h5"
refused data "rank 1 (host $(hostname)) reads other data than rank 0 (host $(hostname)): data.path data2.h5"

two_ranks per_node "--data.path data1.h5" "--data.path copy1.h5 --comm.timeout_s 30 --train.threads 2"
[ "$(cat per_node.status)" -eq 0 ] || fail "per-node settings: exit status $(cat per_node.status)" per_node.out per_node.err
grep -q "^Epoch 1/1" per_node.out || fail "per-node settings: no epoch line" per_node.out
# Both replicas ended the epoch with the same parameters, which the run checked and recorded.
grep -q '"parameters_checksum":"[0-9a-f]\{16\}"' run-per_node/metrics.jsonl ||
  fail "per-node settings: no parameters_checksum in metrics.jsonl" run-per_node/metrics.jsonl
echo "one job: other settings and data refused, per-node settings train"
