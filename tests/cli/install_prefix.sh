#!/usr/bin/env bash
# `cmake --install` into a prefix of the site's choosing (not /usr, where the package test installs): the
# files land in bin/ and share/ddptrain/, the installed Slurm scripts point at that prefix, and from a
# directory outside the source and build trees, with only the prefix's bin/ added to PATH, `ddptrain
# --version`, `check-env` and a 2-rank run of the installed quickstart config through the installed ddprun
# work. The package test (tests/package) covers a fresh root; this one runs wherever cmake is.
#   bash tests/cli/install_prefix.sh path/to/ddptrain source-dir   (ddptrain inside its build directory)
set -euo pipefail
ddptrain=$1
build=$(cd "$(dirname "$ddptrain")" && pwd)
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
[ -f "$build/cmake_install.cmake" ] || skip_because "$build is not a CMake build directory"
enter_scratch_dir
prefix=$work/opt/ddptrain-site
cmake --install "$build" --prefix "$prefix" >install.txt 2>&1 || fail "cmake --install" install.txt

for f in bin/ddptrain bin/ddprun share/ddptrain/README.md share/ddptrain/configs/quickstart.ini \
  share/ddptrain/configs/imdb.ini share/ddptrain/slurm/common.sh share/ddptrain/torch_checkpoint.py \
  share/ddptrain/ARCHITECTURE.md share/ddptrain/launch/README.md share/ddptrain/launch/CONFIG.md \
  share/ddptrain/io/README.md share/ddptrain/comm/README.md share/ddptrain/models/GPU.md \
  share/ddptrain/tests/README.md share/ddptrain/benchmarks/README.md share/ddptrain/benchmarks/RESULTS.md; do
  [ -f "$prefix/$f" ] || fail "cmake --install did not install $f" install.txt
done
for f in ddptrain ddprun; do [ -x "$prefix/bin/$f" ] || fail "bin/$f is not executable"; done
for script in "$prefix"/share/ddptrain/slurm/*.sbatch; do
  grep -v '^ *#' "$script" | grep -q "launch/\|build/ddptrain" &&
    fail "$(basename "$script") still names a source-tree path" "$script"
  # Every path of the prefix that its settings name (config, binary, common.sh) was installed.
  while read -r path; do
    [ -e "$path" ] || fail "$(basename "$script") names $path, which was not installed" "$script"
  done < <(grep -o "$prefix/[A-Za-z0-9_./-]*" "$script" | sort -u)
  grep -q "$prefix/bin/ddptrain" "$script" || fail "$(basename "$script") does not run the installed ddptrain" \
    "$script"
  bash -n "$script" || fail "$(basename "$script") is not valid bash"
done

# From here only the installed files: a PATH without the build directory, a directory of its own.
mkdir run-here && cd run-here
export PATH="$prefix/bin:/usr/local/bin:/usr/bin:/bin"
[ "$(command -v ddptrain)" = "$prefix/bin/ddptrain" ] || fail "PATH does not find the installed ddptrain"
ddptrain --version >version.txt 2>&1 || fail "ddptrain --version" version.txt
grep -q '^ddptrain [0-9]' version.txt || fail "no version line" version.txt
ddptrain check-env >check_env.txt 2>&1 || fail "check-env from the prefix" check_env.txt
grep -q "HDF5" check_env.txt || fail "check-env's report has no HDF5 line" check_env.txt
ddptrain prepare synthetic --output data/quickstart.h5 --train 2000 --test 400 --vocab 300 --maxlen 20 \
  --seed 1 >prepare.txt 2>&1 || fail "prepare synthetic" prepare.txt
ddprun --np 2 -- --config "$prefix/share/ddptrain/configs/quickstart.ini" --train.epochs 1 \
  --log.progress lines >quickstart.txt 2>&1 || fail "the installed quickstart with ddprun" quickstart.txt
[ -f runs/quickstart/last.h5 ] || fail "no runs/quickstart/last.h5" quickstart.txt
[ "$(json_field runs/quickstart/metrics.jsonl epoch | wc -l)" -ge 1 ] ||
  fail "no epoch in metrics.jsonl" runs/quickstart/metrics.jsonl
echo "PASS: installed into $prefix; --version, check-env and a 2-rank quickstart epoch ran from there alone"
