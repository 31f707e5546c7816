#!/usr/bin/env bash
# `ddptrain prepare KIND --val-fraction F` for every kind: /val holds the last round(F * rows) training rows,
# /train the others, and a bad F exits 2 with one line naming --val-fraction.
#   bash tests/cli/prepare_val_fraction.sh path/to/ddptrain source-dir
# `A && B || fail` asserts both: the fail runs when either is false, as meant.
# shellcheck disable=SC2015
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

rows() {  # rows FILE DATASET: the first dimension
  h5ls "$1/$2" | sed -E 's/.*\{([0-9]+).*/\1/'
}

# synthetic: /train then /val is the training stream of the file without /val.
"$ddptrain" prepare synthetic --output whole.h5 --train 200 --test 20 --vocab 100 --maxlen 12 >whole.txt
"$ddptrain" prepare synthetic --output held.h5 --train 200 --test 20 --vocab 100 --maxlen 12 --val-fraction 0.25 \
  >held.txt 2>&1 || fail "prepare synthetic --val-fraction failed" held.txt
grep -q "150 train, 50 val and 20 test samples" held.txt || fail "synthetic summary" held.txt
[ "$(rows held.h5 train/x)" = 150 ] && [ "$(rows held.h5 val/x)" = 50 ] && [ "$(rows held.h5 val/y)" = 50 ] ||
  fail "synthetic: /train and /val sizes" held.txt
for d in x y; do
  h5dump -d "/train/$d" -b LE -o whole_$d.bin whole.h5 >/dev/null
  h5dump -d "/train/$d" -b LE -o train_$d.bin held.h5 >/dev/null
  h5dump -d "/val/$d" -b LE -o val_$d.bin held.h5 >/dev/null
  cat train_$d.bin val_$d.bin | cmp -s - whole_$d.bin || fail "synthetic: /train + /val/$d differs from /train/$d"
done
if h5ls whole.h5 | grep -q '^val'; then fail "a file without --val-fraction has /val"; fi

# text: the summary counts both groups.
for split in train test; do
  mkdir -p corpus/$split/pos corpus/$split/neg
  for i in $(seq 20); do
    echo "great film $i" >"corpus/$split/pos/$i.txt"
    echo "awful film $i" >"corpus/$split/neg/$i.txt"
  done
done
"$ddptrain" prepare text --input corpus --output text.h5 --val-fraction 0.1 --seed 5 >text.txt 2>&1 ||
  fail "prepare text --val-fraction failed" text.txt
grep -qE "wrote text.h5: train 36 \([0-9]+ neg, [0-9]+ pos\), val 4 \([0-9]+ neg, [0-9]+ pos\), test 40 \(20 neg, 20 pos\)" \
  text.txt || fail "text summary" text.txt
[ "$(rows text.h5 val/x)" = 4 ] || fail "text: /val/x rows" text.txt
# A class of one training document loses it to /val with some seeds: exactly then a warning says so.
mkdir corpus/train/rare corpus/test/rare
echo "rare film" >corpus/train/rare/1.txt
echo "rare film" >corpus/test/rare/1.txt
warned=0
for seed in 1 2 3 4 5 6 7 8; do
  "$ddptrain" prepare text --input corpus --output rare.h5 --val-fraction 0.5 --seed $seed >rare.txt 2>&1 ||
    fail "prepare text with a rare class failed" rare.txt
  lost=0
  grep -qE "^wrote rare.h5: train [0-9]+ \([^)]*, 0 rare\)" rare.txt && lost=1
  said=0
  grep -qF "warning: class rare has no /train row: --val-fraction put its only training document in /val" rare.txt &&
    said=1
  [ "$lost" = "$said" ] || fail "seed $seed: a class without /train rows ($lost) and its warning ($said) disagree" rare.txt
  warned=$((warned + said))
done
[ "$warned" -gt 0 ] || fail "no seed of 8 put the rare class's document in /val: the warning was never tried"
rm -r corpus/train/rare corpus/test/rare

# Bad fractions: exit 2, one line naming the option, no file.
bad_fraction() {  # MENTION ARGS...: exit 2 with one line holding MENTION, and no bad.h5
  expect_user_error "$*" "$1" "$ddptrain" "${@:2}"
  [ ! -e bad.h5 ] || fail "$*: bad.h5 was written"
}
bad_fraction "--val-fraction must be in [0, 1), got -0.1" prepare synthetic --output bad.h5 --val-fraction -0.1
bad_fraction "--val-fraction must be in [0, 1), got 1" prepare text --input corpus --output bad.h5 --val-fraction 1
bad_fraction "--val-fraction 0.99 of 40 training rows leaves no row in /train" \
  prepare text --input corpus --output bad.h5 --val-fraction 0.99
bad_fraction "--val-fraction" prepare imdb-npz --input absent.npz --output bad.h5 --val-fraction 2
bad_fraction "'--val-fraction' is invalid" prepare synthetic --output bad.h5 --val-fraction tenth
echo "PASS: /val for synthetic and text, bad fractions rejected"
