#!/usr/bin/env python3
"""A latency-bandwidth (alpha-beta) model of ddptrain's step time across nodes, fitted to measured multi-node
steps, and its predictions for larger jobs: a Markdown section (fit, every point against the model,
predictions) and an SVG of scaling efficiency against ranks.

    python3 benchmarks/scaling_model.py --points points.csv --rows rows.csv \
        [--table scaling.md] [--svg scaling.svg] [--efficiency shared|per-layout] [--host-cost] \
        [--compute-ms MS] [--ranks-per-node R] \
        [--vocab 20000 --embedding 128 --hidden 128 --layers 1 --batch 32 --seq 80]

Inputs (CSV, a header line naming the columns in any order; blank lines and lines starting with # skipped)
--------------------------------------------------------------------------------------------------------
--points: layout,nodes,ranks_per_node,link_mbit,step_ms,compute_ms,bytes_per_step_rank, one measured job a row.
  layout               allreduce_dense | allreduce_sparse | ps_dedicated
  nodes, ranks_per_node  all-reduce: ranks = nodes * ranks_per_node. ps_dedicated: `nodes` counts every node,
                       the server's included; the server (the last rank) is alone on its node and
                       ranks_per_node is the number of workers on each of the other nodes-1 nodes, so
                       workers W = (nodes - 1) * ranks_per_node and ranks = W + 1.
  link_mbit            the per-node link rate (a tc rate, or the measured rate of an unshaped link).
  step_ms              the measured mean step time.
  compute_ms           forward + backward + optimizer of one step without any exchange (a one-rank run of the
                       same layout, shapes and threads per rank).
  fit                  optional, 0 or 1 (default 1): 0 reports the point against the model but leaves it out of
                       the fit (a job the model does not describe, e.g. more busy ranks than the machine's cores).
  bytes_per_step_rank  bytes sent over the node links per step per rank: the sum over all nodes of the
                       interfaces' transmitted-byte counters, divided by steps and by all ranks (for the
                       all-reduce layouts every node is alike, so one node's count / ranks_per_node).
--rows: samples,unique_rows: the mean number of distinct embedding rows (tokens) in a batch of `samples`
  samples, measured on the dataset (samples = 32, 64, ..., 16384).
Bad input (a missing file or column, a non-number, an empty file) ends the script with exit code 2 and one
line naming the file and the line.

Model
-----
    step = compute + exchange,    exchange = sum over the exchange's phases of (alpha * m + B / (eff * L) [+ h B])

  m      messages on the critical path that cross a node link (hops between ranks of one node go through
         shared memory and are taken as free; a one-node job has no exchange cost in this model)
  B      bytes through the busiest node link in the phase
  L      the link rate in bytes/s (link_mbit * 1e6 / 8)
  alpha  seconds per message, and eff, the fraction of the link rate the exchange achieves: both fitted.
         eff is one number for all layouts (--efficiency shared, the default: 2 parameters), or one per
         layout (--efficiency per-layout). It absorbs everything that costs per byte: TCP, MPI's copies and
         reductions, the parameter server's summation; see "Limits" below.
  h      with --host-cost only: seconds per byte of B that do not depend on the link rate (the host's
         copies and reductions), fitted too; one more parameter, which needs points at several link rates.

Collectives, for p ranks on N nodes, r = p / N ranks per node, ranks numbered node by node (mpirun's default
by-slot mapping), so that a ring crosses each node boundary once per direction:
  ring all-reduce of S bytes (S >= 64 KiB): reduce-scatter then all-gather, 2(p-1) steps, each with a hop
      across every node boundary:  m = 2(p-1),  B = 2(p-1)/p * S  (sent; as much is received, full duplex).
  recursive-doubling all-reduce of S bytes (S < 64 KiB: the 129 floats of the dense layer): log2 p rounds
      each exchanging all S; the log2 N rounds whose partners are r or more ranks apart leave the node:
      m = ceil(log2 N),  B = r * S * ceil(log2 N).
  recursive-doubling all-gather of s bytes per rank (the row counts, s = 4): round k sends 2^k s, and the
      rounds with partners r or more apart send s (r + 2r + ... + p/2) in all:  m = ceil(log2 N),  B = r s (p - r).
  ring all-gatherv of s bytes per rank on average (the row ids):  m = p - 1,  B = (p - 1) s.

Parameters: P = V E + L (4H(E + H) + 8H) + H + 1 floats (models/param_layout.cpp; 2,692,225 at V = 20000,
E = H = 128, L = 1), each a float32. The trainer all-reduces one segment per MPI_Iallreduce (embedding,
each LSTM layer, dense), so the segments' messages add up.

U(n), the distinct rows touched by n samples: interpolated in log-log between the --rows points, extrapolated
with the slope of the nearest end segment, and capped at min(V, n * seq). u = U(b) for one rank's batch b,
U(p b) for the union of p ranks' batches.

  allreduce_dense   ring all-reduce of the embedding (4VE bytes) and of each LSTM layer (4(4H(in + H) + 8H)),
                    recursive doubling of the dense layer (4(H + 1)).
  allreduce_sparse  the LSTM and dense segments as above, then comm/mpi_reducer.cpp average_rows: an
                    all-gather of the row counts (4 bytes), an all-gatherv of the row ids (4u bytes a rank),
                    and a ring all-reduce of the union's rows, 4 E U(pb) bytes, or of the whole embedding,
                    4VE, when 2 U(pb) > V (the code's dense fallback).
  ps_dedicated      W workers, K servers each alone on its node (the measured jobs have K = 1; "K servers"
                    in the predictions means K = ranks / 8 dedicated server nodes). Server j owns shard
                    [b_j, e_j) of the flat vector (comm/ps_protocol.cpp's split). A step, every worker
                    sends every server one push and gets one pull (comm/row_sparse.h):
                      push_j = 16 + 4 (1 + u_j + values_j + rest_j)  (header; row count; row ids; the touched
                               rows' part in the shard; the shard outside the embedding), or 16 + 4 (e_j - b_j)
                               dense when that is not larger;  K = 1: u_j = u, values_j = u E, rest_j = P - VE.
                               With K > 1 the touched rows are taken as spread evenly over the embedding.
                      pull_j = 16 + 4 (e_j - b_j), dense.
                    In sync mode a server first takes all W pushes, then updates and sends all W pulls: its
                    link carries the two phases one after the other, so B = W (push_j + pull_j) (the sum, not
                    the max of the two directions), and it handles its W requests and W replies one by one:
                    m = 2W. B is the busiest of that and a worker node's r (sum push_j + sum pull_j).

Bytes per step per rank, predicted for the points: the bytes the model sends over node links in a step, all
nodes, divided by all ranks: an all-reduce node's sent B / r; for the parameter server
W (sum push_j + sum pull_j) / (W + K). Interface counters also count TCP/IP headers and ACKs, a few percent
above the payload.

Fit: with x_i = B_i / L_i (seconds at the full link rate) and the measured exchange y_i = step_i - compute_i,
    minimize  sum_i ((alpha m_i + x_i / eff [+ h B_i] - y_i) / step_i)^2   over alpha, 1/eff [, h] >= 0,
the sum of squared relative errors of the step time (the target is a relative error; unweighted, the slow
100 Mbit points would decide everything). It is linear in (alpha, 1/eff, h) and solved exactly with numpy by
trying every subset of free parameters (a non-negative least squares for a handful of unknowns). Standard
errors come from the weighted residuals.

Predictions: ranks 2, 8, 32, 128, 512 at 10, 25, 100, 200 Gbit/s, one rank per node (--ranks-per-node R to
change it), compute = --compute-ms (default the median compute_ms of the points), the fitted alpha and eff.
Scaling efficiency = compute / step, the fraction of each rank's step spent computing (for the parameter
server, of each worker's step; the servers' ranks train nothing).

Limits: without --host-cost, eff folds per-byte host work (MPI's reduction and copies, the server's summation
of W gradients) into the link term, so it holds near the measured link rates only: at much faster links that
work does not shrink with the link, and the fit tends to push it into alpha instead, which then inflates the
latency of large rings. The table's implied efficiency per point shows it: if it falls as the link rate rises,
fit again with --host-cost.
"""
import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass, field

