#!/usr/bin/env bash
# What --log.timeline costs a step: the same 2-rank all-reduce run (the quickstart's data and model, 3 epochs)
# with the timeline off and on, alternating, 3 times each; prints every run's mean step time over its
# epochs (metrics.jsonl's step_time_ms) and the medians.
#   bash benchmarks/timeline_overhead.sh [build-dir] [scratch-dir]
set -euo pipefail
build=${1:-build}
scratch=${2:-/tmp/ddptrain-timeline}
mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
data=$scratch/quickstart.h5
[ -f "$data" ] || "$build"/ddptrain prepare synthetic --output "$data" --train 20000 --test 4000 --vocab 2000 \
  --maxlen 40 --seed 1 >/dev/null

mean_step_ms() { awk -F'"step_time_ms": ' 'NF > 1 {split($2, a, ","); s += a[1]; n++} END {printf "%.4f", s / n}' "$1"; }
median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }

off=() on=()
for trial in 1 2 3; do
  for mode in off on; do
    run=$scratch/run-$mode-$trial
    rm -rf "$run"
    extra=()
    [ "$mode" = on ] && extra=(--log.timeline "$scratch/trace-$trial.json")
    mpirun -np 2 --bind-to none "$build"/ddptrain --config launch/configs/quickstart.ini --data.path "$data" \
      --comm.backend mpi --train.epochs 3 --checkpoint.dir "$run" --log.progress lines "${extra[@]}" >/dev/null
    ms=$(mean_step_ms "$run/metrics.jsonl")
    echo "trial $trial, timeline $mode: $ms ms/step"
    if [ "$mode" = on ]; then on+=("$ms"); else off+=("$ms"); fi
  done
done
echo "median ms/step: timeline off $(median "${off[@]}"), on $(median "${on[@]}")"
echo "trace size: $(du -h "$scratch/trace-1.json" | cut -f1) for 3 epochs x 2 ranks"
