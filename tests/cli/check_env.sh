#!/usr/bin/env bash
# `ddptrain check-env` end to end, alone and under `mpirun -np 2`. On a machine without a usable GPU the
# default (--device auto) calls the node fine for CPU training and says why there is no GPU in a few words
# ("no GPU driver", "built without CUDA"), as training's start-up lines do; CUDA's own words come only with
# --verbose or --device cuda, which exits 3 with the "no GPU visible" advice. On a GPU machine (nvidia-smi
# lists a GPU and the build has CUDA) it exits 0 and names the GPU. Either way the report has the MPI and
# HDF5 versions, one report per node, each rank's cores (with a hint when the binding leaves cores idle),
# `--device cpu` passes and a bad option exits 2.
#   bash tests/cli/check_env.sh path/to/ddptrain source-dir
set -uo pipefail
ddptrain=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$work" || exit 1

# run NAME COMMAND...: stdout to NAME.out, stderr to NAME.err, exit status in $status.
run() {
  local name=$1
  shift
  status=0
  "$@" >"$name.out" 2>"$name.err" || status=$?
}
fail() {
  echo "FAIL: $*"
  for f in "$last".out "$last".err; do
    [ -s "$f" ] && { echo "--- $f"; cat "$f"; }
  done
  exit 1
}
expect_status() {  # NAME EXPECTED
  last=$1
  [ "$status" -eq "$2" ] || fail "$1: exit status $status, expected $2"
}
expect_text() {  # NAME TEXT
  last=$1
  grep -qF -- "$2" "$1.out" || fail "$1: no '$2' in the report"
}
expect_one_report() {  # NAME RANKS
  last=$1
  [ "$(grep -c '^=== node ' "$1.out")" -eq 1 ] || fail "$1: expected exactly one node report"
  grep -q "^=== node .*: $2 rank(s) ===" "$1.out" || fail "$1: the node report does not list $2 ranks"
  for ((r = 0; r < $2; r++)); do grep -q "^  rank $r: local rank $r," "$1.out" || fail "$1: rank $r missing"; done
}
expect_versions() {  # NAME
  last=$1
  grep -qE '^  MPI +[^ ]' "$1.out" || fail "$1: no MPI version"
  grep -qE '^  HDF5 +[0-9]+\.[0-9]+\.[0-9]+' "$1.out" || fail "$1: no HDF5 version"
  grep -qE '^  BLAS +[^ ]' "$1.out" || fail "$1: no BLAS"
  grep -q 'fatal' "$1.err" && fail "$1: a rank failed"
  return 0
}

run plain "$ddptrain" check-env
expect_versions plain

# A GPU machine: nvidia-smi lists a GPU, CUDA_VISIBLE_DEVICES does not hide them all, the build has CUDA.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >gpus.txt 2>/dev/null &&
  [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ] && ! grep -qE '^  CUDA runtime +not built' plain.out; then
  gpus=$(grep -c '^GPU ' gpus.txt)
fi

if [ "$gpus" -gt 0 ]; then
  echo "GPU machine: $gpus GPU(s) listed by nvidia-smi"
  expect_status plain 0
  expect_text plain "verdict: OK"
  expect_text plain "smoke test: OK on cuda:0"
  named=0
  while read -r name; do grep -qF -- "$name" plain.out && named=1; done \
    < <(sed -n 's/^GPU [0-9]*: \(.*\) (UUID.*/\1/p' gpus.txt)
  [ "$named" -eq 1 ] || fail "plain: no GPU name from nvidia-smi -L in the report"

  run np2 mpirun -np 2 "$ddptrain" check-env --device cuda
  expect_versions np2
  expect_one_report np2 2
  visible=$gpus
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .); fi
  if [ "$visible" -ge 2 ]; then
    expect_status np2 0
    expect_text np2 "verdict: OK"
  else
    expect_status np2 3
    expect_text np2 "more ranks than GPUs on node"
  fi
