#!/usr/bin/env bash
# The colocated parameter server in async mode with a straggler converges on the quickstart's data set
# (`prepare synthetic --train 20000 --test 4000 --vocab 2000 --maxlen 40 --seed 1`, launch/configs/
# quickstart.ini): 2 ranks, each training and serving half of the parameters, the last one sleeping 5 ms
# after each of its steps, reach val_acc > 0.9 within 3 epochs (the MPI tests hold the same on a smaller set,
# tests/mpi/ps_trainer_test.cpp). The model leaves its first plateau (val_acc 0.5) at a step that async
# staleness moves: on an idle machine in epoch 2 (0.99), under CI's load once only late in it (0.84), then
# 0.99 an epoch later, so the third epoch is what makes this a test of convergence rather than of timing.
#   bash tests/cli/async_straggler_quickstart.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
src=$2
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir
"$ddptrain" prepare synthetic --output quickstart.h5 --train 20000 --test 4000 --vocab 2000 --maxlen 40 \
  --seed 1 >prepare.txt 2>&1 || fail "prepare synthetic" prepare.txt
mpirun -np 2 "$ddptrain" --config "$src/launch/configs/quickstart.ini" --data.path quickstart.h5 \
  --checkpoint.dir async --device cpu --comm.backend ps --comm.ps_servers 0 --comm.ps_mode async \
  --train.straggle_ms 5 --train.epochs 3 --train.threads 1 --log.progress lines >out.txt 2>&1 ||
  fail "the colocated async run" out.txt
grep -q "colocated: 2 ranks" out.txt || fail "not the colocated layout" out.txt
best=$(json_field async/metrics.jsonl val_acc | sort -g | tail -1)
[ -n "$best" ] || fail "no val_acc in metrics.jsonl" async/metrics.jsonl
echo "colocated async with a 5 ms straggler: best val_acc $best in 3 epochs"
python3 -c "import sys; sys.exit(float(sys.argv[1]) <= 0.9)" "$best" ||
  fail "val_acc $best, expected > 0.9 (chance is 0.5)" out.txt
echo PASS
