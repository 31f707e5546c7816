#!/usr/bin/env bash
# Every model variant learns: quickstart-sized synthetic data (order-dependent: negations flip sentiment words,
# a negated topic is not the class), 2 ranks, 4 epochs each; the test accuracy each must reach is stated
# below, with a margin under what they reached when the test was written (LSTM 0.990, GRU 0.974,
# bidirectional LSTM 0.995, 2-layer LSTM with dropout 0.983, bidirectional GRU on 4 classes 1.000).
#   bash tests/cli/model_variants_learn.sh path/to/ddptrain
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output two.h5 --train 6000 --test 1000 --vocab 1000 --maxlen 32 --seed 3 \
  >prepare.txt 2>&1 || fail "prepare synthetic" prepare.txt
"$ddptrain" prepare synthetic --output four.h5 --classes 4 --train 6000 --test 1000 --vocab 1000 --maxlen 32 \
  --seed 3 >>prepare.txt 2>&1 || fail "prepare synthetic --classes 4" prepare.txt

# name, data, least test accuracy, the variant's keys
variants=(
  "lstm|two.h5|0.93|"
  "gru|two.h5|0.93|--model.cell gru"
  "bilstm|two.h5|0.93|--model.bidirectional true --model.mask_padding true"
  "lstm2_dropout|two.h5|0.90|--model.layers 2 --model.dropout 0.2 --model.embedding_dropout 0.1"
  "bigru_4class|four.h5|0.95|--model.cell gru --model.bidirectional true --model.mask_padding true"
)
for v in "${variants[@]}"; do
  IFS='|' read -r name data least keys <<<"$v"
  # shellcheck disable=SC2086  # the keys are words
  mpirun -np 2 "$ddptrain" --data.path "$data" --checkpoint.dir "run_$name" --model.embedding_dim 32 \
    --model.hidden 32 --train.epochs 4 --train.learning_rate 0.005 --log.progress lines $keys \
    >"$name.txt" 2>&1 || fail "$name: training failed" "$name.txt"
  acc=$(json_field "run_$name/metrics.jsonl" test_acc event=test)
  echo "$name: test_acc $acc (at least $least)"
  awk -v a="$acc" -v l="$least" 'BEGIN { exit !(a >= l) }' || fail "$name: test_acc $acc < $least" "$name.txt"
done
echo "PASS"
