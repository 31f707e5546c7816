#!/usr/bin/env bash
# `ddptrain check-env` end to end, alone and under `mpirun -np 2`: on a machine without a usable GPU it exits
# 3 with the "no GPU visible" advice; on a GPU machine (nvidia-smi lists a GPU and the build has CUDA) it
# exits 0 and names the GPU. Either way the report has the MPI and HDF5 versions, one report per node,
# each rank's cores (with a hint when the binding leaves cores idle), `--device cpu` passes and a bad option
# exits 2.
#   bash tests/cli/check_env.sh path/to/ddptrain source-dir
set -uo pipefail
ddptrain=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$work"

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

  run np2 mpirun -np 2 "$ddptrain" check-env
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
  echo "no usable GPU here: expecting the advice and exit status 3"
  expect_status plain 3
  expect_text plain "PROBLEM: no GPU visible"
  expect_text plain "use --device cpu on CPU-only nodes"
  expect_text plain "smoke test: OK on cpu"

  run np2 mpirun -np 2 "$ddptrain" check-env
  expect_status np2 3
  expect_versions np2
  expect_one_report np2 2
  expect_text np2 "PROBLEM: no GPU visible"
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
  grep -q "hint:" unbound.out && fail "unbound: a hint although the rank may use every core"
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
echo "PASS"
