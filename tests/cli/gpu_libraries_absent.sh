#!/usr/bin/env bash
# A build with CUDA on a node without cuDNN and NCCL (a CPU node of a mixed cluster sharing one install): the
# binary needs neither to start (nothing of CUDA among its load-time libraries), --version, check-env and a
# 2-rank training run work, check-env says which GPU library is missing, and --device cuda refuses with one
# line naming it, exit 2. The node is made in a private mount namespace where every file the loader could
# open as cuDNN or NCCL (ld.so.cache's, the build's own path) is covered by an empty one.
#   bash tests/cli/gpu_libraries_absent.sh path/to/ddptrain source-dir
set -uo pipefail
ddptrain=$(realpath "$1")
source_dir=$(cd "$2" && pwd)
# shellcheck source=tests/cli/lib/cli_test.sh
source "$source_dir/tests/cli/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" --version >version_here.txt 2>&1 || fail "ddptrain --version" version_here.txt
grep -q '^GPU path: not built' version_here.txt &&
  skip_because "this ddptrain was built without CUDA: it opens no GPU library"
[ "$(id -u)" -eq 0 ] || skip_because "covering the GPU libraries needs root (a private mount namespace)"
unshare -m true 2>/dev/null || skip_because "the kernel refuses a private mount namespace (unshare -m)"

# Nothing of CUDA is a load-time dependency: the loader would stop the process before main() without it.
ldd "$ddptrain" >ldd.txt 2>&1
! grep -E 'libcudnn|libnccl|libcudart|libcuda\.' ldd.txt || fail "ddptrain needs GPU libraries to start" ldd.txt

# The libraries the binary opens at run time (--version: "opens libcudnn.so.9 (else /path/libcudnn.so.9),
# ..."): every file the loader could find by those names is covered, and the driver's too.
names=$(grep -oE 'lib(cudnn|nccl)\.so\.[0-9]+ \(else' version_here.txt | awk '{print $1}')
[ "$(echo "$names" | wc -l)" -eq 2 ] || fail "--version names no cuDNN and NCCL libraries" version_here.txt
cudnn_name=$(echo "$names" | grep cudnn)
files=()
for name in $names libcuda.so.1; do
  while read -r path; do
    [ -e "$path" ] && files+=("$(realpath "$path")")
  done < <(ldconfig -p | awk -v n="$name" '$1 == n {print $NF}'
    grep -oE "\(else [^)]*/$name\)" version_here.txt | sed 's/^(else //; s/)$//')
done

# run_without NAME COMMAND...: COMMAND in the namespace without them; stdout+stderr in NAME.txt, status $status.
run_without() {
  local name=$1
  shift
  status=0
  # shellcheck disable=SC2016 # expanded by the inner bash
  unshare -m bash -c 'for f in "${@:2:$1}"; do mount --bind /dev/null "$f" || exit 99; done; shift "$(($1 + 1))"
    unset LD_LIBRARY_PATH; exec "$@"' _ "${#files[@]}" "${files[@]}" "$@" >"$name.txt" 2>&1 || status=$?
  [ "$status" -ne 99 ] || fail "could not cover the GPU libraries" "$name.txt"
}

run_without version "$ddptrain" --version
[ "$status" -eq 0 ] || fail "ddptrain --version exited $status without cuDNN and NCCL" version.txt

run_without check_env "$ddptrain" check-env
[ "$status" -eq 0 ] || fail "check-env exited $status on a node without GPU libraries" check_env.txt
grep -qE "^ *cuDNN +none \($cudnn_name could not be loaded" check_env.txt ||
  fail "check-env does not say that $cudnn_name is missing" check_env.txt
grep -qE '^ *NCCL +none \(libnccl\.so\.[0-9]+ could not be loaded' check_env.txt ||
  fail "check-env does not say that NCCL is missing" check_env.txt

"$ddptrain" prepare synthetic --output data.h5 --train 2000 --test 400 --vocab 500 --maxlen 20 --seed 1 \
  >prepare.txt 2>&1 || fail "prepare synthetic" prepare.txt
config=$source_dir/launch/configs/quickstart.ini
run_without train mpirun -np 2 "$ddptrain" --config "$config" --data.path data.h5 --train.epochs 1 \
  --checkpoint.dir run --log.progress lines
[ "$status" -eq 0 ] || fail "training exited $status without cuDNN and NCCL" train.txt
grep -q '^Epoch 1/1' train.txt || fail "no epoch trained" train.txt
[ "$(json_field run/metrics.jsonl device,epoch | awk 'END {print $1}')" = cpu ] || fail "the run did not train on the CPU" train.txt

run_without refused "$ddptrain" --config "$config" --data.path data.h5 --checkpoint.dir refused --device cuda
[ "$status" -eq 2 ] || fail "--device cuda exited $status, expected 2" refused.txt
[ "$(wc -l <refused.txt)" -eq 1 ] || fail "--device cuda: not one line" refused.txt
grep -qF "$cudnn_name" refused.txt || fail "--device cuda does not name $cudnn_name" refused.txt
echo "PASS: without $(echo "$names" | tr '\n' ' ')the CUDA build started, trained and refused --device cuda:"
cat refused.txt
