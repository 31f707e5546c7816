#!/usr/bin/env bash
# A minimal root of this machine's distribution, as a tarball: the fresh root the package test installs into.
#   bash tests/package/rootfs_tarball.sh OUT.tar
# debootstrap --variant=minbase, for the release (/etc/os-release) and from the first mirror and components
# apt uses here (deb822 .sources or sources.list), so it reaches what the machine's apt reaches.
set -euo pipefail
out=${1:?usage: rootfs_tarball.sh OUT.tar}
# shellcheck disable=SC1091
. /etc/os-release
suite=${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}
mirror="" components=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  uris=$(awk '/^URIs:/ {print $2; exit}' "$f")
  if awk '/^Suites:/' "$f" | grep -qw "$suite" && [ -n "$uris" ]; then
    mirror=$uris
    components=$(awk '/^Components:/ {$1=""; print; exit}' "$f" | xargs | tr ' ' ,)
    break
  fi
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  read -r mirror components < <(awk -v s="$suite" '$1 == "deb" && $3 == s {m=$2; $1=$2=$3=""; print m, $0; exit}' \
    /etc/apt/sources.list)
  components=$(echo "$components" | xargs | tr ' ' ,)
fi
[ -n "$mirror" ] || { echo "rootfs_tarball.sh: no apt source for $suite found" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "debootstrap --variant=minbase --components=${components:-main} $suite $mirror"
debootstrap --variant=minbase --components="${components:-main}" "$suite" "$dir" "$mirror"
tar -C "$dir" -cf "$out.part" .
mv "$out.part" "$out"
