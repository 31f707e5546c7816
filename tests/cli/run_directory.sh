#!/usr/bin/env bash
# A run directory belongs to one run, and --resume checks what it resumes:
#   - a second run into a used checkpoint.dir is refused (exit 2, one line naming the ways out), and
#     replaces it only with --checkpoint.overwrite true; every metrics.jsonl line names its run
#   - --resume auto with other data is refused (exit 2, one line) unless checkpoint.allow_data_change; then
#     the best epoch is chosen afresh among those judged on the new data
#   - --resume auto of a finished run says so, exits 0 and writes nothing
#   - data.validation_split 0.1: epochs report val_*, best.h5 is the epoch of the lowest val_loss, and the
#     test split is scored once at the end, on best.h5
#   - two runs at once in one directory: the second is refused while the first holds its lock
#   - resume refuses another model.mask_padding; a directory where the run writes a file is refused before
#     training; best.h5 that is a link is replaced, its target untouched; a lost best.h5 is restored
#   bash tests/cli/run_directory.sh path/to/ddptrain source-dir
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir


"$ddptrain" prepare synthetic --output data.h5 --train 1200 --test 300 --vocab 300 --maxlen 20 >/dev/null
"$ddptrain" prepare synthetic --output other.h5 --train 1200 --test 300 --vocab 300 --maxlen 20 --seed 9 \
  >/dev/null
train=("$ddptrain" --checkpoint.dir run --model.embedding_dim 16 --model.hidden 16 --train.learning_rate 0.01
  --log.progress lines)

# 1. One run per directory.
"${train[@]}" --data.path data.h5 --train.epochs 3 --data.validation_split 0.1 >first.txt 2>&1 || fail "first run" first.txt
first_id=$(grep -oP '^run \K\S+' first.txt) || fail "no run id in the log" first.txt
cp run/best.h5 best-before.h5
expect_user_error "a second run into run/" "--checkpoint.overwrite true" "${train[@]}" --data.path data.h5 \
  --train.epochs 3
grep -qF "holds another run" bad_err.txt || fail "the refusal does not say why" bad_err.txt
cmp -s run/best.h5 best-before.h5 || fail "the refused run changed best.h5"
[ "$(json_field run/metrics.jsonl run_id "run_id=$first_id" | wc -l)" -eq 4 ] ||
  fail "metrics.jsonl: 3 epochs and a test line of run $first_id expected" run/metrics.jsonl
json_field run/metrics.jsonl time | grep -q '^20[0-9][0-9]-[01][0-9]-[0-3][0-9]T' || fail "no timestamps" run/metrics.jsonl

# 2. The validation split: val_* per epoch, best.h5 on the lowest val_loss, test once at the end.
grep -qF "train 1080, val 120 (the last rows of /train), test 300" first.txt || fail "the data plan" first.txt
[ "$(grep -c ' - val_loss: ' first.txt)" -eq 3 ] || fail "epoch lines do not report val_loss" first.txt
[ "$(grep -c '^Test (best.h5, epoch [1-3]) - test_loss: ' first.txt)" -eq 1 ] || fail "no single test line" first.txt
best_epoch=$(json_field run/metrics.jsonl val_loss,epoch | sort -g | head -1 | cut -d' ' -f2)
grep -qF "Test (best.h5, epoch $best_epoch)" first.txt || fail "best.h5 is not epoch $best_epoch" first.txt run/metrics.jsonl
"$ddptrain" evaluate --checkpoint run/best.h5 --data data.h5 >evaluate.txt || fail "evaluate" evaluate.txt
test_loss=$(json_field run/metrics.jsonl test_loss event=test)
awk -v a="$test_loss" -v b="$(grep -oP 'loss \K[0-9.]+' evaluate.txt)" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }' ||
  fail "the run's test_loss $test_loss is not evaluate's of best.h5" evaluate.txt

# A file with /val (prepare --val-fraction) validates on it under data.validation = auto.
"$ddptrain" prepare synthetic --output with-val.h5 --train 1200 --test 300 --vocab 300 --maxlen 20 \
  --val-fraction 0.1 >/dev/null
"$ddptrain" --checkpoint.dir val-run --data.path with-val.h5 --train.epochs 1 --model.hidden 16 >val.txt 2>&1 ||
  fail "training with /val" val.txt
grep -qF "train 1080, val 120 (/val), test 300" val.txt || fail "/val is not the validation" val.txt

