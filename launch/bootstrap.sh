#!/usr/bin/env bash
# One entry point for a fresh Debian/Ubuntu machine (the README's two commands):
#   bash launch/bootstrap.sh quickstart   install what is missing, build, make the embedded dataset, train it
#                                         with mpirun -np 2
#   bash launch/bootstrap.sh test         install what is missing, build with warnings as errors, run the
#                                         whole test suite, again on a build without oneDNN, then the unit
#                                         tests under ASan + UBSan (gcc), and with clang the unit tests and
#                                         the fuzz targets for FUZZ_SECONDS each (default 45)
# Environment: BUILD_DIR (default build), JOBS (default: all cores), DDPTRAIN_CUDA (AUTO|ON|OFF).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cuda=${DDPTRAIN_CUDA:-AUTO}

# Open MPI refuses to run as root and more ranks than cores unless told; CI runs as root on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# oneDNN's CMake package looks for OpenCL, which libdnnl-dev only recommends (ocl-icd-opencl-dev); dpkg-dev,
# debootstrap, podman, buildah and runc are for the package and container tests; clang with its runtime
# (libFuzzer) for the fuzz targets; libxsmm-dev (a static library) for gemm_library_bench's libxsmm column.
packages=(build-essential cmake clang-format git libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libboost-program-options-dev
  libopenblas-dev libdnnl-dev libgtest-dev zlib1g-dev nlohmann-json3-dev libfmt-dev libicu-dev python3-numpy python3-h5py slurm-wlm
  shellcheck dpkg-dev debootstrap podman buildah runc ocl-icd-opencl-dev clang-14 libclang-rt-14-dev
  libxsmm-dev)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "== installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

configure_and_build() {  # dir, extra cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDDPTRAIN_CUDA="$cuda" "$@"
  cmake --build "$dir" -j "$jobs"
}

run_tests() {  # dir, extra ctest args...
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure -j 2 "$@") && return 0
  # A log keeps its start and end: the failures' output again, last, one test at a time. It still fails.
  echo "== the failed tests once more, alone, for their output"
  (cd "$dir" && ctest --rerun-failed --output-on-failure "$@") || true
  return 1
}

case "${1:-}" in
  quickstart)
    install_missing
    configure_and_build "$build"
    mkdir -p data
    [ -f data/quickstart.h5 ] || "$build"/ddptrain prepare synthetic --output data/quickstart.h5 \
      --train 20000 --test 4000 --vocab 2000 --maxlen 40 --seed 1
    # runs/quickstart is the demo's own directory: each quickstart replaces the previous one.
    mpirun -np 2 "$build"/ddptrain --config launch/configs/quickstart.ini --checkpoint.overwrite true
    ;;
  test)
    install_missing
    configure_and_build "$build" -DDDPTRAIN_WERROR=ON
    run_tests "$build"
    echo "== the whole suite again on a build without oneDNN (the CPU replica on its builtin kernels)"
    # A site without libdnnl-dev gets this build; CUDA is left out as its code is the first build's.
    cuda=OFF configure_and_build "$build-builtin" -DDDPTRAIN_WERROR=ON -DDDPTRAIN_ONEDNN=OFF
    # The package and container tests build their own CPU-only package and image; once is enough.
    run_tests "$build-builtin" -LE 'package|container'
    echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
    # Without CUDA and oneDNN: the build's other half (their *_none.cpp twins), and no JIT code for the
    # sanitizers to misread.
    cuda=OFF configure_and_build "$build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPTRAIN_WERROR=ON \
      -DDDPTRAIN_SANITIZE=ON -DDDPTRAIN_BUILD_BENCHMARKS=OFF -DDDPTRAIN_ONEDNN=OFF
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_tests "$build-asan" -L unit
    echo "== with clang: the unit tests and the fuzz targets' replays under ASan + UBSan, then each target fuzzed"
    # The fuzz build (tests/fuzz) turns the sanitizers on itself and runs the compute loops serially.
    CC=clang-14 CXX=clang++-14 cuda=OFF configure_and_build "$build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDDPTRAIN_WERROR=ON -DDDPTRAIN_FUZZ=ON -DDDPTRAIN_BUILD_BENCHMARKS=OFF -DDDPTRAIN_ONEDNN=OFF
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_tests "$build-fuzz" -L unit
    bash tests/fuzz/run.sh "$build-fuzz" "${FUZZ_SECONDS:-45}"
    ;;
  *)
    echo "usage: bash launch/bootstrap.sh quickstart|test" >&2
    exit 2
    ;;
esac
