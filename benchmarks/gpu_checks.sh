#!/usr/bin/env bash
# The GPU acceptance command: on a GPU node, from the repository root,
#   bash benchmarks/gpu_checks.sh [--rebuild] [build-dir] [log-dir]      (defaults: build, $SCRATCH or /tmp/...)
# builds ddptrain with CUDA where build-dir has no CUDA-enabled ddptrain (or with --rebuild / REBUILD=1), runs
# every check that needs a GPU and writes LOG_DIR/report.md, ready to paste into benchmarks/RESULTS.md:
# versions, the command line, and a table of PASS/FAIL/SKIP, seconds and the numbers each check measured.
# Every check runs even when an earlier one failed. The exit status is the number of failed checks (a SKIP is
# not a failure). Also written: LOG_DIR/summary.txt, LOG_DIR/gpu_checks.log (everything), LOG_DIR/out/NAME.txt
# (each check's output). CHECKS="name ..." runs only those (the build always runs first):
#   self_check     check-env --device cuda and the trainer's start log both say "self-check passed"
#   startup        with the self-check on, E256 H512 L2 T200 batch 128 and E128 H128 T200 batch 1024 print
#                  their first step within 5 s of the process start (the data made beforehand; the run's own
#                  start_to_first_step_s beside it); and
#                  self_check_bench --device cuda's table (the check and the parameter draw by model)
#   gpu_tests      the GPU tests (CPU/GPU parity, layout round trip, NCCL, the input pipeline); none may skip;
#                  then the stream-order tests at 2 ranks (a gradient produced behind a delay on another
#                  stream): staged MPI on any GPU count, NCCL's where each rank has a GPU
#   quickstart     the quickstart on the GPU reaches val_acc >= 0.90; NVML's gpu_util is in metrics.jsonl;
#                  the start log says its steps replay CUDA graphs
#   variants       a 2-layer masked bidirectional GRU over 4 classes with dropout and clipping trains on the
#                  GPU (self-check passed, test_acc >= 0.90), and the CPU predicts its checkpoint alike
#   resume_cpu     the GPU run's checkpoint resumes on the CPU for one more epoch
#   evaluate       evaluate on the GPU and on the CPU agree
#   text           prepare text, train, predict and evaluate on the GPU; the CPU predicts its checkpoint alike
#   check_env      check-env names the GPU and exits 0 (tests/cli/check_env.sh's GPU branch)
#   timeline       a GPU run's trace has forward/backward on "GPU stream", buckets on "NCCL stream", the copies
#   mixed          one GPU worker, one CPU worker and a parameter server (comm.backend auto) train together;
#                  then a GPU rank and a CPU rank with the MPI all-reduce (comm.backend mpi)
#   epoch_bench    the side-by-side epoch against PyTorch and the cuDNN floor (SKIP without PyTorch)
#   sweep          (only when named in CHECKS: minutes) every shape against PyTorch eager, PyTorch with the
#                  step in a CUDA graph and the cuDNN floor, with the start to the first step
#                  (benchmarks/gpu_sweep.py; SWEEP_GRID full or quick, the default; SWEEP_PART K/N splits
#                  it over calls; SWEEP_PRECISION fp32, the default, tf32, bf16 or fp16 on every side;
#                  SWEEP_CUDA_GRAPH=off runs ddptrain's steps eagerly, against the default auto);
#                  SKIP without PyTorch
#   multi_gpu      (two or more GPUs; SKIP saying so on one) the quickstart on every GPU with comm.backend
#                  nccl, once per comm.compression (none, bf16, fp16): every rank's self-check and NCCL
#                  average check pass, val_acc >= 0.90, every epoch's replicas agree bit for bit (the run
#                  checks it: parameters_checksum), NCCL buckets run while backward runs (timeline); then
#                  once more with one GPU per rank through CUDA_VISIBLE_DEVICES, as --gpus-per-task gives
#   sanitizer_memcheck, sanitizer_racecheck, sanitizer_synccheck
#                  compute-sanitizer over the replica, optimizer and pipeline tests ("sanitizer": all three;
#                  each is cut off after SANITIZER_TIMEOUT seconds, 540 by default)
# Every other check is cut off after CHECK_TIMEOUT seconds (900 by default) and counts as failed, so that one
# hung check (a collective that never returns, say) still leaves a report of all the others.
# shellcheck disable=SC2317  # the check_* functions are called by name from run_check
set -uo pipefail

usage="bash benchmarks/gpu_checks.sh [--rebuild] [build-dir] [log-dir]"
# The checks use relative paths (launch/configs, tests/cli, benchmarks/*.py): refuse anywhere else.
if [ ! -f benchmarks/gpu_checks.sh ] || [ ! -f CMakeLists.txt ]; then
  echo "gpu_checks.sh: run it from the repository root: cd into the ddptrain checkout, then $usage" >&2
  exit 2
fi
command_line="bash benchmarks/gpu_checks.sh$(printf ' %q' "$@")"
for var in CHECKS CHECK_TIMEOUT REBUILD SANITIZER_TIMEOUT SCRATCH SWEEP_GRID SWEEP_PART SWEEP_PRECISION; do
  [ -n "${!var:-}" ] && command_line="$var=\"${!var}\" $command_line"