try:
    import numpy as np
except ImportError:
    sys.exit("scaling_model.py needs numpy (Debian: apt-get install python3-numpy, then run it with "
             "/usr/bin/python3)")

LAYOUTS = ("allreduce_dense", "allreduce_sparse", "ps_dedicated")
POINT_COLUMNS = ("layout", "nodes", "ranks_per_node", "link_mbit", "step_ms", "compute_ms", "bytes_per_step_rank")
ROWS_COLUMNS = ("samples", "unique_rows")
FLOAT_BYTES = 4
PS_HEADER_BYTES = 16  # comm/ps_protocol.h's PsHeader in front of every message
RING_MIN_BYTES = 64 * 1024  # all-reduces below this are taken as recursive doubling
PREDICT_RANKS = (2, 8, 32, 128, 512)
PREDICT_GBIT = (10, 25, 100, 200)
SVG_GBIT = (10, 100)  # solid, dashed
ERROR_TARGET = 0.20
COLORS = {"allreduce_dense": "#1f77b4", "allreduce_sparse": "#2ca02c", "ps_dedicated": "#d62728"}


class InputError(Exception):
    """Bad input (or an output file that cannot be written): one line naming the file (and the line),
    then exit code 2."""


# --- Shapes and rows -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The model's shapes (--vocab etc.), and the float counts of the parameter segments the trainer
    exchanges, as models/param_layout.cpp lays them out."""

    vocab: int
    embedding: int
    hidden: int
    layers: int
    batch: int
    seq: int

    @property
    def embedding_floats(self):
        return self.vocab * self.embedding

    def lstm_layer_floats(self, layer):
        """w_ih [4H, in], w_hh [4H, H], b_ih and b_hh [4H]; in = E for the first layer, H above."""
        width_in = self.embedding if layer == 0 else self.hidden
        return 4 * self.hidden * (width_in + self.hidden) + 8 * self.hidden

    @property
    def dense_floats(self):
        return self.hidden + 1

    @property
    def total_floats(self):
        return (self.embedding_floats + sum(self.lstm_layer_floats(l) for l in range(self.layers)) +
                self.dense_floats)


class RowsModel:
    """U(n): the distinct embedding rows touched by n samples, from the measured --rows table."""

    def __init__(self, samples, unique, shape):
        self.log_n = np.log(np.asarray(samples, dtype=float))
        self.log_u = np.log(np.asarray(unique, dtype=float))
        self.shape = shape

    def unique(self, n):
        """Log-log interpolation; outside the table the nearest end segment's slope, since the growth of
        distinct tokens with samples is close to a power law locally. Capped at the vocabulary and at
        n * seq (a sample has at most seq tokens)."""
        x = math.log(n)
        if x <= self.log_n[0]:
            i = 0
        elif x >= self.log_n[-1]:
            i = len(self.log_n) - 2
        else:
            i = int(np.searchsorted(self.log_n, x)) - 1
        slope = (self.log_u[i + 1] - self.log_u[i]) / (self.log_n[i + 1] - self.log_n[i])
        u = math.exp(self.log_u[i] + slope * (x - self.log_n[i]))
        return min(u, float(self.shape.vocab), float(n * self.shape.seq))


# --- Reading the CSVs ----------------------------------------------------------------------------------------


def read_csv(path, columns):
    """The data rows of a CSV as (line number, {column: text}), checked for the columns it must have and
    for the field count, so that every later error can name its line. Blank and #-lines are skipped."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
            reader = csv.reader(f)
            records = [(reader.line_num, row) for row in reader]
    except OSError as e:
        raise InputError(f"{path}: cannot read this file ({e.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: not a CSV text file ({e})") from None
    records = [(line, [x.strip() for x in row]) for line, row in records
               if any(x.strip() for x in row) and not row[0].lstrip().startswith("#")]
    if not records:
        raise InputError(f"{path} line 1: empty file, expected a header line: {','.join(columns)}")
    header_line, header = records[0]
    for name in columns:
        if name not in header:
            raise InputError(f"{path} line {header_line}: missing column '{name}' "
                             f"(the header must name {','.join(columns)})")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise InputError(f"{path} line {header_line}: column '{duplicates[0]}' appears twice")
    if len(records) == 1:
        raise InputError(f"{path} line {header_line}: no data rows after the header")
    rows = []
    for line, fields in records[1:]:
        if len(fields) != len(header):
            raise InputError(f"{path} line {line}: {len(fields)} fields, the header has {len(header)}")
        rows.append((line, dict(zip(header, fields))))
    return rows


