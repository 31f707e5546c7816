#!/usr/bin/env bash
# One entry point for a fresh Debian/Ubuntu machine (the README's two commands):
#   bash launch/bootstrap.sh quickstart   install what building and running ddptrain needs (apt), build only
#                                         the ddptrain target, make the embedded dataset, train it with
#                                         mpirun -np 2
#   bash launch/bootstrap.sh test         install the rest of what the test suite needs, then the suite
#                                         (phases below); ends with each phase's time and every skip
#   bash launch/bootstrap.sh deps quickstart|test   only install the packages of that command
#   bash launch/bootstrap.sh packages quickstart|test   print them, one line
#   bash launch/bootstrap.sh check-tools  whether every tool the suite calls is found (after `deps test`)
# The test phases: the whole suite on a Release build with oneDNN (and CUDA where the toolkit is found) and
# warnings as errors; on a build without oneDNN the tests whose code differs (labels unit, mpi, kernels);
# the unit tests under ASan + UBSan (gcc); with clang the unit tests and the fuzz targets' replays under
# ASan + UBSan, then the fuzz targets, JOBS at a time, for FUZZ_SECONDS in all (default 120, shared
# between the targets: 40 s each for 5 targets on 2 cores).
# Under `test` a skip for a missing package is a failure (tests/lib/skip.sh); the skips left (no GPU,
# PyTorch, ...) are listed at the end with their reasons.
# Environment: BUILD_DIR (default build), JOBS (default: all cores), DDPTRAIN_CUDA (AUTO|ON|OFF).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cuda=${DDPTRAIN_CUDA:-AUTO}

# Open MPI refuses to run as root and more ranks than cores unless told; CI runs as root on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# Building and running ddptrain. oneDNN's CMake package looks for OpenCL, which libdnnl-dev only recommends
# (ocl-icd-opencl-dev).
quickstart_packages=(build-essential cmake libopenmpi-dev openmpi-bin libhdf5-dev libboost-program-options-dev
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev zlib1g-dev nlohmann-json3-dev libfmt-dev libicu-dev)
# The test suite's: GoogleTest; clang-format and git (the format check); h5dump, numpy and h5py (datasets
# written and read outside ddptrain); Slurm; shellcheck; iproute2 (ip, tc: the cluster tests' nodes);
# dpkg-dev and file (CPack's DEB generator), debootstrap, podman, buildah and runc (the package, fresh-root
# and container tests); clang with its runtime (libFuzzer) for the fuzz targets; libxsmm-dev (a static
# library) for gemm_library_bench's libxsmm column. PyTorch (python3-torch) stays optional: it checks only
# launch/torch_checkpoint.py, and brings 166 more packages (540 MiB) on top of these.
test_packages=(libgtest-dev clang-format git hdf5-tools python3 python3-numpy python3-h5py slurm-wlm shellcheck
  iproute2 dpkg-dev file debootstrap podman buildah runc clang-14 libclang-rt-14-dev libxsmm-dev)
# Every program the suite calls outside this repository and the build, with its package (check-tools; the
# launch_bootstrap_packages test checks that each is in the lists above or in every Debian root).
suite_tools=(cmake:cmake c++:build-essential cc:build-essential mpirun:openmpi-bin h5dump:hdf5-tools
  python3:python3 git:git clang-format:clang-format shellcheck:shellcheck slurmctld:slurm-wlm slurmd:slurm-wlm
  sbatch:slurm-wlm scontrol:slurm-wlm sinfo:slurm-wlm scancel:slurm-wlm srun:slurm-wlm ip:iproute2
  tc:iproute2 unshare:util-linux nsenter:util-linux script:bsdutils file:file dpkg-shlibdeps:dpkg-dev
  dpkg-deb:dpkg debootstrap:debootstrap podman:podman buildah:buildah runc:runc clang-14:clang-14
  clang++-14:clang-14)

packages_of() {  # quickstart|test
  case "$1" in
    quickstart) echo "${quickstart_packages[*]}" ;;
    test) echo "${quickstart_packages[*]} ${test_packages[*]}" ;;
    *) echo "bootstrap.sh: packages of 'quickstart' or 'test', not '$1'" >&2; exit 2 ;;
  esac
}

