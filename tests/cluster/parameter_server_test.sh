#!/usr/bin/env bash
# The parameter server with its server alone on a node of the one-machine cluster (tests/cluster/cluster.sh):
# 3 nodes, one rank each: workers on node1 and node2, the server (the last rank) on node3. Checks: the start
# log places the server on node3; the final parameters equal those of the same 3 ranks on one node (sync
# mode is exact); the server's link carried every worker's pull of the whole parameter vector each step; with
# comm.compression = bf16 (gradients pushed, updates pulled as bfloat16) every epoch's replicas agree bit for
# bit and the server's link carries at most 60% of float's bytes each way, and so does a node of the
# colocated layout (every rank trains and serves); and nothing of the cluster is left.
#   bash tests/cluster/parameter_server_test.sh path/to/ddptrain source-dir [foreign-blas-kernels]
# (as root; else exit 77, skipped). With foreign-blas-kernels the caller's environment picks OpenBLAS
# kernels other than this CPU's own (OPENBLAS_CORETYPE=Haswell where the CPU has AVX2, else Prescott), as
# some machines' environments do: every node must run the caller's kernels for the comparison to hold.
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
if [ "${3:-}" = foreign-blas-kernels ]; then
  if grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; else export OPENBLAS_CORETYPE=Prescott; fi
  echo "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE in the caller's environment"
fi
# shellcheck source=tests/cluster/cluster_test_lib.sh
source "$src/tests/cluster/cluster_test_lib.sh"
cluster_test_setup "$ddptrain" 3 1gbit

read -r -a one_node <<<"$(training_args "$src" "$shared/one-node") --comm.backend ps --comm.ps_servers 1"
mpirun -np 3 --bind-to none "$ddptrain" "${one_node[@]}" >"$shared/one-node.txt" 2>&1 ||
  { cat "$shared/one-node.txt"; fail "the one-node 3-rank run failed"; }

read -r -a before <<<"$(cluster_net_bytes node3)"
read -r -a three_nodes <<<"$(training_args "$src" "$shared/three-nodes") --comm.backend ps --comm.ps_servers 1"
cluster_mpirun -H node1:1,node2:1,node3:1 -np 3 "$ddptrain" "${three_nodes[@]}" >"$shared/three-nodes.txt" 2>&1 ||
  { cat "$shared/three-nodes.txt"; fail "the 3-node run failed"; }
read -r -a after <<<"$(cluster_net_bytes node3)"

grep -q "rank 2/3 on node3 " "$shared/three-nodes.txt" || { cat "$shared/three-nodes.txt"; fail "rank 2 is not on node3"; }
grep -qi "parameter server" "$shared/three-nodes.txt" || { cat "$shared/three-nodes.txt"; fail "no parameter server"; }
difference=$(max_param_difference "$shared/one-node/last.h5" "$shared/three-nodes/last.h5") ||
  fail "the checkpoints hold different parameter counts"
[ "$difference" = 0 ] || fail "the parameters differ from the one-node run by up to $difference"
echo "ok: workers on node1 and node2, the server on node3: the parameters of the one-node run, bit for bit"

parameters=$(grep -oE '[0-9]+ parameters;' "$shared/three-nodes.txt" | head -n 1 | cut -d' ' -f1)
steps=$(grep -oE '"steps": ?[0-9]+' "$shared/three-nodes/metrics.jsonl" | tr -dc '0-9\n' | awk '{ s += $1 } END { print s }')
if [ -z "$parameters" ] || [ -z "$steps" ]; then fail "no parameter count or steps in the run's output"; fi
sent=$((after[0] - before[0]))
pulls=$((steps * 2 * parameters * 4))
echo "node3 (server) sent $sent bytes over $steps steps; 2 workers' pulls of $parameters parameters: $pulls bytes"
[ "$sent" -ge "$pulls" ] || fail "the server's node sent less than the workers' pulls: the exchange did not cross the link"

read -r -a bf16_before <<<"$(cluster_net_bytes node3)"
read -r -a bf16_run <<<"$(training_args "$src" "$shared/three-nodes-bf16") --comm.backend ps --comm.ps_servers 1 \
  --comm.compression bf16"
cluster_mpirun -H node1:1,node2:1,node3:1 -np 3 "$ddptrain" "${bf16_run[@]}" >"$shared/three-nodes-bf16.txt" 2>&1 ||
  { cat "$shared/three-nodes-bf16.txt"; fail "the 3-node run with bf16 failed"; }
read -r -a bf16_after <<<"$(cluster_net_bytes node3)"
grep -q "gradients pushed and updates pulled as bf16" "$shared/three-nodes-bf16.txt" ||
  { cat "$shared/three-nodes-bf16.txt"; fail "the bf16 run does not say it pushes and pulls bf16"; }
epochs=$(grep -c '"epoch"' "$shared/three-nodes-bf16/metrics.jsonl")
agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/three-nodes-bf16/metrics.jsonl")
if [ "$epochs" -eq 0 ] || [ "$agreed" -ne "$epochs" ]; then
  fail "bf16: $agreed of $epochs epochs with agreed replicas"
fi
bf16_sent=$((bf16_after[0] - bf16_before[0]))
bf16_received=$((bf16_after[1] - bf16_before[1]))
float_received=$((after[1] - before[1]))
echo "node3 (server) with bf16: sent $bf16_sent bytes (float: $sent), received $bf16_received (float: $float_received)"
[ $((100 * bf16_sent)) -le $((60 * sent)) ] || fail "bf16: the server sent more than 60% of float's bytes"
[ $((100 * bf16_received)) -le $((60 * float_received)) ] || fail "bf16: the server received more than 60% of float's bytes"
[ "$bf16_sent" -ge $((pulls / 2)) ] || fail "bf16: the server sent less than the workers' bf16 pulls"
echo "ok: bf16 across 3 nodes: every epoch's replicas bit-identical, the server's link carried about half the bytes"

# The colocated layout (every rank trains and serves a shard): reduce-scatter and all-gather, float and bf16.
declare -A colocated_received=()
for wire in none bf16; do
  read -r -a start <<<"$(cluster_net_bytes node1)"
  read -r -a run <<<"$(training_args "$src" "$shared/colocated-$wire") --comm.backend ps --comm.ps_servers 0 \
    --comm.compression $wire"
  cluster_mpirun -H node1:1,node2:1,node3:1 -np 3 "$ddptrain" "${run[@]}" >"$shared/colocated-$wire.txt" 2>&1 ||
    { cat "$shared/colocated-$wire.txt"; fail "the colocated 3-node run with comm.compression $wire failed"; }
  read -r -a end <<<"$(cluster_net_bytes node1)"
  epochs=$(grep -c '"epoch"' "$shared/colocated-$wire/metrics.jsonl")
  agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/colocated-$wire/metrics.jsonl")
  if [ "$epochs" -eq 0 ] || [ "$agreed" -ne "$epochs" ]; then
    fail "colocated, $wire: $agreed of $epochs epochs with agreed replicas"
  fi
  colocated_received[$wire]=$((end[1] - start[1]))
done
echo "node1, colocated: received ${colocated_received[bf16]} bytes with bf16, ${colocated_received[none]} with float"
[ $((100 * colocated_received[bf16])) -le $((60 * colocated_received[none])) ] ||
  fail "colocated bf16: node1 received more than 60% of float's bytes"
echo "ok: colocated bf16 across 3 nodes: every epoch's replicas bit-identical, about half the bytes"

expect_no_leftovers
