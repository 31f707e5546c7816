#!/usr/bin/env bash
# A tiny aclImdb-layout folder (with a file that is not UTF-8 and an empty file) is prepared with
# `ddptrain prepare text`, trained for a few epochs on the CPU, then `ddptrain predict` must rank a positive
# review above a negative one and `ddptrain evaluate` must report the test accuracy. Also predict's bad input.
#   bash tests/cli/text_end_to_end.sh path/to/ddptrain source-dir
# DDPTRAIN_TEST_DEVICE=cuda trains, predicts and evaluates on the GPU instead, and then also checks that the
# CPU predicts and evaluates the GPU's checkpoint alike (probabilities within 1e-4).
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -euo pipefail
ddptrain=$1
device=${DDPTRAIN_TEST_DEVICE:-cpu}
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
use_python_with_h5py "editing a dataset and a checkpoint needs h5py"
enter_scratch_dir

# Reviews of neutral filler words; the label is carried by two sentiment words placed at random.
filler=(the a film movie plot actor scene story it was and of director script camera music ending cast
  character time)
# The moods are read through a nameref (review's `local -n`).
# shellcheck disable=SC2034
positive=(great wonderful excellent superb loved brilliant)
# shellcheck disable=SC2034
negative=(awful terrible boring dreadful hated dull)
RANDOM=7  # a fixed seed: the same folder on every run
review() {
  local -n mood=$1
  local words=() i
  for i in $(seq 10); do words+=("${filler[RANDOM % ${#filler[@]}]}"); done
  for i in 1 2; do
    local at=$((RANDOM % (${#words[@]} + 1)))
    words=("${words[@]:0:at}" "${mood[RANDOM % ${#mood[@]}]}" "${words[@]:at}")
  done
  echo "${words[*]^}. <br /><br />${words[0]}!"
}
for split in train test; do
  count=$([ "$split" = train ] && echo 60 || echo 20)
  mkdir -p "corpus/$split/pos" "corpus/$split/neg"
  for i in $(seq "$count"); do
    review positive >"corpus/$split/pos/${i}_9.txt"
    review negative >"corpus/$split/neg/${i}_2.txt"
  done
done
# Latin-1 bytes (not UTF-8) in a positive review, and an empty file that must be skipped. (A Latin-1 file that
# starts with "ÿþ", a UTF-16 byte order mark, and has an even length reads as UTF-16: the mark decides.)
printf 'caf\xe9 \xff\xfe great wonderful film, don\x92t miss it\n' >corpus/train/pos/latin1_10.txt
: >corpus/train/neg/empty_1.txt
# Hidden entries (a class folder named .NET, a Finder's .DS_Store) are left out, and the summary says so.
mkdir corpus/train/.NET corpus/test/.NET
echo "great wonderful" >corpus/train/.NET/1.txt
echo "great wonderful" >corpus/test/.NET/1.txt
echo "great wonderful" >corpus/train/pos/.DS_Store

"$ddptrain" prepare text --input corpus --output data.h5 --vocab 100 --maxlen 24 --threads 2 \
  >prepare.txt 2>&1 || fail "prepare text failed" prepare.txt
grep -q "train 121 (60 neg, 61 pos), test 40 (20 neg, 20 pos)" prepare.txt || fail "wrong row counts" prepare.txt
grep -q "empty files skipped (no words): 1 (train/neg/empty_1.txt)" prepare.txt ||
  fail "the empty file is not reported" prepare.txt
grep -q "files not valid UTF-8, decoded leniently.*: 1 (train/pos/latin1_10.txt)" prepare.txt ||
  fail "the Latin-1 file is not reported" prepare.txt
grep -qF "hidden entries (names starting with '.'), left out: 3 (train/.NET, test/.NET, train/pos/.DS_Store)" \
  prepare.txt || fail "the hidden entries are not reported" prepare.txt

"$ddptrain" --device "$device" --data.path data.h5 --checkpoint.dir run --model.embedding_dim 16 --model.hidden 16 \
  --train.batch_size 16 --train.epochs 8 --train.learning_rate 0.02 --train.seed 1 --log.progress lines \
  >train.txt 2>&1 || fail "training failed" train.txt
[ -f run/best.h5 ] || fail "no run/best.h5" train.txt

# Fine-tuning on data whose vocabulary gives ids other words is said: their embedding rows keep what they
# learned for the old words (here two words swap ids, and a label changes so that the data is other data).
"$python" - <<'EOF' || fail "could not write the retokenized copy"
import h5py, shutil
shutil.copy("data.h5", "swapped.h5")
with h5py.File("swapped.h5", "r+") as f:
    words = list(f["vocab"][()])
    words[3], words[4] = words[4], words[3]
    del f["vocab"]
    f["vocab"] = words
    y = f["train/y"][()]
    y[0] = 1 - y[0]
    f["train/y"][...] = y
EOF
cp -r run tuned
"$ddptrain" --device "$device" --data.path swapped.h5 --checkpoint.dir tuned --model.embedding_dim 16 \
  --model.hidden 16 --train.batch_size 16 --train.epochs 9 --train.learning_rate 0.02 --train.seed 1 \
  --log.progress lines --resume --checkpoint.allow_data_change true >tuned.txt 2>&1 ||
  fail "fine-tuning failed" tuned.txt
grep -qP '^warning: 2 of the [0-9]+ word ids name other words in swapped.h5 than in the checkpoint.s vocabulary \(id 3: ' \
  tuned.txt || fail "the moved words are not said" tuned.txt

"$ddptrain" predict --checkpoint run/best.h5 --data data.h5 --device "$device" \
  --text "A wonderful, excellent film: I loved it." --text "An awful, boring film: I hated it." \
  >predict.txt 2>&1 || fail "predict failed" predict.txt
[ "$(wc -l <predict.txt)" -eq 2 ] || fail "predict printed other than 2 lines" predict.txt
grep -qP '^\d\.\d{4}\tA wonderful, excellent film: I loved it\.$' predict.txt ||
  fail "predict's line format" predict.txt
p_pos=$(sed -n 1p predict.txt | cut -f1)
p_neg=$(sed -n 2p predict.txt | cut -f1)
awk -v p="$p_pos" -v n="$p_neg" 'BEGIN { exit !(p > 0.5 && n < 0.5) }' ||
  fail "positive $p_pos, negative $p_neg: not told apart" predict.txt train.txt

# On a terminal a two-class score says which class it is the probability of (on stderr, so never in a file).
if command -v script >/dev/null; then
  script -qec "'$ddptrain' predict -c run/best.h5 --device $device --text 'excellent superb'" /dev/null \
    >terminal.txt 2>&1 || fail "predict on a terminal failed" terminal.txt
  grep -qF "scores are the probability of class 1, pos (class 0: neg)" terminal.txt ||
    fail "predict on a terminal does not name class 1" terminal.txt
else
  skip_missing --part bsdutils "no script(1) to give predict a terminal"
fi

# --input: one document per line, from a file or stdin.
printf 'excellent superb\nterrible dull\n' >docs.txt
"$ddptrain" predict -c run/best.h5 -d data.h5 --device "$device" --input - <docs.txt >stdin.txt 2>&1 ||
  fail "predict --input - failed" stdin.txt
[ "$(cut -f2 stdin.txt | tr '\n' '|')" = "excellent superb|terrible dull|" ] || fail "predict --input -" stdin.txt
# The checkpoint carries the vocabulary: the dataset is not needed. Blank lines are not documents, and a
# document without words gets no score.
printf 'excellent superb\n\n   \nterrible dull\n?!\n' >docs_with_blanks.txt
"$ddptrain" predict -c run/best.h5 --device "$device" --input docs_with_blanks.txt >alone.txt 2>&1 ||
  fail "predict with only the checkpoint failed" alone.txt
[ "$(head -2 alone.txt)" = "$(cat stdin.txt)" ] || fail "predict without --data scores differently" alone.txt stdin.txt
[ "$(grep -c . alone.txt)" -eq 4 ] && grep -qP '^-\t\?!$' alone.txt &&
  grep -qF "note: 1 document without a single word" alone.txt ||
  fail "blank lines or a document without words" alone.txt
# The checkpoint records which Unicode tables split its vocabulary's words; a vocabulary another ICU split is
# said on stderr, and the documents still score.
"$python" - <<'EOF' || fail "the checkpoint does not record its tokenizer"
import h5py, shutil
shutil.copy("run/best.h5", "older_icu.h5")
with h5py.File("older_icu.h5", "r+") as f:
    recorded = f.attrs["tokenizer"]
    assert (recorded.decode() if isinstance(recorded, bytes) else recorded).startswith("ICU "), recorded
    del f.attrs["header_checksum"]  # an edited checkpoint: read without its checksum
    f.attrs["tokenizer"] = "ICU 1.0, Unicode 1.0"
EOF
"$ddptrain" predict -c older_icu.h5 --device "$device" --input docs.txt >older.txt 2>older-err.txt ||
  fail "predict with another ICU's vocabulary failed" older-err.txt
cmp -s older.txt stdin.txt || fail "another ICU's vocabulary scored differently" older.txt stdin.txt
grep -qF "older_icu.h5's vocabulary was made by a ddptrain whose words were split with ICU 1.0, Unicode 1.0" \
  older-err.txt || fail "another ICU's vocabulary is not said" older-err.txt
# A file as Windows editors write it (a UTF-8 byte order mark, CRLF line ends) scores and echoes alike.
printf '\xef\xbb\xbfexcellent superb\r\nterrible dull\r\n' >docs_windows.txt
"$ddptrain" predict -c run/best.h5 --device "$device" --input docs_windows.txt >windows.txt 2>&1 ||
  fail "predict of a Windows file failed" windows.txt
cmp -s windows.txt stdin.txt || fail "a byte order mark or CRLF changed predict's output" windows.txt stdin.txt
# And as Windows' "Unicode" files are: UTF-16 with a byte order mark, in either byte order, or without one;
# and UTF-32 likewise (whose little-endian mark starts with UTF-16LE's).
for order in UTF-16LE UTF-16BE UTF-16LE-unmarked UTF-32LE UTF-32BE UTF-32LE-unmarked UTF-32BE-unmarked; do
  case $order in
    UTF-16LE) printf '\xff\xfe' >"docs_$order.txt" ;;
    UTF-16BE) printf '\xfe\xff' >"docs_$order.txt" ;;
    UTF-32LE) printf '\xff\xfe\x00\x00' >"docs_$order.txt" ;;
    UTF-32BE) printf '\x00\x00\xfe\xff' >"docs_$order.txt" ;;
    *) : >"docs_$order.txt" ;;
  esac
  printf 'excellent superb\r\nterrible dull\r\n' | iconv -f UTF-8 -t "${order%-unmarked}" >>"docs_$order.txt"
  "$ddptrain" predict -c run/best.h5 --device "$device" --input "docs_$order.txt" >"$order.txt" 2>"$order-err.txt" ||
    fail "predict of a $order file failed" "$order.txt" "$order-err.txt"
  cmp -s "$order.txt" stdin.txt || fail "$order changed predict's output" "$order.txt" stdin.txt
  case $order in
    *-unmarked) why="where its NUL bytes fall" ;;
    *) why="its byte order mark" ;;
  esac
  grep -qF "note: docs_$order.txt read as ${order%-unmarked} ($why)" "$order-err.txt" ||
    fail "reading $order is not said" "$order-err.txt"
