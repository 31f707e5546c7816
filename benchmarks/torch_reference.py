"""The benchmarks' PyTorch side: ddptrain's model (Embedding -> LSTM -> Dense on the last step, BCE with
logits, Adam with Keras's epsilon) and one epoch of its training loop, shared by cpu_torch_compare.py and
gpu_epoch_compare.py so that both compare against the same thing."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.dense = nn.Linear(hidden, 1)

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.dense(out[:, -1]).squeeze(1)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)


def train_epoch(model, optimizer, x, y, perm, batch):
    """One pass over x[perm] in batches of `batch` (the last partial batch dropped, as ddptrain does)."""
    for s in range(len(perm) // batch):
        idx = perm[s * batch:(s + 1) * batch]
        optimizer.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()


class RecurrentClassifier(nn.Module):
    """The GPU sweep's models (gpu_sweep.py): Embedding -> LSTM or GRU (stacked, one or both directions) ->
    Linear on the last layer's final state (both directions'), one logit for two classes, else one per
    class. `masked`: each row's padding (token 0) is left out by packing the sequences, as ddptrain's
    model.mask_padding leaves it out; the rows must then be padded at the end, as packing expects."""

    def __init__(self, vocab, embed, hidden, layers=1, cell="lstm", bidirectional=False, classes=2,
                 masked=False):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        recurrent = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = recurrent(embed, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.directions = 2 if bidirectional else 1
        self.dense = nn.Linear(hidden * self.directions, 1 if classes == 2 else classes)
        self.classes = classes
        self.masked = masked

    def forward(self, tokens):
        x = self.embedding(tokens)
        if self.masked:
            lengths = (tokens != 0).sum(1).cpu()  # a host sync, as every packed PyTorch RNN pays
            x = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state  # LSTM: (h, c)
        last = h[-self.directions:].transpose(0, 1).reshape(tokens.shape[0], -1)
        logits = self.dense(last)
        return logits.squeeze(1) if self.classes == 2 else logits

    def loss(self, logits, labels):
        if self.classes == 2:
            return F.binary_cross_entropy_with_logits(logits, labels.float())
        return F.cross_entropy(logits, labels.long())