# 3. Resume checks its data, and a finished run says so.
expect_user_error "resume on other data" "checkpoint.allow_data_change" "${train[@]}" --data.path other.h5 --train.epochs 3 --resume auto
grep -qF "was trained on data.h5" bad_err.txt || fail "the refusal does not name the checkpoint's data" bad_err.txt
"${train[@]}" --data.path data.h5 --train.epochs 3 --resume auto >again.txt 2>&1 || fail "resume of a finished run" again.txt
grep -qF "already finished its 3 epochs" again.txt || fail "a finished run is not said to be finished" again.txt
grep -q "^Epoch" again.txt && fail "a finished run trained again" again.txt
[ "$(wc -l <run/metrics.jsonl)" -eq 4 ] || fail "a finished run wrote metrics" run/metrics.jsonl
# A run stopped while it scored its test split (the last thing it does) scores it when resumed, once.
grep -vF '"event":"test"' run/metrics.jsonl >untested.jsonl && cp untested.jsonl run/metrics.jsonl
"${train[@]}" --data.path data.h5 --train.epochs 3 --resume auto >retest.txt 2>&1 || fail "resume without a test score" retest.txt
grep -q "^Test (best.h5, epoch $best_epoch)" retest.txt || fail "the missing test score was not made" retest.txt
[ "$(json_field run/metrics.jsonl test_loss event=test | wc -l)" -eq 1 ] || fail "no single test line" run/metrics.jsonl
"${train[@]}" --data.path data.h5 --train.epochs 3 --resume auto >again.txt 2>&1 || fail "resume of a finished run" again.txt
grep -q "^Test" again.txt && fail "a finished run with its test score scored it again" again.txt
"${train[@]}" --train.epochs 4 --data.path other.h5 --resume auto --checkpoint.allow_data_change true >tune.txt 2>&1 || fail "allowed data change" tune.txt
grep -q "^Epoch 4/4" tune.txt || fail "the allowed data change did not train epoch 4" tune.txt
# The old val_loss was measured on other rows: epoch 4, the first judged on other.h5, is best.h5 and the test
# score is its, whatever the old epochs' val_loss was.
grep -qF "was judged on other rows: the next epoch replaces it" tune.txt || fail "the best epoch is not chosen afresh" tune.txt
grep -qF "Test (best.h5, epoch 4)" tune.txt || fail "best.h5 is not the first epoch on the new data" tune.txt
# Other held-out rows change the training rows: said, and the run goes on.
"${train[@]}" --train.epochs 5 --data.path other.h5 --data.validation_split 0.2 --resume auto >split.txt 2>&1 ||
  fail "resume with another validation split" split.txt
grep -qF 'was trained on rows "train 1080, val 120' split.txt && grep -qF 'this run'"'"'s are "train 960, val 240' split.txt ||
  fail "another validation split is not said" split.txt
grep -q "^Epoch 5/5" split.txt || fail "the resumed run did not train epoch 5" split.txt

# Resumed in the middle of an epoch with another batch size: the epoch's samples done so far count in the new
# steps (10 steps of 32 are 5 of 64), so the epoch still trains about one pass of its rows.
geometry=("$ddptrain" --checkpoint.dir geometry --model.embedding_dim 16 --model.hidden 16 --log.progress lines
  --data.path data.h5 --train.epochs 1)
"${geometry[@]}" --train.stop_after_steps 10 >geo1.txt 2>&1 ||
  fail "the first part of the epoch" geo1.txt
"${geometry[@]}" --train.batch_size 64 --resume last >geo2.txt 2>&1 ||
  fail "resume with another batch size" geo2.txt
grep -qF "the interrupted epoch's 320 samples (10 steps of 32) count as 5 steps of 64 now" geo2.txt ||
  fail "the epoch's samples are not counted in the new steps" geo2.txt
steps=$(grep -oP "^Epoch 1/1 - \K[0-9]+(?= steps \([0-9]+ after resuming\))" geo2.txt) || fail "no resumed epoch line" geo2.txt
after=$(grep -oP "^Epoch 1/1 - [0-9]+ steps \(\K[0-9]+(?= after resuming\))" geo2.txt)
[ "$((steps - after))" -eq 5 ] || fail "the resumed epoch ran $after of its $steps steps, not all but 5" geo2.txt
# The start log and the resume event say what the checkpoint holds, in its own steps.
grep -qF "0 epochs and 10 steps done" geo2.txt && [ "$(json_field geometry/metrics.jsonl steps_done event=resume)" = 10 ] ||
  fail "the resume does not say the checkpoint's 10 steps" geo2.txt geometry/metrics.jsonl