def number(path, line, row, column, integer=False, minimum=None, exclusive=False):
    """The value of `column` in a row as a float (or int), with an error naming the line when it is not
    a finite number or is out of range."""
    text = row[column]
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{path} line {line}: {column} = '{text}' is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{path} line {line}: {column} = '{text}' is not a finite number")
    if integer:
        if value != int(value):
            raise InputError(f"{path} line {line}: {column} = '{text}' is not a whole number")
        value = int(value)
    if minimum is not None and (value < minimum or (exclusive and value == minimum)):
        raise InputError(f"{path} line {line}: {column} = '{text}' must be {'>' if exclusive else '>='} "
                         f"{minimum:g}")
    return value


@dataclass
class Point:
    """One measured job of --points."""

    line: int
    layout: str
    nodes: int
    ranks_per_node: int
    link_mbit: float
    step_ms: float
    compute_ms: float
    bytes_per_step_rank: float
    fitted: bool = True  # the optional column `fit`: 0 leaves the point out of the fit (still reported)

    @property
    def ranks(self):
        if self.layout == "ps_dedicated":
            return (self.nodes - 1) * self.ranks_per_node + 1
        return self.nodes * self.ranks_per_node

    @property
    def label(self):
        return f"{self.layout} {self.nodes}x{self.ranks_per_node} @ {self.link_mbit:g} Mbit/s"


def read_points(path):
    points = []
    for line, row in read_csv(path, POINT_COLUMNS):
        layout = row["layout"]
        if layout not in LAYOUTS:
            raise InputError(f"{path} line {line}: layout = '{layout}' is not one of {', '.join(LAYOUTS)}")
        point = Point(line, layout,
                      number(path, line, row, "nodes", integer=True, minimum=1),
                      number(path, line, row, "ranks_per_node", integer=True, minimum=1),
                      number(path, line, row, "link_mbit", minimum=0, exclusive=True),
                      number(path, line, row, "step_ms", minimum=0, exclusive=True),
                      number(path, line, row, "compute_ms", minimum=0),
                      number(path, line, row, "bytes_per_step_rank", minimum=0))
        if "fit" in row:
            if row["fit"] not in ("0", "1"):
                raise InputError(f"{path} line {line}: fit = '{row['fit']}': expected 0 or 1")
            point.fitted = row["fit"] == "1"
        if layout == "ps_dedicated" and point.nodes < 2:
            raise InputError(f"{path} line {line}: ps_dedicated needs nodes >= 2 (the server's own node and "
                             "at least one worker node)")
        points.append(point)
    return points


def read_rows(path, shape):
    """The --rows table, sorted by samples; checked against the shapes, since a table from another dataset
    or vocabulary would silently skew every sparse exchange."""
    table = {}
    for line, row in read_csv(path, ROWS_COLUMNS):
        samples = number(path, line, row, "samples", integer=True, minimum=1)
        unique = number(path, line, row, "unique_rows", minimum=0, exclusive=True)
        if samples in table:
            raise InputError(f"{path} line {line}: samples = {samples} appears twice")
        if unique > shape.vocab:
            raise InputError(f"{path} line {line}: unique_rows = {unique:g} exceeds --vocab {shape.vocab}")
        if unique > samples * shape.seq:
            raise InputError(f"{path} line {line}: unique_rows = {unique:g} exceeds samples * --seq "
                             f"= {samples * shape.seq}")
        table[samples] = unique
    if len(table) < 2:
        raise InputError(f"{path}: needs at least two rows (samples values) to interpolate")
    samples = sorted(table)
    return RowsModel(samples, [table[n] for n in samples], shape)


