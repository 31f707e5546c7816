#!/usr/bin/env bash
# A checkpoint loads into PyTorch with launch/torch_checkpoint.py (the documented layout is nn.LSTM's), and
# the PyTorch model scores documents as `ddptrain predict` does (within 1e-4). Skipped (exit 77) where
# Python has no torch or h5py (Debian: python3-torch, python3-h5py).
#   bash tests/cli/torch_checkpoint.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
source_dir=$2
python=/usr/bin/python3
if ! "$python" -c 'import torch, h5py' 2>/dev/null; then
  echo "SKIP: $python has no torch or h5py (apt-get install python3-torch python3-h5py)"
  exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

words=(the a film plot actor scene story was and of music ending cast)
RANDOM=3
for split in train test; do
  mkdir -p "corpus/$split/pos" "corpus/$split/neg"
  for i in $(seq 40); do
    echo "${words[RANDOM % 13]} ${words[RANDOM % 13]} great ${words[RANDOM % 13]} loved it" >"corpus/$split/pos/$i.txt"
    echo "${words[RANDOM % 13]} dull ${words[RANDOM % 13]} ${words[RANDOM % 13]} hated it" >"corpus/$split/neg/$i.txt"
  done
done
"$ddptrain" prepare text --input corpus --output data.h5 --vocab 40 --maxlen 12 >prepare.txt 2>&1 ||
  fail "prepare text" prepare.txt
# Two layers, so the per-layer mapping is exercised too.
"$ddptrain" --data.path data.h5 --checkpoint.dir run --model.embedding_dim 8 --model.hidden 8 --model.layers 2 \
  --train.epochs 3 --train.batch_size 8 --train.learning_rate 0.02 >train.txt 2>&1 || fail "training" train.txt

documents=("the film was great, loved it" "dull plot, hated it" "the music and the cast" "unknown words only")
"$ddptrain" predict --checkpoint run/best.h5 "${documents[@]/#/--text=}" >ddptrain.txt 2>&1 ||
  fail "ddptrain predict" ddptrain.txt
"$python" "$source_dir/launch/torch_checkpoint.py" run/best.h5 "${documents[@]}" >torch.txt 2>&1 ||
  fail "torch_checkpoint.py" torch.txt
paste ddptrain.txt torch.txt | awk -F'\t' '{ d = $1 - $3; if (d < 0) d = -d; if (d > 1e-4 || NF != 4) bad = 1 }
  END { exit bad || NR != 4 }' || fail "PyTorch scores differ from ddptrain's" ddptrain.txt torch.txt
cut -f1 torch.txt | sort -u | wc -l | grep -qx 4 || fail "the documents got the same score" torch.txt
echo "PASS: the checkpoint in PyTorch scores as ddptrain predict"
paste ddptrain.txt torch.txt
