#!/usr/bin/env bash
# How a shell test says it cannot run, or cannot run a part (source it; SKIP_RETURN_CODE 77 in CTest):
#   skip_missing PACKAGE WHAT...          WHAT is missing and the Debian package PACKAGE would bring it: prints
#                                         "SKIP: WHAT (apt-get install PACKAGE)" and exits 77
#   skip_missing --part PACKAGE WHAT...   the same for one part of the test: prints the line and returns
#   skip_because REASON...                a reason no package fixes (no GPU, not root, the kernel refuses
#                                         namespaces): prints "SKIP: REASON" and exits 77
#   skip_because --part REASON...         the same for one part: prints the line and returns
# Under `bash launch/bootstrap.sh test` (DDPTRAIN_STRICT_SKIPS=1) skip_missing is a failure (exit 1) that
# names the package: the bootstrap installs every package the suite needs, so a missing one is its bug.
# tests/skip_report.py lists every "SKIP:" line of a run at its end. launch_bootstrap_packages checks that
# each package a skip_missing here names is one bootstrap.sh installs (or one every Debian root has).

skip_missing() {
  local part=""
  if [ "${1:-}" = --part ]; then
    part=1
    shift
  fi
  local package=$1
  shift
  if [ "${DDPTRAIN_STRICT_SKIPS:-}" = 1 ]; then
    echo "FAIL: $*: a package bash launch/bootstrap.sh test should have installed is missing: $package"
    exit 1
  fi
  echo "SKIP: $* (apt-get install $package)"
  [ -n "$part" ] || exit 77
}

skip_because() {
  local part=""
  if [ "${1:-}" = --part ]; then
    part=1
    shift
  fi
  echo "SKIP: $*"
  [ -n "$part" ] || exit 77
}