done
# Marked UTF-16 without a single NUL (Chinese, no newline) is UTF-16 by its mark.
printf '\xff\xfe\xd9\x8f\xe8\x90' >docs_zh.txt
"$ddptrain" predict -c run/best.h5 --device "$device" --input docs_zh.txt >zh.txt 2>&1 ||
  fail "predict of marked UTF-16 Chinese failed" zh.txt
grep -qP '^0\.\d{4}\t这部$' zh.txt && grep -qF "read as UTF-16LE (its byte order mark)" zh.txt ||
  fail "marked UTF-16 without NULs is not read as UTF-16" zh.txt
# A document that is no UTF-8 (Latin-1) is scored, and said.
printf 'excellent caf\xe9\n' >docs_latin1.txt
"$ddptrain" predict -c run/best.h5 --device "$device" --input docs_latin1.txt >latin1.txt 2>&1 ||
  fail "predict of a Latin-1 file failed" latin1.txt
grep -qP '^0\.\d{4}\texcellent café$' latin1.txt &&
  grep -qF "note: 1 document not valid UTF-8: bytes that are no UTF-8 read as Windows-1252" latin1.txt ||
  fail "a Latin-1 document is not scored or not said" latin1.txt
# Lines that end in a lone CR (old Mac files) are documents as any other; one stray NUL in a short UTF-8 file
# does not make it UTF-16.
printf 'excellent superb\rterrible dull\r' >docs_cr.txt
"$ddptrain" predict -c run/best.h5 --device "$device" --input docs_cr.txt >cr.txt 2>&1 ||
  fail "predict of a file with CR line ends failed" cr.txt
