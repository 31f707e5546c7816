#!/usr/bin/env bash
# run.sh [--total] [--parallel N] BUILD_DIR SECONDS [TARGET...]: fuzzes each target (default: every
# tests/fuzz/fuzz_*.cpp) for a bounded time on a copy of its seed corpus and prints one summary line per target:
#   fuzz_npz: ok, 1234567 execs in 45 s (27434/s), cov: 1803, ft: 6012, corpus: 310
# SECONDS is each target's time; with --total it is the whole run's, shared evenly between the targets (each
# gets SECONDS x N / targets, rounded to whole rounds of N). --parallel N fuzzes N targets at a time, one core
# each (default 1).
# Exits 1 on any finding (crash, hang, leak, out-of-memory, sanitizer report), naming the input that caused it
# (saved as BUILD_DIR/fuzz-findings/<target>/crash-..., leak-..., timeout-..., oom-...), with the log's tail.
# Environment: FUZZ_JOBS (default 1) processes per target (libFuzzer's -fork); FUZZ_KEEP_CORPUS=1 keeps the
# grown corpora (BUILD_DIR/fuzz-corpus/<target>) for merging into tests/fuzz/corpus (see make_seeds.sh).
set -uo pipefail
usage() {
  echo "usage: $0 [--total] [--parallel N] BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
}
total="" at_once=1
while (($# > 0)); do
  case "$1" in
    --total) total=1; shift ;;
    --parallel) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; at_once=$2; shift 2 ;;
    *) break ;;
  esac
done
if (($# < 2)) || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then usage; fi
build=$(cd "$1" && pwd) seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
if ((${#targets[@]} == 0)); then
  # The targets whose source is here (a build folder may hold binaries of targets since removed).
  for source in "$here"/fuzz_*.cpp; do
    target=$(basename "$source" .cpp)
    [[ -x $build/tests/fuzz/$target ]] && targets+=("$target")
  done
fi
if ((${#targets[@]} == 0)); then
  echo "run.sh: no fuzz targets in $build/tests/fuzz (configure with -DDDPTRAIN_FUZZ=ON and build)" >&2
  exit 2
fi
if [[ -n $total ]]; then
  rounds=$(((${#targets[@]} + at_once - 1) / at_once))
  seconds=$((seconds / rounds))
  ((seconds > 0)) || { echo "run.sh: under 1 s per target" >&2; exit 2; }
  echo "fuzzing ${#targets[@]} targets, $at_once at a time, $seconds s each"
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# fuzz_one TARGET: fuzzes it and prints its summary; returns 1 on a finding.
fuzz_one() {
  local target=$1 failed=0 binary work findings log parallel status last execs cov ft corpus took rate artifacts artifact
  binary=$build/tests/fuzz/$target
  work=$build/fuzz-corpus/$target findings=$build/fuzz-findings/$target log=$build/fuzz-logs/$target.log
  rm -rf "$work" "$findings"
  mkdir -p "$work" "$findings" "$(dirname "$log")"
  [[ -d $here/corpus/$target ]] && cp "$here"/corpus/"$target"/* "$work"/ 2>/dev/null
  [[ -d $here/regressions/$target ]] && cp "$here"/regressions/"$target"/* "$work"/ 2>/dev/null
  # -timeout: one input running longer is a hang; -rss_limit_mb / -malloc_limit_mb: an input that makes
  # the reader allocate more is a finding; -detect_leaks: so is memory it loses.
  parallel=()
  ((${FUZZ_JOBS:-1} > 1)) && parallel=(-fork="$FUZZ_JOBS")
  "$binary" "$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$findings/" "${parallel[@]}" >"$log" 2>&1
  status=$?
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  execs=${execs:-$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")}
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+')
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+')
  corpus=$(grep -oE 'corp: [0-9]+' <<<"$last" | grep -oE '[0-9]+')
  took=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 | grep -oE '[0-9]+ second' | grep -oE '[0-9]+')
  took=${took:-$seconds}
  rate=$((${execs:-0} / (took > 0 ? took : 1)))
  artifacts=$(find "$findings" -type f | sort)
  if ((status != 0)) || [[ -n $artifacts ]]; then
    failed=1
    echo "$target: FINDING (exit $status) after ${execs:-?} execs, cov: ${cov:-?}, ft: ${ft:-?}; log $log"
    grep -E 'ERROR: |runtime error:|SUMMARY: |==[0-9]+== ?ERROR|Test unit written to|uncaught exception|terminate called|deadly signal' "$log" |
      head -20 | sed 's/^/  /'
    for artifact in $artifacts; do
      echo "  input: $artifact (replay: $binary $artifact)"
    done
    tail -40 "$log" | sed 's/^/  | /'
  else
    echo "$target: ok, ${execs:-?} execs in ${took} s (${rate}/s), cov: ${cov:-?}, ft: ${ft:-?}, corpus: ${corpus:-?}"
  fi
  [[ ${FUZZ_KEEP_CORPUS:-0} == 1 ]] || rm -rf "$work"
  return $failed
}

# N at a time; each summary is printed whole when its target ends.
failed=0
summaries=$(mktemp -d)
trap 'rm -rf "$summaries"' EXIT
declare -A running=()  # PID -> target
finish_one() {
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  cat "$summaries/${running[$pid]}"
  ((status == 0)) || failed=1
  unset "running[$pid]"
}
for target in "${targets[@]}"; do
  ((${#running[@]} < at_once)) || finish_one
  fuzz_one "$target" >"$summaries/$target" 2>&1 &
  running[$!]=$target
done
while ((${#running[@]} > 0)); do finish_one; done
exit $failed