done
rebuild=${REBUILD:-0}
args=()
only_check=""  # --only NAME: the child process run_check starts to run one check under a time limit
while [ $# -gt 0 ]; do
  arg=$1
  shift
  case $arg in
    --rebuild) rebuild=1 ;;
    --only) only_check=${1:-}; shift ;;
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_checks.sh: unknown option $arg; usage: $usage" >&2; exit 2 ;;
    *) args+=("$arg") ;;
  esac
done
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
build=$(absolute "${args[0]:-build}")
scratch=${SCRATCH:-/tmp/ddptrain-gpu-checks}
logs=$(absolute "${args[1]:-$scratch}")
ddptrain=$build/ddptrain
data=$scratch/quickstart.h5
sanitizer_timeout=${SANITIZER_TIMEOUT:-540}
check_timeout=${CHECK_TIMEOUT:-900}
# nvcc and compute-sanitizer: the CUDA install where a node does not put them on PATH.
{ command -v nvcc && command -v compute-sanitizer; } >/dev/null || PATH=$PATH:/usr/local/cuda/bin

# The acceptance checks first, the slow sanitizers last: a run cut short by a time limit keeps what matters.
all_checks=(self_check startup gpu_tests quickstart variants resume_cpu evaluate text check_env timeline mixed
  multi_gpu epoch_bench
  sanitizer_memcheck sanitizer_racecheck sanitizer_synccheck)
selected=()
for name in ${CHECKS:-${all_checks[*]}}; do
  case $name in
    build) ;;  # always runs first
    sanitizer) selected+=(sanitizer_memcheck sanitizer_racecheck sanitizer_synccheck) ;;
    *) selected+=("$name") ;;
  esac
done

# --- Helpers ------------------------------------------------------------------------------------------------

# note NAME TEXT: one figure for check NAME's "numbers" cell in the report.
note() {
  local name=$1
  shift
  echo "$*" >>"$logs/notes/$name"
}
# metric FILE KEY: the last epoch's value of KEY in a metrics.jsonl ("" when absent).
metric() {
  grep '"epoch"' "$1" | tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$2"
}
# at_least VALUE FLOOR: true when VALUE is a number >= FLOOR.
at_least() { awk -v v="$1" -v f="$2" 'BEGIN { exit !(v != "" && v + 0 >= f + 0) }'; }
quickstart() {  # extra arguments for a one-rank quickstart training on the prepared data
  "$ddptrain" --config launch/configs/quickstart.ini --data.path "$data" --log.progress lines "$@"
}
# same_evaluation GPU_FILE CPU_FILE: two outputs of evaluate agree: their first lines, "test: loss L -
# accuracy A ...", have losses within 2e-4 and the same accuracy.
same_evaluation() {
  paste -d' ' <(head -n 1 "$1") <(head -n 1 "$2") |
    awk '{ n = NF / 2; d = $3 - $(n + 3); if (d < 0) d = -d; exit !(d <= 2e-4 && $6 == $(n + 6)) }'
}
# gtest_counts FILE: "N passed, N failed, N skipped" from a gtest run's output.
gtest_counts() {
  local passed failed skipped
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$1" | tail -n 1)
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$1" | tail -n 1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$1" | tail -n 1)
  echo "${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
}

