#!/usr/bin/env bash
# comm.overlap = delayed (the pipelined all-reduce: step k's average applied at step k + 1): two CPU ranks
# train under the MPI all-reduce, which auto picks for it and says why, with both exchanges of the
# embedding; every epoch's replicas agree bit for bit (the run checks it and records parameters_checksum).
# The parameter server and GPU ranks are refused with one line, exit 2.
#   bash tests/cli/delayed_exchange.sh path/to/ddptrain
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output data.h5 --train 256 --test 64 --vocab 300 --maxlen 16 --seed 3 \
  >prepare.txt 2>&1 || fail "prepare synthetic failed" prepare.txt
args=(--data.path data.h5 --model.embedding_dim 8 --model.hidden 8 --train.batch_size 8 --train.epochs 2
  --train.threads 1 --comm.overlap delayed --log.progress lines)
for sparse in true false; do
  mpirun -np 2 "$ddptrain" "${args[@]}" --comm.sparse_embedding "$sparse" --checkpoint.dir "run-$sparse" \
    >"train-$sparse.txt" 2>&1 || fail "sparse_embedding $sparse: the run failed" "train-$sparse.txt"
  grep -q "backend mpi: .*comm.overlap = delayed needs the all-reduce" "train-$sparse.txt" ||
    fail "sparse_embedding $sparse: auto did not take the all-reduce for the delayed exchange" "train-$sparse.txt"
  [ "$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "run-$sparse/metrics.jsonl")" -eq 2 ] ||
    fail "sparse_embedding $sparse: not two agreed checksums" "run-$sparse/metrics.jsonl"
done
expect_user_error "the parameter server" "comm.overlap = delayed runs with the MPI all-reduce on CPU ranks, but comm.backend = ps" \
  "$ddptrain" "${args[@]}" --comm.backend ps --checkpoint.dir run-ps
expect_user_error "a bad value" "comm.overlap" "$ddptrain" "${args[@]}" --comm.overlap soon --checkpoint.dir run-bad
echo "delayed exchange: trains on the all-reduce with agreed replicas; the parameter server refused"
