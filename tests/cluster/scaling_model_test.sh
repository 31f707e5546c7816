#!/usr/bin/env bash
# benchmarks/scaling_model.py on generated data: step times made from a known alpha and link efficiency (with
# messages and bytes counted here, independently of the script, for the three layouts), so the fit must give
# them back within 5% and the script's bytes must match these; then a bad CSV must end it with exit code 2
# and a line naming the file and the line. No arguments; exit 0 (pass) or 1 (fail).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script=$here/../../benchmarks/scaling_model.py
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}

check_fit() {  # the script's 'fit:' line (without 'fit: '), the true alpha in us, the true efficiency
  "$python" - "$@" <<'EOF'
import sys
values = dict(item.split("=") for item in sys.argv[1].split())
want = {"alpha_us": float(sys.argv[2])}
want.update({k: float(sys.argv[3]) for k in values if k.startswith("efficiency_")})
bad = [f"{k} = {values[k]} (want {v})" for k, v in want.items() if abs(float(values[k]) / v - 1) > 0.05]
print("recovered within 5%:" if not bad else "off by more than 5%:", ", ".join(bad) or sys.argv[1])
sys.exit(1 if bad or len(want) != 4 else 0)
EOF
}

python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import numpy' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
[ -n "$python" ] || fail "no python3 with numpy (apt-get install python3-numpy)"

alpha_us=50
efficiency=0.8
"$python" - "$scratch" "$alpha_us" "$efficiency" <<'EOF' || fail "could not generate the data"
import math, sys

folder, alpha, eff = sys.argv[1], float(sys.argv[2]) * 1e-6, float(sys.argv[3])
V, E, H, b = 20000, 128, 128, 32
P = V * E + 4 * H * (E + H) + 8 * H + H + 1
assert P == 2692225
emb, lstm, dense = 4 * V * E, 4 * (4 * H * (E + H) + 8 * H), 4 * (H + 1)
U = {n: min(V, 120.0 * n ** 0.7) for n in (2 ** k for k in range(5, 15))}
with open(f"{folder}/rows.csv", "w") as f:
    f.write("samples,unique_rows\n" + "".join(f"{n},{u!r}\n" for n, u in U.items()))

def log2(n):
    return math.ceil(math.log2(n)) if n > 1 else 0

def dense_layout(N, r):
    p = N * r
    return 4 * (p - 1) + log2(N), 2 * (p - 1) / p * (emb + lstm) + r * dense * log2(N), r

def sparse_layout(N, r):
    p = N * r
    u, union = U[b], U[b * p]
    messages = log2(N) + (p - 1) + 2 * (p - 1) + 2 * (p - 1) + log2(N)
    link = (r * 4 * (p - r) + (p - 1) * 4 * u + 2 * (p - 1) / p * (4 * E * union + lstm) +
            r * dense * log2(N))
    return messages, link, r

def ps_layout(N, r):
    W = (N - 1) * r
    push, pull = 16 + 4 * (1 + U[b] + U[b] * E + P - V * E), 16 + 4 * P
    return 2 * W, W * (push + pull), W + 1  # every byte crosses a link; sent per rank: over W + 1 ranks

with open(f"{folder}/points.csv", "w") as f:
    f.write("layout,nodes,ranks_per_node,link_mbit,step_ms,compute_ms,bytes_per_step_rank\n")
    for layout, count in (("allreduce_dense", dense_layout), ("allreduce_sparse", sparse_layout),
                          ("ps_dedicated", ps_layout)):
        for N, r in ((2, 1), (4, 1), (2, 2), (4, 2), (8, 1)):
            for mbit in (100, 1000, 10000):
                messages, link, per_rank = count(N, r)
                step_ms = 20 + 1e3 * (alpha * messages + link * 8 / (mbit * 1e6 * eff))
                f.write(f"{layout},{N},{r},{mbit},{step_ms:.6f},20,{link / per_rank:.1f}\n")
EOF

out=$("$python" "$script" --points "$scratch/points.csv" --rows "$scratch/rows.csv" \
  --table "$scratch/table.md" --svg "$scratch/plot.svg" 2>&1) || fail "the script failed on good data: $out"
echo "$out"
fit=$(echo "$out" | sed -n 's/^fit: //p')
[ -n "$fit" ] || fail "no 'fit:' line in the output"
check_fit "$fit" "$alpha_us" "$efficiency" ||
  fail "the fit did not recover alpha = $alpha_us us, efficiency = $efficiency"
echo "$out" | grep -q '^bytes per step per rank: max |error| 0\.0%' ||
  fail "the script's bytes per step per rank differ from the independent count"
grep -q '^| allreduce_sparse | 10 |' "$scratch/table.md" || fail "the table has no prediction rows"
"$python" -c 'import sys, xml.etree.ElementTree as t; t.parse(sys.argv[1])' "$scratch/plot.svg" ||
  fail "the SVG is not well-formed XML"

# A bad CSV: exit code 2, one line naming the file and the line.
sed '3s/,20,/,twenty,/' "$scratch/points.csv" >"$scratch/bad.csv"
err=$("$python" "$script" --points "$scratch/bad.csv" --rows "$scratch/rows.csv" 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "a non-number exited $rc, not 2: $err"
echo "$err" | grep -q "bad.csv line 3: compute_ms = 'twenty' is not a number" || fail "unclear error: $err"
[ "$(echo "$err" | wc -l)" -eq 1 ] || fail "more than one error line: $err"
: >"$scratch/empty.csv"
err=$("$python" "$script" --points "$scratch/empty.csv" --rows "$scratch/rows.csv" 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "an empty file exited $rc, not 2: $err"
echo "$err" | grep -q "empty.csv line 1: empty file" || fail "unclear error: $err"
echo "PASS"
