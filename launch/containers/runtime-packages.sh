#!/usr/bin/env bash
# The Debian/Ubuntu packages that hold the shared libraries a binary loads, one per line, sorted, so that no
# package name (they change between releases: libopenmpi3 became libopenmpi3t64, libhdf5-103-1
# libhdf5-103-1t64) is written anywhere by hand. The image recipes no longer need it (they install ddptrain's
# Debian package, whose dependencies dpkg-shlibdeps reads off the binary); it serves a binary copied into an
# image or a machine without the package, as the recipes used it before:
#   bash launch/containers/runtime-packages.sh path/to/binary > runtime-packages.txt
#   bash launch/containers/runtime-packages.sh --not-installed runtime-packages.txt
# The second form, for a runtime stage, prints those of the list that are not installed yet: the CUDA
# images hold their cuDNN and NCCL packages (apt-mark hold), and asking apt for a held package that has a
# newer version fails the build, so the packages the base image has are left alone.
# Libraries that no package holds (a toolkit unpacked from a tarball) are named on stderr and left out: the
# runtime image must bring them itself (check with ldd once the binary is installed).
# Exit status: 0, or 1 with one line on stderr when the binary is missing or ldd cannot resolve a library.
set -euo pipefail
if [ "${1:-}" = --not-installed ]; then
  list=${2:?usage: runtime-packages.sh --not-installed LIST}
  [ -f "$list" ] || { echo "runtime-packages.sh: $list: no such file" >&2; exit 1; }
  while read -r package; do
    [ -z "$package" ] || [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" = "install ok installed" ] ||
      echo "$package"
  done <"$list"
  exit 0
fi
binary=${1:?usage: runtime-packages.sh BINARY | --not-installed LIST}
[ -f "$binary" ] || { echo "runtime-packages.sh: $binary: no such file" >&2; exit 1; }
libraries=$(ldd "$binary") || { echo "runtime-packages.sh: $binary: ldd failed" >&2; exit 1; }
missing=$(awk '/not found/ {print $1}' <<<"$libraries" | paste -sd' ')
[ -z "$missing" ] || { echo "runtime-packages.sh: $binary: libraries not found: $missing" >&2; exit 1; }

# The package that owns PATH. dpkg records the path it unpacked, which is not always the one ldd prints:
# the loader may go through /lib (a link to /usr/lib on merged-/usr systems) and soname links.
owner() {
  local path=$1 real candidate
  real=$(realpath "$path")
  for candidate in "$path" "$real" "${path#/usr}" "${real#/usr}" "/usr${path}" "/usr${real}"; do
    dpkg-query -S "$candidate" 2>/dev/null | awk -F': ' '!/^diversion/ && !found++ { sub(/:[^:]*$/, "", $1); print $1 }' |
      grep . && return 0
  done
  return 1
}

while read -r path; do
  owner "$path" || echo "runtime-packages.sh: $path belongs to no package: the runtime image must provide it" >&2
done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$libraries") | sort -u
