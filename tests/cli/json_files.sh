#!/usr/bin/env bash
# Every JSON file ddptrain writes is JSON that Python's json module reads, strictly (no NaN or Infinity
# tokens): metrics.jsonl and the timeline of a 2-rank run, and of a run whose loss became NaN, where the
# diverged numbers are null and "not_finite" says what they were. The first epoch's line says how long the
# process took to its first step (start_to_first_step_s: more than nothing, less than the whole command).
#   bash tests/cli/json_files.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir
"$ddptrain" prepare synthetic --output data.h5 --train 600 --test 100 --vocab 80 --maxlen 12 --seed 4 >/dev/null
common=(--data.path data.h5 --model.embedding_dim 8 --model.hidden 8 --train.epochs 2 --log.progress lines
  --log.timeline trace.json)
started=$(date +%s.%N)
mpirun -np 2 "$ddptrain" "${common[@]}" --checkpoint.dir healthy --comm.backend mpi >healthy.txt 2>&1 ||
  fail "the 2-rank run" healthy.txt
command_s=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
# A learning rate of 1e30 overflows the parameters in the first steps: the loss is NaN from then on (with the
# builtin LSTM kernels; oneDNN's saturating activations keep that loss finite, if huge).
"$ddptrain" "${common[@]}" --checkpoint.dir diverged --train.optimizer sgd --train.learning_rate 1e30 \
  --model.cpu_kernels builtin >diverged.txt 2>&1 || fail "the diverging run" diverged.txt

# strict_json FILE: the file (JSON lines for *.jsonl) parses, without Python's NaN and Infinity extensions.
strict_json() {
  python3 - "$1" <<'PY' || fail "$1 is not strict JSON" "$1"
import json, sys
def refuse(token):
    raise ValueError(f"{token} is not JSON")
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
if path.endswith(".jsonl"):
    lines = [json.loads(line, parse_constant=refuse) for line in text.splitlines()]
    assert lines and all(isinstance(line, dict) for line in lines), "one object per line"
else:
    events = json.loads(text, parse_constant=refuse)
    assert isinstance(events, list) and events, "a non-empty array of trace events"
PY
}

written=0
for file in healthy/*.json healthy/*.jsonl diverged/*.json diverged/*.jsonl; do
  strict_json "$file"
  written=$((written + 1))
done
[ "$written" -eq 4 ] || fail "expected metrics.jsonl and trace.json in both runs, checked $written files"

# The diverged run says so: null losses, and why.
[ "$(json_field diverged/metrics.jsonl loss epoch=2)" = nan ] || fail "epoch 2's loss is not null with reason nan" diverged/metrics.jsonl
json_field diverged/metrics.jsonl not_finite epoch=2 | grep -q '"val_loss": "nan"' ||
  fail "no not_finite reason for val_loss" diverged/metrics.jsonl
[ -s diverged/curves.svg ] || fail "no learning curves for the diverged run"
# ... and the console says it once, with the cure.
[ "$(grep -c '^warning: the .* loss is NaN in epoch .*: the run diverged (lower train.learning_rate' diverged.txt)" -eq 1 ] ||
  fail "the diverged run is not warned of once" diverged.txt
grep -q "^warning:" healthy.txt && fail "a healthy run warned" healthy.txt
# The healthy run's numbers are numbers.
json_field healthy/metrics.jsonl loss epoch=2 | grep -qE '^[0-9]+\.[0-9]+' || fail "epoch 2's loss" healthy/metrics.jsonl
first_step=$(json_field healthy/metrics.jsonl start_to_first_step_s epoch=1)
awk -v s="$first_step" -v c="$command_s" 'BEGIN { exit !(s > 0 && s < c) }' ||
  fail "start_to_first_step_s is $first_step, not between 0 and the command's $command_s s" healthy/metrics.jsonl
[ -z "$(json_field healthy/metrics.jsonl start_to_first_step_s epoch=2)" ] ||
  fail "epoch 2 repeats start_to_first_step_s" healthy/metrics.jsonl
echo "ok: $written JSON files parse strictly; a NaN loss is null with its reason; the first step came" \
  "$first_step s after the process's start (the command took $command_s s)"
