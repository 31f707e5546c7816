#!/usr/bin/env bash
# The Debian package, installed into a fresh root of this machine's distribution and used from there alone:
#   bash tests/package/install_deb_test.sh SOURCE_DIR WORK_DIR [ROOT_CACHE_DIR]
# builds a CPU-only ddptrain in WORK_DIR/build (a package for the site without CUDA: a CUDA build's libraries
# come from NVIDIA's tarballs, which a fresh root has not), makes the .deb with CPack, unpacks a minimal root
# made by debootstrap (launch/containers/base-image.sh, cached as a tarball in ROOT_CACHE_DIR, the
# container test's cache too), installs the package there with apt (so the
# dependencies the package declares are all it gets), and inside that root runs `ddptrain --version`,
# `ddptrain check-env`, and the quickstart with the installed ddprun, configs and 2 ranks. The installed Slurm
# scripts must name only installed files and pass shellcheck.
# Needs root, debootstrap, dpkg-dev, file and the distribution's mirror (its apt source); skips (exit 77,
# saying why, tests/lib/skip.sh) without the first four. DDPTRAIN_DEB=path/to.deb tests that package instead of
# building one: under CTest the package that tests/package/fresh_root_test.sh made in its fresh root.
# DDPTRAIN_CUDA_BUILD=BUILD_DIR (under CTest, where the build has CUDA): that build's package too, installed
# over the first in the same root, which has no CUDA, cuDNN, NCCL or driver: it must start, run check-env
# (saying which GPU libraries are missing), train the quickstart, and refuse --device cuda with one line
# naming cuDNN's library, exit 2. One package serves GPU nodes and CPU-only nodes.
set -euo pipefail
# shellcheck source=tests/package/fresh_root_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/fresh_root_lib.sh"
package_test_arguments "$@"
phase_start=$SECONDS
phase() {
  echo "== $* (previous phase: $((SECONDS - phase_start)) s)"
  phase_start=$SECONDS
}
[ "$(id -u)" -eq 0 ] || skip_because "installing a package into a fresh root needs root (chroot, mounts)"
command -v debootstrap >/dev/null || skip_missing debootstrap "debootstrap is not installed"
command -v dpkg-shlibdeps >/dev/null || skip_missing dpkg-dev "dpkg-shlibdeps is not installed"
# CPack's DEB generator runs file(1) on the binaries it packs.
command -v file >/dev/null || skip_missing file "file is not installed"

# --- the package ---------------------------------------------------------------------------------------------
deb=${DDPTRAIN_DEB:-}
if [ -z "$deb" ]; then
  phase "building a CPU-only package"
  cmake -S "$source_dir" -B "$work_dir/build" -DCMAKE_BUILD_TYPE=Release -DDDPTRAIN_CUDA=OFF \
    -DDDPTRAIN_BUILD_TESTS=OFF -DDDPTRAIN_BUILD_BENCHMARKS=OFF >"$work_dir/configure.log" 2>&1 ||
    fail "configure" "$work_dir/configure.log"
  cmake --build "$work_dir/build" -j "$(nproc)" --target ddptrain >"$work_dir/build.log" 2>&1 ||
    fail "build" "$work_dir/build.log"
  rm -f "$work_dir"/build/ddptrain_*.deb
  (cd "$work_dir/build" && cpack -G DEB) >"$work_dir/cpack.log" 2>&1 || fail "cpack" "$work_dir/cpack.log"
  deb=$(ls "$work_dir"/build/ddptrain_*.deb)
fi
[ -f "$deb" ] || fail "no package at $deb"
echo "package: $deb"
dpkg-deb -f "$deb" Depends | grep -q openmpi-bin || fail "the package does not depend on openmpi-bin (mpirun)"
dpkg-deb -f "$deb" Depends | grep -q libhdf5 || fail "the package's dependencies were not read off the binary"

# --- a fresh root ------------------------------------------------------------------------------------------
# This machine's release: the package was built against its libraries.
phase "a minimal root of this machine's release (debootstrap, or its cached tarball)"
enter_fresh_root "$source_dir" "$work_dir" "$root_cache"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OPENBLAS_NUM_THREADS=1 "$@"; }

