#!/usr/bin/env bash
# Inputs a user mistypes or a machine refuses: each ends with exit 2 and a line naming the key, value or file,
# never a crash, an allocation that fails minutes later, or a partial file left behind.
#   bash tests/cli/bad_inputs.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output d.h5 --train 200 --test 50 --vocab 100 --maxlen 10 --seed 1 >/dev/null
small=(--data.path d.h5 --model.embedding_dim 8 --train.epochs 1)

# Keys past any sensible bound, or not finite.
expect_user_error "threads" "train.threads = 100000" "$ddptrain" "${small[@]}" --train.threads 100000
expect_user_error "prefetch" "data.prefetch = 100000000" "$ddptrain" "${small[@]}" --data.prefetch 100000000
expect_user_error "infinite learning rate" "train.learning_rate = inf: must be 0 or a finite number" \
  "$ddptrain" "${small[@]}" --train.learning_rate inf
expect_user_error "learning rate past float" "train.learning_rate" "$ddptrain" "${small[@]}" --train.learning_rate 1e39
expect_user_error "epsilon below float" "train.epsilon" "$ddptrain" "${small[@]}" --train.epsilon 1e-50
expect_user_error "hidden" "model.hidden = 100000" "$ddptrain" "${small[@]}" --model.hidden 100000
expect_user_error "layers" "model.layers = 1000" "$ddptrain" "${small[@]}" --model.layers 1000
expect_user_error "a model too large for a rank" "parameters, more than" \
  "$ddptrain" --data.path d.h5 --model.embedding_dim 30000 --model.hidden 30000 --train.epochs 1
expect_user_error "a directory as --config" "is a directory" "$ddptrain" --config .
expect_user_error "prepare --maxlen" "--maxlen must be from 1 to" \
  "$ddptrain" prepare synthetic --output big.h5 --maxlen 2147483647
expect_user_error "prepare imdb-npz --vocab" "--vocab must be from 1 to" \
  "$ddptrain" prepare imdb-npz --input absent.npz --output big.h5 --vocab 2147483647
expect_user_error "a negative seed" "--seed must be 0 or more, got '-1'" \
  "$ddptrain" prepare synthetic --output neg.h5 --seed -1
expect_user_error "a negative seed after =" "--seed must be 0 or more" \
  "$ddptrain" prepare text --input . --output neg.h5 --seed=-5
printf '[train]\nseed = -1\n' >negative_seed.ini
expect_user_error "a negative seed in a config" "negative_seed.ini: train.seed must be 0 or more, got '-1'" \
  "$ddptrain" --config negative_seed.ini "${small[@]}"
expect_user_error "a negative seed on the command line" "--train.seed must be 0 or more" \
  "$ddptrain" "${small[@]}" --train.seed -7

# A binary file as --config: one line naming it, its bytes escaped, never the raw bytes on a terminal.
head -c 4096 "$ddptrain" >binary.ini
expect_user_error "a binary config" "binary.ini: " "$ddptrain" --config binary.ini
LC_ALL=C grep -q '[^[:print:]]' bad_err.txt && fail "a binary config: raw bytes in the message" bad_err.txt
[ "$(wc -c <bad_err.txt)" -lt 400 ] || fail "a binary config: the message is not short" bad_err.txt

# A config saved with a UTF-8 byte order mark reads as without one.
printf '\xEF\xBB\xBF[train]\nepochs = 1\n' >bom.ini
"$ddptrain" --config bom.ini --data.path d.h5 --model.embedding_dim 8 --model.hidden 8 --checkpoint.dir bom \
  >bom.txt 2>&1 || fail "a config with a byte order mark was refused" bom.txt

# A file-size limit (as a full disk): the write fails with one line, and no partial file stays.
status=0
(
  trap '' XFSZ
  ulimit -f 1000
  exec "$ddptrain" prepare synthetic --output huge.h5 --train 1000000 --test 10
) >huge.txt 2>huge_err.txt || status=$?
[ "$status" -eq 2 ] || fail "a write past the file-size limit: exit $status, expected 2" huge.txt huge_err.txt
[ "$(wc -l <huge_err.txt)" -eq 1 ] || fail "a failed write: not one line" huge_err.txt
grep -q "huge.h5.tmp: cannot write" huge_err.txt || fail "no line naming the file" huge_err.txt
ls huge.h5* 2>/dev/null && fail "a partial file was left behind"

# A shard smaller than a batch under every backend, including the default on two ranks (the colocated
# parameter server) and a dedicated server: the reason on one line, exit 2, no crash.
for layout in "2 auto" "2 mpi" "3 ps --comm.ps_servers 1"; do
  read -r ranks backend servers <<<"$layout"
  name="shard-$ranks-$backend"
  status=0
  # shellcheck disable=SC2086 # $servers is zero or two words
  mpirun -np "$ranks" "$ddptrain" "${small[@]}" --train.batch_size 128 --comm.backend "$backend" $servers \
    --checkpoint.dir "$name" >"$name.txt" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "$layout, a shard smaller than a batch: exit $status" "$name.txt"
  grep -q "fewer than 2 .* x train.batch_size 128" "$name.txt" || fail "$layout: no line naming train.batch_size" \
    "$name.txt"
  grep -qi "segmentation\|signal" "$name.txt" && fail "$layout: a rank crashed" "$name.txt"
done
echo "PASS: bad keys, a byte order mark, a failed write and a small shard"