cmp -s cr.txt stdin.txt || fail "CR line ends changed predict's output" cr.txt stdin.txt
printf 'excellent\0superb\nterrible dull\n' >docs_nul.txt
"$ddptrain" predict -c run/best.h5 --device "$device" --input docs_nul.txt >nul.txt 2>&1 ||
  fail "predict of a file with a NUL failed" nul.txt
[ "$(grep -c . nul.txt)" -eq 2 ] && ! grep -q "read as UTF-16" nul.txt || fail "one NUL made the file UTF-16" nul.txt

"$ddptrain" evaluate --checkpoint run/best.h5 --data data.h5 --device "$device" >evaluate.txt 2>&1 ||
  fail "evaluate failed" evaluate.txt
grep -qP '^test: loss \d+\.\d{4} - accuracy \d\.\d{4} - macro-F1 \d\.\d{4} \(40 samples\)$' evaluate.txt ||
  fail "evaluate's output" evaluate.txt
# Per class (named by the folders) and the confusion matrix, whose cells add up to the test rows.
grep -qP '^neg +\d\.\d{4} +\d\.\d{4} +\d\.\d{4} +20$' evaluate.txt || fail "no report for class neg" evaluate.txt
awk '/^confusion matrix/ { m = 1; next } m && $2 ~ /^[0-9]+$/ { s += $2 + $3 } END { exit s != 40 }' evaluate.txt ||
  fail "the confusion matrix does not add up to 40 rows" evaluate.txt
