#!/usr/bin/env bash
# A checkpoint loads into PyTorch with launch/torch_checkpoint.py (the documented layout is nn.LSTM's and
# nn.GRU's), and the PyTorch model scores documents as `ddptrain predict` does (within 1e-4): the Keras LSTM,
# a GRU with dropout, and a masked bidirectional GRU of three classes (PyTorch packs the shifted rows). Skipped (exit 77) where
# Python has no torch or h5py (Debian: python3-torch, python3-h5py).
#   bash tests/cli/torch_checkpoint.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
source_dir=$2
python=/usr/bin/python3
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
"$python" -c 'import h5py' 2>/dev/null || skip_missing python3-h5py "$python has no h5py"
# PyTorch stays optional: bootstrap.sh test does not install it. It checks only launch/torch_checkpoint.py,
# which no part of training uses, and on a machine with the test command's packages Debian 12's python3-torch
# still brings 166 packages, 540 MiB installed (apt-get install -s --no-install-recommends python3-torch).
"$python" -c 'import torch' 2>/dev/null ||
  skip_because "PyTorch is not installed (optional, not installed by bootstrap.sh test: apt-get install python3-torch)"
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
paste ddptrain.txt torch.txt

# A two-class GRU (dropout in training only), the same comparison.
"$ddptrain" --data.path data.h5 --checkpoint.dir gru --model.embedding_dim 8 --model.hidden 8 --model.layers 2 \
  --model.cell gru --model.dropout 0.2 --train.epochs 3 --train.batch_size 8 --train.learning_rate 0.02 \
  >gru_train.txt 2>&1 || fail "training the GRU" gru_train.txt
"$ddptrain" predict --checkpoint gru/best.h5 "${documents[@]/#/--text=}" >gru_ddptrain.txt 2>&1 ||
  fail "ddptrain predict (GRU)" gru_ddptrain.txt
"$python" "$source_dir/launch/torch_checkpoint.py" gru/best.h5 "${documents[@]}" >gru_torch.txt 2>&1 ||
  fail "torch_checkpoint.py (GRU)" gru_torch.txt
paste gru_ddptrain.txt gru_torch.txt | awk -F'\t' '{ d = $1 - $3; if (d < 0) d = -d; if (d > 1e-4) bad = 1 }
  END { exit bad || NR != 4 }' || fail "PyTorch's GRU scores differ from ddptrain's" gru_ddptrain.txt gru_torch.txt

# Three classes, a masked bidirectional GRU: every class's probability.
for split in train test; do
  mkdir -p "corpus/$split/plot"
  for i in $(seq 40); do
    echo "${words[RANDOM % 13]} twist ${words[RANDOM % 13]} scene" >"corpus/$split/plot/$i.txt"
  done
done
"$ddptrain" prepare text --input corpus --output three.h5 --vocab 40 --maxlen 12 >prepare3.txt 2>&1 ||
  fail "prepare text (three classes)" prepare3.txt
"$ddptrain" --data.path three.h5 --checkpoint.dir bigru --model.embedding_dim 8 --model.hidden 8 --model.cell gru \
  --model.bidirectional true --model.mask_padding true --model.layers 2 --train.epochs 3 --train.batch_size 8 \
  --train.learning_rate 0.02 >bigru_train.txt 2>&1 || fail "training the bidirectional GRU" bigru_train.txt
documents+=("a twist in the scene" "twist")
"$ddptrain" predict --checkpoint bigru/best.h5 --all-probabilities "${documents[@]/#/--text=}" >bigru_ddptrain.txt 2>&1 ||
  fail "ddptrain predict (bidirectional GRU)" bigru_ddptrain.txt
"$python" "$source_dir/launch/torch_checkpoint.py" bigru/best.h5 "${documents[@]}" >bigru_torch.txt 2>&1 ||
  fail "torch_checkpoint.py (bidirectional GRU)" bigru_torch.txt
# ddptrain: class, p, "neg=.. plot=.. pos=..", text; PyTorch: "p0 p1 p2", text.
paste <(cut -f3 bigru_ddptrain.txt | sed -E 's/[a-z]+=//g') <(cut -f1 bigru_torch.txt) |
  awk -F'\t' '{ n = split($1, a, " "); split($2, b, " "); if (n != 3) bad = 1
    for (i = 1; i <= n; ++i) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > 1e-4) bad = 1 } }
    END { exit bad || NR != 6 }' || fail "PyTorch's bidirectional GRU differs from ddptrain's" bigru_ddptrain.txt bigru_torch.txt
echo "PASS: the checkpoints in PyTorch score as ddptrain predict"
paste bigru_ddptrain.txt bigru_torch.txt
