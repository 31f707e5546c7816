#!/usr/bin/env bash
# A/B of two builds on the parameter server: the quickstart's step time and ps_bench's updates/s, the two
# builds' runs interleaved so that both see the same machine load.
#   bash benchmarks/ps_ab.sh OLD_BUILD NEW_BUILD [repeats]
# Each build needs ddptrain and benchmarks/ps_bench (CUDA off is fine). Prints one line per configuration:
# the median over the repeats for each build, with min-max.
set -euo pipefail
old=$1
new=$2
repeats=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
data=$scratch/quickstart.h5
"$new"/ddptrain prepare synthetic --output "$data" --train 20000 --test 4000 --vocab 2000 --maxlen 40 \
  --seed 1 >/dev/null

quickstart_step_ms() {  # build ranks
  mpirun -np "$2" --bind-to none "$1"/ddptrain --config launch/configs/quickstart.ini --data.path "$data" \
    --checkpoint.dir "$scratch/run" --checkpoint.overwrite true --comm.backend ps --comm.ps_servers 1 --train.epochs 2 \
    --log.progress lines >/dev/null 2>&1
  grep '"epoch"' "$scratch/run/metrics.jsonl" | tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["step_time_ms"])'
}

ps_bench_updates() {  # build ranks mode compute_ms
  mpirun -np "$2" "$1"/benchmarks/ps_bench --mode "$3" --compute-ms "$4" --straggle-ms 0 2>/dev/null |
    sed -n 's/^RESULT .*updates_per_s=\([0-9.]*\).*/\1/p'
}

summary() {  # values...: "median (min-max)"
  printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {printf "%s (%s-%s)", v[int((NR + 1) / 2)], v[1], v[NR]}'
}

run() {  # label function args...
  local label=$1 fn=$2
  shift 2
  local a=() b=()
  for ((i = 0; i < repeats; ++i)); do
    a+=("$("$fn" "$old" "$@")")
    b+=("$("$fn" "$new" "$@")")
  done
  printf '%-42s old %-26s new %s\n' "$label" "$(summary "${a[@]}")" "$(summary "${b[@]}")"
}

for ranks in 2 3 4; do
  run "quickstart ps, $ranks ranks: step ms" quickstart_step_ms "$ranks"
done
for compute in 0 20; do
  for ranks in 2 3 4; do
    for mode in ps-sync ps-async; do
      run "ps_bench $mode, $ranks ranks, compute $compute ms: updates/s" ps_bench_updates "$ranks" "$mode" "$compute"
    done
  done
done
