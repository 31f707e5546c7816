#!/usr/bin/env bash
# The launch scripts parse (bash -n) and pass shellcheck: launch/slurm/*, launch/ddprun, launch/bootstrap.sh,
# the benchmark scripts (the GPU acceptance command among them), the command-line, Slurm, cluster, CMake,
# package, container and fuzz tests, and the container scripts. Exit 77
# (skipped) when shellcheck is not installed.
#   bash tests/slurm/lint_launch_scripts.sh source-dir
set -euo pipefail
cd "$1"
scripts=(launch/slurm/*.sbatch launch/slurm/common.sh launch/ddprun launch/bootstrap.sh benchmarks/*.sh tests/slurm/*.sh
  tests/cli/*.sh tests/cli/lib/*.sh tests/lib/*.sh tests/cluster/*.sh tests/cmake/*.sh tests/package/*.sh launch/containers/*.sh tests/container/*.sh tests/fuzz/*.sh)
status=0
for script in "${scripts[@]}"; do
  bash -n "$script" || { echo "FAIL: bash -n $script"; status=1; }
done
if ! command -v shellcheck >/dev/null 2>&1; then
  [ "$status" -eq 0 ] || exit 1
  # shellcheck source=tests/lib/skip.sh
  source tests/lib/skip.sh
  skip_missing shellcheck "shellcheck is not installed; bash -n passed"
fi
# -x follows the `source` lines (their paths are given relative to the source dir).
shellcheck -x "${scripts[@]}" || { echo "FAIL: shellcheck"; status=1; }
[ "$status" -eq 0 ] && echo "ok: ${#scripts[@]} scripts pass bash -n and shellcheck"
exit "$status"
