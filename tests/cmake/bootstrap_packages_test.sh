#!/usr/bin/env bash
# launch/bootstrap.sh installs what the suite needs: every package a test's skip_missing names (tests/lib/
# skip.sh) and every package of bootstrap.sh's own list of the suite's tools (check-tools) is in the packages
# `bootstrap.sh test` installs, or is one that every Debian root has (Essential: yes). A test that starts
# calling a new program, and names its package as it skips without it, fails here until bootstrap.sh
# installs that package. The fresh-root test (tests/package/fresh_root_test.sh) then installs the list for
# real and runs check-tools.
#   bash tests/cmake/bootstrap_packages_test.sh SOURCE_DIR
set -uo pipefail
cd "${1:?usage: bootstrap_packages_test.sh SOURCE_DIR}" || exit 1
# shellcheck source=tests/lib/skip.sh
source tests/lib/skip.sh
command -v dpkg-query >/dev/null || skip_because "no dpkg-query (not a Debian-based system): Essential packages unknown"
listed=" $(bash launch/bootstrap.sh packages test) "
failures=0

# known PACKAGE WHERE: the package is installed by bootstrap.sh test, or Essential.
known() {
  [[ $listed == *" $1 "* ]] && return 0
  [ "$(dpkg-query -W -f='${Essential}' "$1" 2>/dev/null)" = yes ] && return 0
  echo "FAIL: $2 names the package $1, which bash launch/bootstrap.sh test does not install"
  failures=$((failures + 1))
}

calls=0
while IFS=: read -r file line text; do
  package=$(sed -E 's/.*skip_missing (--part )?//; s/ .*//' <<<"$text")
  if ! [[ $package =~ ^[a-z0-9][a-z0-9.+-]+$ ]]; then
    echo "FAIL: $file:$line: skip_missing must name its package literally: $text"
    failures=$((failures + 1))
    continue
  fi
  known "$package" "$file:$line"
  calls=$((calls + 1))
done < <(grep -rnE --include='*.sh' 'skip_missing ' tests | grep -vE '^tests/(lib/skip|cmake/bootstrap_packages_test)\.sh:' | grep -vE ':[0-9]+: *#')
[ "$calls" -gt 10 ] || { echo "FAIL: only $calls skip_missing calls found in tests/: the search is broken"; exit 1; }

tools=0
while read -r entry; do
  known "${entry#*:}" "bootstrap.sh's suite_tools (${entry%%:*})"
  tools=$((tools + 1))
done < <(sed -n '/^suite_tools=(/,/)/p' launch/bootstrap.sh | tr ' ()' '\n' | grep -E '^[^=#]+:[a-z0-9.+-]+$')
[ "$tools" -gt 10 ] || { echo "FAIL: only $tools entries read from bootstrap.sh's suite_tools"; exit 1; }

[ "$failures" -eq 0 ] || exit 1
echo "PASS: the $calls skip_missing calls of tests/ and the $tools tools of suite_tools name packages that bootstrap.sh test installs or every Debian root has"