install_missing() {  # quickstart|test
  local missing=() p list
  list=$(packages_of "$1")
  for p in $list; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "== installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

check_tools() {
  local entry tool absent=0
  for entry in "${suite_tools[@]}"; do
    tool=${entry%%:*}
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ] && [ ! -x "/sbin/$tool" ]; then
      echo "missing: $tool (package ${entry#*:})"
      absent=1
    fi
  done
  /usr/bin/python3 -c 'import numpy, h5py' 2>/dev/null || { echo "missing: python3's numpy or h5py"; absent=1; }
  [ "$absent" -eq 0 ] && echo "check-tools: all ${#suite_tools[@]} tools and python3's numpy and h5py found"
  return "$absent"
}

configure_and_build() {  # dir, extra cmake args... (a --target list may follow a lone --)
  local dir=$1 targets=()
  shift
  local args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    args+=("$1")
    shift
  done
  [ $# -eq 0 ] || { shift; for t in "$@"; do targets+=(--target "$t"); done; }
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDDPTRAIN_CUDA="$cuda" "${args[@]}"
  cmake --build "$dir" -j "$jobs" "${targets[@]}"
}

# Each phase's name and seconds, printed at the end (also when a phase fails).
phase_names=()
phase_seconds=()
phase_started=""
phase() {  # NAME: ends the phase before, starts this one
  local now=$SECONDS
  [ -z "$phase_started" ] || phase_seconds+=($((now - phase_started)))
  phase_started=$now
  [ $# -eq 0 ] && return
  phase_names+=("$1")
  echo "== $1 (at $((now / 60)) min $((now % 60)) s)"
}
print_phases() {
  local i total=0 status=$1
  [ -z "$phase_started" ] || { phase_seconds+=($((SECONDS - phase_started))); phase_started=""; }
  echo "== phases"
  for i in "${!phase_names[@]}"; do
    printf '  %6s s  %s\n' "${phase_seconds[i]:-?}" "${phase_names[i]}"
    total=$((total + ${phase_seconds[i]:-0}))
  done
  printf '  %6s s  in all (%d min %02d s), exit %d\n' "$total" $((total / 60)) $((total % 60)) "$status"
}

junits=()
run_tests() {  # dir, extra ctest args...
  local dir=$1 junit
  shift
  junit=$(realpath "$dir")/ctest-junit.xml
  junits+=("$junit")
  # --test-output-size-passed: the whole output of passed tests too, where skip_report.py finds their
  # "SKIP:" lines. Two tests at a time hold the build's core slots (ctest-cores.json, tests/cores.cmake),
  # and up to two that mostly wait (label waits) run beside them.
  (cd "$dir" && ctest --output-on-failure -j 4 --resource-spec-file ctest-cores.json --output-junit "$junit" \
    --test-output-size-passed 10000000 "$@") && return 0
  # A log keeps its start and end: the failures' output again, last, one test at a time. It still fails.
  echo "== the failed tests once more, alone, for their output"
  (cd "$dir" && ctest --rerun-failed --output-on-failure "$@") || true
  return 1
}

# The skips of every suite run so far, with their reasons; fails where one was not allowed.
report_skips() {
  local junit status=0
  for junit in "${junits[@]}"; do
    [ -f "$junit" ] || continue
    echo "== skips in $(basename "$(dirname "$junit")")"
    python3 tests/skip_report.py "$junit" || status=1
  done
  return "$status"
}
# A phase failed: the skips so far, then exit 1 (the EXIT trap prints the phases' times).
failed_run() {
  phase "skips (the run failed)"
  report_skips || true
  exit 1
}

case "${1:-}" in
  quickstart)
    install_missing quickstart
    # The trainer alone: the tests and benchmarks are `test`'s (and need its packages).
    configure_and_build "$build" -DDDPTRAIN_BUILD_TESTS=OFF -DDDPTRAIN_BUILD_BENCHMARKS=OFF -- ddptrain
    mkdir -p data
    [ -f data/quickstart.h5 ] || "$build"/ddptrain prepare synthetic --output data/quickstart.h5 \
      --train 20000 --test 4000 --vocab 2000 --maxlen 40 --seed 1
    # runs/quickstart is the demo's own directory: each quickstart replaces the previous one.
    mpirun -np 2 "$build"/ddptrain --config launch/configs/quickstart.ini --checkpoint.overwrite true
    ;;
  deps | packages)
    case "${2:-}" in
      quickstart | test) ;;
      *) echo "usage: bash launch/bootstrap.sh $1 quickstart|test" >&2; exit 2 ;;
    esac
    if [ "$1" = deps ]; then install_missing "$2"; else packages_of "$2"; fi
    ;;
  check-tools)
    check_tools
    ;;
  test)
    trap 'status=$?; print_phases "$status"' EXIT
    phase "install the test command's packages"
    install_missing test
    check_tools
    # Every skip for a missing package is now a failure (tests/lib/skip.sh).
    export DDPTRAIN_STRICT_SKIPS=1
    # The fresh-root and container tests start from a minimal Debian root; debootstrap mostly waits for the
    # mirror, so it runs beside the first build and leaves the root cached in the build folder.
    mkdir -p "$build/debootstrap-cache"
    prewarm=""
    if [ "$(id -u)" -eq 0 ] && command -v debootstrap >/dev/null; then
      bash launch/containers/base-image.sh --cache "$build/debootstrap-cache" \
        --tarball-only "$build/debootstrap-cache/prewarm.tar" >"$build/debootstrap-cache/prewarm.log" 2>&1 &
      prewarm=$!
    fi
    phase "build: Release, oneDNN, CUDA $cuda, warnings as errors"
    # oneDNN ON: the packages are installed, so a oneDNN not found is an error, not tests skipped.
    configure_and_build "$build" -DDDPTRAIN_WERROR=ON -DDDPTRAIN_ONEDNN=ON -DDDPTRAIN_BUILD_TESTS=ON \
      -DDDPTRAIN_BUILD_BENCHMARKS=ON
    if [ -n "$prewarm" ]; then
      wait "$prewarm" || { cat "$build/debootstrap-cache/prewarm.log"; exit 1; }
      rm -f "$build/debootstrap-cache/prewarm.tar"
    fi
    phase "the whole suite"
    run_tests "$build" || failed_run
    phase "build without oneDNN (the CPU replica's builtin kernels)"
    # A site without libdnnl-dev gets this build. CUDA is left out: its code is the first build's. Only the
    # tests whose code differs from the first build's run (labels unit, mpi and kernels: the replica's
    # numbers, learning, exact resumes); the rest (launching, Slurm, the cluster, packages, containers,
    # bad input) runs the same engine code as above.
    cuda=OFF configure_and_build "$build-builtin" -DDDPTRAIN_WERROR=ON -DDDPTRAIN_ONEDNN=OFF
    phase "without oneDNN: the tests labelled unit, mpi or kernels"
    run_tests "$build-builtin" -L 'unit|mpi|kernels' || failed_run
    phase "build: ASan + UBSan (gcc), the unit tests"
    # Without CUDA and oneDNN: the build's other half (their *_none.cpp twins), and no JIT code for the
    # sanitizers to misread. Only the unit tests (and ddptrain, which some of them run) are built.
    cuda=OFF configure_and_build "$build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPTRAIN_WERROR=ON \
      -DDDPTRAIN_SANITIZE=ON -DDDPTRAIN_BUILD_BENCHMARKS=OFF -DDDPTRAIN_ONEDNN=OFF -- ddptrain ddptrain_unit_tests
    phase "ASan + UBSan (gcc): the unit tests"
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_tests "$build-asan" -L unit || failed_run
    phase "build: clang, ASan + UBSan, the unit tests and the fuzz targets"
    # The fuzz build (tests/fuzz) turns the sanitizers on itself and runs the compute loops serially. What
    # runs here is built: ddptrain, the unit tests and the fuzz targets.
    CC=clang-14 CXX=clang++-14 cuda=OFF configure_and_build "$build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDDPTRAIN_WERROR=ON -DDDPTRAIN_FUZZ=ON -DDDPTRAIN_BUILD_BENCHMARKS=OFF -DDDPTRAIN_ONEDNN=OFF \
      -- ddptrain ddptrain_unit_tests fuzz_targets
    phase "clang: the unit tests and the fuzz replays"
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_tests "$build-fuzz" -L unit || failed_run
    phase "fuzz targets: ${FUZZ_SECONDS:-120} s in all, $jobs at a time"
    bash tests/fuzz/run.sh --total --parallel "$jobs" "$build-fuzz" "${FUZZ_SECONDS:-120}" || failed_run
    phase "skips"
    report_skips
    ;;
  *)
    echo "usage: bash launch/bootstrap.sh quickstart|test|deps quickstart|test|packages quickstart|test|check-tools" >&2
    exit 2
    ;;
esac
