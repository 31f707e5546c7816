#!/usr/bin/env python3
"""Side by side on one GPU: a full IMDB-shaped training epoch (25,000 samples, seq 80, E = H = 128,
vocab 20000) of ddptrain and of the same model in PyTorch (nn.Embedding + nn.LSTM + nn.Linear + Adam, cuDNN on,
data already on the GPU), at batch 32, 256 and 1024. Prints a Markdown table for benchmarks/RESULTS.md.

    python3 benchmarks/gpu_epoch_compare.py --ddptrain build/ddptrain --data /tmp/synthetic-25000.h5 \
        [--floor build/benchmarks/cudnn_floor_bench] [--batches 32 256 1024] [--algos auto standard]

ddptrain runs once per cuDNN algorithm (model.cudnn_rnn_algo) in --algos. The floor is cuDNN's forward +
backward alone with the fastest of its algorithms that it accepts for the shape (standard, persistent
small-hidden, persistent static), named in the table.

ddptrain's time is the training time of its second epoch (train_time_s in metrics.jsonl, evaluation
excluded); PyTorch's is the second of two timed epochs, bracketed by torch.cuda.synchronize().
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def torch_epoch_seconds(batch, samples, seq, vocab, embed, hidden, epochs=2):
    import torch

    import torch_reference

    torch.backends.cudnn.enabled = True
    torch.backends.cuda.matmul.allow_tf32 = False  # same fp32 arithmetic as ddptrain
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")

    model = torch_reference.Classifier(vocab, embed, hidden).to(device)
    optimizer = torch_reference.adam(model)
    generator = torch.Generator(device=device).manual_seed(1)
    x = torch.randint(0, vocab, (samples, seq), device=device, generator=generator)
    y = torch.randint(0, 2, (samples,), device=device, generator=generator).float()
    steps = samples // batch
    times = []
    for _ in range(epochs):
        perm = torch.randperm(samples, device=device, generator=generator)
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch_reference.train_epoch(model, optimizer, x, y, perm, batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[-1], steps


def ddptrain_epoch_seconds(binary, data, batch, algo, workdir):
    run_dir = os.path.join(workdir, f"run-{batch}-{algo}")
    command = [binary, "--data.path", data, "--device", "cuda", "--checkpoint.dir", run_dir,
               "--model.embedding_dim", "128", "--model.hidden", "128", "--train.batch_size", str(batch),
               "--train.epochs", "2", "--log.progress", "lines", "--data.validate", "false",
               "--data.validation", "test",
               "--model.cudnn_rnn_algo", algo]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        epochs = [e for e in map(json.loads, f) if "epoch" in e]  # the last line is the test score
    return epochs[-1]["train_time_s"], epochs[-1]["steps"], epochs[-1].get("data_wait_s", 0.0)


def floor_ms(binary, batch):
    """(ms, algorithm) of the fastest algorithm cuDNN accepts, or (None, None)."""
    if not binary:
        return None, None
    best = (None, None)
    for algo in ("standard", "persist_small_h", "persist_static"):
        run = subprocess.run([binary, "--batch", str(batch), "--algo", algo], capture_output=True, text=True)
        if run.returncode == 3:  # cuDNN turned the algorithm down for this shape
            print(f"floor, batch {batch}, {algo}: {run.stdout.strip().splitlines()[-1]}", file=sys.stderr)
            continue
        run.check_returncode()
        for line in run.stdout.splitlines():
            if line.startswith("floor_ms"):
                ms = float(line.split()[1])
                print(f"floor, batch {batch}, {algo}: {ms:.4f} ms", file=sys.stderr)
                if best[0] is None or ms < best[0]:
                    best = (ms, algo)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ddptrain", required=True)
    parser.add_argument("--data", required=True, help="synthetic IMDB-shaped file (25,000 train samples)")
    parser.add_argument("--floor", help="cuDNN forward+backward floor benchmark binary (optional)")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256, 1024])
    parser.add_argument("--algos", nargs="+", default=["auto", "standard"],
                        help="model.cudnn_rnn_algo values to run ddptrain with")
    args = parser.parse_args()
    import torch

    print(f"GPU: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, CUDA {torch.version.cuda}")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for batch in args.batches:
            theirs, _ = torch_epoch_seconds(batch, 25000, 80, 20000, 128, 128)
            floor, floor_algo = floor_ms(args.floor, batch)
            for algo in args.algos:
                ours, steps, wait = ddptrain_epoch_seconds(args.ddptrain, args.data, batch, algo, workdir)
                floor_epoch = floor * steps / 1e3 if floor else None
                rows.append(f"| {batch} | {algo} | {ours:.3f} s | {theirs:.3f} s | {ours / theirs:.2f}x | "
                            f"{f'{floor_epoch:.3f} s ({floor_algo})' if floor_epoch else 'n/a'} | "
                            f"{f'{ours / floor_epoch:.2f}x' if floor_epoch else 'n/a'} | {100 * wait / ours:.2f}% |")
                print(rows[-1], file=sys.stderr)
    print("| batch | ddptrain cudnn_rnn_algo | ddptrain epoch | PyTorch epoch | ddptrain / PyTorch "
          "| cuDNN floor x steps (algorithm) | ddptrain / floor | input wait |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
