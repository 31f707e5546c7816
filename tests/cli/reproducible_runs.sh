#!/usr/bin/env bash
# A run is reproducible: the same config, seed, data, number of ranks and kernels give the same parameters bit
# for bit.
#   - one rank, model.cpu_kernels auto: two runs are equal;
#   - one rank, each of ddptrain's own LSTM cells (packed, onednn_gemm, builtin; those this build and CPU
#     have): two runs are equal; for packed over oneDNN's sgemm a run on train.threads 2 equals them (each
#     thread's rows of the batch add up in the order one thread's would). Not so for packed over the BLAS
#     (a build without oneDNN: OpenBLAS's Haswell kernels round a block of rows by its size, seen in CI), nor
#     for the other two: oneDNN's sgemm under
#     onednn_gemm picks its kernel by the rows each thread hands it, and builtin's products run on the BLAS's
#     own threads, which split them as its kernel chooses (OpenBLAS's Haswell kernels, OPENBLAS_CORETYPE,
#     move the last bit between 1 and 2 threads where its SkylakeX ones do not). The test runs under
#     OPENBLAS_CORETYPE as CI's environment gives it, set or not.
#   - two ranks, the default backend: two runs are equal (on kernels named, since auto at one thread per
#     rank goes by a measurement of the FMA width that a heavily loaded machine can misjudge: CI saw two
#     such runs take different kernels);
#   - a run resumed under auto runs the kernels its checkpoint's run chose (the answer of the measurement of
#     the core's FMA units that auto makes, recorded in the checkpoint), not what its own start measures.
# Another kernel family or another number of ranks sums in another order: equal within rounding, not bits.
#   bash tests/cli/reproducible_runs.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output data.h5 --train 1200 --test 200 --vocab 300 --maxlen 20 >/dev/null
common=(--data.path data.h5 --model.embedding_dim 16 --model.hidden 16 --train.learning_rate 0.01
  --train.epochs 2 --log.progress lines)

# params RUN_DIR: the final parameters' values, one number a line.
params() {
  h5dump -m %.9g -d /params "$1/last.h5" | tail -n +2 >"$1.params" || fail "h5dump of $1/last.h5"
  echo "$1.params"
}

# run NAME ARGS...: one rank, no launcher; returns 3 where the build or CPU has not the kernels asked for.
run() {
  local name=$1 status=0
  shift
  "$ddptrain" "${common[@]}" --checkpoint.dir "$name" "$@" >"$name.log" 2>&1 || status=$?
  if [ "$status" -eq 2 ] && grep -q "model.cpu_kernels" "$name.log"; then return 3; fi
  [ "$status" -eq 0 ] || fail "run $name exited $status" "$name.log"
}

run auto-a
run auto-b
cmp -s "$(params auto-a)" "$(params auto-b)" || fail "two runs with model.cpu_kernels auto differ"
echo "ok: auto ($(grep -m1 -o 'cpu, [^[]*' auto-a.log)), two runs equal"

tried=0
named=""  # the first of ddptrain's own cells that ran, for the 2-rank runs
for kernels in packed onednn_gemm builtin; do
  status=0
  run "$kernels-1" --model.cpu_kernels "$kernels" --train.threads 1 || status=$?
  if [ "$status" -eq 3 ]; then
    echo "skip $kernels: $(tail -n 1 "$kernels-1.log")"
    continue
  fi
  run "$kernels-1b" --model.cpu_kernels "$kernels" --train.threads 1
  cmp -s "$(params "$kernels-1")" "$(params "$kernels-1b")" || fail "two runs with $kernels differ"
  tried=$((tried + 1))
  [ -n "$named" ] || named=$kernels
  # packed is thread-count invariant where its whole-sequence products run on oneDNN's sgemm; in a build
  # without oneDNN they go through the BLAS, whose kernels may round a block of rows by its size.
  if [ "$kernels" != packed ] || ! grep -q "the sgemm of oneDNN" "$kernels-1.log"; then
    echo "ok: $kernels, two runs equal"
    continue
  fi
  run "$kernels-2" --model.cpu_kernels "$kernels" --train.threads 2
  grep -q "^compute threads: 2 per rank" "$kernels-2.log" ||
    fail "the $kernels run did not say it ran on 2 threads" "$kernels-2.log"
  cmp -s "$(params "$kernels-1")" "$(params "$kernels-2")" ||
    fail "$kernels on 2 threads differs from 1 thread"
  echo "ok: $kernels, two runs equal, and on 2 threads too"
done
[ "$tried" -gt 0 ] || fail "none of ddptrain's own cells ran (builtin always should)"

for name in ranks-a ranks-b; do
  mpirun -np 2 "$ddptrain" "${common[@]}" --model.cpu_kernels "$named" --checkpoint.dir "$name" >"$name.log" 2>&1 ||
    fail "the 2-rank run $name failed" "$name.log"
done
cmp -s "$(params ranks-a)" "$(params ranks-b)" || fail "two 2-rank runs differ"
echo "ok: 2 ranks ($(grep -m1 -o '^backend [a-z]*' ranks-a.log), $named), two runs equal"

# The checkpoint records what auto measured (on AVX-512 cores, where it decides between oneDNN's LSTM and the
# packed tiles on one thread): flipped there, the resumed run must run the other kernels. Where the build
# lacks either (no oneDNN: the builtin cells either way), the answer decides nothing.
run auto-1 --train.threads 1
if ! grep -qE "cpu, LSTM on oneDNN .*AVX-512|cpu, LSTM cells over packed AVX-512" auto-1.log; then
  echo "skip: auto's measurement decides nothing here ($(grep -m1 -o 'cpu, [^[]*' auto-1.log))"
elif /usr/bin/python3 - <<'EOF'; then
import h5py, shutil, sys
shutil.copytree("auto-1", "auto-flipped")
with h5py.File("auto-flipped/last.h5", "r+") as f:
    if "avx512_fma_wide" not in f.attrs:
        sys.exit(1)
    f.attrs["avx512_fma_wide"] = 1 - int(f.attrs["avx512_fma_wide"])
    del f.attrs["header_checksum"]  # an edited checkpoint: read without its checksum
EOF
  run auto-flipped --train.threads 1 --train.epochs 3 --resume
  kernels_before=$(grep -m1 -o 'cpu, [^[]*' auto-1.log)
  kernels_after=$(grep -m1 -o 'cpu, [^[]*' auto-flipped.log)
  [ "$kernels_before" != "$kernels_after" ] ||
    fail "the resumed run did not take the kernels its checkpoint recorded ($kernels_after both times)" auto-flipped.log
  echo "ok: a resume takes auto's recorded choice ($kernels_before, then as recorded: $kernels_after)"
else
  echo "skip: the checkpoint records no measurement of auto (no AVX-512 here, or no h5py)"
fi
