#!/usr/bin/env bash
# The colocated parameter server against all-reduce on 2 CPU ranks of one host, with launch/configs/imdb.ini
# (embedding and LSTM 128, Adam 0.001, batch 32 per rank) on IMDB-shaped synthetic rows (vocab 20000, maxlen
# 80; 25000 for the straggler runs, 8000 for memory), runs of the configurations interleaved:
#   bash benchmarks/ps_colocated_bench.sh BUILD straggler [repeats] [straggle_ms] [epochs]
#     all-reduce, colocated sync and colocated async with the last rank sleeping straggle_ms after each step
#     (train.straggle_ms): per configuration the median over the repeats of the updates per second (optimizer
#     steps: one per step in sync and all-reduce, one per rank's gradient in async) and of the training time
#     until the first epoch whose val_acc reaches 0.9, with min-max, and the last val_acc.
#   bash benchmarks/ps_colocated_bench.sh BUILD memory [repeats]
#     peak resident memory (GNU time's %M) of each rank for all-reduce, colocated sync (rows and dense) and a dedicated server
#     (1 worker + 1 server): 100 steps and a checkpoint, median over the repeats.
set -euo pipefail
build=$1
what=$2
repeats=${3:-3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
data=$scratch/imdb-shapes.h5
rows=8000
[ "$what" = straggler ] && rows=25000
"$build"/ddptrain prepare synthetic --output "$data" --train "$rows" --test 2500 --vocab 20000 --maxlen 80 \
  --seed 1 >/dev/null
common=(--config "$root/launch/configs/imdb.ini" --data.path "$data" --checkpoint.dir "$scratch/run"
  --checkpoint.overwrite true --log.progress lines --train.threads 1)

if [ "$what" = straggler ]; then
  straggle=${4:-12}
  epochs=${5:-4}
  declare -A configs=(
    [all-reduce]="--comm.backend mpi"
    [colocated-sync]="--comm.backend ps --comm.ps_servers 0"
    [colocated-async]="--comm.backend ps --comm.ps_servers 0 --comm.ps_mode async"
  )
  names=(all-reduce colocated-sync colocated-async)
  for _ in $(seq "$repeats"); do
    for name in "${names[@]}"; do
      # shellcheck disable=SC2086  # the configuration's options are words
      mpirun -np 2 --bind-to none "$build"/ddptrain "${common[@]}" --train.epochs "$epochs" \
        --train.straggle_ms "$straggle" ${configs[$name]} >"$scratch/$name.log" 2>&1 ||
        { cat "$scratch/$name.log"; exit 1; }
      # One line per run: "updates/s seconds-to-0.9 last-val_acc".
      python3 - "$scratch/run/metrics.jsonl" "$name" >>"$scratch/$name" <<'PY'
import json, sys
epochs = [r for r in map(json.loads, open(sys.argv[1])) if "epoch" in r]
per_step = epochs[0]["workers"] if sys.argv[2].endswith("async") else 1  # async: one update per gradient
train = sum(r["train_time_s"] for r in epochs)
updates = sum(r["steps_run"] for r in epochs) * per_step
elapsed, to_target = 0.0, "nan"
for r in epochs:
    elapsed += r["train_time_s"]
    if r["val_acc"] >= 0.9:
        to_target = f"{elapsed:.2f}"
        break
print(f"{updates / train:.2f} {to_target} {epochs[-1]['val_acc']:.4f}")
PY
    done
  done
  echo "straggle ${straggle} ms on rank 1, ${epochs} epochs, ${repeats} runs each:"
  for name in "${names[@]}"; do
    python3 - "$name" "$scratch/$name" <<'PY'
import math, statistics, sys
rows = [line.split() for line in open(sys.argv[2])]
rate = [float(r[0]) for r in rows]
reached = [float(r[1]) for r in rows if r[1] != "nan"]
target = (f"{statistics.median(reached):.2f} s ({min(reached):.2f}-{max(reached):.2f})"
          if len(reached) == len(rows) else f"reached in {len(reached)} of {len(rows)} runs")
print(f"{sys.argv[1]:16s} updates/s {statistics.median(rate):.1f} ({min(rate):.1f}-{max(rate):.1f}), "
      f"train time to val_acc 0.9: {target}, last val_acc {rows[-1][2]}")
PY
  done
elif [ "$what" = memory ]; then
  declare -A configs=(
    [all-reduce]="--comm.backend mpi"
    [colocated-sync]="--comm.backend ps --comm.ps_servers 0"
    [colocated-dense]="--comm.backend ps --comm.ps_servers 0 --comm.sparse_embedding false"
    [dedicated]="--comm.backend ps --comm.ps_servers 1"
  )
  names=(all-reduce colocated-sync colocated-dense dedicated)
  for _ in $(seq "$repeats"); do
    for name in "${names[@]}"; do
      # shellcheck disable=SC2086,SC2016  # the options are words; the rank is the launched rank's
      mpirun -np 2 --bind-to none bash -c '/usr/bin/time -o "$0.$OMPI_COMM_WORLD_RANK" -f "%M" "$1" "${@:2}"' \
        "$scratch/rss" "$build"/ddptrain "${common[@]}" --train.epochs 1 --train.max_steps_per_epoch 100 \
        ${configs[$name]} >"$scratch/$name.log" 2>&1 || { cat "$scratch/$name.log"; exit 1; }
      for rank in 0 1; do echo "rank $rank $(cat "$scratch/rss.$rank")" >>"$scratch/$name"; done
    done
  done
  echo "peak RSS per rank (MiB), median of ${repeats} runs (min-max):"
  for name in "${names[@]}"; do
    python3 - "$name" "$scratch/$name" <<'PY'
import statistics, sys
by_rank = {}
for line in open(sys.argv[2]):
    _, rank, kib = line.split()
    by_rank.setdefault(int(rank), []).append(int(kib) / 1024)
cells = [f"rank {r}: {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for r, v in sorted(by_rank.items())]
print(f"{sys.argv[1]:16s} " + ", ".join(cells))
PY
  done
else
  echo "usage: $0 BUILD straggler|memory [repeats] ..." >&2
  exit 2
fi
