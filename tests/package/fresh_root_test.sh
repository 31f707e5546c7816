#!/usr/bin/env bash
# The README's first command on a fresh machine: a minimal root of this machine's Debian release (debootstrap
# --variant=minbase, launch/containers/base-image.sh, cached as a tarball in ROOT_CACHE_DIR) gets a copy of the
# checkout (the files git knows, as they are in the work tree), and in it, as root:
#   1. bash launch/bootstrap.sh quickstart: apt installs the quickstart's packages, ddptrain is built and
#      trains the quickstart on 2 ranks, which must reach val_acc >= 0.99;
#   2. bash launch/bootstrap.sh deps test, then check-tools: the test command's packages install, and every
#      tool the suite calls is then found (what a fresh machine lacked before: file, ip);
#   3. the quickstart's build makes the Debian package (CPack, which needs file and dpkg-dev), left as
#      WORK_DIR/ddptrain.deb for the package test (tests/package/install_deb_test.sh) to install into another
#      fresh root.
# Prints each step's time, and the seconds from the unpacked root to the quickstart's first epoch.
# With DDPTRAIN_FRESH_ROOT_FULL=1 (by hand: it takes the test command's whole run, not for CI) it then runs the
# README's test command itself, bash launch/bootstrap.sh test, in the root, and times it too.
#   bash tests/package/fresh_root_test.sh SOURCE_DIR WORK_DIR [ROOT_CACHE_DIR]
# Needs root, debootstrap, git, a source that is a git checkout, and the distribution's mirror (its apt source); skips (exit 77, saying why,
# tests/lib/skip.sh) without the first three.
set -euo pipefail
# shellcheck source=tests/package/fresh_root_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/fresh_root_lib.sh"
package_test_arguments "$@"
[ "$(id -u)" -eq 0 ] || skip_because "a fresh root needs root (chroot, mounts)"
command -v debootstrap >/dev/null || skip_missing debootstrap "debootstrap is not installed"
command -v git >/dev/null || skip_missing git "git is not installed (it lists the checkout's files)"
git -C "$source_dir" rev-parse --git-dir >/dev/null 2>&1 ||
  skip_because "$source_dir is not a git checkout: the fresh root starts from a clone of it"

steps=()
step_start=$SECONDS
step() {  # NAME: the time since the previous step ended
  steps+=("$(printf '%5d s  %s' $((SECONDS - step_start)) "$1")")
  echo "== $1: $((SECONDS - step_start)) s"
  step_start=$SECONDS
}

enter_fresh_root "$source_dir" "$work_dir" "$root_cache"
step "a minimal $release_codename root (debootstrap, or its cached tarball), set up to chroot into"
# A clone, as a user's, then the checkout's work tree as it is: tracked files and new ones git does not
# ignore (no build folders or data), files deleted but not committed removed.
git clone -q --no-hardlinks "$source_dir" "$root/src" || fail "git clone of $source_dir"
(cd "$source_dir" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done | tar --null -T - -cf -) |
  tar -C "$root/src" -xf -
(cd "$source_dir" && git ls-files -z --deleted) | (cd "$root/src" && xargs -0 -r rm -f)
[ -f "$root/src/launch/bootstrap.sh" ] || fail "the checkout was not copied into the root"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
! in_root sh -c 'command -v cmake || command -v mpirun || command -v c++' >/dev/null ||
  fail "the fresh root already has cmake, mpirun or a C++ compiler"
step "the root unpacked, the checkout copied in"

# Each line of the quickstart's output with the seconds since the root was ready.
t0=$SECONDS
status=0
in_root sh -c 'cd /src && bash launch/bootstrap.sh quickstart' 2>&1 |
  while IFS= read -r line; do printf '%5d  %s\n' $((SECONDS - t0)) "$line"; done >"$work_dir/quickstart.log" ||
  status=$?
[ "$status" -eq 0 ] || fail "bash launch/bootstrap.sh quickstart in the fresh root" "$work_dir/quickstart.log"
first_epoch=$(awk '$2 ~ /^Epoch/ && $3 ~ /^1\// {print $1; exit}' "$work_dir/quickstart.log")
[ -n "$first_epoch" ] || fail "no first epoch in the quickstart's output" "$work_dir/quickstart.log"
best=$(grep -o 'val_acc: [0-9.]*' "$work_dir/quickstart.log" | awk '{print $2}' | sort -g | tail -1)
awk -v a="${best:-0}" 'BEGIN { exit !(a >= 0.99) }' ||
  fail "the quickstart reached val_acc ${best:-none}, expected >= 0.99" "$work_dir/quickstart.log"
[ -f "$root/src/runs/quickstart/best.h5" ] || fail "no runs/quickstart/best.h5" "$work_dir/quickstart.log"
grep -q ' Built target ddptrain$' "$work_dir/quickstart.log" || fail "the quickstart built no ddptrain" \
  "$work_dir/quickstart.log"
! grep -qE 'Built target (ddptrain_unit_tests|ddptrain_mpi_tests|cpu_step_bench)' "$work_dir/quickstart.log" ||
  fail "the quickstart built tests or benchmarks" "$work_dir/quickstart.log"
grep -E '^ *[0-9]+  (Epoch [0-9]+/|Test )' "$work_dir/quickstart.log"
step "bash launch/bootstrap.sh quickstart (first epoch ${first_epoch} s after the root was ready, best val_acc $best)"

in_root sh -c 'cd /src && bash launch/bootstrap.sh deps test' >"$work_dir/deps_test.log" 2>&1 ||
  fail "bash launch/bootstrap.sh deps test in the fresh root" "$work_dir/deps_test.log"
in_root sh -c 'cd /src && bash launch/bootstrap.sh check-tools' >"$work_dir/check_tools.log" 2>&1 ||
  fail "after bootstrap.sh deps test, tools the suite calls are missing" "$work_dir/check_tools.log"
cat "$work_dir/check_tools.log"
step "bash launch/bootstrap.sh deps test, then check-tools"

in_root sh -c 'cd /src/build && cpack -G DEB' >"$work_dir/cpack.log" 2>&1 || fail "cpack in the fresh root" \
  "$work_dir/cpack.log"
debs=("$root"/src/build/ddptrain_*.deb)
[ -f "${debs[0]}" ] || fail "cpack made no ddptrain_*.deb" "$work_dir/cpack.log"
cp "${debs[0]}" "$work_dir/ddptrain.deb"
step "the Debian package (cpack) of the quickstart's build: $work_dir/ddptrain.deb"

if [ "${DDPTRAIN_FRESH_ROOT_FULL:-0}" = 1 ]; then
  in_root sh -c 'cd /src && bash launch/bootstrap.sh test' >"$work_dir/test.log" 2>&1 ||
    fail "bash launch/bootstrap.sh test in the fresh root" "$work_dir/test.log"
  grep -E 'tests passed|SKIP|skipped' "$work_dir/test.log" | tail -40
  step "bash launch/bootstrap.sh test (the README's test command)"
fi

echo "== steps"
printf '%s\n' "${steps[@]}"
release=$(awk -F= '$1 == "PRETTY_NAME" {gsub(/"/, "", $2); print $2}' /etc/os-release)
echo "PASS: in a fresh $release root the quickstart trained (first epoch ${first_epoch} s after the root was" \
  "ready), the test command's packages gave every tool the suite calls, and the package was made"