# check_package DEB: installs DEB in the root and checks the installed files, --version, check-env and the
# quickstart; sets $best to the quickstart's best val_acc.
check_package() {
  local deb=$1
  phase "apt-get install ./$(basename "$deb") in the fresh root"
  ! in_root sh -c 'command -v ddptrain' >/dev/null || fail "the root already has ddptrain"
  cp "$deb" "$root/tmp/"
  in_root sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    /tmp/$(basename "$deb")" >"$work_dir/apt.log" 2>&1 || fail "apt-get install" "$work_dir/apt.log"

  phase "the installed files"
  for f in /usr/bin/ddptrain /usr/bin/ddprun /usr/share/ddptrain/README.md /usr/share/ddptrain/configs/quickstart.ini \
    /usr/share/ddptrain/configs/imdb.ini /usr/share/ddptrain/slurm/common.sh /usr/share/ddptrain/ARCHITECTURE.md \
    /usr/share/ddptrain/launch/CONFIG.md /usr/share/ddptrain/models/GPU.md /usr/share/ddptrain/benchmarks/RESULTS.md; do
    [ -f "$root$f" ] || fail "the package did not install $f"
  done
  for script in "$root"/usr/share/ddptrain/slurm/*.sbatch; do
    grep -v '^ *#' "$script" | grep -q "launch/\|build/ddptrain" &&
      fail "$(basename "$script") still names a source-tree path" "$script"
    # Every absolute path its settings name (config, binary, common.sh) exists in the installed root.
    while read -r path; do
      [ -e "$root$path" ] || fail "$(basename "$script") names $path, which the package did not install"
    done < <(grep -o '/usr/[A-Za-z0-9_./-]*' "$script" | sort -u)
    if command -v shellcheck >/dev/null; then
      (cd "$root/usr/share/ddptrain/slurm" && shellcheck -x "$(basename "$script")") >"$work_dir/shellcheck.log" 2>&1 ||
        fail "shellcheck $(basename "$script")" "$work_dir/shellcheck.log"
    fi
  done

  phase "ddptrain --version and check-env"
  in_root ddptrain --version >"$work_dir/version.log" 2>&1 || fail "ddptrain --version" "$work_dir/version.log"
  grep -q "^ddptrain " "$work_dir/version.log" || fail "ddptrain --version printed no version" "$work_dir/version.log"
  status=0
  in_root ddptrain check-env >"$work_dir/check_env.log" 2>&1 || status=$?
  [ "$status" -eq 0 ] || fail "check-env exited $status in the fresh root" "$work_dir/check_env.log"
  grep -q "HDF5" "$work_dir/check_env.log" || fail "check-env's report has no HDF5 line" "$work_dir/check_env.log"

  phase "the quickstart, 2 ranks, from the installed files"
  rm -rf "$root/work"
  mkdir -p "$root/work"
  in_root sh -c 'cd /work && ddptrain prepare synthetic --output data/quickstart.h5 --train 20000 --test 4000 \
    --vocab 2000 --maxlen 40 --seed 1 && ddprun --np 2 -- --config /usr/share/ddptrain/configs/quickstart.ini \
    --log.progress lines' >"$work_dir/quickstart.log" 2>&1 || fail "the quickstart" "$work_dir/quickstart.log"
  # The quickstart's promise (launch/configs/quickstart.ini): val_acc >= 0.99.
  best=$(grep -o 'val_acc: [0-9.]*' "$work_dir/quickstart.log" | awk '{print $2}' | sort -g | tail -1)
  [ -n "$best" ] || fail "no val_acc in the quickstart's output" "$work_dir/quickstart.log"
  awk -v a="$best" 'BEGIN { exit !(a >= 0.99) }' || fail "the quickstart reached val_acc $best, expected >= 0.99" \
    "$work_dir/quickstart.log"
  [ -f "$root/work/runs/quickstart/best.h5" ] || fail "no runs/quickstart/best.h5" "$work_dir/quickstart.log"
}

! in_root sh -c 'command -v mpirun' >/dev/null || fail "the fresh root already has mpirun"
check_package "$deb"
! in_root sh -c 'ddptrain --version' | grep -q '^GPU path: CUDA' || fail "the CPU-only package has a GPU path"

cuda_build=${DDPTRAIN_CUDA_BUILD:-}
if [ -n "$cuda_build" ]; then
  phase "the package of the build with CUDA ($cuda_build)"
  rm -rf "$work_dir/cuda-package"
  (cd "$cuda_build" && cpack -G DEB -B "$work_dir/cuda-package") >"$work_dir/cpack_cuda.log" 2>&1 ||
    fail "cpack in $cuda_build" "$work_dir/cpack_cuda.log"
  cuda_deb=$(ls "$work_dir"/cuda-package/ddptrain_*.deb)
  ! ls "$root"/usr/lib/x86_64-linux-gnu/libcudnn* "$root"/usr/local/cuda >/dev/null 2>&1 ||
    fail "the fresh root has cuDNN or a CUDA toolkit"
  in_root sh -c 'apt-get remove -y -qq ddptrain' >"$work_dir/apt_remove.log" 2>&1 ||
    fail "apt-get remove ddptrain" "$work_dir/apt_remove.log"
  check_package "$cuda_deb"
  grep -q '^GPU path: CUDA' "$work_dir/version.log" || fail "the CUDA package has no GPU path" "$work_dir/version.log"
  grep -qE '^ *cuDNN +none \(libcudnn\.so\.[0-9]+ could not be loaded' "$work_dir/check_env.log" ||
    fail "check-env does not say cuDNN is missing" "$work_dir/check_env.log"
  phase "--device cuda where there is no GPU, cuDNN or NCCL"
  status=0
  in_root sh -c 'cd /work && ddptrain --config /usr/share/ddptrain/configs/quickstart.ini --device cuda \
    --checkpoint.dir runs/refused' >"$work_dir/refused.log" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "--device cuda exited $status, expected 2" "$work_dir/refused.log"
  [ "$(wc -l <"$work_dir/refused.log")" -eq 1 ] || fail "--device cuda: not one line" "$work_dir/refused.log"
  grep -qE 'libcudnn\.so\.[0-9]+' "$work_dir/refused.log" || fail "--device cuda does not name cuDNN's library" \
    "$work_dir/refused.log"
  cat "$work_dir/refused.log"
fi
phase "done"
release=$(awk -F= '$1 == "PRETTY_NAME" {gsub(/"/, "", $2); print $2}' /etc/os-release)
echo "PASS: $(basename "$deb") installed into a fresh $release root and trained the quickstart to val_acc $best${cuda_build:+; so did the package built with CUDA, which refused --device cuda naming the missing library}"