else
  echo "no usable GPU here: auto is fine, cuda exits 3 with the advice"
  expect_status plain 0
  expect_text plain "verdict: OK (no GPU: training runs on the CPU)"
  expect_text plain "smoke test: OK on cpu"
  # Why there is no GPU, in a few words: no driver on a CUDA build, or a build without CUDA. CUDA's own text
  # ("CUDA driver version is insufficient for CUDA runtime version") and the advice stay out.
  few=("no GPU driver" "no GPU visible" "built without CUDA")
  long_text="insufficient|configure with|check the driver"
  full_reason="(no GPU visible \(|this ddptrain was built without CUDA \()"
  few_words=$(sed -n 's/^  rank 0: local rank 0, .*, device cpu (\(.*\))$/\1/p' plain.out)
  [[ " ${few[*]} " == *" $few_words "* ]] || fail "plain: rank 0 does not say in a few words why it has no GPU"
  grep -qiE "$long_text" plain.out && fail "plain: CUDA's long text without --verbose"

  run verbose "$ddptrain" check-env --verbose
  expect_status verbose 0
  grep -qE "^  GPUs +none: $full_reason" verbose.out ||
    fail "verbose: no full reason for the missing GPU"

  run cuda "$ddptrain" check-env --device cuda
  expect_status cuda 3
  expect_text cuda "PROBLEM: no GPU visible"
  expect_text cuda "on CPU-only nodes use --device auto (the default) or cpu"
  grep -qE "^  GPUs +none: $full_reason" cuda.out ||
    fail "cuda: no full reason for the missing GPU although a GPU was asked for"
  grep -qE "^    binding: device = cuda: .*, which a run refuses$" cuda.out ||
    fail "cuda: the binding line does not describe the request that was made"

  run np2 mpirun -np 2 "$ddptrain" check-env
  expect_status np2 0
  expect_versions np2
  expect_one_report np2 2
  expect_text np2 "device cpu ($few_words)"
  run np2_cuda mpirun -np 2 "$ddptrain" check-env --device cuda
  expect_status np2_cuda 3
  expect_one_report np2_cuda 2
  expect_text np2_cuda "PROBLEM: no GPU visible"

  # Training's start-up lines: each rank says the same few words; device = cuda is an error with the full
  # reason.
  "$ddptrain" prepare synthetic --output data.h5 --train 80 --test 32 --vocab 50 --maxlen 8 >/dev/null
  train=(--data.path data.h5 --checkpoint.dir run --comm.backend mpi --model.embedding_dim 4 --model.hidden 4
    --train.epochs 1 --log.progress lines)
  run train mpirun -np 2 "$ddptrain" "${train[@]}"
  expect_status train 0
  for r in 0 1; do
    grep -qE "\(local rank $r/2\): cpu(, LSTM (on|cells over) [^[]*)? \[device = auto: $few_words\], train rows" train.out ||
      fail "train: rank $r's start-up line does not say 'cpu [device = auto: $few_words]'"
  done
  grep -qiE "$long_text" train.out && fail "train: CUDA's long text under device auto"
  run train_cuda "$ddptrain" "${train[@]}" --device cuda
  expect_status train_cuda 2
  grep -qE "^ddptrain: error: device = cuda: $full_reason" train_cuda.err ||
    fail "train_cuda: the error does not give the full reason"
fi

# A CPU-only check passes wherever the CPU path works; auto accepts either device.
run cpu "$ddptrain" check-env --device cpu
expect_status cpu 0
expect_text cpu "verdict: OK"
expect_text cpu "GPUs           not checked (--device cpu)"
run cpu_np2 mpirun -np 2 "$ddptrain" check-env --device cpu
expect_status cpu_np2 0
expect_one_report cpu_np2 2
expect_text cpu_np2 "check-env: OK"
run auto "$ddptrain" check-env --device auto
expect_status auto 0
expect_text auto "verdict: OK"

# Each rank's cores; a hint where the launcher's binding leaves a CPU rank fewer than its share (Open MPI
# binds a lone rank to one core), none where it does not.
expect_text cpu_np2 "    cores: "
if [ "$(nproc)" -ge 2 ]; then
  run bound mpirun -np 1 --bind-to core "$ddptrain" check-env --device cpu
  expect_status bound 0
  expect_text bound "    hint: the launcher bound this rank to 1 of the node's"
  run unbound mpirun -np 1 --bind-to none "$ddptrain" check-env --device cpu
  expect_status unbound 0
  grep -q "hint: the launcher" unbound.out && fail "unbound: a hint although the rank may use every core"
fi