# Resumed with a lower train.max_steps_per_epoch than the steps the epoch has trained: it ends after one more
# step, and the start log, the epoch line and metrics.jsonl count every step it trained.
capped=("$ddptrain" --checkpoint.dir capped --model.embedding_dim 16 --model.hidden 16 --log.progress lines
  --data.path data.h5 --train.epochs 1)
"${capped[@]}" --train.stop_after_steps 10 >cap1.txt 2>&1 || fail "the first part of the epoch" cap1.txt
"${capped[@]}" --train.max_steps_per_epoch 4 --resume last >cap2.txt 2>&1 ||
  fail "resume with fewer steps per epoch" cap2.txt
grep -qF "the interrupted epoch had trained 10 steps, as many as or more than the 4 an epoch has now" cap2.txt ||
  fail "the lowered step cap is not said" cap2.txt
grep -qF "0 epochs and 10 steps done" cap2.txt || fail "the start log miscounts the epoch's steps" cap2.txt
grep -q "^Epoch 1/1 - 11 steps (1 after resuming)" cap2.txt || fail "the epoch line miscounts its steps" cap2.txt
[ "$(json_field capped/metrics.jsonl steps epoch=1)" = 11 ] && [ "$(json_field capped/metrics.jsonl steps_done event=resume)" = 10 ] ||
  fail "metrics.jsonl miscounts the resumed epoch's steps" capped/metrics.jsonl

# 4. Overwrite replaces the old run: a new id, only its own lines.
"${train[@]}" --data.path data.h5 --checkpoint.overwrite true --train.epochs 1 >new.txt 2>&1 || fail "overwrite" new.txt
new_id=$(grep -oP '^run \K\S+' new.txt)
[ "$new_id" != "$first_id" ] || fail "the new run kept the old id"
[ "$(json_field run/metrics.jsonl run_id "run_id=$new_id" | wc -l)" -eq "$(wc -l <run/metrics.jsonl)" ] ||
  fail "metrics.jsonl mixes runs" run/metrics.jsonl
# 5. What the run writes is checked before it trains, and best.h5 is replaced, never written through.
expect_user_error "resume with masking switched on" "model.mask_padding = false, the config asks for true" \
  "${train[@]}" --data.path data.h5 --train.epochs 2 --resume auto --model.mask_padding true
cp run/last.h5 last-before.h5
mv run/best.h5 best-file.h5 && mkdir run/best.h5
expect_user_error "a directory where best.h5 goes" "run/best.h5: not a plain file (a directory)" \
  "${train[@]}" --data.path data.h5 --train.epochs 2 --resume auto
grep -q "^Epoch" bad_out.txt && fail "the run trained before refusing" bad_out.txt
cmp -s run/last.h5 last-before.h5 || fail "the refused run changed last.h5"
rmdir run/best.h5
# Stopped inside epoch 1, best.h5 a link to other.h5: finishing epoch 1 writes best.h5 (the first epoch is
# always the best so far).
linked=("$ddptrain" --checkpoint.dir linked --data.path data.h5 --model.embedding_dim 16 --model.hidden 16)
"${linked[@]}" --train.epochs 1 --train.stop_after_steps 5 >stopped.txt 2>&1 || fail "a run stopped after 5 steps" stopped.txt
[ -f linked/last.h5 ] && [ ! -e linked/best.h5 ] || fail "the stopped run: last.h5 and no best.h5 expected"
grep -qF "stopped after 5 steps (train.stop_after_steps 5)" stopped.txt || fail "the stop is not said" stopped.txt
# Resumed with the same stop: nothing to train, which the run must say rather than end as if finished.
"${linked[@]}" --train.epochs 1 --train.stop_after_steps 5 --resume auto >again.txt 2>&1 || fail "resume at the stop" again.txt
grep -qF "already at 5 steps (train.stop_after_steps 5)" again.txt || fail "resuming at the stop is silent" again.txt
cp other.h5 other-before.h5 && ln -s "$PWD/other.h5" linked/best.h5
"${linked[@]}" --train.epochs 1 --resume auto >linked.txt 2>&1 || fail "resume with best.h5 a link" linked.txt
cmp -s other.h5 other-before.h5 || fail "best.h5 was written through its link into other.h5"
[ -f linked/best.h5 ] && [ ! -L linked/best.h5 ] || fail "best.h5 is still a link"
# best.h5 lost (a kill while it was being copied): restored from last.h5 where that holds the best epoch's
# model, else the next epoch takes its place; either way the run ends with a test score on best.h5.
rm linked/best.h5
"${linked[@]}" --train.epochs 2 --resume auto >restored.txt 2>&1 || fail "resume without best.h5" restored.txt
grep -qF "linked/best.h5 is missing; restored from linked/last.h5, which holds the best epoch 1" restored.txt ||
  fail "best.h5 was not restored" restored.txt
