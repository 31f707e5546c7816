#!/usr/bin/env python3
"""Values from a JSON-lines file (metrics.jsonl) for the shell tests and benchmark scripts.

  json_field.py FILE KEYS [KEY=VALUE ...]

prints, for every line that is a JSON object with all of KEYS (comma-separated) and whose KEY equals VALUE
for each condition (compared as text: epoch=3, run_id=2026...), the values of KEYS on one line, separated
by spaces. A null value (a diverged loss) prints as its "not_finite" reason (nan, inf). Other lines (the
test score's when KEYS name an epoch's numbers, a half-written last line) are skipped.
"""
import json
import os
import sys


def text(value):
    return json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, keys = sys.argv[1], sys.argv[2].split(",")
    conditions = [arg.split("=", 1) for arg in sys.argv[3:]]
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            if any(key not in record for key in keys):
                continue
            if any(key not in record or text(record[key]) != value for key, value in conditions):
                continue
            not_finite = record.get("not_finite", {})
            values = [not_finite.get(k, "null") if record.get(k) is None else text(record[k]) for k in keys]
            print(" ".join(values))


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        # The reader had enough (grep -q, head): not an error of this script. Point stdout at /dev/null so
        # that Python's exit-time flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
