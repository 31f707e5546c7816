#!/usr/bin/env bash
# A rank of a 3-rank parameter-server run is killed (kill -9): the job must end within the bound with a
# message naming the lost rank, and --resume must then finish the training.
#   bash tests/cli/kill_and_resume.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$work"
"$ddptrain" prepare synthetic --output data.h5 --train 2000 --test 400 --vocab 300 --maxlen 20 --seed 3 >/dev/null
bound=20
run=(mpirun -np 3 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend ps --comm.timeout_s "$bound"
  --model.embedding_dim 16 --model.hidden 16 --train.epochs 6 --train.straggle_ms 20 --log.progress lines)

"${run[@]}" >out.txt 2>err.txt &
launcher=$!
wait_for_first_epoch run || { echo "FAIL: no epoch finished"; cat err.txt; exit 1; }
victim=$(pid_of_rank run 1)
[ -n "$victim" ] || { echo "FAIL: rank 1 not found"; exit 1; }
killed=$(date +%s)
kill -9 "$victim"
status=0
wait "$launcher" || status=$?
elapsed=$(($(date +%s) - killed))
echo "job ended $elapsed s after rank 1 was killed, exit status $status"
[ "$status" -ne 0 ] || { echo "FAIL: the job reported success"; exit 1; }
[ "$elapsed" -le $((2 * bound + 5)) ] || { echo "FAIL: took $elapsed s, bound $bound s"; exit 1; }
grep -q "rank 1" err.txt || { echo "FAIL: no message names rank 1:"; cat err.txt; exit 1; }

"${run[@]}" --resume >resume.txt 2>&1 || { echo "FAIL: --resume failed"; cat resume.txt; exit 1; }
grep -q "resumed from" resume.txt || { echo "FAIL: did not resume"; cat resume.txt; exit 1; }
grep -q '"epoch": 6,' run/metrics.jsonl || { echo "FAIL: epoch 6 missing"; cat run/metrics.jsonl; exit 1; }
