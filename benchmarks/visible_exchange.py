#!/usr/bin/env python3
"""Rank 0's time per step in the spans where its step waits for the gradient exchange, from a run's
timeline (log.timeline): what overlap left visible, in milliseconds per step.

    python3 benchmarks/visible_exchange.py RUN_DIR/timeline.json

The spans: the all-reduce's "reduction wait" and its "embedding rows exchange" (the row ids' all-gather), the
parameter server's "push/pull" (a worker's exchange with the servers, the update included) and the colocated
layout's exchange spans with their "fetch rows". The first step (connections, first touches) is left out."""
import json
import sys

EXCHANGE = ("reduction wait", "embedding rows exchange", "push/pull", "fetch rows",
            "push rows, update, all-gather", "reduce-scatter, update, all-gather")


def main(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    rank0 = [e for e in events if e.get("ph") == "X" and e.get("pid") == 0]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in rank0 if e["name"] == "step")[1:]
    if not steps:
        sys.exit(f"{path}: no step on rank 0's timeline")
    visible = 0.0
    for e in rank0:
        if e["name"] in EXCHANGE and any(begin <= e["ts"] < end for begin, end in steps):
            visible += e["dur"]
    print(f"{visible / len(steps) / 1000:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