# Shared libraries the loader cannot find (cuDNN, NCCL, the CUDA runtime on a node where they live elsewhere):
# look in the CUDA installs and in NVIDIA's Python wheels (site-packages/nvidia/*/lib), add what is found to
# LD_LIBRARY_PATH, and say what is still missing.
find_missing_libraries() {
  [ -f "$1" ] || return 0
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

# --- The checks: each returns 0 (PASS), 77 (SKIP) or anything else (FAIL) --------------------------------

check_build() {
  local why=""
  if [ "$rebuild" = 1 ]; then
    why="--rebuild"
  elif [ ! -x "$ddptrain" ]; then
    why="no ddptrain in $build"
  elif "$ddptrain" check-env --device cpu 2>/dev/null | grep -q '^ *CUDA runtime *not built'; then
    why="the ddptrain in $build was built without CUDA"
  fi
  if [ -z "$why" ]; then
    note build "existing $ddptrain (not rebuilt; --rebuild rebuilds)"
    return 0
  fi
  echo "building: $why"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDPTRAIN_CUDA=ON || { note build "cmake configure failed ($why)"; return 1; }
  cmake --build "$build" -j || { note build "cmake --build failed ($why)"; return 1; }
  [ -x "$ddptrain" ] || { note build "the build made no $ddptrain"; return 1; }
  note build "built Release with DDPTRAIN_CUDA=ON in $build ($why)"
}

check_self_check() {
  local ok=0 line
  # check-env's exit status is the check_env check's business; here only the self-check lines count.
  "$ddptrain" check-env --device cuda | tee "$scratch/check_env_cuda.txt"
  if grep 'self-check:' "$scratch/check_env_cuda.txt" | grep -q 'passed' &&
    ! grep 'self-check:' "$scratch/check_env_cuda.txt" | grep -qv 'passed'; then
    while read -r line; do note self_check "check-env $line"; done < <(grep 'self-check:' "$scratch/check_env_cuda.txt")
  else
    note self_check "check-env: no passing self-check line"
    ok=1
  fi
  # The trainer runs the same check before its first step and puts the result in its start log.
  rm -rf "$scratch/run-selfcheck"
  quickstart --device cuda --checkpoint.dir "$scratch/run-selfcheck" --train.epochs 1 | tee "$scratch/selfcheck-train.txt"
  # The start line: "rank 0/1 on HOST (...): cuda GPU (...), self-check passed in T s (...) [reason], train rows [...)"
  line=$(grep -m 1 -o 'self-check passed in .*' "$scratch/selfcheck-train.txt" | sed 's/ \[[^]]*\], train rows.*//')
  if [ -n "$line" ]; then
    note self_check "trainer start log: $line"
  else
    note self_check "trainer start log: no 'self-check passed in' line"
    ok=1
  fi
  return "$ok"
}

# first_step_seconds COMMAND...: runs COMMAND (a one-rank training with --log.progress lines --log.interval 1)
# and prints, last, the seconds from its start to its first "step 1/" line.
first_step_seconds() {
  local start line first=""
  start=$(date +%s.%N)
  while IFS= read -r line; do
    [ -z "$first" ] && [[ $line == *"step 1/"* ]] && first=$(date +%s.%N)
    echo "$line" >&2
  done < <("$@" 2>&1)
  [ -n "$first" ] || return 1
  awk -v a="$start" -v b="$first" 'BEGIN { printf "%.1f\n", b - a }'
}

check_startup() {
  local data_t200=$scratch/startup_t200.h5 ok=0 shape e h l b seconds
  [ -f "$data_t200" ] || "$ddptrain" prepare synthetic --output "$data_t200" --train 4096 --test 512 \
    --vocab 20000 --maxlen 200 --seed 5 || return 1
  for shape in "256 512 2 128" "128 128 1 1024"; do
    read -r e h l b <<<"$shape"
    seconds=$(first_step_seconds "$ddptrain" --data.path "$data_t200" --device cuda \
      --checkpoint.dir "$scratch/run-startup" --checkpoint.overwrite true --model.embedding_dim "$e" \
      --model.hidden "$h" --model.layers "$l" --train.batch_size "$b" --train.epochs 1 \
      --train.max_steps_per_epoch 3 --log.progress lines --log.interval 1)
    if [ -z "$seconds" ]; then
      note startup "E$e H$h L$l T200 batch $b: no first step line"
      ok=1
      continue
    fi
    note startup "E$e H$h L$l T200 batch $b: first step after $seconds s (its start_to_first_step_s:" \
      "$(grep '"epoch"' "$scratch/run-startup/metrics.jsonl" | head -n 1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin).get("start_to_first_step_s", "none"))') s)"
    awk -v s="$seconds" 'BEGIN { exit !(s <= 5) }' || { echo "first step after $seconds s > 5 s"; ok=1; }
  done
  "$build"/benchmarks/self_check_bench --device cuda | tee "$scratch/self_check_bench.txt" || ok=1
  return "$ok"
}

check_gpu_tests() {
  # The stream-order tests need 2 ranks: below.
  "$build"/tests/ddptrain_gpu_tests --gtest_color=no --gtest_filter='-*StreamOrder*' | tee "$scratch/gpu_tests.txt"
  local rc=${PIPESTATUS[0]}
  note gpu_tests "$(gtest_counts "$scratch/gpu_tests.txt")"
  [ "$rc" = 0 ] || return 1
  ! grep -q '^\[  SKIPPED \]' "$scratch/gpu_tests.txt" || { echo "tests skipped on a GPU machine"; return 1; }
  # A gradient produced on another stream behind a delay, averaged by 2 ranks: the staged MPI reducer on one
  # GPU too; NCCL's (none, fp16, bf16) where each rank has a GPU of its own (they skip, saying so, on one).
  mpirun -np 2 "$build"/tests/ddptrain_gpu_tests --gtest_color=no --gtest_filter='*StreamOrder*' |
    tee "$scratch/stream_order.txt"
  rc=${PIPESTATUS[0]}
  note gpu_tests "stream order at 2 ranks: $(gtest_counts "$scratch/stream_order.txt")"
  [ "$rc" = 0 ] || return 1
  grep -q 'OK \] Reducers/StreamOrder.*staged_mpi' "$scratch/stream_order.txt" ||
    { echo "the staged MPI stream-order test did not run"; return 1; }
  # The communicator contract over NCCL and staged MPI needs a GPU per rank: 2 ranks where 2 GPUs are.
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$gpus" -lt 2 ]; then
    note gpu_tests "NCCL contract at 2 ranks not run: $gpus GPU(s)"
    return 0
  fi
  mpirun -np 2 "$build"/tests/ddptrain_mpi_tests --gtest_color=no --gtest_filter='CommunicatorContract.*:Communicators/*-*SelfCheckAgreesOnAFailureToStart' |
    tee "$scratch/contract_tests.txt"
  rc=${PIPESTATUS[0]}
  note gpu_tests "NCCL contract at 2 ranks: $(gtest_counts "$scratch/contract_tests.txt")"
  [ "$rc" = 0 ] || return 1
  ! grep -q '^\[  SKIPPED \] Comm' "$scratch/contract_tests.txt" || { echo "contract tests skipped on 2 GPUs"; return 1; }
}

# sanitize TOOL: compute-sanitizer TOOL over the replica, optimizer and pipeline tests, time-bounded.
sanitize() {
  local tool=$1 out=$scratch/sanitizer_$1.txt rc summary
  command -v compute-sanitizer >/dev/null || { note "sanitizer_$tool" "compute-sanitizer not found"; return 1; }
  # memcheck: memory errors and leaks, not API errors, which the tests provoke on purpose (a bad device
  # ordinal) and the code checks at every call.
  # The sweep over every variant runs the same kernels as the parity tests before it, 16 times over: under
  # racecheck it alone took 131 s on an H200, so the sanitizers leave it to gpu_tests.
  local options=()
  [ "$tool" = memcheck ] && options=(--report-api-errors no --leak-check full)
  timeout "$sanitizer_timeout" compute-sanitizer --tool "$tool" "${options[@]}" --error-exitcode 9 \
    "$build"/tests/ddptrain_gpu_tests --gtest_color=no \
    --gtest_filter='CudaReplica.*:CudaOptimizer.*:Cuda/ReplicaContract*:*DeviceBatchSource*-*InEveryVariant' |
    tee "$out"
  rc=${PIPESTATUS[0]}
  summary=$(grep 'SUMMARY:' "$out" | tail -n 1 | sed 's/^=* *//')
  note "sanitizer_$tool" "${summary:-no sanitizer summary}; tests $(gtest_counts "$out")"
  [ "$rc" = 124 ] && note "sanitizer_$tool" "cut off after $sanitizer_timeout s (SANITIZER_TIMEOUT)"
  [ "$rc" = 0 ] || return 1
  # A filter that matched nothing would pass while checking nothing.
  ! grep -q '^\[  PASSED  \] 0 tests' "$out" && grep -q '^\[  PASSED  \]' "$out"
}
check_sanitizer_memcheck() { sanitize memcheck; }
check_sanitizer_racecheck() { sanitize racecheck; }
check_sanitizer_synccheck() { sanitize synccheck; }

check_quickstart() {
  rm -rf "$scratch/run-gpu"
  quickstart --device cuda --checkpoint.dir "$scratch/run-gpu" 2>&1 | tee "$scratch/quickstart.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  # train.cuda_graph = auto: one rank on NCCL replays its steps from graphs.
  grep -q "step in a CUDA graph per batch shape" "$scratch/quickstart.txt" ||
    { echo "the start log does not say 'step in a CUDA graph per batch shape'"; return 1; }
  local metrics=$scratch/run-gpu/metrics.jsonl best best_epoch
  tail -n 1 "$metrics"
  read -r best best_epoch < <(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "\"epoch\"" in l]
top = max(rows, key=lambda r: r["val_acc"])
print(top["val_acc"], top["epoch"])' "$metrics")
  note quickstart "best val_acc $best (epoch $best_epoch), final epoch $(metric "$metrics" epoch)," \
    "gpu_util $(metric "$metrics" gpu_util), steps from CUDA graphs"
  at_least "$best" 0.90 || { echo "best val_acc $best < 0.90"; return 1; }
  [ -n "$(metric "$metrics" gpu_util)" ] || { echo "no gpu_util in metrics.jsonl (NVML)"; return 1; }
  case $(metric "$metrics" device) in
    cuda | cuda:*) ;;
    *) echo "metrics.jsonl does not say device cuda (or cuda:N)"; return 1 ;;
  esac
}

