#!/usr/bin/env python3
"""Per rank and span name: how many spans a ddptrain trace (--log.timeline) holds, their median and mean.

    python3 benchmarks/timeline_summary.py RUN/trace.json [--rank R]
"""
import argparse
import collections
import json
import statistics


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--rank", type=int, help="only this rank (a trace's process id is its rank)")
    args = parser.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    durations = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and (args.rank is None or e.get("pid") == args.rank):
            durations[(e.get("pid"), e["name"])].append(e["dur"] / 1000.0)
    print(f"{'rank':>4}  {'span':32} {'count':>6} {'median ms':>10} {'mean ms':>9}")
    for (rank, name), ms in sorted(durations.items()):
        print(f"{rank:>4}  {name:32} {len(ms):>6} {statistics.median(ms):>10.3f} {statistics.fmean(ms):>9.3f}")


if __name__ == "__main__":
    main()
