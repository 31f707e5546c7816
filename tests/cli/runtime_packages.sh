#!/usr/bin/env bash
# launch/containers/runtime-packages.sh, which the container recipes use to pick their runtime packages, on
# the ddptrain just built: the packages it prints are installed here, their files hold every library ldd
# resolves for ddptrain (but those it names on stderr as belonging to no package), --not-installed leaves out
# what is installed, and a missing binary or an unresolvable library is one error line and exit 1.
#   bash tests/cli/runtime_packages.sh path/to/ddptrain source-dir
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -uo pipefail
ddptrain=$1
script=$2/launch/containers/runtime-packages.sh
# shellcheck source=tests/lib/skip.sh
source "$(dirname "$0")/../lib/skip.sh"
command -v dpkg-query >/dev/null || skip_because "no dpkg-query (not a Debian-based system)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

bash "$script" "$ddptrain" >"$work/packages" 2>"$work/stderr" || { cat "$work/stderr"; fail "exit status $?"; }
[ -s "$work/packages" ] || fail "no packages printed"
echo "$(wc -l <"$work/packages") packages; belonging to no package:"
cat "$work/stderr"

: >"$work/files"
while read -r package; do
  [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" = "install ok installed" ] ||
    fail "$package is not an installed package"
  dpkg-query -L "$package" | sed 's|.*/||' >>"$work/files"
done <"$work/packages"
sort -u -o "$work/files" "$work/files"

# Every resolved library: its name, or the name of the file it links to, is in a listed package (the
# packages' own files), unless the script said no package holds it.
while read -r path; do
  grep -qF "$path belongs to no package" "$work/stderr" && continue
  name=${path##*/}
  real=$(realpath "$path")
  grep -qxF "$name" "$work/files" || grep -qxF "${real##*/}" "$work/files" ||
    fail "$path is in none of the listed packages"
done < <(ldd "$ddptrain" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
# The engine's own dependencies are among them (whatever the release calls their packages).
for library in libmpi libhdf5 libboost_program_options libopenblas; do
  grep -q "^$library" "$work/files" || fail "no package of $library listed"
done

# --not-installed: of a list, the packages not installed here (the runtime stage installs only those).
printf '%s\n' "$(head -n 1 "$work/packages")" ddptrain-no-such-package "" >"$work/list"
bash "$script" --not-installed "$work/list" >"$work/missing" || fail "--not-installed: exit status $?"
[ "$(cat "$work/missing")" = ddptrain-no-such-package ] ||
  fail "--not-installed printed '$(cat "$work/missing")', expected only ddptrain-no-such-package"

# A missing binary.
status=0
bash "$script" "$work/no-such-binary" >"$work/out" 2>"$work/err" || status=$?
[ "$status" -eq 1 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -q "no-such-binary: no such file" "$work/err" ||
  fail "missing binary: status $status, stderr: $(cat "$work/err")"

# A library the loader cannot find: a program linked against a library that was then removed.
if command -v cc >/dev/null; then
  echo 'int gone(void) { return 1; }' >"$work/gone.c"
  echo 'int gone(void); int main(void) { return gone(); }' >"$work/main.c"
  cc -shared -fPIC -o "$work/libgone.so" "$work/gone.c" &&
    cc -o "$work/uses-gone" "$work/main.c" -L"$work" -lgone || fail "could not build the test program"
  rm "$work/libgone.so"
  status=0
  bash "$script" "$work/uses-gone" >"$work/out" 2>"$work/err" || status=$?
  [ "$status" -eq 1 ] && grep -q "libraries not found: libgone.so" "$work/err" ||
    fail "unresolvable library: status $status, stderr: $(cat "$work/err")"
else
  skip_missing --part build-essential "no C compiler (cc): the unresolvable-library case is not checked"
fi
echo "PASS"
