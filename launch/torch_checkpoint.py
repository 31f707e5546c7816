#!/usr/bin/env python3
"""A ddptrain checkpoint (RUN/best.h5 or RUN/last.h5) as a PyTorch model, with its vocabulary.

    from torch_checkpoint import load
    model, vocab, maxlen = load("runs/imdb/best.h5")
    probabilities = model.probabilities(tokens)           # tokens: int64 [batch, maxlen], left-padded

or from the shell, scoring documents tokenized as `ddptrain predict` does for plain ASCII words (two
classes: p of class 1; more: every class's probability, as `ddptrain predict --all-probabilities`):

    python3 launch/torch_checkpoint.py runs/imdb/best.h5 "a wonderful film" "a dull film"

The flat /params buffer is laid out as models/param_layout.h says, which is nn.LSTM's and nn.GRU's own
layout and names: embedding [V, E]; per layer and direction (forward, then _reverse) w_ih [G*H, in],
w_hh [G*H, H], b_ih [G*H], b_hh [G*H] (LSTM gates i, f, g, o; GRU r, z, n with the reset gate on the
recurrent product, as nn.GRU); dense.w [D] or [K, D], dense.b [1] or [K]. With masking (the checkpoint's
mask_padding) each row's left padding is skipped: the rows are shifted left and packed with their lengths,
so the forward direction ends on the last token and the reverse one on the first real token. Needs h5py and
torch (Debian: python3-h5py, python3-torch).
"""
import re
import sys

import h5py
import numpy as np
import torch
import torch.nn as nn


def text_attr(attrs, name, default):
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


class Classifier(nn.Module):
    """Embedding -> stacked LSTM or GRU (one or two directions) -> Dense; returns logits [batch, outputs]."""

    def __init__(self, vocab_size, embedding_dim, hidden, layers, cell="lstm", bidirectional=False,
                 classes=2, mask_padding=False):
        super().__init__()
        self.hidden, self.bidirectional, self.mask_padding = hidden, bidirectional, mask_padding
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(embedding_dim, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.outputs = 1 if classes == 2 else classes
        self.dense = nn.Linear(hidden * (2 if bidirectional else 1), self.outputs)

    def forward(self, tokens):
        if not self.mask_padding:
            out, _ = self.rnn(self.embedding(tokens))
            last = out[:, -1, :self.hidden]
            if self.bidirectional:
                last = torch.cat([last, out[:, 0, self.hidden:]], dim=1)
            return self.dense(last)
        # Leading zeros are padding (at most maxlen - 1 of them): shift each row left and pack it.
        seq = tokens.shape[1]
        padding = (tokens != 0).int().argmax(dim=1)
        padding = torch.where((tokens != 0).any(dim=1), padding, torch.full_like(padding, seq - 1))
        lengths = seq - padding
        shifted = torch.stack([torch.roll(row, -int(p)) for row, p in zip(tokens, padding)])
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(shifted), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, state = self.rnn(packed)
        h_n = state[0] if isinstance(state, tuple) else state  # [layers * directions, batch, hidden]
        directions = 2 if self.bidirectional else 1
        last = torch.cat([h_n[-directions + d] for d in range(directions)], dim=1)
        return self.dense(last)

    def probabilities(self, tokens):
        logits = self(tokens)
        return torch.sigmoid(logits[:, 0]) if self.outputs == 1 else torch.softmax(logits, dim=1)


def load(path):
    """(model in eval mode, vocabulary list or None, maxlen or None) of a ddptrain checkpoint."""
    with h5py.File(path, "r") as f:
        if text_attr(f.attrs, "format", "") != "ddptrain-checkpoint-1":
            raise ValueError(f"{path}: not a ddptrain checkpoint")
        v, e, h, layers = (int(f.attrs[k]) for k in ("vocab_size", "embedding_dim", "hidden", "layers"))
        cell = text_attr(f.attrs, "cell", "lstm") or "lstm"
        bidirectional = bool(int(f.attrs.get("bidirectional", 0)))
        classes = int(f.attrs.get("classes", 2))
        mask_padding = bool(int(f.attrs.get("mask_padding", 0)))
        flat = np.asarray(f["params"], dtype=np.float32)
        vocab = [w.decode() if isinstance(w, bytes) else w for w in f["vocab"][:v]] if "vocab" in f else None
        maxlen = int(f.attrs["maxlen"]) if "maxlen" in f.attrs else None

    model = Classifier(v, e, h, layers, cell, bidirectional, classes, mask_padding)
    gates = 4 if cell == "lstm" else 3
    directions = 2 if bidirectional else 1
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
            inputs = e if layer == 0 else h * directions
            for d in range(directions):
                suffix = f"l{layer}" + ("_reverse" if d == 1 else "")
                getattr(model.rnn, f"weight_ih_{suffix}").copy_(take(gates * h, inputs))
                getattr(model.rnn, f"weight_hh_{suffix}").copy_(take(gates * h, h))
                getattr(model.rnn, f"bias_ih_{suffix}").copy_(take(gates * h))
                getattr(model.rnn, f"bias_hh_{suffix}").copy_(take(gates * h))
        model.dense.weight.copy_(take(model.outputs, h * directions))
        model.dense.bias.copy_(take(model.outputs))
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
        for text, p in zip(argv[2:], model.probabilities(tokens).tolist()):
            scores = f"{p:.4f}" if model.outputs == 1 else " ".join(f"{q:.4f}" for q in p)
            print(f"{scores}\t{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
