#!/usr/bin/env bash
# Peak resident memory of each rank for a small and a 100x larger synthetic dataset (IMDB shapes: maxlen 80,
# vocab 20000, 25,000 test samples). A rank holds a bounded window of batches, so both should be about equal.
#   bash benchmarks/peak_rss.sh [build-dir] [scratch-dir]
# Each run trains 300 steps per rank (one epoch, capped) with 2 all-reduce ranks, after validating every rank's shard, and
# evaluates on the whole test split. Peak RSS comes from GNU time (%M, KiB) around each rank.
set -euo pipefail
build=${1:-build}
scratch=${2:-/tmp/ddptrain-rss}
mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for train in 25000 2500000; do
  data=$scratch/synthetic-$train.h5
  [ -f "$data" ] || "$build"/ddptrain prepare synthetic --output "$data" --train "$train" --test 25000 \
    --vocab 20000 --maxlen 80 --seed 1 >/dev/null
  echo "== $train training samples ($(du -h "$data" | cut -f1) file)"
  mpirun -np 2 /usr/bin/time -f "rank peak RSS: %M KiB" "$build"/ddptrain --data.path "$data" \
    --checkpoint.dir "$scratch/run-$train" --train.epochs 1 --train.max_steps_per_epoch 300 --train.threads 1 --comm.backend mpi \
    --log.progress lines 2>&1 | grep -E "peak RSS|^Epoch"
done
