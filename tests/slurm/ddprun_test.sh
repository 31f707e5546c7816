#!/usr/bin/env bash
# launch/ddprun: one rank per GPU named by CUDA_VISIBLE_DEVICES, the CPU fallback (2 ranks, with a message),
# --np, bad --np (exit 2), and a real CPU run that trains one epoch on 2 ranks.
#   bash tests/slurm/ddprun_test.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
ddprun=$src/launch/ddprun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export DDPTRAIN=$ddptrain

expect_command() {  # expected command line, then ddprun's arguments; CUDA_VISIBLE_DEVICES from the caller
  local expected=$1 got
  shift
  got=$("$ddprun" --dry-run "$@" 2>"$work/err.txt") || { echo "FAIL: ddprun $* failed"; cat "$work/err.txt"; exit 1; }
  [ "$got" = "$expected" ] || { echo "FAIL: ddprun $*: got '$got', expected '$expected'"; exit 1; }
}

CUDA_VISIBLE_DEVICES=0,1,3 expect_command "mpirun -np 3 --bind-to none $ddptrain --config x.ini" -- --config x.ini
CUDA_VISIBLE_DEVICES=2 expect_command "mpirun -np 1 --bind-to none $ddptrain --config x.ini" -- --config x.ini
CUDA_VISIBLE_DEVICES=0,1 expect_command "mpirun -np 4 --bind-to none $ddptrain --config x.ini" --np 4 -- --config x.ini
# CUDA reads the list up to its first entry that is no device.
CUDA_VISIBLE_DEVICES=0,-1,2 expect_command "mpirun -np 1 --bind-to none $ddptrain --config x.ini" -- --config x.ini
CUDA_VISIBLE_DEVICES="GPU-8a1f2c3d-0000-1111-2222-333344445555, 1" \
  expect_command "mpirun -np 2 --bind-to none $ddptrain --config x.ini" -- --config x.ini
# DDPTRAIN may be a command that runs ddptrain (a container's), split on blanks as the batch scripts split it.
CUDA_VISIBLE_DEVICES=0 DDPTRAIN="env $ddptrain" expect_command "mpirun -np 1 --bind-to none env $ddptrain --a b" -- --a b
for none in "" NoDevFiles -1 " " "x,0"; do
  CUDA_VISIBLE_DEVICES=$none expect_command "mpirun -np 2 --bind-to none $ddptrain --a b" -- --a b
  grep -q "no GPU visible" "$work/err.txt" ||
    { echo "FAIL: no CPU fallback message for CUDA_VISIBLE_DEVICES='$none'"; cat "$work/err.txt"; exit 1; }
done
CUDA_VISIBLE_DEVICES='' MPIRUN_ARGS="--oversubscribe --tag-output" \
  expect_command "mpirun -np 2 --bind-to none --oversubscribe --tag-output $ddptrain --a b" -- --a b

# --help: the usage and what ddprun does, on stdout, exit 0.
"$ddprun" --help >"$work/help.txt" 2>&1 || { echo "FAIL: ddprun --help failed"; cat "$work/help.txt"; exit 1; }
if ! grep -q "^usage: launch/ddprun" "$work/help.txt" || ! grep -q "MPIRUN_ARGS" "$work/help.txt"; then
  echo "FAIL: ddprun --help"
  cat "$work/help.txt"
  exit 1
fi

status=0
"$ddprun" --np 0 -- --config x.ini 2>"$work/err.txt" || status=$?
if [ "$status" -ne 2 ] || ! grep -q -- "--np 0" "$work/err.txt"; then
  echo "FAIL: --np 0 gave exit $status, expected 2 with a message naming it"
  exit 1
fi
status=0
"$ddprun" --np= -- --config x.ini 2>"$work/err.txt" || status=$?
if [ "$status" -ne 2 ] || ! grep -q -- "--np (empty)" "$work/err.txt"; then
  echo "FAIL: an empty --np= gave exit $status, expected 2 with a message naming it"
  exit 1
fi
status=0
DDPTRAIN=$work/missing "$ddprun" -- --config x.ini 2>"$work/err.txt" || status=$?
if [ "$status" -ne 2 ] || ! grep -q "$work/missing" "$work/err.txt"; then
  echo "FAIL: a missing binary gave exit $status, expected 2 with a message naming it"
  exit 1