accuracy=$(head -1 evaluate.txt | sed -E 's/.*accuracy ([0-9.]+).*/\1/')
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.9) }' || fail "test accuracy $accuracy < 0.9" evaluate.txt train.txt

if [ "$device" != cpu ]; then  # the GPU's checkpoint on the CPU: the same predictions and test metrics
  "$ddptrain" predict -c run/best.h5 -d data.h5 --device cpu --input docs.txt >cpu_predict.txt 2>&1 ||
    fail "predict on the CPU failed" cpu_predict.txt
  paste stdin.txt cpu_predict.txt | awk -F'\t' '{ d = $1 - $3; if (d < 0) d = -d; if (d > 1e-4) bad = 1 }
    END { exit bad }' || fail "$device and cpu predict differently" stdin.txt cpu_predict.txt
  "$ddptrain" evaluate -c run/best.h5 -d data.h5 --device cpu >cpu_evaluate.txt 2>&1 ||
    fail "evaluate on the CPU failed" cpu_evaluate.txt
  # Printed to 4 decimals: the losses may differ by one in the last digit, the accuracies not at all.
  paste -d' ' <(head -1 evaluate.txt) <(head -1 cpu_evaluate.txt) |
    awk '{ d = $3 - $14; if (d < 0) d = -d; exit !(d <= 2e-4 && $6 == $17) }' ||
    fail "$device and cpu evaluate differently" evaluate.txt cpu_evaluate.txt
fi

# Bad input: exit code 2 and one line naming the problem.
expect_user_error "predict without documents" "--text" "$ddptrain" predict --checkpoint run/best.h5 --data data.h5
expect_user_error "predict with --text and --input" "--input" "$ddptrain" predict -c run/best.h5 -d data.h5 --text a --input docs.txt
vocab_size=$(grep -oP 'vocab_size \K\d+' prepare.txt)
"$ddptrain" prepare synthetic --output plain.h5 --train 40 --test 8 --vocab "$vocab_size" --maxlen 24 >/dev/null
"$ddptrain" --data.path plain.h5 --checkpoint.dir plain-run --model.embedding_dim 16 --model.hidden 16 \
  --train.epochs 1 >plain-train.txt 2>&1 || fail "training on plain.h5 failed" plain-train.txt
expect_user_error "a checkpoint without a vocabulary" "--data" "$ddptrain" predict -c plain-run/best.h5 --text great
expect_user_error "missing --input file" "absent.txt" "$ddptrain" predict -c run/best.h5 -d data.h5 --input absent.txt
"$ddptrain" prepare text --input corpus --output other.h5 --vocab 10 --maxlen 24 >/dev/null
expect_user_error "dataset of another vocabulary" "vocab_size" "$ddptrain" predict -c run/best.h5 -d other.h5 --text a
# The same vocab_size with other words (an x after every word of 3 letters or more: the ids now name other
# words) or with no words at all.
cp -r corpus shifted
find shifted -name '*.txt' -exec sed -i -E 's/\b([A-Za-z]{3,})\b/\1x/g' {} +
"$ddptrain" prepare text --input shifted --output shifted.h5 --vocab 100 --maxlen 24 >shifted.txt
[ "$(grep -oP 'vocab_size \K\d+' shifted.txt)" = "$vocab_size" ] || fail "the shifted corpus has another vocab_size" shifted.txt
expect_user_error "evaluate on a dataset whose ids name other words" "in the model's vocabulary but" \
  "$ddptrain" evaluate -c run/best.h5 -d shifted.h5
expect_user_error "predict with a dataset whose ids name other words" "in the model's vocabulary but" \
  "$ddptrain" predict -c run/best.h5 -d shifted.h5 --text great
expect_user_error "evaluate on token ids without words" "holds token ids without one" \
  "$ddptrain" evaluate -c run/best.h5 -d plain.h5
echo "PASS: prepared, trained (test accuracy $accuracy), positive $p_pos > negative $p_neg"
