#!/usr/bin/env bash
# Three classes end to end: a folder-per-class corpus (train/<class>/, test/<class>/, and a train/unsup that
# is not a class) is prepared with `ddptrain prepare text`, trained on 2 ranks with a bidirectional GRU over
# masked padding, then `ddptrain evaluate` must print per-class scores and the confusion matrix, and
# `ddptrain predict` the class names. Also the keys' bad values.
#   bash tests/cli/multiclass_end_to_end.sh path/to/ddptrain
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
use_python_with_h5py "reading and editing the dataset and checkpoint needs h5py"
enter_scratch_dir

# Documents of filler words; the class is carried by two topic words, and a negated word of another topic
# ("not <word>") in every other document, so that the order of words counts.
filler=(the a report news today it was and of people time said year new city week)
# The topics are read through namerefs (document's `local -n`).
# shellcheck disable=SC2034
sports=(match goal team league coach striker)
# shellcheck disable=SC2034
science=(atom cell physics theory experiment molecule)
# shellcheck disable=SC2034
music=(album guitar concert song melody band)
classes=(music science sports)
RANDOM=11  # a fixed seed: the same folder on every run
document() {
  local -n topic=$1
  local -n other=$2
  local words=() i
  # RANDOM is read in this shell only: bash reseeds it in a command substitution's subshell.
  local length=$((6 + RANDOM % 8))
  for ((i = 0; i < length; i++)); do words+=("${filler[RANDOM % ${#filler[@]}]}"); done
  for i in 1 2; do
    local at=$((RANDOM % (${#words[@]} + 1)))
    words=("${words[@]:0:at}" "${topic[RANDOM % ${#topic[@]}]}" "${words[@]:at}")
  done
  if [ $((RANDOM % 2)) -eq 0 ]; then
    local at=$((RANDOM % (${#words[@]} + 1)))
    words=("${words[@]:0:at}" not "${other[RANDOM % ${#other[@]}]}" "${words[@]:at}")
  fi
  echo "${words[*]^}."
}
for split in train test; do
  count=$([ "$split" = train ] && echo 80 || echo 20)
  for c in 0 1 2; do
    mkdir -p "corpus/$split/${classes[c]}"
    for i in $(seq "$count"); do
      document "${classes[c]}" "${classes[(c + 1) % 3]}" >"corpus/$split/${classes[c]}/$i.txt"
    done
  done
done
mkdir -p corpus/train/unsup && echo "unlabelled words" >corpus/train/unsup/1.txt

# A class folder in one split only (misspelt, not copied) is an error naming it, not a class left out.
mkdir -p corpus/test/Sports && echo "goal" >corpus/test/Sports/1.txt
status=0
"$ddptrain" prepare text --input corpus --output misspelt.h5 --vocab 80 --maxlen 24 >misspelt.txt 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "a class folder in one split only: exit $status, expected 2" misspelt.txt
[ "$(wc -l <misspelt.txt)" -eq 1 ] || fail "a class folder in one split only: not one line" misspelt.txt
grep -q "corpus/train/Sports: no such folder, though" misspelt.txt ||
  fail "a class folder in one split only is not named" misspelt.txt
[ ! -e misspelt.h5 ] || fail "a dataset was written despite the error"
rm -r corpus/test/Sports

"$ddptrain" prepare text --input corpus --output data.h5 --vocab 80 --maxlen 24 --threads 2 \
  >prepare.txt 2>&1 || fail "prepare text failed" prepare.txt
grep -q "train 240 (80 music, 80 science, 80 sports), test 60 (20 music, 20 science, 20 sports)" prepare.txt ||
  fail "wrong row counts" prepare.txt
grep -q "no class (--not-classes), left out: 1 (train/unsup)" prepare.txt || fail "train/unsup is not reported" prepare.txt
# The list may have spaces after its commas, as a list typed by hand does.
mkdir -p corpus/train/extra && echo "more words" >corpus/train/extra/1.txt
"$ddptrain" prepare text --input corpus --output spaced.h5 --vocab 80 --maxlen 24 --not-classes "unsup, extra" \
  >spaced.txt 2>&1 || fail "--not-classes with a space after its comma" spaced.txt
grep -q "no class (--not-classes), left out: 2 (train/extra, train/unsup)" spaced.txt ||
  fail "--not-classes 'unsup, extra' did not leave both out" spaced.txt
rm -r corpus/train/extra spaced.h5
"$python" - <<'PY' || fail "the dataset's classes" prepare.txt
import h5py
f = h5py.File("data.h5", "r")
assert f.attrs["num_classes"] == 3, dict(f.attrs)
assert [c.decode() if isinstance(c, bytes) else c for c in f["classes"][()]] == ["music", "science", "sports"]
assert set(f["train/y"][()]) == {0, 1, 2}
PY

args=(--data.path data.h5 --checkpoint.dir run --model.embedding_dim 16 --model.hidden 16 --model.cell gru
  --model.bidirectional true --model.mask_padding true --model.dropout 0.1 --model.embedding_dropout 0.1
  --model.layers 2 --train.batch_size 16 --train.epochs 10 --train.learning_rate 0.01 --train.seed 1
  --log.progress lines)
mpirun -np 2 "$ddptrain" "${args[@]}" >train.txt 2>&1 || fail "training failed" train.txt
grep -qP 'val_macro_f1: \d\.\d{4}$' train.txt || fail "no macro-F1 in the epoch lines" train.txt
grep -qP '^Test \(best.h5, epoch \d+\) - test_loss: .* - test_macro_f1: \d\.\d{4} \(60 samples\)$' train.txt ||
  fail "no test line with macro-F1" train.txt
f1=$(json_field run/metrics.jsonl test_macro_f1 event=test)
awk -v f="$f1" 'BEGIN { exit !(f >= 0.9) }' || fail "test macro-F1 $f1 < 0.9" train.txt

"$ddptrain" evaluate --checkpoint run/best.h5 --data data.h5 >evaluate.txt 2>&1 || fail "evaluate failed" evaluate.txt
grep -qP '^test: loss \d+\.\d{4} - accuracy \d\.\d{4} - macro-F1 \d\.\d{4} \(60 samples\)$' evaluate.txt ||
  fail "evaluate's first line" evaluate.txt
for c in "${classes[@]}"; do
  grep -qP "^$c +\d\.\d{4} +\d\.\d{4} +\d\.\d{4} +20$" evaluate.txt || fail "no report line for $c" evaluate.txt
done
grep -q '^confusion matrix (rows: true class, columns: predicted class):$' evaluate.txt ||
  fail "no confusion matrix" evaluate.txt
awk '/^confusion matrix/ { m = 1; next } m && $2 ~ /^[0-9]+$/ { s += $2 + $3 + $4; d += $(2 + n++) }
  END { exit !(s == 60 && d >= 54) }' evaluate.txt || fail "the confusion matrix: 60 rows, 54 on its diagonal" evaluate.txt

"$ddptrain" predict -c run/best.h5 --text "The striker scored a goal for the team" \
  --text "Not concert news: the physics of the atom" -a >predict.txt 2>&1 || fail "predict failed" predict.txt
grep -qP '^sports\t\d\.\d{4}\tmusic=\d\.\d{4} science=\d\.\d{4} sports=\d\.\d{4}\tThe striker' predict.txt ||
  fail "predict's first line" predict.txt
grep -qP '^science\t' <(sed -n 2p predict.txt) || fail "a negated topic decided the class" predict.txt
# A document without a word has as many fields as the others, each score '-'.
"$ddptrain" predict -c run/best.h5 --text "goal team" --text "?!" -a >unscored.txt 2>/dev/null ||
  fail "predict of a document without words failed" unscored.txt
if [ "$(awk -F'\t' '{print NF}' unscored.txt | sort -u)" != 4 ] || ! grep -qP '^-\t-\t-\t\?!$' unscored.txt; then
  fail "a document without words does not split like the others" unscored.txt
fi
# Class names that hold what separates predict's fields (a space, '=', a tab) are printed quoted, so every
# line still splits: the same checkpoint with its classes renamed.
cp run/best.h5 renamed.h5
"$python" - <<'PY' || fail "renaming the checkpoint's classes"
import h5py
with h5py.File("renamed.h5", "r+") as f:
    del f["classes"]
    f.create_dataset("classes", data=["music", "pure science", "sports=\tball"], dtype=h5py.string_dtype())
PY
"$ddptrain" predict -c renamed.h5 --text "Not concert news: the physics of the atom" -a >renamed.txt 2>&1 ||
  fail "predict with renamed classes failed" renamed.txt
grep -qP '^"pure science"\t\d\.\d{4}\tmusic=\d\.\d{4} "pure science"=\d\.\d{4} "sports=\\tball"=\d\.\d{4}\tNot concert' \
  renamed.txt || fail "class names with separators are not quoted" renamed.txt
# evaluate on a dataset whose class ids name other classes than the model's is refused, naming the first.
expect_user_error "evaluate with other class names" 'class 1 is "pure science" in the model but "science" in data.h5' \
  "$ddptrain" evaluate -c renamed.h5 -d data.h5

# Bad values: one line naming the key.
expect_user_error "bidirectional without masking" "model.bidirectional" \
  "$ddptrain" --data.path data.h5 --model.bidirectional true
expect_user_error "an unknown cell" "model.cell = rnn" "$ddptrain" --data.path data.h5 --model.cell rnn
expect_user_error "dropout of 1" "model.dropout = 1" "$ddptrain" --data.path data.h5 --model.dropout 1
expect_user_error "a step schedule without its interval" "train.lr_decay_steps" \
  "$ddptrain" --data.path data.h5 --train.lr_schedule step
expect_user_error "a negative clip norm" "train.clip_norm = -1" "$ddptrain" --data.path data.h5 --train.clip_norm -1
"$python" - <<'PY'
import h5py, shutil
shutil.copy("data.h5", "one_class.h5")
with h5py.File("one_class.h5", "a") as f:
    f.attrs["num_classes"] = 1
shutil.copy("data.h5", "big_label.h5")
with h5py.File("big_label.h5", "a") as f:
    y = f["train/y"]; y[5] = 3
PY
expect_user_error "num_classes 1" "attribute num_classes = 1" "$ddptrain" --data.path one_class.h5 --checkpoint.dir bad
expect_user_error "a label >= num_classes" "/train/y[5] = 3 is not a label (num_classes = 3" \
  "$ddptrain" --data.path big_label.h5 --checkpoint.dir bad
echo "PASS"