check_variants() {
  local topics=$scratch/topics.h5 run=$scratch/run-variants acc
  rm -rf "$run"
  "$ddptrain" prepare synthetic --output "$topics" --classes 4 --train 6000 --test 1000 --vocab 1000 --maxlen 32 \
    --seed 3 || return 1
  "$ddptrain" --data.path "$topics" --device cuda --checkpoint.dir "$run" --model.embedding_dim 32 \
    --model.hidden 32 --model.layers 2 --model.cell gru --model.bidirectional true --model.mask_padding true \
    --model.dropout 0.2 --model.embedding_dropout 0.1 --train.clip_norm 1 --train.epochs 4 \
    --train.learning_rate 0.005 --log.progress lines 2>&1 | tee "$scratch/variants.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  grep -q "self-check passed" "$scratch/variants.txt" || { echo "no 'self-check passed' in the start log"; return 1; }
  acc=$(python3 tests/json_field.py "$run/metrics.jsonl" test_acc event=test)
  note variants "masked biGRU, 2 layers, 4 classes, dropout, clipping: test_acc $acc on the GPU"
  at_least "$acc" 0.90 || { echo "test_acc $acc < 0.90"; return 1; }
  # The checkpoint evaluated on the GPU and on the CPU: the first line, "test: loss L - accuracy A (N
  # samples)", agrees (then the per-class report and the confusion matrix).
  "$ddptrain" evaluate --checkpoint "$run/best.h5" --data "$topics" --device cuda >"$scratch/variants-gpu.txt" &&
    "$ddptrain" evaluate --checkpoint "$run/best.h5" --data "$topics" --device cpu >"$scratch/variants-cpu.txt" ||
    return 1
  cat "$scratch/variants-gpu.txt" "$scratch/variants-cpu.txt"
  same_evaluation "$scratch/variants-gpu.txt" "$scratch/variants-cpu.txt"
}

