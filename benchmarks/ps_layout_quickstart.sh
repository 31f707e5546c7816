#!/usr/bin/env bash
# The quickstart (2 ranks, its config) under each way CPU ranks can combine gradients, the runs interleaved
# so that all see the same machine load: all-reduce (comm.backend = mpi, with and without the sparse
# embedding exchange), the parameter server with a dedicated server rank (1 worker + 1 server) and the
# colocated parameter server (2 ranks, each training and serving half the parameters), with its row-sparse
# exchange of the embedding (the default) and without it.
#   bash benchmarks/ps_layout_quickstart.sh BUILD [repeats] [epochs] [quickstart|imdb|imdb-full]
# imdb: the IMDB model's shapes (vocab 20000, maxlen 80, embedding and LSTM 128) on 4000 synthetic rows;
# imdb-full: launch/configs/imdb.ini itself on an IMDB-sized set (25000 train rows, vocab 20000, maxlen 80).
# Prints, per configuration, the median over the repeats of the last epoch's train_time_s and step_time_ms
# (from metrics.jsonl), with min-max, and the final val_acc.
set -euo pipefail
build=$1
repeats=${2:-5}
epochs=${3:-2}
shape=${4:-quickstart}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
data=$scratch/quickstart.h5
model=()
config=$root/launch/configs/quickstart.ini
if [ "$shape" = imdb-full ]; then
  "$build"/ddptrain prepare synthetic --output "$data" --train 25000 --test 2500 --vocab 20000 --maxlen 80 \
    --seed 1 >/dev/null
  config=$root/launch/configs/imdb.ini
elif [ "$shape" = imdb ]; then
  "$build"/ddptrain prepare synthetic --output "$data" --train 4000 --test 800 --vocab 20000 --maxlen 80 \
    --seed 1 >/dev/null
  model=(--model.embedding_dim 128 --model.hidden 128)
else
  "$build"/ddptrain prepare synthetic --output "$data" --train 20000 --test 4000 --vocab 2000 --maxlen 40 \
    --seed 1 >/dev/null
fi

declare -A configs=(
  [all-reduce]="--comm.backend mpi"
  [all-reduce-dense]="--comm.backend mpi --comm.sparse_embedding false"
  [ps-dedicated]="--comm.backend ps --comm.ps_servers 1"
  [ps-colocated]="--comm.backend ps --comm.ps_servers 0"
  [ps-colocated-dense]="--comm.backend ps --comm.ps_servers 0 --comm.sparse_embedding false"
)
names=(all-reduce all-reduce-dense ps-dedicated ps-colocated ps-colocated-dense)

# run NAME: one quickstart; appends "train_time_s step_time_ms val_acc" of its last epoch to $scratch/NAME.
run() {
  local name=$1
  # shellcheck disable=SC2086  # the configuration's options are words
  mpirun -np 2 --bind-to none "$build"/ddptrain --config "$config" --data.path "$data" \
    --checkpoint.dir "$scratch/run" --checkpoint.overwrite true --train.epochs "$epochs" --log.progress lines \
    "${model[@]}" ${configs[$name]} >"$scratch/$name.log" 2>&1 || { cat "$scratch/$name.log"; exit 1; }
  python3 "$root/tests/json_field.py" "$scratch/run/metrics.jsonl" train_time_s,step_time_ms,val_acc \
    "epoch=$epochs" >>"$scratch/$name"
}

for _ in $(seq "$repeats"); do
  for name in "${names[@]}"; do run "$name"; done
done

for name in "${names[@]}"; do
  python3 - "$name" "$scratch/$name" <<'PY'
import statistics, sys
rows = [list(map(float, line.split())) for line in open(sys.argv[2])]
train, step, acc = zip(*rows)
print(f"{sys.argv[1]:16s} epoch train {statistics.median(train):.2f} s ({min(train):.2f}-{max(train):.2f}), "
      f"step {statistics.median(step):.2f} ms ({min(step):.2f}-{max(step):.2f}), val_acc {acc[-1]:.4f}, "
      f"{len(rows)} runs")
PY
done
