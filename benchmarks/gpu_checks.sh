#!/usr/bin/env bash
# The checks that need a GPU, in one go, on a GPU node from the repository root with a CUDA build:
#   bash benchmarks/gpu_checks.sh [build-dir] [log-dir]
# Every check runs even when an earlier one failed; the end prints PASS/FAIL per check (also written to
# LOG_DIR/summary.txt, with the whole output in LOG_DIR/gpu_checks.log) and the exit status is the number of
# failed checks. CHECKS="name ..." runs only those (names as in the summary).
#   gpu_tests      the GPU tests (CPU/GPU parity, layout round trip, NCCL, the input pipeline); none may skip
#   quickstart     the quickstart on the GPU reaches val_acc >= 0.90; NVML's gpu_util is in metrics.jsonl
#   resume_cpu     the GPU run's checkpoint resumes on the CPU for one more epoch
#   evaluate       evaluate on the GPU and on the CPU agree
#   text           prepare text, train, predict and evaluate on the GPU; the CPU predicts its checkpoint alike
#   check_env      check-env names the GPU and exits 0 (tests/cli/check_env.sh's GPU branch)
#   timeline       a GPU run's trace has forward/backward on "GPU stream", buckets on "NCCL stream", the copies
#   mixed          one GPU worker, one CPU worker and a parameter server (comm.backend auto) train together
#   epoch_bench    the side-by-side epoch against PyTorch and the cuDNN floor (table for RESULTS.md)
#   sanitizer      compute-sanitizer memcheck over the replica, optimizer and pipeline tests
# shellcheck disable=SC2317  # the check_* functions are called by name from the loop at the end
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
logs=${2:-${SCRATCH:-/tmp/ddptrain-gpu-checks}}
scratch=${SCRATCH:-/tmp/ddptrain-gpu-checks}
mkdir -p "$scratch" "$logs"
exec > >(tee "$logs/gpu_checks.log") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ddptrain=$build/ddptrain
data=$scratch/quickstart.h5
nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader || true