check_resume_cpu() {
  [ -f "$scratch/run-gpu/last.h5" ] || { echo "needs the quickstart check's run"; return 1; }
  local epochs metrics=$scratch/run-gpu/metrics.jsonl
  epochs=$(metric "$metrics" epoch)
  quickstart --device cpu --checkpoint.dir "$scratch/run-gpu" --train.epochs $((epochs + 1)) --resume || return 1
  note resume_cpu "epoch $(metric "$metrics" epoch) on the CPU after $epochs on the GPU: val_acc $(metric "$metrics" val_acc)"
  [ "$(metric "$metrics" epoch)" = $((epochs + 1)) ] || { echo "no epoch $((epochs + 1))"; return 1; }
  at_least "$(metric "$metrics" val_acc)" 0.90
}

check_evaluate() {
  [ -f "$scratch/run-gpu/best.h5" ] || { echo "needs the quickstart check's run"; return 1; }
  "$ddptrain" evaluate --checkpoint "$scratch/run-gpu/best.h5" --data "$data" --device cuda >"$scratch/eval-gpu.txt" &&
    "$ddptrain" evaluate --checkpoint "$scratch/run-gpu/best.h5" --data "$data" --device cpu >"$scratch/eval-cpu.txt" ||
    return 1
  cat "$scratch/eval-gpu.txt" "$scratch/eval-cpu.txt"
  # The first line, "test: loss L - accuracy A - macro-F1 F (N samples)", then the per-class report.
  note evaluate "$(awk 'NR == 1 { printf "GPU loss %s accuracy %s; ", $3, $6 }' "$scratch/eval-gpu.txt")$(
    awk 'NR == 1 { printf "CPU loss %s accuracy %s", $3, $6 }' "$scratch/eval-cpu.txt")"
  same_evaluation "$scratch/eval-gpu.txt" "$scratch/eval-cpu.txt"
}

check_text() {
  DDPTRAIN_TEST_DEVICE=cuda bash tests/cli/text_end_to_end.sh "$ddptrain" "$PWD" | tee "$scratch/text.txt"
  local rc=${PIPESTATUS[0]}
  note text "$(grep -o 'test: loss.*' "$scratch/text.txt" | head -n 1)"
  return "$rc"
}

check_check_env() {
  DDPTRAIN_TEST_STOP_IN_CALL=$build/tests/libstop_in_call.so bash tests/cli/check_env.sh "$ddptrain" "$PWD" | tee "$scratch/check_env.txt" || return 1
  grep -q '^GPU machine' "$scratch/check_env.txt" || { echo "check_env.sh saw no GPU: it took its CPU branch"; return 1; }
  note check_env "$(grep -m 1 -o 'GPU 0: .*' "$scratch/check_env.txt")"
}

check_timeline() {
  rm -rf "$scratch/run-timeline"
  quickstart --device cuda --checkpoint.dir "$scratch/run-timeline" --train.epochs 1 \
    --log.timeline "$scratch/gpu-trace.json" || return 1
  python3 - "$scratch/gpu-trace.json" <<'EOF' | tee "$scratch/timeline.txt"
import collections, json, sys
events = json.load(open(sys.argv[1]))
tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
spans = collections.Counter((e["name"], tracks.get((e["pid"], e["tid"]), "?").split(" ")[0])
                            for e in events if e.get("ph") == "X")
for key, count in sorted(spans.items()):
    print(f"{count:8d}  {key[0]}  [{key[1]}]")
need = [("forward", "GPU"), ("backward", "GPU"), ("all-reduce bucket", "NCCL"), ("host-to-device copy", None),
        ("data wait", None), ("optimizer", None), ("evaluation", None), ("checkpoint", None)]
found = {n: sum(c for k, c in spans.items() if k[0] == n and (t is None or k[1] == t)) for n, t in need}
print("spans: " + ", ".join(f"{n} {c}" for n, c in found.items()))
missing = [n for n, c in found.items() if c == 0]
if missing:
    sys.exit(f"missing spans: {missing}")
EOF
  local rc=${PIPESTATUS[0]}
  note timeline "$(grep -m 1 '^spans: ' "$scratch/timeline.txt")"
  return "$rc"
}