grep -q "^Test (best.h5, epoch [12])" restored.txt || fail "no test score on best.h5" restored.txt
"${linked[@]}" --train.epochs 4 --train.stop_after_steps 80 --resume auto >mid.txt 2>&1 || fail "stop in epoch 3" mid.txt
rm linked/best.h5
"${linked[@]}" --train.epochs 3 --resume auto >replaced.txt 2>&1 || fail "resume mid-epoch without best.h5" replaced.txt
grep -qF "linked/best.h5 is missing (the best epoch " replaced.txt && grep -qF "was lost) and linked/last.h5 holds a later model" replaced.txt ||
  fail "the lost best.h5 is not said" replaced.txt
grep -q "^Test (best.h5, epoch 3)" replaced.txt || fail "epoch 3 did not take the lost best.h5's place" replaced.txt

# Two runs in one directory at once (a job submitted twice): the second is refused while the first holds the
# directory's lock, naming it; the first is not disturbed, and once it has ended the directory is free again.
busy=("$ddptrain" --checkpoint.dir busy --model.embedding_dim 16 --model.hidden 16 --data.path data.h5)
"${busy[@]}" --train.epochs 1 --train.straggle_ms 50 >busy.txt 2>&1 &
busy_run=$!
for _ in $(seq 600); do
  [ -s busy/config.ini ] && break
  sleep 0.05
done
expect_user_error "a second run in a busy directory" "checkpoint.dir = busy: another run is using this directory (pid $busy_run on host" \
  "${busy[@]}" --train.epochs 1 --resume auto
wait "$busy_run" || fail "the first run was disturbed" busy.txt
grep -q "^Test (best.h5, epoch 1)" busy.txt || fail "the first run did not finish" busy.txt
"${busy[@]}" --train.epochs 2 --resume auto --model.dropout 0.25 >busy-next.txt 2>&1 ||
  fail "the directory stayed locked after its run ended" busy-next.txt
# A setting of the arithmetic changed on resuming is named (the run goes on with it).
grep -qF "note: busy/last.h5 was trained with other settings; from here on the run trains with model.dropout = 0.25 (was 0)" \
  busy-next.txt || fail "the changed model.dropout is not named" busy-next.txt
# Another run's best.h5 copied in is refused, not scored as this run's; moved away, the run goes on.
mv busy/best.h5 busy-best.h5
cp linked/best.h5 busy/best.h5
expect_user_error "another run's best.h5" "not by run $(grep -oP '^run \K\S+' busy.txt) that busy/last.h5 continues" \
  "${busy[@]}" --train.epochs 3 --resume auto --model.dropout 0.25
rm busy/best.h5
# So is another run's last.h5: its lines would join this run's in metrics.jsonl.
cp busy/last.h5 busy-last.h5
cp linked/last.h5 busy/last.h5
expect_user_error "another run's last.h5" "busy/metrics.jsonl holds the lines of run $(grep -oP '^run \K\S+' busy.txt), not of run" \
  "${busy[@]}" --train.epochs 3 --resume auto --model.dropout 0.25
mv busy-last.h5 busy/last.h5
"${busy[@]}" --train.epochs 3 --resume auto --model.dropout 0.25 >busy-third.txt 2>&1 ||
  fail "resume without the foreign best.h5" busy-third.txt
grep -q "^Test (best.h5, epoch 3)" busy-third.txt || fail "the next epoch did not become best.h5" busy-third.txt
# A stale best.h5 of this run (the job killed while copying last.h5 over it: the earlier best stays whole)
# is replaced from last.h5, which holds the best epoch, before the test split is scored.
cp busy-best.h5 busy/best.h5
sed -i '/"event":"test"/d' busy/metrics.jsonl
"${busy[@]}" --train.epochs 3 --resume auto --model.dropout 0.25 >busy-stale.txt 2>&1 ||
  fail "resume with a stale best.h5" busy-stale.txt
grep -qP "^note: busy/best.h5 holds epoch [12], not the best one; restored from busy/last.h5, which holds the best epoch 3" \
  busy-stale.txt || fail "the stale best.h5 is not said" busy-stale.txt
grep -q "^Test (best.h5, epoch 3)" busy-stale.txt || fail "the test score is not of epoch 3" busy-stale.txt
echo "PASS: one run per directory, resume checks its data, best.h5 on val (epoch $best_epoch), test once, outputs checked first"
