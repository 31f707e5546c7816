#!/usr/bin/env python3
"""Every model shape side by side on one GPU: for each shape, ddptrain's epoch, PyTorch's eager epoch and its
epoch with the whole step in one CUDA graph (fp32, TF32 off on both; --precision tf32: TF32 on both, as
ddptrain's model.precision = tf32 and PyTorch's allow_tf32; --precision bf16: ddptrain's model.precision =
bf16 against PyTorch's forward and loss under torch.autocast(dtype=bfloat16), TF32 off, and the floor with
bfloat16 data; --precision fp16 the same in float16, PyTorch with GradScaler, whose host check of each step
no CUDA graph captures), the cuDNN floor x steps, and the
time from process start to the first step of both, against the targets (ddptrain's epoch at most 0.9x
PyTorch's CUDA-graph epoch; at most 1.10x the cuDNN floor x steps at batch 128 or more; the first step
within 5 s). Prints a Markdown table for benchmarks/RESULTS.md and writes WORK/sweep.csv.

    python3 benchmarks/gpu_sweep.py --ddptrain build/ddptrain --floor build/benchmarks/cudnn_floor_bench \\
        --work /tmp/sweep [--grid full|quick|tiny] [--part K/N] [--seconds 1.5] [--device cuda|cpu] \\
        [--precision fp32|tf32|bf16|fp16]

Grids. full: LSTM and GRU; hidden 128, 256, 512, 1024 (embedding min(hidden, 256)); 1 and 2 layers; T 80
and 200; batch 32, 128, 512; and a masked bidirectional 3-class GRU (hidden 128 and 256, T 200, every
batch): 102 shapes. quick: hidden 128 and 512, batch 32 and 512 (34 shapes). tiny: two small shapes, for
checking the script itself on a CPU (--device cpu: ddptrain alone; PyTorch and the floor need CUDA).
--part K/N runs every N-th shape from the K-th, so that a grid can be split over several calls.

An epoch is 25,000 samples: the steady step time x (25000 // batch) steps. Each side runs S steps, S
chosen per shape from PyTorch's first steps so that a measurement lasts about --seconds (5 to 25000 //
batch). ddptrain runs 2 epochs of S steps (train.max_steps_per_epoch) on a synthetic set of that shape;
its step time is the second epoch's step_time_ms, its start the first's start_to_first_step_s (from the
process's exec). PyTorch's step time is the mean over S steps after 3 warm-up steps (and, graphed, after
the capture), timed with torch.cuda.synchronize(); its start is measured from before a child process's
exec (interpreter, import, CUDA context, model, data, then the first step begins), for one shape in each
(cell, hidden, layers) group at batch 128 and T 200 (--torch-start all: every shape). A masked model packs
its sequences (pack_padded_sequence), which needs the lengths on the host every step: PyTorch cannot
capture that step in a graph, and the table says so. The floor is cuDNN's forward and backward alone with
the fastest algorithm cuDNN accepts for the shape (standard, persist_small_h, persist_static), every
sequence full length.
"""
import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import time

EPOCH_SAMPLES = 25000
VOCAB = 20000
TARGET_VS_GRAPH = 0.90
TARGET_VS_FLOOR = 1.10
TARGET_START_S = 5.0


def shapes_of(grid):
    shapes = []

    def add(cell, hidden, layers, seq, batch, bidirectional=False, masked=False, classes=2):
        shapes.append(dict(cell=cell, hidden=hidden, embed=min(hidden, 256), layers=layers, seq=seq,
                           batch=batch, bidirectional=bidirectional, masked=masked, classes=classes))

    if grid == "tiny":
        add("lstm", 16, 1, 12, 16)
        shapes.append(dict(cell="gru", hidden=16, embed=8, layers=2, seq=12, batch=16, bidirectional=True,
                           masked=True, classes=3))
        return shapes
    hiddens = (128, 256, 512, 1024) if grid == "full" else (128, 512)
    batches = (32, 128, 512) if grid == "full" else (32, 512)
    for cell in ("lstm", "gru"):
        for hidden in hiddens:
            for layers in (1, 2):
                for seq in (80, 200):
                    for batch in batches:
                        add(cell, hidden, layers, seq, batch)
    for hidden in (128, 256) if grid == "full" else (128,):
        for batch in batches:
            add("gru", hidden, 1, 200, batch, bidirectional=True, masked=True, classes=3)
    return shapes


def name_of(s):
    kind = ("masked bidirectional " if s["masked"] else "") + s["cell"].upper()
    classes = f", {s['classes']} classes" if s["classes"] != 2 else ""
    return f"{kind} E{s['embed']} H{s['hidden']} L{s['layers']} T{s['seq']}{classes}"