check_mixed() {
  local ok=0 metrics
  # comm.backend auto: one GPU worker, one CPU worker and a dedicated server.
  rm -rf "$scratch/run-mixed"
  local common=(--config launch/configs/quickstart.ini --data.path "$data" --checkpoint.dir "$scratch/run-mixed"
    --train.epochs 2 --log.progress lines)
  mpirun -np 1 -x CUDA_VISIBLE_DEVICES=0 "$ddptrain" "${common[@]}" : \
    -np 2 -x CUDA_VISIBLE_DEVICES= "$ddptrain" "${common[@]}" | tee "$scratch/mixed.txt" || return 1
  grep -q "backend ps: 1 of 3 ranks on GPUs" "$scratch/mixed.txt" || { echo "expected 1 of 3 ranks on a GPU"; ok=1; }
  metrics=$scratch/run-mixed/metrics.jsonl
  tail -n 1 "$metrics"
  note mixed "ps: backend $(metric "$metrics" backend), $(metric "$metrics" workers) workers," \
    "val_acc $(metric "$metrics" val_acc) after epoch $(metric "$metrics" epoch)"
  if [ "$(metric "$metrics" backend)" != ps ] || [ "$(metric "$metrics" workers)" != 2 ]; then
    echo "expected the parameter server with 2 workers"
    ok=1
  fi
  at_least "$(metric "$metrics" val_acc)" 0.90 || ok=1
  # comm.backend mpi: the GPU rank stages its gradients through host memory and all-reduces them with the CPU
  # rank's, segment by segment, though the two replicas finish their segments in different orders.
  rm -rf "$scratch/run-mixed-mpi"
  common=(--config launch/configs/quickstart.ini --data.path "$data" --checkpoint.dir "$scratch/run-mixed-mpi"
    --train.epochs 2 --log.progress lines --comm.backend mpi)
  mpirun -np 1 -x CUDA_VISIBLE_DEVICES=0 "$ddptrain" "${common[@]}" : \
    -np 1 -x CUDA_VISIBLE_DEVICES= "$ddptrain" "${common[@]}" | tee "$scratch/mixed-mpi.txt" || return 1
  grep -q "backend mpi: 1 of 2 ranks on GPUs" "$scratch/mixed-mpi.txt" || { echo "expected 1 of 2 ranks on a GPU"; ok=1; }
  metrics=$scratch/run-mixed-mpi/metrics.jsonl
  tail -n 1 "$metrics"
  note mixed "mpi all-reduce, GPU and CPU rank: val_acc $(metric "$metrics" val_acc) after epoch $(metric "$metrics" epoch)"
  at_least "$(metric "$metrics" val_acc)" 0.90 || ok=1
  return "$ok"
}

# multi_gpu_run NAME RANKS [ddptrain ARGS...]: the quickstart on RANKS GPU ranks with NCCL and a timeline; checks
# the start log, val_acc, the agreed checksum and the overlap of NCCL buckets with backward. Returns 1 on a
# failed check.
multi_gpu_run() {
  local name=$1 ranks=$2 run=$scratch/run-multi-$1 ok=0 metrics passed averaged
  shift 2
  rm -rf "$run"
  mpirun -np "$ranks" "$@" --config launch/configs/quickstart.ini --data.path "$data" --device cuda \
    --comm.backend nccl --checkpoint.dir "$run" --train.epochs 3 --log.progress lines \
    --log.timeline "$run/trace.json" | tee "$scratch/multi-$name.txt" || { note multi_gpu "$name: the run failed"; return 1; }
  passed=$(grep -c 'self-check passed' "$scratch/multi-$name.txt")
  averaged=$(grep -c 'nccl averages = closed form' "$scratch/multi-$name.txt")
  if [ "$passed" != "$ranks" ] || [ "$averaged" != "$ranks" ]; then
    echo "$name: $passed of $ranks self-checks and $averaged NCCL average checks passed"
    ok=1
  fi
  metrics=$run/metrics.jsonl
  at_least "$(metric "$metrics" val_acc)" 0.90 || { echo "$name: val_acc below 0.90"; ok=1; }
  [ -n "$(metric "$metrics" parameters_checksum)" ] || { echo "$name: no parameters_checksum"; ok=1; }
  python3 - "$run/trace.json" <<'PY' | tee "$scratch/multi-$name-overlap.txt" || ok=1
import collections, json, sys
events = json.load(open(sys.argv[1]))
tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
spans = collections.defaultdict(list)  # (rank, kind) -> [(start, end)]
for e in events:
    if e.get("ph") != "X":
        continue
    track = tracks.get((e["pid"], e["tid"]), "")
    if e["name"] == "backward" and track.startswith("GPU"):
        spans[(e["pid"], "backward")].append((e["ts"], e["ts"] + e["dur"]))
    if e["name"] == "all-reduce bucket" and track.startswith("NCCL"):
        spans[(e["pid"], "bucket")].append((e["ts"], e["ts"] + e["dur"]))
buckets = overlapping = 0
for (rank, kind), intervals in spans.items():
    if kind != "bucket":
        continue
    backward = sorted(spans.get((rank, "backward"), []))
    for start, end in intervals:
        buckets += 1
        overlapping += any(b0 < end and start < b1 for b0, b1 in backward)
print(f"NCCL buckets overlapping backward: {overlapping} of {buckets}")
sys.exit(0 if overlapping > 0 else "no NCCL bucket ran while backward ran")
PY
  note multi_gpu "$name: $passed/$ranks self-checks, val_acc $(metric "$metrics" val_acc)," \
    "checksum $(metric "$metrics" parameters_checksum), $(tail -n 1 "$scratch/multi-$name-overlap.txt")"
  return "$ok"
}

