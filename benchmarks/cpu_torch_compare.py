#!/usr/bin/env python3
"""Side by side on the same CPU cores: IMDB-shaped training epochs (seq 80, E = H = 128, vocab 20000, batch 32
per rank, Adam) of ddptrain and of the same model in PyTorch (nn.Embedding + nn.LSTM + nn.Linear + Adam), for
each layout RANKSxTHREADS (one process per rank, THREADS BLAS/intra-op threads each). With more than one rank
PyTorch runs DistributedDataParallel over gloo, ddptrain its MPI all-reduce (comm.backend mpi; --backend auto
gives ddptrain's default instead, the colocated parameter server on CPU ranks). Prints a Markdown table for
benchmarks/RESULTS.md.

    python3 benchmarks/cpu_torch_compare.py --ddptrain build/ddptrain --data /tmp/synthetic-25000.h5 \
        [--layouts 1x2 2x1] [--repeats 3]

--data is a file from `ddptrain prepare synthetic --train 25000 --vocab 20000 --maxlen 80`; PyTorch trains on
random tokens of the same shapes held in memory (its input pipeline costs nothing), ddptrain reads the file
through its prefetcher. Both sides time their second epoch of training, evaluation excluded: ddptrain's
train_time_s from metrics.jsonl, PyTorch's the slowest rank's wall time between two barriers. The ratio is
of the step times, so --samples may be smaller than the file's training split to keep PyTorch's side short.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SEQ, VOCAB, EMBED, HIDDEN, BATCH = 80, 20000, 128, 128, 32


def torch_rank(rank, ranks, threads, samples, port, results):
    """One PyTorch rank: two epochs over its samples // ranks; puts its second epoch's seconds in results."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import torch_reference

    if ranks > 1:  # bound one core per rank, as mpirun binds ddptrain's ranks
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    if ranks > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=ranks)

    model = torch_reference.Classifier(VOCAB, EMBED, HIDDEN)
    if ranks > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch_reference.adam(model)
    per_rank = samples // ranks
    generator = torch.Generator().manual_seed(1 + rank)
    x = torch.randint(0, VOCAB, (per_rank, SEQ), generator=generator)
    y = torch.randint(0, 2, (per_rank,), generator=generator).float()
    steps = per_rank // BATCH
    seconds = 0.0
    for _ in range(2):
        perm = torch.randperm(per_rank, generator=generator)
        if ranks > 1:
            dist.barrier()
        start = time.perf_counter()
        torch_reference.train_epoch(model, optimizer, x, y, perm, BATCH)
        if ranks > 1:
            dist.barrier()
        seconds = time.perf_counter() - start
    if ranks > 1:
        dist.destroy_process_group()
    results.put((rank, seconds, steps))


def torch_epoch(ranks, threads, samples, port, blas_threads):
    import torch.multiprocessing as mp

    # PyTorch parallelizes each op with its own OpenMP threads; the BLAS's threads on top of them made a step
    # 3-4x slower on 2 cores (RESULTS.md), so by default its BLAS runs one thread, its best setting measured.
    if blas_threads > 0:
        os.environ["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    else:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=torch_rank, args=(r, ranks, threads, samples, port, results))
                 for r in range(ranks)]
    for p in processes:
        p.start()
    outcome = [results.get() for _ in processes]
    for p in processes:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a PyTorch rank exited with {p.exitcode}")
    return max(seconds for _, seconds, _ in outcome), outcome[0][2]


def ddptrain_epoch(binary, data, ranks, threads, workdir, run, backend):
    run_dir = os.path.join(workdir, f"run-{ranks}x{threads}-{run}")
    # One rank gets every core it asks for; several ranks are bound one core each, as mpirun does by default.
    binding = ["--bind-to", "none"] if ranks == 1 else ["--bind-to", "core"]
    command = ["mpirun", "-np", str(ranks), *binding, binary, "--config", "launch/configs/imdb.ini",
               "--data.path", data, "--comm.backend", backend, "--train.threads", str(threads),
               "--train.epochs", "2", "--checkpoint.dir", run_dir, "--log.progress", "lines",
               "--data.validate", "false",
               "--data.validation", "test"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        epochs = [e for e in map(json.loads, f) if "epoch" in e]  # the last line is the test score
    return epochs[-1]["train_time_s"], epochs[-1]["steps"]


def median_and_range(values):
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ddptrain", required=True)
    parser.add_argument("--data", required=True, help="synthetic IMDB-shaped file")
    parser.add_argument("--samples", type=int, default=25000, help="training samples per epoch (all ranks)")
    parser.add_argument("--layouts", nargs="+", default=["1x2", "2x1"], help="RANKSxTHREADS")
    parser.add_argument("--torch-blas-threads", type=int, default=1,
                        help="OPENBLAS_NUM_THREADS for PyTorch's ranks; 0 leaves it unset (the BLAS's default)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved")
    parser.add_argument("--backend", default="mpi", help="ddptrain's comm.backend (auto: its default)")
    args = parser.parse_args()
    import torch

    print(f"PyTorch {torch.__version__} (CPU, {torch.backends.mkldnn.is_available() and 'oneDNN' or 'no oneDNN'})",
          file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for layout in args.layouts:
            ranks, threads = (int(part) for part in layout.split("x"))
            ours, theirs = [], []
            for run in range(args.repeats):  # interleaved, so a noisy minute hits both sides
                seconds, our_steps = ddptrain_epoch(args.ddptrain, args.data, ranks, threads, workdir, run,
                                                     args.backend)
                ours.append(seconds)
                seconds, their_steps = torch_epoch(ranks, threads, args.samples, 29500 + run,
                                                   args.torch_blas_threads)
                theirs.append(seconds)
                print(f"{layout} run {run}: ddptrain {ours[-1]:.2f} s ({our_steps} steps), "
                      f"PyTorch {theirs[-1]:.2f} s ({their_steps} steps)", file=sys.stderr)
            ratio = (statistics.median(ours) / our_steps) / (statistics.median(theirs) / their_steps)
            rows.append(f"| {ranks} × {threads} | {our_steps} | {median_and_range(ours)} | "
                        f"{1e3 * statistics.median(ours) / our_steps:.1f} ms | {their_steps} | "
                        f"{median_and_range(theirs)} | {1e3 * statistics.median(theirs) / their_steps:.1f} ms | "
                        f"**{ratio:.2f}×** |")
    print("| ranks × threads | ddptrain steps per rank | ddptrain epoch, median (min–max) | ddptrain step "
          "| PyTorch steps per rank | PyTorch epoch, median (min–max) | PyTorch step | ddptrain / PyTorch, per step |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