fi

# A word with a space is printed quoted, so that the dry run's line runs as printed.
CUDA_VISIBLE_DEVICES=0 expect_command "mpirun -np 1 --bind-to none $ddptrain --config my\\ cfg.ini" -- --config "my cfg.ini"
# A rank command that is no program (mpirun's 127), or no mpirun at all, is a failure, never exit 0.
status=0
CUDA_VISIBLE_DEVICES='' DDPTRAIN="env $work/missing" "$ddprun" -- --config x.ini >"$work/out.txt" 2>&1 || status=$?
[ "$status" -ne 0 ] || { echo "FAIL: ddprun returned 0 when the ranks' command was no program"; cat "$work/out.txt"; exit 1; }
mkdir "$work/no-mpirun"
ln -s "$(command -v bash)" "$work/no-mpirun/bash"
status=0
PATH=$work/no-mpirun "$(command -v bash)" "$ddprun" -- --config x.ini >"$work/out.txt" 2>&1 || status=$?
if [ "$status" -ne 2 ] || ! grep -q "no mpirun in PATH" "$work/out.txt"; then
  echo "FAIL: without mpirun ddprun gave exit $status, expected 2 with a message"
  cat "$work/out.txt"
  exit 1
fi

# A real run on this machine's CPUs.
cd "$work"
"$ddptrain" prepare synthetic --output data.h5 --train 1000 --test 200 --vocab 200 --maxlen 16 --seed 5 >/dev/null
CUDA_VISIBLE_DEVICES='' "$ddprun" -- --config "$src/launch/configs/quickstart.ini" --data.path data.h5 \
  --checkpoint.dir run --train.epochs 1 --model.embedding_dim 8 --model.hidden 8 --log.progress lines \
  >out.txt 2>&1 || { echo "FAIL: the CPU run failed"; cat out.txt; exit 1; }
grep -q "2 rank(s)" out.txt || { echo "FAIL: not one job of 2 ranks"; cat out.txt; exit 1; }
grep -qE '"epoch": ?1,' run/metrics.jsonl || { echo "FAIL: no epoch in run/metrics.jsonl"; cat out.txt; exit 1; }

# Ctrl-C: SIGINT to ddprun's process group, as a terminal sends it. Every rank checkpoints and ddprun returns
# 75; the run then resumes to its end.
stop_run=(--data.path data.h5 --checkpoint.dir stopped --train.epochs 400 --model.embedding_dim 8
  --model.hidden 8 --log.progress lines)
set -m  # ddprun in a process group of its own, as a terminal's foreground job
CUDA_VISIBLE_DEVICES='' "$ddprun" -- "${stop_run[@]}" >stop.txt 2>&1 &
job=$!
set +m
for _ in $(seq 600); do
  [ -s stopped/metrics.jsonl ] && break
  sleep 0.05
done
[ -s stopped/metrics.jsonl ] || { echo "FAIL: no epoch within 30 s"; cat stop.txt; exit 1; }
kill -INT -- "-$job"
status=0
wait "$job" || status=$?
[ "$status" -eq 75 ] || { echo "FAIL: ddprun returned $status after Ctrl-C, expected 75"; cat stop.txt; exit 1; }
grep -q "^stopped by SIGUSR1 after epoch [0-9]*" stop.txt || { echo "FAIL: no stop message"; cat stop.txt; exit 1; }
[ -f stopped/last.h5 ] || { echo "FAIL: no last.h5"; exit 1; }
done_epochs=$(grep -c '"epoch"' stopped/metrics.jsonl)
CUDA_VISIBLE_DEVICES='' "$ddprun" -- "${stop_run[@]/400/$((done_epochs + 1))}" --resume auto >resume.txt 2>&1 ||
  { echo "FAIL: resume after Ctrl-C"; cat resume.txt; exit 1; }
grep -q "resumed from" resume.txt || { echo "FAIL: did not resume"; cat resume.txt; exit 1; }
echo "ok: ddprun counts GPUs, falls back to 2 CPU ranks, trains, and a Ctrl-C checkpoints (exit 75) and resumes"