check_multi_gpu() {
  local gpus ok=0 compression
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$gpus" -lt 2 ]; then
    echo "multi_gpu needs two or more GPUs; this node has $gpus"
    note multi_gpu "not run: needs two or more GPUs, this node has $gpus"
    return 77
  fi
  for compression in none bf16 fp16; do
    multi_gpu_run "$compression" "$gpus" "$ddptrain" --comm.compression "$compression" || ok=1
  done
  # One GPU per rank, as Slurm's --gpus-per-task or a site's wrapper gives it: each rank sees GPU 0 only.
  # shellcheck disable=SC2016  # expanded by each rank's own shell
  multi_gpu_run visible-devices "$gpus" bash -c \
    'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$0" "$@"' "$ddptrain" || ok=1
  return "$ok"
}

check_epoch_bench() {
  local torch_error floor=() rc=0
  [ -x "$build/benchmarks/cudnn_floor_bench" ] && floor=(--floor "$build/benchmarks/cudnn_floor_bench")
  if torch_error=$(python3 -c "import torch" 2>&1); then
    torch_error=""
    local bench_data=$scratch/synthetic-25000.h5
    [ -f "$bench_data" ] || "$ddptrain" prepare synthetic --output "$bench_data" --train 25000 --test 25000 \
      --vocab 20000 --maxlen 80 --seed 1 || return 1
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_epoch_compare.py --ddptrain "$ddptrain" --data "$bench_data" \
      "${floor[@]}" | tee "$logs/epoch_table.md"
    rc=${PIPESTATUS[0]}
    note epoch_bench "table below"
  else
    torch_error=$(tail -n 1 <<<"${torch_error:-import torch failed}")
    note epoch_bench "PyTorch not importable ($torch_error): no comparison"
  fi
  # The replica's whole train_step against cuDNN's LSTM alone, per algorithm (exit 3: cuDNN turned it down).
  # It needs no PyTorch, so it runs either way.
  if [ -x "$build/benchmarks/cudnn_floor_bench" ]; then
    local batch algo
    for batch in 32 256 1024; do
      for algo in standard persist_small_h persist_static; do
        "$build/benchmarks/cudnn_floor_bench" --batch "$batch" --algo "$algo" --replica | grep -E '_ms|unsupported' |
          sed "s/^/batch $batch $algo: /"
      done
    done | tee "$logs/replica_vs_floor.txt"
    [ -s "$logs/replica_vs_floor.txt" ] && note epoch_bench "replica vs cuDNN floor below"
  fi
  [ "$rc" = 0 ] || return 1
  [ -z "$torch_error" ] || return 77
}

check_sweep() {
  local torch_error floor=()
  if ! torch_error=$(python3 -c "import torch" 2>&1); then
    note sweep "PyTorch not importable ($(tail -n 1 <<<"$torch_error")): no sweep"
    return 77
  fi
  [ -x "$build/benchmarks/cudnn_floor_bench" ] && floor=(--floor "$build/benchmarks/cudnn_floor_bench")
  PYTHONUNBUFFERED=1 python3 benchmarks/gpu_sweep.py --ddptrain "$ddptrain" "${floor[@]}" --work "$scratch/sweep" \
    --grid "${SWEEP_GRID:-quick}" --part "${SWEEP_PART:-1/1}" --precision "${SWEEP_PRECISION:-fp32}" \
    --cuda-graph "${SWEEP_CUDA_GRAPH:-auto}" |
    tee "$logs/sweep_table.md"
  local rc=${PIPESTATUS[0]}
  note sweep "grid ${SWEEP_GRID:-quick}, part ${SWEEP_PART:-1/1}, precision ${SWEEP_PRECISION:-fp32}," \
    "train.cuda_graph ${SWEEP_CUDA_GRAPH:-auto}: table below"
  return "$rc"
}

# --- Running and reporting ----------------------------------------------------------------------------------

failed=0
# run_check NAME: runs check_NAME, its output also in out/NAME.txt; records verdict and seconds.
run_check() {
  local name=$1 start rc verdict seconds
  echo "== $name"
  start=$(date +%s)
  case $name in
    # The build takes what it takes; each sanitizer has its own limit.
    build | sanitizer_*) "check_$name" 2>&1 | tee "$logs/out/$name.txt" ;;
    # timeout ends the whole process group: mpirun and the ranks it started too.
    *) timeout -k 10 "$check_timeout" bash "$0" --only "$name" "${args[@]}" 2>&1 | tee "$logs/out/$name.txt" ;;
  esac
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    note "$name" "cut off after $check_timeout s (CHECK_TIMEOUT)"
  fi
  case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIP ;;
    *) verdict=FAIL failed=$((failed + 1)) ;;
  esac
  seconds=$(($(date +%s) - start))
  echo "$verdict $name ($seconds s)" | tee -a "$logs/summary.txt"
  printf '%s\t%s\t%s\n' "$name" "$verdict" "$seconds" >>"$logs/results.tsv"
}

