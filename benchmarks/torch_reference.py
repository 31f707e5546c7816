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
