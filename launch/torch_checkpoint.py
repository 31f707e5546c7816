#!/usr/bin/env python3
"""A ddptrain checkpoint (RUN/best.h5 or RUN/last.h5) as a PyTorch model, with its vocabulary.

    from torch_checkpoint import load
    model, vocab, maxlen = load("runs/imdb/best.h5")
    probabilities = torch.sigmoid(model(tokens))          # tokens: int64 [batch, maxlen], left-padded

or from the shell, scoring documents tokenized as `ddptrain predict` does for plain ASCII words:

    python3 launch/torch_checkpoint.py runs/imdb/best.h5 "a wonderful film" "a dull film"

The flat /params buffer is laid out as models/param_layout.h says, which is also nn.LSTM's own layout
(gate blocks i, f, g, o; two biases): embedding [V, E]; per layer w_ih [4H, in], w_hh [4H, H], b_ih [4H],
b_hh [4H]; dense.w [H], dense.b [1]. Needs h5py and torch (Debian: python3-h5py, python3-torch).
"""
import re
import sys

import h5py
import numpy as np
import torch
import torch.nn as nn


class Classifier(nn.Module):
    """Embedding -> stacked LSTM -> Dense(1) on the last time step; returns logits."""

    def __init__(self, vocab_size, embedding_dim, hidden, layers):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden, num_layers=layers, batch_first=True)
        self.dense = nn.Linear(hidden, 1)

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.dense(out[:, -1]).squeeze(1)


def load(path):
    """(model in eval mode, vocabulary list or None, maxlen or None) of a ddptrain checkpoint."""
    with h5py.File(path, "r") as f:
        if f.attrs.get("format", b"") not in (b"ddptrain-checkpoint-1", "ddptrain-checkpoint-1"):
            raise ValueError(f"{path}: not a ddptrain checkpoint")
        v, e, h, layers = (int(f.attrs[k]) for k in ("vocab_size", "embedding_dim", "hidden", "layers"))
        flat = np.asarray(f["params"], dtype=np.float32)
        vocab = [w.decode() if isinstance(w, bytes) else w for w in f["vocab"][:v]] if "vocab" in f else None
        maxlen = int(f.attrs["maxlen"]) if "maxlen" in f.attrs else None

    model = Classifier(v, e, h, layers)
    offset = 0

    def take(*shape):
        nonlocal offset
        size = int(np.prod(shape))
        tensor = torch.from_numpy(flat[offset:offset + size].reshape(shape).copy())
        offset += size
        return tensor

    with torch.no_grad():
        model.embedding.weight.copy_(take(v, e))
        for layer in range(layers):
            inputs = e if layer == 0 else h
            getattr(model.lstm, f"weight_ih_l{layer}").copy_(take(4 * h, inputs))
            getattr(model.lstm, f"weight_hh_l{layer}").copy_(take(4 * h, h))
            getattr(model.lstm, f"bias_ih_l{layer}").copy_(take(4 * h))
            getattr(model.lstm, f"bias_hh_l{layer}").copy_(take(4 * h))
        model.dense.weight.copy_(take(1, h))
        model.dense.bias.copy_(take(1))
    if offset != flat.size:
        raise ValueError(f"{path}: /params holds {flat.size} values, the model {offset}")
    return model.eval(), vocab, maxlen


def encode(text, vocab, maxlen):
    """Keras IMDB ids of lower-cased ASCII words: [1] + ids (2 if unknown), the last maxlen, left-padded."""
    ids = {word: i for i, word in reversed(list(enumerate(vocab))) if i >= 3}
    words = [w.strip("'") for w in re.findall(r"[a-z0-9']+", text.lower())]
    row = [1] + [ids.get(word, 2) for word in words if word]
    row = row[-maxlen:]
    return [0] * (maxlen - len(row)) + row


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    model, vocab, maxlen = load(argv[1])
    if vocab is None:
        print(f"{argv[1]}: the checkpoint carries no vocabulary", file=sys.stderr)
        return 2
    tokens = torch.tensor([encode(text, vocab, maxlen) for text in argv[2:]], dtype=torch.int64)
    with torch.no_grad():
        for text, p in zip(argv[2:], torch.sigmoid(model(tokens)).tolist()):
            print(f"{p:.4f}\t{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
