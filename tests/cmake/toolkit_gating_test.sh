#!/usr/bin/env bash
# The CUDA toolkit gating in CMakeLists.txt, against fake cuDNN and NCCL folders (headers and empty library
# files only): configures the project as a user would, with the fake one in place of the real one.
#   bash tests/cmake/toolkit_gating_test.sh SOURCE_DIR
# - a cuDNN 8 under DDPTRAIN_CUDA=AUTO gives a CPU build and one message naming cuDNN 8.9 as too old;
# - the same under DDPTRAIN_CUDA=ON is a configure error naming it;
# - an NCCL 2.12 under AUTO gives a CPU build naming NCCL 2.12;
# - with no CUDA toolkit to be found (CUDACXX names no compiler) under ON, the error names the toolkit first
#   and then the cuDNN 8.9, as on a machine without CUDA;
# - a cuDNN 9.1 with an NCCL 2.14 gives the CUDA path, where this machine has nvcc (otherwise said and skipped).
# CMake wraps a long message over several lines: the patterns are matched against the log's lines joined by
# single spaces.
set -uo pipefail
source=$(cd "${1:?usage: toolkit_gating_test.sh SOURCE_DIR}" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

# fake_cudnn DIR MAJOR MINOR / fake_nccl DIR MAJOR MINOR: a folder that looks like the library to CMake.
fake_cudnn() {
  mkdir -p "$1/include" "$1/lib"
  : >"$1/include/cudnn.h"
  printf '#define CUDNN_MAJOR %s\n#define CUDNN_MINOR %s\n#define CUDNN_PATCHLEVEL 0\n' "$2" "$3" \
    >"$1/include/cudnn_version.h"
  : >"$1/lib/libcudnn.so"
}
fake_nccl() {
  mkdir -p "$1/include" "$1/lib"
  printf '#define NCCL_MAJOR %s\n#define NCCL_MINOR %s\n#define NCCL_PATCH 0\n' "$2" "$3" >"$1/include/nccl.h"
  : >"$1/lib/libnccl.so"
}

# configure NAME CUDA_MODE CUDNN_DIR NCCL_DIR: configures into $scratch/NAME, output in $scratch/NAME.log;
# returns cmake's status. The environment's CUDACXX reaches CMake's check for a CUDA compiler.
configure() {
  cmake -S "$source" -B "$scratch/$1" -DDDPTRAIN_CUDA="$2" -DDDPTRAIN_BUILD_TESTS=OFF \
    -DDDPTRAIN_BUILD_BENCHMARKS=OFF -DCUDNN_INCLUDE_DIR="$3/include" -DCUDNN_LIBRARY="$3/lib/libcudnn.so" \
    -DNCCL_INCLUDE_DIR="$4/include" -DNCCL_LIBRARY="$4/lib/libnccl.so" >"$scratch/$1.log" 2>&1
}

# expect NAME WHAT GREP-PATTERN: the log of NAME, its lines joined by single spaces, matches the pattern.
expect() {
  if tr -s ' \n' '  ' <"$scratch/$1.log" | grep -qE "$3"; then
    echo "ok: $2"
  else
    echo "FAIL: $2: no line matching '$3' in:"
    sed 's/^/    /' "$scratch/$1.log" | tail -n 25
    failures=$((failures + 1))
  fi
}

fake_cudnn "$scratch/cudnn8" 8 9
fake_cudnn "$scratch/cudnn9" 9 1
fake_nccl "$scratch/nccl212" 2 12
fake_nccl "$scratch/nccl214" 2 14

if configure old_cudnn_auto AUTO "$scratch/cudnn8" "$scratch/nccl214"; then
  expect old_cudnn_auto "cuDNN 8.9 under AUTO: a CPU build" 'CUDA path OFF'
  expect old_cudnn_auto "cuDNN 8.9 under AUTO: the message names it" \
    'building for CPUs only .*cuDNN 8\.9 in .*cudnn8/include is older than 9\.0'
else
  echo "FAIL: cuDNN 8.9 under AUTO: configure failed"
  tail -n 25 "$scratch/old_cudnn_auto.log"
  failures=$((failures + 1))
fi

if configure old_cudnn_on ON "$scratch/cudnn8" "$scratch/nccl214"; then
  echo "FAIL: cuDNN 8.9 under ON: configure succeeded"
  failures=$((failures + 1))
else
  expect old_cudnn_on "cuDNN 8.9 under ON: a configure error naming it" \
    'DDPTRAIN_CUDA=ON, but the CUDA path cannot be built:.*cuDNN 8\.9'
fi

# No toolkit: CUDACXX names a compiler that is not there, and nvcc is off the PATH.
if CUDACXX=/nonexistent/nvcc PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:) \
  configure no_toolkit_on ON "$scratch/cudnn8" "$scratch/nccl214"; then
  echo "FAIL: no CUDA toolkit under ON: configure succeeded"
  failures=$((failures + 1))
else
  expect no_toolkit_on "no CUDA toolkit under ON: an error naming the toolkit, then cuDNN 8.9" \
    'DDPTRAIN_CUDA=ON, but the CUDA path cannot be built: the CUDA toolkit \(nvcc and the runtime\) was not found.*cuDNN 8\.9'
fi

if configure old_nccl_auto AUTO "$scratch/cudnn9" "$scratch/nccl212"; then
  expect old_nccl_auto "NCCL 2.12 under AUTO: a CPU build naming it" \
    'building for CPUs only .*NCCL 2\.12 in .*nccl212/include is older than 2\.14'
else
  echo "FAIL: NCCL 2.12 under AUTO: configure failed"
  failures=$((failures + 1))
fi

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  if configure supported AUTO "$scratch/cudnn9" "$scratch/nccl214"; then
    expect supported "cuDNN 9.1 and NCCL 2.14 with nvcc: the CUDA path" 'CUDA path ON \(CUDA [0-9.]+, cuDNN 9\.1, NCCL 2\.14\)'
  else
    echo "FAIL: cuDNN 9.1 and NCCL 2.14: configure failed"
    tail -n 25 "$scratch/supported.log"
    failures=$((failures + 1))
  fi
else
  # The CUDA toolkit is not a package bootstrap.sh installs (NVIDIA's, not Debian's).
  # shellcheck source=tests/lib/skip.sh
  source "$source/tests/lib/skip.sh"
  skip_because --part "the supported case needs nvcc (the CUDA toolkit, which bootstrap.sh does not install)"
fi

[ "$failures" -eq 0 ] && echo "toolkit gating: all cases passed"
exit $((failures > 0))