# OpenBLAS made to run kernels older than an AVX2 CPU (as its dispatch does on a VM whose CPU model it does
# not recognise): a hint naming the setting that fixes it, in check-env's report and training's start lines.
if grep -qE '^  BLAS +OpenBLAS' cpu.out && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  if grep -qE '^  BLAS .*(Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids|Excavator)' cpu.out; then
    grep -q "hint: OpenBLAS" cpu.out && fail "cpu: a BLAS hint although OpenBLAS runs AVX2 kernels"
  fi
  OPENBLAS_CORETYPE=Prescott run old_kernels "$ddptrain" check-env --device cpu
  expect_status old_kernels 0
  expect_text old_kernels "    hint: OpenBLAS runs its Prescott kernels on a CPU with"
  expect_text old_kernels "(OPENBLAS_CORETYPE=Prescott asks for them)"
  "$ddptrain" prepare synthetic --output tiny.h5 --train 64 --test 32 --vocab 50 --maxlen 8 --seed 1 >/dev/null ||
    fail "prepare synthetic failed"
  OPENBLAS_CORETYPE=Prescott run old_kernels_train "$ddptrain" --data.path tiny.h5 --train.epochs 1 \
    --train.batch_size 16 --model.embedding_dim 8 --model.hidden 8 --checkpoint.dir old_kernels_run --device cpu
  expect_status old_kernels_train 0
  expect_text old_kernels_train "hint (rank 0): OpenBLAS runs its Prescott kernels"
fi

# Bad options: exit 2 and one line naming the option or value.
run bad_option "$ddptrain" check-env --bogus
expect_status bad_option 2
grep -q "^ddptrain: error: check-env: .*--bogus" bad_option.err || fail "bad_option: message does not name --bogus"
[ "$(grep -c '^ddptrain:' bad_option.err)" -eq 1 ] || fail "bad_option: expected one error line"
run bad_device mpirun -np 2 "$ddptrain" check-env --device gpu
expect_status bad_device 2
grep -q "^ddptrain: error: check-env: --device .*'gpu'" bad_device.err || fail "bad_device: message does not name gpu"
[ "$(grep -c '^ddptrain:' bad_device.err)" -eq 1 ] || fail "bad_device: expected one error line"
run bad_timeout "$ddptrain" check-env --timeout 0
expect_status bad_timeout 2
grep -q "^ddptrain: error: check-env: --timeout must be at least 1 (seconds), got 0" bad_timeout.err ||
  fail "bad_timeout: message does not name --timeout"

# A rank that hangs in its checks (a GPU probe on a broken node), seen from the others: rank 1 stops itself on
# entering the gather of the reports (tests/cli/lib/stop_in_call.c). Rank 0 must end the job after
# --timeout, naming where it waited, and the launcher must end the stopped rank too.
stopper=${DDPTRAIN_TEST_STOP_IN_CALL:?the path of the stop_in_call library, as ctest sets it}
started=$(date +%s)
run hung timeout 60 mpirun -np 2 -x LD_PRELOAD="$stopper" -x DDPTRAIN_TEST_STOP_IN=MPI_Gather \
  -x DDPTRAIN_TEST_STOP_RANK=1 "$ddptrain" check-env --device cpu --timeout 3
elapsed=$(($(date +%s) - started))
echo "hung rank: check-env ended after $elapsed s, exit status $status"
leftover=$(pgrep -f "$ddptrain check-env --device cpu --timeout 3" || true)
for pid in $leftover; do kill -9 "$pid"; done
[ -z "$leftover" ] || fail "hung: the stopped rank outlived the job"
expect_status hung 3
# A hang, not a duration: the bound is --timeout plus a margin for a loaded machine.
[ "$elapsed" -le 18 ] || fail "hung: took $elapsed s, bound 18 s (--timeout 3 + 15)"
last=hung
grep -q "no progress for .* (check-env --timeout 3) while gathering every rank's report to rank 0" hung.err ||
  fail "hung: no message names the timeout and where rank 0 waited"

# A rank that never comes (its node's start-up stuck before ddptrain runs): the others wait --timeout in
# MPI_Init, not training's 120 s, and say so.
started=$(date +%s)
# shellcheck disable=SC2016  # expanded by each rank's shell
run late timeout 60 mpirun -np 2 bash -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then sleep 40; fi; exec "$0" check-env --device cpu --timeout 3' "$ddptrain"
elapsed=$(($(date +%s) - started))
echo "late rank: check-env ended after $elapsed s, exit status $status"
expect_status late 3
[ "$elapsed" -le 18 ] || fail "late: took $elapsed s, bound 18 s (--timeout 3 + 15)"
last=late
grep -q "no progress for .* (check-env --timeout 3) while starting MPI (MPI_Init)" late.err ||
  fail "late: no message names the timeout and MPI_Init"
echo "PASS"