# Shared libraries the loader cannot find (cuDNN, NCCL, the CUDA runtime on a node where they live elsewhere):
# look in the CUDA installs and in NVIDIA's Python wheels (site-packages/nvidia/*/lib), add what is found to
# LD_LIBRARY_PATH, and say what is still missing.
find_missing_libraries() {
  local lib path roots=(/usr/local/cuda*/ /usr/lib/x86_64-linux-gnu)
  read -r -a site <<<"$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)"
  roots+=("${site[@]}")
  for lib in $(ldd "$1" | awk '/not found/ {print $1}' | sort -u); do
    path=$(find "${roots[@]}" -name "$lib" -print -quit 2>/dev/null)
    if [ -n "$path" ]; then
      export LD_LIBRARY_PATH=${path%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      echo "library $lib: found in ${path%/*}"
    else
      echo "library $lib: not found anywhere"
    fi
  done
}
find_missing_libraries "$ddptrain"
find_missing_libraries "$build/tests/ddptrain_gpu_tests"

# metric FILE KEY: the last epoch's value of KEY in a metrics.jsonl ("" when absent).
metric() {
  grep '"epoch"' "$1" | tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$2"
}
# at_least VALUE FLOOR: true when VALUE is a number >= FLOOR.
at_least() { awk -v v="$1" -v f="$2" 'BEGIN { exit !(v != "" && v + 0 >= f + 0) }'; }
quickstart() {  # extra arguments for a one-rank quickstart training on the prepared data
  "$ddptrain" --config launch/configs/quickstart.ini --data.path "$data" --log.progress lines "$@"
}

check_gpu_tests() {
  "$build"/tests/ddptrain_gpu_tests --gtest_color=no | tee "$scratch/gpu_tests.txt" || return 1
  ! grep -q '^\[  SKIPPED \]' "$scratch/gpu_tests.txt" || { echo "tests skipped on a GPU machine"; return 1; }
}

check_sanitizer() {
  command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
  timeout 540 compute-sanitizer --tool memcheck --error-exitcode 9 "$build"/tests/ddptrain_gpu_tests \
    --gtest_color=no --gtest_filter='CudaReplica.*:CudaOptimizer.*:*DeviceBatchSource*'
}

check_quickstart() {
  rm -rf "$scratch/run-gpu"
  quickstart --device cuda --checkpoint.dir "$scratch/run-gpu" || return 1
  local metrics=$scratch/run-gpu/metrics.jsonl
  tail -n 1 "$metrics"
  local best
  best=$(python3 -c 'import json, sys; print(max(json.loads(l)["val_acc"] for l in open(sys.argv[1])))' "$metrics")
  at_least "$best" 0.90 || { echo "best val_acc $best < 0.90"; return 1; }
  [ -n "$(metric "$metrics" gpu_util)" ] || { echo "no gpu_util in metrics.jsonl (NVML)"; return 1; }
  [ "$(metric "$metrics" device)" = cuda ] || { echo "metrics.jsonl does not say device cuda"; return 1; }
}

check_resume_cpu() {
  [ -f "$scratch/run-gpu/last.h5" ] || { echo "needs the quickstart check's run"; return 1; }
  local epochs
  epochs=$(metric "$scratch/run-gpu/metrics.jsonl" epoch)
  quickstart --device cpu --checkpoint.dir "$scratch/run-gpu" --train.epochs $((epochs + 1)) --resume || return 1
  [ "$(metric "$scratch/run-gpu/metrics.jsonl" epoch)" = $((epochs + 1)) ] || { echo "no epoch $((epochs + 1))"; return 1; }
  at_least "$(metric "$scratch/run-gpu/metrics.jsonl" val_acc)" 0.90
}

check_evaluate() {
  [ -f "$scratch/run-gpu/best.h5" ] || { echo "needs the quickstart check's run"; return 1; }
  "$ddptrain" evaluate --checkpoint "$scratch/run-gpu/best.h5" --data "$data" --device cuda >"$scratch/eval-gpu.txt" &&
    "$ddptrain" evaluate --checkpoint "$scratch/run-gpu/best.h5" --data "$data" --device cpu >"$scratch/eval-cpu.txt" ||
    return 1
  cat "$scratch/eval-gpu.txt" "$scratch/eval-cpu.txt"
  paste -d' ' "$scratch/eval-gpu.txt" "$scratch/eval-cpu.txt" |
    awk '{ d = $3 - $11; if (d < 0) d = -d; exit !(d <= 2e-4 && $6 == $14) }'
}

check_text() { DDPTRAIN_TEST_DEVICE=cuda bash tests/cli/text_end_to_end.sh "$ddptrain" "$PWD"; }

check_check_env() {
  bash tests/cli/check_env.sh "$ddptrain" "$PWD" | tee "$scratch/check_env.txt" || return 1
  grep -q '^GPU machine' "$scratch/check_env.txt" || { echo "check_env.sh saw no GPU: it took its CPU branch"; return 1; }
}

check_timeline() {
  rm -rf "$scratch/run-timeline"
  quickstart --device cuda --checkpoint.dir "$scratch/run-timeline" --train.epochs 1 \
    --log.timeline "$scratch/gpu-trace.json" || return 1
  python3 - "$scratch/gpu-trace.json" <<'EOF'
import collections, json, sys
events = json.load(open(sys.argv[1]))
tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
spans = collections.Counter((e["name"], tracks.get((e["pid"], e["tid"]), "?").split(" ")[0])
                            for e in events if e.get("ph") == "X")
for key, count in sorted(spans.items()):
    print(f"{count:8d}  {key[0]}  [{key[1]}]")
need = [("forward", "GPU"), ("backward", "GPU"), ("all-reduce bucket", "NCCL"), ("host-to-device copy", None),
        ("data wait", None), ("optimizer", None), ("evaluation", None), ("checkpoint", None)]
missing = [n for n, t in need if not any(k[0] == n and (t is None or k[1] == t) for k in spans)]
if missing:
    sys.exit(f"missing spans: {missing}")
EOF
}

check_mixed() {
  rm -rf "$scratch/run-mixed"
  local common=(--config launch/configs/quickstart.ini --data.path "$data" --checkpoint.dir "$scratch/run-mixed"
    --train.epochs 2 --log.progress lines)
  mpirun -np 1 -x CUDA_VISIBLE_DEVICES=0 "$ddptrain" "${common[@]}" : \
    -np 2 -x CUDA_VISIBLE_DEVICES= "$ddptrain" "${common[@]}" | tee "$scratch/mixed.txt" || return 1
  grep -q "backend ps: 1 of 3 ranks on GPUs" "$scratch/mixed.txt" || { echo "expected 1 of 3 ranks on a GPU"; return 1; }
  local metrics=$scratch/run-mixed/metrics.jsonl
  tail -n 1 "$metrics"
  if [ "$(metric "$metrics" backend)" != ps ] || [ "$(metric "$metrics" workers)" != 2 ]; then
    echo "expected the parameter server with 2 workers"
    return 1
  fi
  at_least "$(metric "$metrics" val_acc)" 0.90
}

check_epoch_bench() {
  local bench_data=$scratch/synthetic-25000.h5
  [ -f "$bench_data" ] || "$ddptrain" prepare synthetic --output "$bench_data" --train 25000 --test 25000 \
    --vocab 20000 --maxlen 80 --seed 1 || return 1
  local floor=()
  [ -x "$build/benchmarks/cudnn_floor_bench" ] && floor=(--floor "$build/benchmarks/cudnn_floor_bench")
  python3 -c "import torch" || { echo "PyTorch not importable"; return 1; }
  PYTHONUNBUFFERED=1 python3 benchmarks/gpu_epoch_compare.py --ddptrain "$ddptrain" --data "$bench_data" \
    "${floor[@]}" | tee "$logs/epoch_table.md" || return 1
  # The replica's whole train_step against cuDNN's LSTM alone, per algorithm (exit 3: cuDNN turned it down).
  [ -x "$build/benchmarks/cudnn_floor_bench" ] || return 0
  local batch algo
  for batch in 32 256 1024; do
    for algo in standard persist_small_h persist_static; do
      "$build/benchmarks/cudnn_floor_bench" --batch "$batch" --algo "$algo" --replica | grep -E '_ms|unsupported' |
        sed "s/^/batch $batch $algo: /"
    done
  done | tee "$logs/replica_vs_floor.txt"
}

# The acceptance checks first, the slow sanitizer last: a run cut short by a time limit keeps what matters.
all_checks="gpu_tests quickstart resume_cpu evaluate text check_env timeline mixed epoch_bench sanitizer"
[ -f "$data" ] || "$ddptrain" prepare synthetic --output "$data" --train 20000 --test 4000 --vocab 2000 \
  --maxlen 40 --seed 1 >/dev/null
failed=0
: >"$logs/summary.txt"
for name in ${CHECKS:-$all_checks}; do
  echo "== $name"
  start=$(date +%s)
  if "check_$name"; then verdict=PASS; else verdict=FAIL failed=$((failed + 1)); fi
  echo "$verdict $name ($(($(date +%s) - start)) s)" | tee -a "$logs/summary.txt"
done
echo "== summary"
cat "$logs/summary.txt"
exit "$failed"
