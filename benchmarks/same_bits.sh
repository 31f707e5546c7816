#!/usr/bin/env bash
# Final parameter checksums of short, seeded runs, for "a refactoring changes no bit" before/after checks:
#   bash benchmarks/same_bits.sh BUILD > after.txt; diff before.txt after.txt
# Runs the quickstart and the IMDB model's shapes (vocab 20000, maxlen 80, embedding and LSTM 128, on 2000
# synthetic rows), 2 epochs each, under all-reduce (2 ranks), the colocated parameter server (2 ranks) and a
# dedicated server (2 workers + 1 server), the parameter server synchronous (async is not reproducible).
# Prints one line per run: shape, backend, the last epoch's parameters_checksum and val_loss.
set -euo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
mkdir -p runs
"$build"/ddptrain prepare synthetic --output quickstart.h5 --train 4000 --test 800 --vocab 2000 --maxlen 40 \
  --seed 1 >/dev/null
"$build"/ddptrain prepare synthetic --output imdb.h5 --train 2000 --test 400 --vocab 20000 --maxlen 80 \
  --seed 1 >/dev/null
# The last epoch's record (the test's line comes after it).
last_field() {
  python3 -c 'import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
print([r for r in records if "event" not in r][-1][sys.argv[2]])' "$@"
}
for shape in quickstart imdb; do
  config=$root/launch/configs/$shape.ini
  for layout in "mpi 2 --comm.backend mpi" "ps_colocated 2 --comm.backend ps --comm.ps_servers 0" \
    "ps_dedicated 3 --comm.backend ps --comm.ps_servers 1"; do
    read -r name ranks args <<<"$layout"
    dir=$scratch/runs/$shape-$name
    # shellcheck disable=SC2086 # the layout's arguments are words
    mpirun -np "$ranks" "$build"/ddptrain --config "$config" --data.path "$shape.h5" --device cpu \
      --train.epochs 2 --train.threads 1 --checkpoint.dir "$dir" --log.progress lines $args >"$dir.log" 2>&1 ||
      { echo "FAIL: $shape $name"; tail -20 "$dir.log"; exit 1; }
    echo "$shape $name $(last_field "$dir/metrics.jsonl" parameters_checksum) $(last_field "$dir/metrics.jsonl" val_loss)"
  done
done
