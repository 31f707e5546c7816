#!/usr/bin/env bash
# The CPU image built and run for real: a local Debian base image (launch/containers/base-image.sh, from a
# debootstrap root cached in CACHE_DIR), the image from launch/containers/Containerfile on it with CUDA=OFF
# (the build stage makes the Debian package, the run stage installs it with apt), then in the image the
# quickstart with 2 ranks (the embedded dataset, launch/configs/quickstart.ini as the package installs it,
# which must reach val_acc >= 0.99) and `ddptrain check-env` through the image's entrypoint (exit 0 and
# "verdict: OK": the CPU build on a node without GPU). Prints each phase's time; removes the images and
# containers it made, keeps the cached root for the next run.
#   bash tests/container/quickstart_in_image.sh source-dir [cache-dir]
# As root with podman, buildah, debootstrap and runc (apt-get install podman buildah debootstrap runc);
# otherwise, or where the machine refuses namespaces or mounts, exit 77 (skipped), saying why. The machine
# needs the Debian mirror its apt uses.
set -uo pipefail
src=$(realpath "$1")
cache=${2:-${DDPTRAIN_BASE_CACHE:-}}
jobs=${JOBS:-2}

# shellcheck source=tests/lib/skip.sh
source "$src/tests/lib/skip.sh"
[ "$(id -u)" -eq 0 ] || skip_because "building images needs root (debootstrap, podman's storage)"
command -v podman >/dev/null 2>&1 || skip_missing podman "podman is not installed"
command -v buildah >/dev/null 2>&1 || skip_missing buildah "buildah is not installed"
command -v debootstrap >/dev/null 2>&1 || skip_missing debootstrap "debootstrap is not installed"
command -v runc >/dev/null 2>&1 || skip_missing runc "runc is not installed"
command -v unshare >/dev/null 2>&1 || skip_missing util-linux "unshare is not installed"
probe=$(mktemp -d)
# What a container needs of the kernel: new mount, PID, IPC, UTS and network namespaces, and mounts in them.
# shellcheck disable=SC2016 # $0 is expanded by the inner shell
unshare --mount --pid --ipc --uts --net --fork sh -c 'mount -t tmpfs probe "$0" && umount "$0"' "$probe" \
  >/dev/null 2>&1 || { rmdir "$probe"; skip_because "this kernel or container refuses new namespaces or mounts"; }
rmdir "$probe"

# The names this run gives its images and containers, so that it removes only its own.
id=ddptrain-test-$$
base=localhost/$id-base:bookworm
image=localhost/$id:cpu
podman=(podman --runtime runc --cgroup-manager cgroupfs)
work=$(mktemp -d)
cleanup() {
  "${podman[@]}" rm -f --ignore "$id-quickstart" "$id-prepare" "$id-check-env" >/dev/null 2>&1
  "${podman[@]}" rmi -f "$image" "$base" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $1"
  shift
  for f in "$@"; do [ -f "$f" ] && { echo "--- $f"; tail -40 "$f"; }; done
  exit 1
}
start=$SECONDS
phase_start=$SECONDS
phase() {  # NAME: the time since the previous phase ended
  echo "== $1: $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}

bash "$src/launch/containers/base-image.sh" ${cache:+--cache "$cache"} --tag "$base" >"$work/base.log" 2>&1 ||
  fail "base-image.sh" "$work/base.log"
cat "$work/base.log"
phase "base image $base"

# The CPU form of the GPU recipe; chroot isolation: build steps need no runtime of their own.
buildah build --isolation chroot -f "$src/launch/containers/Containerfile" \
  --build-arg BUILD_BASE="$base" --build-arg RUN_BASE="$base" --build-arg CUDA=OFF --build-arg JOBS="$jobs" \
  -t "$image" "$src" >"$work/build.log" 2>&1 || fail "buildah build" "$work/build.log"
grep -E '^CPack: - package: |^Setting up ddptrain ' "$work/build.log"
phase "image $image (ddptrain built, packaged and installed with apt)"

# The run directory is a folder of this machine mounted at the image's working directory (/work).
run=("${podman[@]}" run --rm --network none --shm-size=1g -v "$work/run:/work"
  -e OMPI_ALLOW_RUN_AS_ROOT=1 -e OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 -e OMPI_MCA_rmaps_base_oversubscribe=1)
mkdir "$work/run"
"${run[@]}" --name "$id-prepare" "$image" prepare synthetic --output data/quickstart.h5 --train 20000 \
  --test 4000 --vocab 2000 --maxlen 40 --seed 1 >"$work/prepare.log" 2>&1 || fail "prepare" "$work/prepare.log"
"${run[@]}" --name "$id-quickstart" --entrypoint mpirun "$image" -np 2 ddptrain \
  --config /usr/share/ddptrain/configs/quickstart.ini --log.progress lines >"$work/quickstart.log" 2>&1 ||
  fail "the quickstart in the image" "$work/quickstart.log"
grep -q '^ddptrain .*: 2 rank(s)' "$work/quickstart.log" || fail "not one job of 2 ranks" "$work/quickstart.log"
metrics=$work/run/runs/quickstart/metrics.jsonl
best=$(python3 "$src/tests/json_field.py" "$metrics" val_acc | sort -g | tail -1)
[ -n "$best" ] || fail "no epoch in metrics.jsonl" "$work/quickstart.log"
python3 -c "import sys; sys.exit(float(sys.argv[1]) < 0.99)" "$best" ||
  fail "the quickstart reached val_acc $best, expected >= 0.99" "$work/quickstart.log"
grep -E '^Epoch [0-9]+/[0-9]+ - [0-9]+ steps|^Test ' "$work/quickstart.log"
phase "quickstart in the image, 2 ranks (best val_acc $best)"

status=0
"${run[@]}" --name "$id-check-env" "$image" check-env >"$work/check-env.log" 2>&1 || status=$?
[ "$status" -eq 0 ] || fail "check-env in the image: exit status $status, expected 0" "$work/check-env.log"
grep -q 'verdict: OK' "$work/check-env.log" || fail "check-env: no 'verdict: OK'" "$work/check-env.log"
grep -E '^  (MPI|HDF5|BLAS) ' "$work/check-env.log"
phase "check-env in the image"

cleanup
trap - EXIT
"${podman[@]}" image exists "$image" && fail "the image $image is still there"
phase "removing the images"
echo "ok: the CPU image builds from launch/containers/Containerfile, installs ddptrain's package with apt," \
  "trains the quickstart on 2 ranks and passes check-env ($((SECONDS - start)) s in all)"