# --- Exchanges -------------------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """What one step's exchange costs the busiest node link: messages on the critical path, bytes through
    the link (phases summed), and the bytes sent over node links per rank (for the bytes check)."""

    messages: float = 0.0
    link_bytes: float = 0.0
    sent_per_rank: float = 0.0

    def add(self, messages, link_bytes, ranks_per_node):
        """One more phase of an all-reduce layout, where every node is alike."""
        self.messages += messages
        self.link_bytes += link_bytes
        self.sent_per_rank += link_bytes / ranks_per_node


def ceil_log2(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def allreduce(exchange, size_bytes, ranks, nodes):
    """An MPI_Allreduce of size_bytes: ring at and above RING_MIN_BYTES, recursive doubling below."""
    if nodes < 2 or size_bytes == 0:
        return
    per_node = ranks // nodes
    if size_bytes >= RING_MIN_BYTES:
        exchange.add(2 * (ranks - 1), 2 * (ranks - 1) / ranks * size_bytes, per_node)
    else:
        exchange.add(ceil_log2(nodes), per_node * size_bytes * ceil_log2(nodes), per_node)


def model_segments(exchange, shape, ranks, nodes):
    """The all-reduces of the LSTM layers and the dense layer, one per segment."""
    for layer in range(shape.layers):
        allreduce(exchange, FLOAT_BYTES * shape.lstm_layer_floats(layer), ranks, nodes)
    allreduce(exchange, FLOAT_BYTES * shape.dense_floats, ranks, nodes)


def exchange_allreduce_dense(shape, ranks, nodes):
    exchange = Exchange()
    allreduce(exchange, FLOAT_BYTES * shape.embedding_floats, ranks, nodes)
    model_segments(exchange, shape, ranks, nodes)
    return exchange


def exchange_allreduce_sparse(shape, rows, ranks, nodes):
    """engine/data_parallel_step.cpp with comm.sparse_embedding: the dense segments, then average_rows."""
    exchange = Exchange()
    model_segments(exchange, shape, ranks, nodes)
    if nodes < 2:
        return exchange
    per_node = ranks // nodes
    # MPI_Allgather of one int per rank (recursive doubling).
    exchange.add(ceil_log2(nodes), per_node * FLOAT_BYTES * (ranks - per_node), per_node)
    # MPI_Allgatherv of the row ids (ring): u int32s per rank.
    exchange.add(ranks - 1, (ranks - 1) * FLOAT_BYTES * rows.unique(shape.batch), per_node)
    union = rows.unique(ranks * shape.batch)
    union_floats = shape.embedding_floats if 2 * union > shape.vocab else union * shape.embedding
    allreduce(exchange, FLOAT_BYTES * union_floats, ranks, nodes)
    return exchange


def ps_shard_bytes(shape, rows, servers):
    """Per server j: (push_j, pull_j) bytes of one worker's step (comm/row_sparse.cpp's encoding, with the
    batch's touched rows spread evenly over the embedding when the embedding spans several shards)."""
    total = shape.total_floats
    region_end = shape.embedding_floats
    width = shape.embedding
    touched = rows.unique(shape.batch)
    result = []
    for j in range(servers):
        begin = j * (total // servers) + min(j, total % servers)
        end = (j + 1) * (total // servers) + min(j + 1, total % servers)
        shard = end - begin
        part_begin, part_end = max(begin, 0), min(end, region_end)
        push = shard
        if part_begin < part_end:
            meeting_rows = math.ceil(part_end / width) - part_begin // width
            part = part_end - part_begin
            sparse = 1 + touched * meeting_rows / shape.vocab + touched * part / shape.vocab + (shard - part)
            push = min(sparse, shard)
        result.append((PS_HEADER_BYTES + FLOAT_BYTES * push, PS_HEADER_BYTES + FLOAT_BYTES * shard))
    return result


def exchange_ps(shape, rows, workers, servers, workers_per_node):
    """Sync parameter server, each server alone on its node: see the module docstring."""
    shards = ps_shard_bytes(shape, rows, servers)
    push_all = sum(push for push, _ in shards)
    pull_all = sum(pull for _, pull in shards)
    server_link = max(workers * (push + pull) for push, pull in shards)
    worker_link = min(workers_per_node, workers) * (push_all + pull_all)
    return Exchange(messages=2 * workers, link_bytes=max(server_link, worker_link),
                    sent_per_rank=workers * (push_all + pull_all) / (workers + servers))


def exchange_of(layout, shape, rows, ranks, ranks_per_node, servers=1):
    """The exchange of a job of `ranks` ranks (servers included for the parameter server)."""
    if layout == "ps_dedicated":
        return exchange_ps(shape, rows, ranks - servers, servers, ranks_per_node)
    per_node = min(ranks_per_node, ranks)
    nodes = max(1, ranks // per_node)
    if layout == "allreduce_dense":
        return exchange_allreduce_dense(shape, ranks, nodes)
    return exchange_allreduce_sparse(shape, rows, ranks, nodes)


def link_seconds(exchange, link_mbit):
    """The link term at full efficiency: bytes / link rate."""
    return exchange.link_bytes * 8 / (link_mbit * 1e6)


# --- Fit ---------------------------------------------------------------------------------------------------------


def nonnegative_lstsq(a, y):
    """argmin ||a x - y|| over x >= 0, exactly, by solving the unconstrained problem on every subset of free
    columns (numpy has no NNLS; a negative latency or per-byte cost is meaningless, and there are only a
    few unknowns). Subsets whose columns are not independent are skipped. Returns (x, free mask)."""
    columns = a.shape[1]
    best = None
    for mask in range(1, 1 << columns):
        free = [c for c in range(columns) if mask >> c & 1]
        sub = a[:, free]
        if np.linalg.matrix_rank(sub) < len(free):
            continue
        solution, *_ = np.linalg.lstsq(sub, y, rcond=None)
        if np.any(solution < 0):
            continue
        x = np.zeros(columns)
        x[free] = solution
        residual = float(np.sum((a @ x - y) ** 2))
        if best is None or residual < best[0] - 1e-18:
            best = (residual, x, np.array([c in free for c in range(columns)]))
    if best is None:
        raise RuntimeError("no non-negative alpha and efficiency fit these points (is step_ms above "
                           "compute_ms?)")
    return best[1], best[2]


@dataclass
class Fit:
    """The fitted parameters: alpha (s per message), 1/eff per layout (under per-layout mode only the
    layouts with points), host (s per byte of the busiest link; None without --host-cost), their standard
    errors (None where not estimable or at the bound 0), and notes on what the points could not tell."""

    mode: str
    alpha: float
    alpha_se: object
    inverse_efficiency: dict
    inverse_efficiency_se: dict
    host: object = None
    host_se: object = None
    notes: list = field(default_factory=list)

    def efficiency(self, layout):
        return 1 / self.inverse_efficiency[layout]

    def efficiency_se(self, layout):
        """By the delta method, d(1/v) = dv / v^2."""
        se = self.inverse_efficiency_se[layout]
        return None if se is None else se / self.inverse_efficiency[layout] ** 2

    def exchange_seconds(self, layout, exchange, link_mbit):
        return (self.alpha * exchange.messages + (self.host or 0.0) * exchange.link_bytes +
                self.inverse_efficiency[layout] * link_seconds(exchange, link_mbit))


def fit_model(points, exchanges, mode, host_cost):
    """Weighted non-negative least squares of the exchange time (see the module docstring). Columns:
    messages, [bytes (--host-cost)], then bytes / link rate, one column per efficiency group."""
    groups = [LAYOUTS] if mode == "shared" else [(l,) for l in LAYOUTS if any(p.layout == l for p in points)]
    first_link = 2 if host_cost else 1
    a = np.zeros((len(points), first_link + len(groups)))
    y = np.zeros(len(points))
    weight = np.zeros(len(points))
    for i, (point, exchange) in enumerate(zip(points, exchanges)):
        a[i, 0] = exchange.messages
        if host_cost:
            a[i, 1] = exchange.link_bytes
        g = next(k for k, group in enumerate(groups) if point.layout in group)
        a[i, first_link + g] = link_seconds(exchange, point.link_mbit)
        y[i] = (point.step_ms - point.compute_ms) / 1e3
        weight[i] = 1e3 / point.step_ms
    if not np.any(a[:, first_link:]):
        raise RuntimeError("no point sends bytes over a node link (one-node jobs only): the model is fitted to "
                           "multi-node jobs")
    aw, yw = a * weight[:, None], y * weight
    notes = []
    if np.linalg.matrix_rank(aw) < aw.shape[1]:
        notes.append("these points cannot tell every parameter apart (add points that differ in ranks or "
                     "link rate); the fit kept the ones they determine")
    x, free = nonnegative_lstsq(aw, yw)
    for g, group in enumerate(groups):
        if not free[first_link + g]:
            raise RuntimeError(f"the fit puts no cost on the bytes of {' and '.join(group)}: the points' exchange "
                               "times do not grow with their bytes / link rate (check step_ms and compute_ms, "
                               "and that the points include jobs of more than one node)")
    se = [None] * len(x)
    dof = len(points) - int(np.sum(free))
    if dof > 0:
        residual = float(np.sum((aw @ x - yw) ** 2))
        covariance = residual / dof * np.linalg.inv(aw[:, free].T @ aw[:, free])
        for column, value in zip(np.flatnonzero(free), np.sqrt(np.diag(covariance))):
            se[column] = float(value)
    else:
        notes.append("as many points as free parameters: no standard errors")
    if not free[0]:
        notes.append("alpha is at its bound 0: the points show no per-message cost")
    if host_cost and not free[1]:
        notes.append("the host cost is at its bound 0: the points show no per-byte cost beyond the link's")
    inverse, inverse_se = {}, {}
    for g, group in enumerate(groups):
        for layout in group:
            inverse[layout] = float(x[first_link + g])
            inverse_se[layout] = se[first_link + g]
    fit = Fit(mode, float(x[0]), se[0], inverse, inverse_se, notes=notes)
    if host_cost:
        fit.host, fit.host_se = float(x[1]), se[1]
    return fit


# --- Predictions ---------------------------------------------------------------------------------------------


@dataclass
class Prediction:
    label: str  # the row's name in the table
    layout: str  # whose exchange and efficiency it uses
    many_servers: bool  # the parameter server with K = ranks / 8 servers instead of one
    cells: dict  # (gbit, ranks) -> (step_ms, scaling efficiency)


def predict(fit, shape, rows, compute_ms, ranks_per_node, ranks_list, gbit_list):
    """Step time and scaling efficiency of each layout the fit covers, on the grid ranks x link rates."""
    result = []
    variants = [(l, l, False) for l in LAYOUTS] + [("ps_dedicated, K = ranks/8 servers", "ps_dedicated", True)]
    for label, layout, many_servers in variants:
        if layout not in fit.inverse_efficiency:
            continue
        cells = {}
        for ranks in ranks_list:
            servers = max(1, ranks // 8) if many_servers else 1
            exchange = exchange_of(layout, shape, rows, ranks, ranks_per_node, servers)
            for gbit in gbit_list:
                step = compute_ms + 1e3 * fit.exchange_seconds(layout, exchange, gbit * 1e3)
                cells[(gbit, ranks)] = (step, compute_ms / step)
        result.append(Prediction(label, layout, many_servers, cells))
    return result


# --- Output --------------------------------------------------------------------------------------------------


def ms_text(value):
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def relative(predicted, measured):
    return (predicted - measured) / measured if measured > 0 else None


def percent(value, sign=True):
    return "-" if value is None else (f"{100 * value:+.1f}%" if sign else f"{100 * value:.1f}%")


def implied_efficiency(fit, point, exchange):
    """The efficiency that would make the model exact at this point, with the fitted alpha (and h):
    drifting with the link rate, it shows per-byte costs that do not scale with the link."""
    seconds = ((point.step_ms - point.compute_ms) / 1e3 - fit.alpha * exchange.messages -
               (fit.host or 0.0) * exchange.link_bytes)
    full_rate = link_seconds(exchange, point.link_mbit)
    return full_rate / seconds if seconds > 0 and full_rate > 0 else None


def efficiency_text(fit, layout):
    value, se = fit.efficiency(layout), fit.efficiency_se(layout)
    return f"{value:.3f}" + (f" ± {se:.3f}" if se is not None else "")


def model_step_ms(fit, point, exchange):
    return point.compute_ms + 1e3 * fit.exchange_seconds(point.layout, exchange, point.link_mbit)


def errors(fit, points, exchanges):
    """(|relative error|, label) of the step times and of the bytes (points with measured bytes), largest
    first."""
    steps, bytes_ = [], []
    for point, exchange in zip(points, exchanges):
        label = f"line {point.line}: {point.label}"
        steps.append((abs(relative(model_step_ms(fit, point, exchange), point.step_ms)), label))
        byte_error = relative(exchange.sent_per_rank, point.bytes_per_step_rank)
        if byte_error is not None:
            bytes_.append((abs(byte_error), label))
    return sorted(steps, reverse=True), sorted(bytes_, reverse=True)


def parameters_section(fit, shape, rows, points):
    host_term = " + h · bytes" if fit.host is not None else ""
    out = ["## Scaling model (alpha-beta fit)", "",
           f"step = compute + Σ phases (α · messages + bytes on the busiest node link / (efficiency · link rate)"
           f"{host_term}); model, collectives and fit in `benchmarks/scaling_model.py`'s docstring.", "",
           "### Fitted parameters", "", "| parameter | value |", "|---|---|"]
    alpha_se = f" ± {1e6 * fit.alpha_se:.1f}" if fit.alpha_se is not None else ""
    out.append(f"| α (per message on the critical path) | {1e6 * fit.alpha:.1f}{alpha_se} µs |")
    if fit.mode == "shared":
        out.append(f"| efficiency (all layouts) | {efficiency_text(fit, LAYOUTS[0])} |")
    else:
        for layout in fit.inverse_efficiency:
            out.append(f"| efficiency, {layout} | {efficiency_text(fit, layout)} |")
    if fit.host is not None:
        host_se = f" ± {1e9 * fit.host_se:.3f}" if fit.host_se is not None else ""
        out.append(f"| h (host, per byte on the busiest link) | {1e9 * fit.host:.3f}{host_se} ns |")
    out.append(f"| points | {len(points)} |")
    out.append(f"| shapes | V = {shape.vocab}, E = {shape.embedding}, H = {shape.hidden}, "
               f"layers = {shape.layers}, batch = {shape.batch} per rank, seq = {shape.seq}: "
               f"P = {shape.total_floats:,} parameters |")
    out.append(f"| rows touched | U({shape.batch}) = {rows.unique(shape.batch):.0f} per rank |")
    out += [f"| note | {note} |" for note in fit.notes]
    return out + [""]


def points_section(fit, points, exchanges):
    out = ["### Measured points against the model", "",
           "Step times in ms; bytes sent over node links per step per rank in kB; error = (model - measured) / "
           "measured. Implied efficiency: the efficiency that would make this point exact. Fitted: whether the "
           "point took part in the fit (the CSV's `fit` column).", "",
           "| layout | nodes × ranks/node | link Mbit/s | fitted | compute | step measured | step model | error | "
           "bytes measured | bytes model | error | implied efficiency |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for point, exchange in zip(points, exchanges):
        step = model_step_ms(fit, point, exchange)
        implied = implied_efficiency(fit, point, exchange)
        byte_error = relative(exchange.sent_per_rank, point.bytes_per_step_rank)
        out.append(
            f"| {point.layout} | {point.nodes} × {point.ranks_per_node} | {point.link_mbit:g} | "
            f"{'yes' if point.fitted else 'no'} | {ms_text(point.compute_ms)} | {ms_text(point.step_ms)} | {ms_text(step)} | "
            f"{percent(relative(step, point.step_ms))} | {point.bytes_per_step_rank / 1e3:,.1f} | "
            f"{exchange.sent_per_rank / 1e3:,.1f} | {percent(byte_error)} | "
            f"{'-' if implied is None else f'{implied:.3f}'} |")
    step_errors, byte_errors = errors(fit, points, exchanges)
    worst_bytes = (f"{percent(byte_errors[0][0], False)} ({byte_errors[0][1]})" if byte_errors else "-")
    return out + ["", f"Max |error|: step {percent(step_errors[0][0], False)} ({step_errors[0][1]}), bytes "
                  f"{worst_bytes}; target {ERROR_TARGET:.0%}.", ""]


def predictions_section(fit, points, predictions, compute_ms, ranks_per_node):
    ranks_list = sorted({r for p in predictions for (_, r) in p.cells})
    gbit_list = sorted({g for p in predictions for (g, _) in p.cells})
    placement = "one rank per node" if ranks_per_node == 1 else f"{ranks_per_node} ranks per node"
    out = ["### Predictions", "",
           f"Step time in ms (scaling efficiency = compute / step) with compute = {ms_text(compute_ms)} ms per step, "
           f"{placement}; the parameter server's servers each alone on their own node, ranks = workers + servers.",
           "",
           "| layout | link Gbit/s | " + " | ".join(f"{r} ranks" for r in ranks_list) + " |",
           "|---|---|" + "---|" * len(ranks_list)]
    for prediction in predictions:
        for gbit in gbit_list:
            cells = [prediction.cells[(gbit, r)] for r in ranks_list]
            out.append(f"| {prediction.label} | {gbit:g} | " +
                       " | ".join(f"{ms_text(step)} ({efficiency:.0%})" for step, efficiency in cells) + " |")
    fastest = max(p.link_mbit for p in points) / 1e3
    if fit.host is None:
        caveat = ("the per-byte host work folded into the efficiency does not shrink with the link, so the "
                  "predictions at faster links are optimistic (see --host-cost)")
    else:
        caveat = "the predictions at faster links extrapolate the fitted efficiency and h"
    return out + ["", f"The points' links reach {fastest:g} Gbit/s: {caveat}.", ""]


def write_table(path, fit, shape, rows, points, exchanges, predictions, compute_ms, ranks_per_node):
    """The Markdown section: (a) the fit, (b) every point against the model, (c) the predictions."""
    out = (parameters_section(fit, shape, rows, points) + points_section(fit, points, exchanges) +
           predictions_section(fit, points, predictions, compute_ms, ranks_per_node))
    write_file(path, "\n".join(out))


def write_file(path, text):
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise InputError(f"{path}: cannot write this file ({e.strerror})") from None


def fixed(value, decimals=2):
    return f"{value:.{decimals}f}"


def dash(dashed):
    """The stroke attribute of a dashed line (the second link rate), as learning_curves.cpp draws it."""
    return ' stroke-dasharray="6 4"' if dashed else ""


def xml_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def write_svg(path, fit, shape, rows, points, compute_ms, ranks_per_node):
    """Scaling efficiency against ranks (log2 axis) for each layout at the SVG_GBIT link rates (solid,
    dashed), and the measured points' compute / step as markers, in engine/app/learning_curves.cpp's style."""
    width, height = 960.0, 480.0
    x0, x1, top, bottom = 72.0, width - 24, 112.0, height - 64
    measured_ranks = [p.ranks for p in points]
    lo = math.log2(min([PREDICT_RANKS[0]] + measured_ranks))
    hi = math.log2(max([PREDICT_RANKS[-1]] + measured_ranks))
    measured_eff = [p.compute_ms / p.step_ms for p in points]
    y_hi = max(1.0, math.ceil(max(measured_eff) * 10) / 10)

    def px(ranks):
        return x0 + (math.log2(ranks) - lo) / (hi - lo) * (x1 - x0)

    def py(efficiency):
        return bottom + efficiency / y_hi * (top - bottom)

    curve_ranks = sorted({round(2 ** (lo + (hi - lo) * i / 80)) for i in range(81)} - {1})
    layouts = [l for l in LAYOUTS if l in fit.inverse_efficiency]
    curves = predict(fit, shape, rows, compute_ms, ranks_per_node, curve_ranks, SVG_GBIT)
    curves = [c for c in curves if not c.many_servers]

    title = "Scaling efficiency (compute / step), alpha-beta model"
    efficiencies = (f"efficiency {fit.efficiency(LAYOUTS[0]):.2f}" if fit.mode == "shared" else
                    "efficiency " + ", ".join(f"{l} {fit.efficiency(l):.2f}" for l in layouts))
    placement = "one rank per node" if ranks_per_node == 1 else f"{ranks_per_node} ranks per node"
    host = f", h {1e9 * fit.host:.2f} ns/byte" if fit.host is not None else ""
    subtitles = (f"α = {1e6 * fit.alpha:.1f} µs, {efficiencies}{host}",
                 f"compute {ms_text(compute_ms)} ms per step; {placement}; markers: the measured points, each at its "
                 "own link rate")
    svg = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif">',
           f"<title>{xml_escape(title)}</title>",
           '<rect width="100%" height="100%" fill="#fafafa"/>',
           f'<text x="{fixed(width / 2, 1)}" y="26" text-anchor="middle" font-size="18">{xml_escape(title)}</text>',
           *(f'<text x="{fixed(width / 2, 1)}" y="{46 + 16 * i}" text-anchor="middle" font-size="12" '
             f'fill="#555555">{xml_escape(line)}</text>' for i, line in enumerate(subtitles))]

    # Legend, above the plot: each layout's color, the two line styles, the marker.
    legend = [(l, COLORS[l], None, False) for l in layouts]
    legend += [(f"{g} Gbit/s", "#555555", None, i == 1) for i, g in enumerate(SVG_GBIT)]
    legend.append(("measured", "#555555", "marker", False))
    legend_x = x0
    legend_y = top - 19
    for name, color, kind, dashed in legend:
        if kind == "marker":
            svg.append(f'<circle cx="{fixed(legend_x + 12, 1)}" cy="{fixed(legend_y, 1)}" r="4" fill="{color}" '
                       'stroke="#ffffff"/>')
        else:
            svg.append(f'<line x1="{fixed(legend_x, 1)}" y1="{fixed(legend_y, 1)}" x2="{fixed(legend_x + 24, 1)}" '
                       f'y2="{fixed(legend_y, 1)}" stroke="{color}" stroke-width="2"{dash(dashed)}/>')
        svg.append(f'<text x="{fixed(legend_x + 30, 1)}" y="{fixed(legend_y + 4, 1)}" font-size="12">'
                   f"{xml_escape(name)}</text>")
        legend_x += 30 + 7 * len(name) + 24

    svg.append(f'<rect class="plot-area" x="{fixed(x0)}" y="{fixed(top)}" width="{fixed(x1 - x0)}" '
               f'height="{fixed(bottom - top)}" fill="#ffffff" stroke="#888888"/>')
    step = 0.2 if y_hi <= 1.2 else 0.5
    for k in range(int(round(y_hi / step)) + 1):
        tick = k * step
        ty = fixed(py(tick))
        svg.append(f'<line x1="{fixed(x0)}" y1="{ty}" x2="{fixed(x1)}" y2="{ty}" stroke="#e6e6e6"/>')
        svg.append(f'<text class="y-tick" x="{fixed(x0 - 6)}" y="{fixed(py(tick) + 4)}" text-anchor="end" '
                   f'font-size="11">{tick:.1f}</text>')
    for exponent in range(math.ceil(lo), math.floor(hi) + 1):
        tx = fixed(px(2 ** exponent))
        svg.append(f'<line x1="{tx}" y1="{fixed(bottom)}" x2="{tx}" y2="{fixed(bottom + 5)}" stroke="#888888"/>')
        svg.append(f'<text class="x-tick" x="{tx}" y="{fixed(bottom + 18)}" text-anchor="middle" '
                   f'font-size="11">{2 ** exponent}</text>')
    svg.append(f'<text x="{fixed((x0 + x1) / 2, 1)}" y="{fixed(bottom + 40, 1)}" text-anchor="middle" '
               'font-size="12">ranks (log2 scale)</text>')
    label_x, label_y = 18.0, (top + bottom) / 2
    svg.append(f'<text x="{fixed(label_x, 1)}" y="{fixed(label_y, 1)}" transform="rotate(-90 {fixed(label_x, 1)} '
               f'{fixed(label_y, 1)})" text-anchor="middle" font-size="12">scaling efficiency</text>')

    for curve in curves:
        for i, gbit in enumerate(SVG_GBIT):
            coordinates = " ".join(f"{fixed(px(r))},{fixed(py(curve.cells[(gbit, r)][1]))}" for r in curve_ranks)
            svg.append(f'<polyline class="{curve.layout} gbit{gbit:g}" points="{coordinates}" fill="none" '
                       f'stroke="{COLORS[curve.layout]}" stroke-width="2"{dash(i == 1)}/>')
    for layout in LAYOUTS:
        markers = "".join(f'<circle cx="{fixed(px(p.ranks))}" cy="{fixed(py(e))}" r="4"><title>'
                          f"{xml_escape(p.label)}: {e:.2f}</title></circle>"
                          for p, e in zip(points, measured_eff) if p.layout == layout)
        if markers:
            svg.append(f'<g class="markers measured {layout}" fill="{COLORS[layout]}" stroke="#ffffff">{markers}</g>')
    svg.append("</svg>")
    write_file(path, "\n".join(svg) + "\n")


# --- Main ----------------------------------------------------------------------------------------------------


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description="Fit an alpha-beta model to measured multi-node step times "
                                     "and predict larger jobs (see the module docstring).")
    parser.add_argument("--points", required=True, help="measured jobs (CSV)")
    parser.add_argument("--rows", required=True, help="distinct embedding rows per batch size (CSV)")
    parser.add_argument("--table", help="write the Markdown section here")
    parser.add_argument("--svg", help="write the scaling-efficiency plot here")
    parser.add_argument("--efficiency", choices=("shared", "per-layout"), default="shared",
                        help="one link efficiency for all layouts (default) or one per layout")
    parser.add_argument("--host-cost", action="store_true", help="also fit a per-byte cost that does not "
                        "depend on the link rate (needs points at several link rates)")
    parser.add_argument("--compute-ms", type=float, help="compute per step for the predictions "
                        "(default: the median compute_ms of the points)")
    parser.add_argument("--ranks-per-node", type=int, default=1, help="ranks per node in the predictions")
    parser.add_argument("--vocab", type=int, default=20000)
    parser.add_argument("--embedding", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--seq", type=int, default=80, help="tokens per sample")
    args = parser.parse_args(argv)
    for name in ("vocab", "embedding", "hidden", "layers", "batch", "seq", "ranks_per_node"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.compute_ms is not None and not args.compute_ms >= 0:
        parser.error("--compute-ms must be >= 0")
    return args


def run(args):
    shape = Shape(args.vocab, args.embedding, args.hidden, args.layers, args.batch, args.seq)
    points = read_points(args.points)
    rows = read_rows(args.rows, shape)
    free_parameters = (1 + int(args.host_cost) +
                       (1 if args.efficiency == "shared" else len({p.layout for p in points})))
    if len(points) < free_parameters:
        raise InputError(f"{args.points}: {len(points)} point(s) cannot fit {free_parameters} parameters")
    exchanges = [exchange_of(p.layout, shape, rows, p.ranks, p.ranks_per_node) for p in points]
    fitted = [(p, e) for p, e in zip(points, exchanges) if p.fitted]
    if len(fitted) < free_parameters:
        raise InputError(f"{args.points}: {len(fitted)} point(s) with fit = 1 cannot fit {free_parameters} "
                         "parameters")
    fit = fit_model([p for p, _ in fitted], [e for _, e in fitted], args.efficiency, args.host_cost)
    compute_ms = args.compute_ms if args.compute_ms is not None else statistics.median(
        p.compute_ms for p in points)
    predictions = predict(fit, shape, rows, compute_ms, args.ranks_per_node, PREDICT_RANKS, PREDICT_GBIT)
    if args.table:
        write_table(args.table, fit, shape, rows, points, exchanges, predictions, compute_ms, args.ranks_per_node)
    if args.svg:
        write_svg(args.svg, fit, shape, rows, points, compute_ms, args.ranks_per_node)

    step_errors, byte_errors = errors(fit, points, exchanges)
    fitted_errors, _ = errors(fit, [p for p, _ in fitted], [e for _, e in fitted])
    efficiencies = {l: fit.efficiency(l) for l in fit.inverse_efficiency}
    print(f"scaling model: {len(points)} points, P = {shape.total_floats:,} parameters, "
          f"alpha = {1e6 * fit.alpha:.2f} us, efficiency "
          + (f"{efficiencies[LAYOUTS[0]]:.4f} (shared)" if fit.mode == "shared" else
             ", ".join(f"{l} {e:.4f}" for l, e in efficiencies.items()))
          + (f", h = {1e9 * fit.host:.4f} ns/byte" if fit.host is not None else ""))
    met = "met" if step_errors[0][0] <= ERROR_TARGET else "NOT met"
    print(f"step time: max |error| {percent(step_errors[0][0], False)} ({step_errors[0][1]}), mean |error| "
          f"{percent(statistics.mean(e for e, _ in step_errors), False)}; target {ERROR_TARGET:.0%} {met}")
    if len(fitted) < len(points):
        met = "met" if fitted_errors[0][0] <= ERROR_TARGET else "NOT met"
        print(f"step time, the {len(fitted)} fitted points: max |error| {percent(fitted_errors[0][0], False)} "
              f"({fitted_errors[0][1]}); target {ERROR_TARGET:.0%} {met}")
    if byte_errors:
        print(f"bytes per step per rank: max |error| {percent(byte_errors[0][0], False)} ({byte_errors[0][1]})")
    for note in fit.notes:
        print(f"note: {note}")
    largest = PREDICT_RANKS[-1]
    for gbit in SVG_GBIT:
        print(f"predicted scaling efficiency at {largest} ranks, {gbit} Gbit/s: " + ", ".join(
            f"{p.label} {p.cells[(gbit, largest)][1]:.0%}" for p in predictions))
    print(f"fit: alpha_us={1e6 * fit.alpha:.4f} " +
          " ".join(f"efficiency_{l}={e:.5f}" for l, e in efficiencies.items()) +
          (f" host_ns_per_byte={1e9 * fit.host:.5f}" if fit.host is not None else ""))


def main(argv=None):
    args = parse_arguments(argv)
    try:
        run(args)
    except InputError as e:
        print(f"scaling_model.py: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"scaling_model.py: fit failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