# The software this run used, one Markdown list item each ("unknown" where a tool is missing).
versions_md() {
  local commit="" env_txt=$scratch/check_env_versions.txt row
  "$ddptrain" check-env --device cpu >"$env_txt" 2>&1
  # --version names the commit the binary was built from; the checkout beside it may be another.
  echo "- ddptrain: $("$ddptrain" --version 2>/dev/null || echo "not built")"
  if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- 2>/dev/null || commit="$commit (with local changes)"
  fi
  echo "- checkout the checks ran from: ${commit:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/- GPU (name, driver, memory): /' | grep . || echo "- GPU: none (nvidia-smi found no GPU)"
  echo "- nvcc: $(nvcc --version 2>/dev/null | grep -m 1 release || echo unknown)"
  for row in "CUDA runtime" cuDNN NCCL; do
    echo "- $row: $(sed -n "s/^  $row  *//p" "$env_txt" | head -n 1 | grep . || echo unknown)"
  done
  echo "- MPI: $(mpirun --version 2>/dev/null | head -n 1 | grep . || echo unknown)"
}

# The numbers cell of NAME: its notes on one line, safe inside a table.
numbers_cell() {
  [ -f "$logs/notes/$1" ] || return 0
  paste -s "$logs/notes/$1" | sed 's/\t/; /g; s/|/\\|/g'
}

write_report() {
  local name verdict seconds
  {
    echo "## GPU acceptance run, $(date +%Y-%m-%d) on $(hostname)"
    echo
    versions_md
    echo
    echo '```'
    echo "$command_line"
    echo '```'
    echo
    echo "| check | result | seconds | numbers |"
    echo "|---|---|---|---|"
    while IFS=$'\t' read -r name verdict seconds; do
      echo "| $name | $verdict | $seconds | $(numbers_cell "$name") |"
    done <"$logs/results.tsv"
    echo
    echo "$failed failed, $(grep -c $'\tSKIP\t' "$logs/results.tsv") skipped, $(grep -c $'\tPASS\t' "$logs/results.tsv") passed."
    if [ -s "$logs/epoch_table.md" ]; then
      printf '\n### Epoch against PyTorch (epoch_bench)\n\n'
      cat "$logs/epoch_table.md"
    fi
    if [ -s "$logs/sweep_table.md" ]; then
      printf '\n### Every shape against PyTorch and the cuDNN floor (sweep)\n\n'
      cat "$logs/sweep_table.md"
    fi
    if [ -s "$logs/replica_vs_floor.txt" ]; then
      printf '\n### Replica train_step against the cuDNN floor (epoch_bench)\n\n```\n'
      cat "$logs/replica_vs_floor.txt"
      echo '```'
    fi
    # The end of a failed check's output, so that the report alone says what went wrong.
    while IFS=$'\t' read -r name verdict seconds; do
      [ "$verdict" = FAIL ] || continue
      printf '\n### %s: last lines of its output\n\n```\n' "$name"
      tail -n 15 "$logs/out/$name.txt" 2>/dev/null
      echo '```'
    done <"$logs/results.tsv"
  } >"$logs/report.md"
}

# --- Main ---------------------------------------------------------------------------------------------------

if [ -n "$only_check" ]; then  # the child of run_check: one check, its status for the verdict
  "check_$only_check"
  exit
fi

# A misspelt name in CHECKS is refused before a build that may take minutes.
for name in "${selected[@]}"; do
  declare -F "check_$name" >/dev/null && continue
  echo "gpu_checks.sh: no check named '$name' in CHECKS; the names are: build ${all_checks[*]} sanitizer" >&2
  exit 2
done
mkdir -p "$scratch" "$logs"
rm -rf "$logs/notes" "$logs/out"
rm -f "$logs/epoch_table.md" "$logs/replica_vs_floor.txt" "$logs/report.md"
mkdir -p "$logs/notes" "$logs/out"
: >"$logs/summary.txt"
: >"$logs/results.tsv"
exec > >(tee "$logs/gpu_checks.log") 2>&1
echo "$command_line"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader || true

run_check build
find_missing_libraries "$ddptrain"
find_missing_libraries "$build/tests/ddptrain_gpu_tests"
if [ -x "$ddptrain" ] && [ ! -f "$data" ]; then
  "$ddptrain" prepare synthetic --output "$data" --train 20000 --test 4000 --vocab 2000 --maxlen 40 --seed 1 >/dev/null
fi
for name in "${selected[@]}"; do run_check "$name"; done

write_report
echo "== summary"
cat "$logs/summary.txt"
echo "report: $logs/report.md (for benchmarks/RESULTS.md)"
exit "$failed"