def say(text):
    print(text, file=sys.stderr, flush=True)


# --- ddptrain ------------------------------------------------------------------------------------------------

def dataset(binary, work, seq, classes):
    """A synthetic set of EPOCH_SAMPLES training rows of length `seq` (padded at the front to lengths from
    seq / 2 to seq), made once per (seq, classes)."""
    path = os.path.join(work, f"synthetic-T{seq}-C{classes}.h5")
    if not os.path.exists(path):
        subprocess.run([binary, "prepare", "synthetic", "--output", path, "--train", str(EPOCH_SAMPLES),
                        "--test", "256", "--vocab", str(VOCAB), "--maxlen", str(seq), "--classes",
                        str(classes), "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    return path


def ddptrain_run(binary, work, s, steps, device, precision, cuda_graph):
    """(step ms of the second epoch, seconds from exec to the first step), or (None, reason)."""
    run_dir = os.path.join(work, "run")
    subprocess.run(["rm", "-rf", run_dir], check=True)
    command = [binary, "--data.path", dataset(binary, work, s["seq"], s["classes"]), "--device", device,
               "--checkpoint.dir", run_dir, "--model.embedding_dim", str(s["embed"]), "--model.hidden",
               str(s["hidden"]), "--model.layers", str(s["layers"]), "--model.cell", s["cell"],
               "--model.bidirectional", str(s["bidirectional"]).lower(), "--model.mask_padding",
               str(s["masked"]).lower(), "--train.batch_size", str(s["batch"]), "--train.epochs", "2",
               "--train.max_steps_per_epoch", str(steps), "--log.progress", "lines", "--data.validate",
               "false", "--data.validation", "test", "--model.precision", precision, "--train.cuda_graph",
               cuda_graph]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or ["no output"]
        return None, f"ddptrain exit {run.returncode}: {last[0]}"
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        epochs = [e for e in map(json.loads, f) if "epoch" in e]
    return epochs[-1]["step_time_ms"], epochs[0].get("start_to_first_step_s")


# --- PyTorch -------------------------------------------------------------------------------------------------

def torch_data(torch, s, rows, device, generator):
    """Random tokens, padded at the end for a masked model (packing wants the valid steps first), and
    labels."""
    x = torch.randint(1, VOCAB, (rows, s["seq"]), device=device, generator=generator)
    if s["masked"]:
        lengths = torch.randint(s["seq"] // 2, s["seq"] + 1, (rows,), device=device, generator=generator)
        steps = torch.arange(s["seq"], device=device).unsqueeze(0)
        x = x.masked_fill(steps >= lengths.unsqueeze(1), 0)
    y = torch.randint(0, s["classes"], (rows,), device=device, generator=generator)
    return x, y


def torch_model(torch, s):
    import torch_reference
    return torch_reference.RecurrentClassifier(VOCAB, s["embed"], s["hidden"], s["layers"], s["cell"],
                                               s["bidirectional"], s["classes"], s["masked"]).cuda()


def torch_step_ms(torch, s, steps, graphed):
    """Mean ms per training step over `steps`, eager or with the whole step (forward, loss, backward, Adam)
    replayed from one CUDA graph; None where the step cannot be captured."""
    if graphed and (s["masked"] or s["precision"] == "fp16"):
        return None  # packed sequences, or GradScaler's host check of every step
    model = torch_model(torch, s)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7, capturable=graphed)
    generator = torch.Generator(device="cuda").manual_seed(1)
    batch = s["batch"]
    x, y = torch_data(torch, s, batch * 8, "cuda", generator)
    batches = [(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(8)]

    scaler = torch.amp.GradScaler("cuda") if s["precision"] == "fp16" else None

    def eager(i):
        xb, yb = batches[i % 8]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(torch, model, s, xb, yb)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:  # dynamic loss scaling, as ddptrain's fp16
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    step = eager
    if graphed:
        static_x, static_y = batches[0][0].clone(), batches[0][1].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as CUDA graphs require
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                loss_of(torch, model, s, static_x, static_y).backward()
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss_of(torch, model, s, static_x, static_y).backward()
            optimizer.step()

        def replay(i):
            xb, yb = batches[i % 8]
            static_x.copy_(xb)
            static_y.copy_(yb)
            graph.replay()
        step = replay
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    return 1000.0 * (time.perf_counter() - start) / steps


def set_torch_precision(torch, precision):
    """TF32 off for fp32 (the same arithmetic as ddptrain's fp32) and bf16 (autocast's), on for tf32 (as
    ddptrain's tf32)."""
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


def autocast(torch, precision):
    """The context a PyTorch forward and loss run in: autocast to bfloat16 or float16, else none."""
    if precision == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if precision == "fp16":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def loss_of(torch, model, s, x, y):
    with autocast(torch, s["precision"]):
        return model.loss(model(x), y)


def torch_first_step_child(shape_json):
    """In a child process: everything a PyTorch script does before its first step, then the wall clock at
    the first step's start on stdout."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    s = json.loads(shape_json)
    set_torch_precision(torch, s["precision"])
    model = torch_model(torch, s)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    generator = torch.Generator(device="cuda").manual_seed(1)
    x, y = torch_data(torch, s, EPOCH_SAMPLES, "cuda", generator)
    torch.cuda.synchronize()
    print(f"first_step_at {time.time():.6f}", flush=True)
    optimizer.zero_grad(set_to_none=True)
    loss_of(torch, model, s, x[:s["batch"]], y[:s["batch"]]).backward()
    optimizer.step()
    torch.cuda.synchronize()
    return 0


def torch_start_s(s):
    before = time.time()
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-first-step", json.dumps(s)],
                         capture_output=True, text=True)
    for line in run.stdout.splitlines():
        if line.startswith("first_step_at "):
            return float(line.split()[1]) - before
    say(f"PyTorch's start probe failed: {run.stderr.strip()[-300:]}")
    return None


# --- the cuDNN floor -----------------------------------------------------------------------------------------

def floor_ms(binary, s, iterations, precision):
    """(ms, algorithm) of the fastest algorithm cuDNN accepts for the shape, or (None, None)."""
    if not binary:
        return None, None
    best = (None, None)
    for algo in ("standard", "persist_small_h", "persist_static"):
        command = [binary, "--batch", str(s["batch"]), "--seq", str(s["seq"]), "--embed", str(s["embed"]),
                   "--hidden", str(s["hidden"]), "--layers", str(s["layers"]), "--cell", s["cell"], "--algo",
                   algo, "--warmup", "3", "--iters", str(iterations), "--math",
                   "default" if precision == "tf32" else "fma", "--data",
                   precision if precision in ("bf16", "fp16") else "float"]
        if s["bidirectional"]:
            command.append("--bidirectional")
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode == 3:  # cuDNN turned the algorithm down for this shape
            continue
        if run.returncode != 0:
            say(f"floor {algo}: exit {run.returncode}: {run.stderr.strip()[-300:]}")
            continue
        for line in run.stdout.splitlines():
            if line.startswith("floor_ms"):
                ms = float(line.split()[1])
                if best[0] is None or ms < best[0]:
                    best = (ms, algo)
    return best


# --- the table -----------------------------------------------------------------------------------------------

def ratio(a, b):
    return a / b if a is not None and b else None


def text(value, unit="", digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def marked(value, target, applies=True):
    """A ratio, bold where it misses its target."""
    if value is None:
        return "n/a"
    shown = f"{value:.2f}x"
    return f"**{shown}**" if applies and value > target else shown


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ddptrain")
    parser.add_argument("--floor", help="build/benchmarks/cudnn_floor_bench (optional)")
    parser.add_argument("--work", help="a folder for the data sets, runs and sweep.csv")
    parser.add_argument("--grid", choices=("full", "quick", "tiny"), default="full")
    parser.add_argument("--part", default="1/1", help="K/N: every N-th shape from the K-th")
    parser.add_argument("--seconds", type=float, default=1.5, help="about how long each measurement runs")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--torch-start", choices=("some", "all", "none"), default="some")
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16"), default="fp32",
                        help="the arithmetic of every side: fp32 (TF32 off), tf32, bf16 or fp16 (PyTorch: "
                        "autocast, and GradScaler for fp16)")
    parser.add_argument("--cuda-graph", choices=("auto", "off"), default="auto",
                        help="ddptrain's train.cuda_graph: its steps replayed from CUDA graphs (auto) or eager")
    parser.add_argument("--torch-first-step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_first_step:
        return torch_first_step_child(args.torch_first_step)
    if not args.ddptrain or not args.work:
        parser.error("--ddptrain and --work are needed")
    k, n = (int(v) for v in args.part.split("/"))
    if not 1 <= k <= n:
        parser.error(f"--part {args.part}: expected K/N with 1 <= K <= N")
    os.makedirs(args.work, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    torch = None
    why_no_torch = "--device cpu"
    if args.device == "cuda":
        try:
            import torch as imported
            if imported.cuda.is_available():
                torch = imported
                set_torch_precision(torch, args.precision)  # the same arithmetic on both sides
                say(f"GPU {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}, cuDNN "
                    f"{torch.backends.cudnn.version()}")
            else:
                why_no_torch = "PyTorch sees no CUDA device"
        except ImportError as e:
            why_no_torch = f"PyTorch not importable ({e})"
    if torch is None:
        say(f"no PyTorch side: {why_no_torch}")
    floor_binary = args.floor if args.device == "cuda" else None

    shapes = shapes_of(args.grid)[k - 1::n]
    for s in shapes:
        s["precision"] = args.precision
    rows = []
    started_groups = set()
    for index, s in enumerate(shapes):
        batch = s["batch"]
        epoch_steps = EPOCH_SAMPLES // batch
        # S from PyTorch's first eager steps where it runs, else a fixed count.
        steps = min(epoch_steps, 20)
        if torch is not None:
            probe = torch_step_ms(torch, s, 3, graphed=False)
            steps = max(5, min(epoch_steps, int(1000 * args.seconds / max(probe, 1e-3))))
        ours_ms, ours_start = ddptrain_run(args.ddptrain, args.work, s, steps, args.device, args.precision,
                                           args.cuda_graph)
        if ours_ms is None:
            say(f"{name_of(s)}, batch {batch}: {ours_start}")
            ours_start = None
        eager_ms = torch_step_ms(torch, s, steps, graphed=False) if torch else None
        graph_ms = torch_step_ms(torch, s, steps, graphed=True) if torch else None
        group = (s["cell"], s["hidden"], s["layers"], s["masked"])
        probe_start = torch is not None and (
            args.torch_start == "all" or
            (args.torch_start == "some" and group not in started_groups and batch >= 128 and s["seq"] >= 200))
        theirs_start = torch_start_s(s) if probe_start else None
        if probe_start:
            started_groups.add(group)
        floor, floor_algo = floor_ms(floor_binary, s, max(5, min(50, steps)), args.precision)

        def epoch(ms):
            return None if ms is None else ms * epoch_steps / 1000.0

        row = dict(shape=name_of(s), batch=batch, steps=steps, ddptrain_s=epoch(ours_ms),
                   eager_s=epoch(eager_ms), graph_s=epoch(graph_ms), floor_s=epoch(floor),
                   floor_algo=floor_algo or "", ddptrain_start_s=ours_start, torch_start_s=theirs_start,
                   vs_graph=ratio(ours_ms, graph_ms), vs_floor=ratio(ours_ms, floor))
        rows.append(row)
        say(f"[{index + 1}/{len(shapes)}] {row['shape']}, batch {batch}, {steps} steps: ddptrain "
            f"{text(row['ddptrain_s'], ' s')}, eager {text(row['eager_s'], ' s')}, graph "
            f"{text(row['graph_s'], ' s')}, floor {text(row['floor_s'], ' s')}, start "
            f"{text(ours_start, ' s', 2)}")

    with open(os.path.join(args.work, "sweep.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["shape"])
        writer.writeheader()
        writer.writerows(rows)

    print(f"Precision {args.precision} on every side (TF32 {'on' if args.precision == 'tf32' else 'off'}"
          f"{'; PyTorch under autocast to ' + args.precision if args.precision in ('bf16', 'fp16') else ''}"
          f"{', with GradScaler (no CUDA graph)' if args.precision == 'fp16' else ''}); ddptrain's "
          f"train.cuda_graph = {args.cuda_graph}.\n")
    print("| shape | batch | ddptrain epoch | PyTorch eager | PyTorch CUDA graph | cuDNN floor x steps | "
          f"ddptrain / graph (<= {TARGET_VS_GRAPH}) | ddptrain / floor (<= {TARGET_VS_FLOOR}, batch >= 128) | "
          f"start to first step, ddptrain (<= {TARGET_START_S:.0f} s) | start, PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        graph = text(r["graph_s"], " s") if r["graph_s"] is not None or r["eager_s"] is None else (
            "not capturable (GradScaler)" if args.precision == "fp16" else "not capturable (packed sequences)")
        floor = text(r["floor_s"], " s") + (f" ({r['floor_algo']})" if r["floor_algo"] else "")
        start = r["ddptrain_start_s"]
        start_text = "n/a" if start is None else (f"**{start:.2f} s**" if start > TARGET_START_S else
                                                  f"{start:.2f} s")
        print(f"| {r['shape']} | {r['batch']} | {text(r['ddptrain_s'], ' s')} | {text(r['eager_s'], ' s')} | "
              f"{graph} | {floor} | {marked(r['vs_graph'], TARGET_VS_GRAPH)} | "
              f"{marked(r['vs_floor'], TARGET_VS_FLOOR, r['batch'] >= 128)} | {start_text} | "
              f"{text(r['torch_start_s'], ' s', 2)} |")
    failed = [r for r in rows if r["ddptrain_s"] is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
