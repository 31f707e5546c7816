#!/usr/bin/env bash
# A rank of a 2-rank all-reduce run hangs while alive (SIGSTOP: the launcher sees no death): the other rank
# must end the job within comm.timeout_s plus a margin, saying why, and --resume must then finish the training.
#   bash tests/cli/hung_rank.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
work=$(mktemp -d)
victim=""
cleanup() {
  if [ -n "$victim" ]; then kill -9 "$victim" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$work"
"$ddptrain" prepare synthetic --output data.h5 --train 2000 --test 400 --vocab 300 --maxlen 20 --seed 3 >/dev/null
bound=5
run=(mpirun -np 2 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend mpi --comm.timeout_s "$bound"
  --model.embedding_dim 16 --model.hidden 16 --train.epochs 8 --train.straggle_ms 20 --log.progress lines)

"${run[@]}" >out.txt 2>err.txt &
launcher=$!
wait_for_first_epoch run || { echo "FAIL: no epoch finished"; cat err.txt; exit 1; }
victim=$(pid_of_rank run 1)
[ -n "$victim" ] || { echo "FAIL: rank 1 not found"; exit 1; }
stopped=$(date +%s)
kill -STOP "$victim"
status=0
wait "$launcher" || status=$?
elapsed=$(($(date +%s) - stopped))
echo "job ended $elapsed s after rank 1 stopped, exit status $status"
[ "$status" -ne 0 ] || { echo "FAIL: the job reported success"; exit 1; }
[ "$elapsed" -le $((bound + 15)) ] || { echo "FAIL: took $elapsed s, bound $bound s"; exit 1; }
cat err.txt
grep -q "no training step or evaluation batch finished in" err.txt || {
  echo "FAIL: no message says why:"
  cat err.txt
  exit 1
}
kill -9 "$victim" 2>/dev/null || true

"${run[@]}" --resume >resume.txt 2>&1 || { echo "FAIL: --resume failed"; cat resume.txt; exit 1; }
grep -q "resumed from" resume.txt || { echo "FAIL: did not resume"; cat resume.txt; exit 1; }
grep -q '"epoch": 8,' run/metrics.jsonl || { echo "FAIL: epoch 8 missing"; cat run/metrics.jsonl; exit 1; }
echo "PASS"
