# shellcheck shell=bash
# Sourced by the package tests: a fresh minimal root of this machine's Debian release (debootstrap
# --variant=minbase through launch/containers/base-image.sh, cached as a tarball in ROOT_CACHE_DIR) to chroot
# into, set up as a machine's own / would be: its / is a mount point (unshare --mount, which the cluster and
# container tests use, refuses a root that is not one), with /proc, /sys and /dev, the host's resolv.conf,
# and packages' services kept from starting (a chroot has no init).
#   enter_fresh_root SOURCE_DIR WORK_DIR ROOT_CACHE_DIR
# sets $root (the new root's path) and $release_codename, and unmounts and removes the root at exit.
#   package_test_arguments SOURCE_DIR WORK_DIR [ROOT_CACHE_DIR]
# sets $source_dir and $work_dir (made; both absolute) and $root_cache (WORK_DIR unless given), and sources
# tests/lib/skip.sh. fail MESSAGE [LOG...] ends the test, showing each log's end.

package_test_arguments() {
  source_dir=$(cd "$1" && pwd)
  work_dir=$2
  root_cache=${3:-$2}
  mkdir -p "$work_dir"
  work_dir=$(cd "$work_dir" && pwd)
  # shellcheck source=tests/lib/skip.sh
  source "$source_dir/tests/lib/skip.sh"
}

fail() {
  echo "FAIL: $1"
  shift
  for f in "$@"; do [ -f "$f" ] && { echo "--- $f"; tail -40 "$f"; }; done
  exit 1
}

enter_fresh_root() {
  local source_dir=$1 work_dir=$2 root_cache=$3 fs
  release_codename=$(awk -F= '$1 == "VERSION_CODENAME" {print $2}' /etc/os-release)
  local rootfs_tar=$work_dir/rootfs.tar
  SUITE=$release_codename bash "$source_dir/launch/containers/base-image.sh" --tarball-only "$rootfs_tar" \
    --cache "$root_cache" >"$work_dir/debootstrap.log" 2>&1 || fail "debootstrap" "$work_dir/debootstrap.log"
  root=$(mktemp -d "$work_dir/root.XXXXXX")
  fresh_root_mounts=()
  trap leave_fresh_root EXIT
  mount --bind "$root" "$root"
  fresh_root_mounts+=("$root")
  tar -C "$root" -xf "$rootfs_tar"
  rm -f "$rootfs_tar"
  # The tarball's / is mktemp's, 0700, which keeps the root's own users (munge's post-install script runs as
  # munge, apt's downloads as _apt) out of everything.
  chmod 755 "$root"
  for fs in proc sys dev; do
    mount --rbind "/$fs" "$root/$fs"
    mount --make-rslave "$root/$fs"
    fresh_root_mounts+=("$root/$fs")
  done
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
}

leave_fresh_root() {
  local i
  for ((i = ${#fresh_root_mounts[@]} - 1; i >= 0; i--)); do umount -l "${fresh_root_mounts[i]}" 2>/dev/null || true; done
  # Only remove the root once nothing is mounted inside it.
  if ! grep -qF " $root" /proc/mounts; then rm -rf "$root"; fi
}
