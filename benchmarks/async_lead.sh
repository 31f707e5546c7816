#!/usr/bin/env bash
# How far the fast rank of a colocated async run gets ahead of a straggler: 2 ranks, a small model (embedding
# and LSTM 16) on 2000 synthetic rows, one epoch, the last rank sleeping STRAGGLE_MS after each step
# (train.straggle_ms); per comm.max_staleness, when each rank ended its 20th and its last step (from the
# timeline, milliseconds after its first step ended). A fast rank held to the straggler ends its steps with
# it; one free to run comm.max_staleness steps ahead ends them that many straggler steps earlier.
#   bash benchmarks/async_lead.sh BUILD [straggle_ms] [max_staleness ...]
set -euo pipefail
build=$1
straggle_ms=${2:-20}
shift $(($# > 1 ? 2 : 1))
stalenesses=("$@")
[ ${#stalenesses[@]} -gt 0 ] || stalenesses=(1 4 20)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$build"/ddptrain prepare synthetic --output "$scratch/data.h5" --train 2000 --test 400 --vocab 300 --maxlen 20 \
  --seed 3 >/dev/null
echo "max_staleness | rank: step 20 ends, last step ends (ms)"
for staleness in "${stalenesses[@]}"; do
  rm -rf "$scratch/run"
  mpirun -np 2 "$build"/ddptrain --data.path "$scratch/data.h5" --checkpoint.dir "$scratch/run" \
    --comm.backend ps --comm.ps_servers 0 --comm.ps_mode async --comm.max_staleness "$staleness" \
    --model.embedding_dim 16 --model.hidden 16 --train.epochs 1 --train.threads 1 \
    --train.straggle_ms "$straggle_ms" --log.timeline timeline.json >"$scratch/out.txt" 2>&1 ||
    { cat "$scratch/out.txt"; exit 1; }
  python3 - "$scratch/run/timeline.json" "$staleness" <<'EOF'
import json
import sys

trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
ends = {}
for e in events:
    if e.get("name") == "step" and e.get("ph") == "X":
        ends.setdefault(e["pid"], []).append(e["ts"] + e.get("dur", 0))
line = []
for rank, times in sorted(ends.items()):
    times.sort()
    line.append(f"rank {rank}: {(times[min(20, len(times) - 1)] - times[0]) / 1e3:.0f}, "
                f"{(times[-1] - times[0]) / 1e3:.0f}")
print(f"{sys.argv[2]:>13} | " + "; ".join(line))
EOF
done
