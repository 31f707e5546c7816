#!/usr/bin/env bash
# A local Debian base image for the CPU image, made without a registry: a minimal root (debootstrap
# --variant=minbase) from the mirror the host's apt uses, imported into podman's storage, where buildah finds
# it by name (launch/containers/Containerfile's BUILD_BASE and RUN_BASE).
#   bash launch/containers/base-image.sh [--cache DIR] [--tag NAME]   ddptrain-base:bookworm (default tag)
#   bash launch/containers/base-image.sh --tarball-only OUT.tar       only the root, as a tarball
# The root is cached as DIR/debootstrap-SUITE-minbase.tar (DIR: --cache, else $DDPTRAIN_BASE_CACHE, else
# none) and reused when present, which saves the download (a few minutes) on a rerun. --tarball-only reuses
# it too when a cache is given. Environment: SUITE (default: the host's release on a Debian host, else
# bookworm), MIRROR (default: the first mirror the host's apt uses for SUITE, else deb.debian.org).
# As root (debootstrap and podman's storage need it). The first run writes /etc/containers/containers.conf
# with `default_ulimits = []` when that file is absent: podman otherwise sets rlimits (nproc) that machines
# which run inside a container of their own may forbid. An existing file is left alone.
set -euo pipefail

host_release() {
  # shellcheck disable=SC1091
  (. /etc/os-release && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}")
}
suite=${SUITE:-$(host_release || true)}
suite=${suite:-bookworm}
cache=${DDPTRAIN_BASE_CACHE:-}
tag=""
tarball_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache=${2:?--cache needs a folder}; shift 2 ;;
    --tag) tag=${2:?--tag needs a name}; shift 2 ;;
    --tarball-only) tarball_only=${2:?--tarball-only needs a file}; shift 2 ;;
    *) echo "usage: base-image.sh [--cache DIR] [--tag NAME] | --tarball-only OUT.tar [--cache DIR]" >&2; exit 2 ;;
  esac
done
tag=${tag:-ddptrain-base:$suite}
[ "$(id -u)" -eq 0 ] || { echo "base-image.sh: run as root (debootstrap, podman's storage)" >&2; exit 1; }

# The mirror the host's apt uses for the suite: deb822 sources first, then one-line sources; a site's own
# mirror is then used inside the image too.
host_mirror() {
  local uri="" f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    if awk '/^Suites:/' "$f" | grep -qw -- "$suite"; then
      uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
      [ -z "$uri" ] || break
    fi
  done
  [ -n "$uri" ] || uri=$(awk -v s="$suite" '$1 == "deb" && $3 == s {print $2; exit}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null) || true
  echo "${uri:-http://deb.debian.org/debian}"
}
mirror=${MIRROR:-$(host_mirror)}

# make_tarball OUT: the debootstrap root as a tarball (numeric owners, apt's downloaded packages left out).
# Written beside OUT under a name of its own and renamed, so an interrupted run, or two runs at once (the
# package test unpacks the same root), leave no truncated cache behind.
make_tarball() (
  out=$1
  root=$(mktemp -d "${TMPDIR:-/tmp}/ddptrain-root.XXXXXX")
  # debootstrap mounts /proc and /sys inside the root while it works; unmount what a failure left behind.
  trap 'umount -R "$root/proc" "$root/sys" 2>/dev/null || true; rm -rf "$root" "$root.log"' EXIT
  echo "== debootstrap --variant=minbase $suite from $mirror"
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  mkdir -p "$(dirname "$out")"
  part=$(mktemp "$out.XXXXXX")
  tar -C "$root" --numeric-owner -cf "$part" . || { rm -f "$part"; exit 1; }
  chmod 644 "$part"
  mv "$part" "$out"
)

# The cached root when there is one, else a fresh one (kept in the cache when there is one).
tarball() {  # prints the tarball's path; OUT for --tarball-only
  local want=$1 cached=""
  [ -z "$cache" ] || cached=$cache/debootstrap-$suite-minbase.tar
  if [ -n "$cached" ] && [ -f "$cached" ]; then
    echo "== reusing $cached" >&2
    [ -z "$want" ] || cp "$cached" "$want"
  else
    make_tarball "${cached:-$want}" >&2
    [ -z "$cached" ] || [ -z "$want" ] || cp "$cached" "$want"
  fi
  echo "${want:-$cached}"
}

if [ -n "$tarball_only" ]; then
  tarball "$tarball_only" >/dev/null
  echo "== $tarball_only"
  exit 0
fi

command -v podman >/dev/null || { echo "base-image.sh: podman is not installed" >&2; exit 1; }
conf=/etc/containers/containers.conf
if [ -e "$conf" ]; then
  echo "== $conf exists: left as it is"
else
  mkdir -p /etc/containers
  printf '%s\n' '# Written by ddptrain launch/containers/base-image.sh: no rlimits set in containers, which' \
    '# machines that run in a container of their own may forbid.' '[containers]' 'default_ulimits = []' >"$conf"
  echo "== wrote $conf (default_ulimits = [])"
fi

scratch=""
[ -n "$cache" ] || { scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT; }
tar_path=$(tarball "${scratch:+$scratch/root.tar}")
# The root has no image configuration: give it a PATH and a shell, as Debian's own images have.
podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' --quiet "$tar_path" "$tag" >/dev/null
echo "== imported $tag"
