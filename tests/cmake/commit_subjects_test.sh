#!/usr/bin/env bash
# Commit subjects are at most 72 characters, the details in the body (ARCHITECTURE.md, "Contributing").
# The rule holds for every commit made since it began: commits whose committer date is at or after
# RULE_SINCE (2026-11-29 00:49 UTC, just before the first commit under the rule). A date, unlike a boundary
# commit's hash, needs no ancestry: it holds on every branch and across merges. Older history keeps its long
# subjects. Where the source is no git checkout (a tarball, the package test's copy) there is nothing to
# check, and the test skips, saying why.
#   bash tests/cmake/commit_subjects_test.sh source-dir
set -euo pipefail
# shellcheck source=tests/lib/skip.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/skip.sh"
source_dir=$(cd "$1" && pwd -P)
readonly RULE_SINCE=1795913366
readonly LIMIT=72

command -v git >/dev/null || skip_missing git "git is not installed"
top=$(git -C "$source_dir" rev-parse --show-toplevel 2>/dev/null || true)
if [ -z "$top" ] || [ "$(cd "$top" && pwd -P)" != "$source_dir" ]; then
  skip_because "$source_dir is not a git checkout (a tarball or a copy): no commits to check"
fi
git -C "$source_dir" rev-parse --verify -q HEAD >/dev/null || skip_because "the checkout has no commit yet"

checked=0
long=()
while IFS=' ' read -r time hash subject; do
  [ "$time" -ge "$RULE_SINCE" ] || continue
  checked=$((checked + 1))
  [ "${#subject}" -le "$LIMIT" ] || long+=("${hash:0:10} (${#subject} characters): $subject")
done < <(git -C "$source_dir" log --no-show-signature --format='%ct %H %s' HEAD)

if [ "${#long[@]}" -gt 0 ]; then
  echo "FAIL: ${#long[@]} commit subject(s) longer than $LIMIT characters (put the details in the body;"
  echo "      git commit --amend, or git rebase -i to reword one before it is merged):"
  printf '  %s\n' "${long[@]}"
  exit 1
fi
echo "$checked commit subject(s) since the rule began, each at most $LIMIT characters"
