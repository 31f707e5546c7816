#!/usr/bin/env bash
# 2 nodes x 2 ranks on the one-machine cluster (tests/cluster/cluster.sh), MPI all-reduce over TCP:
# - check-env across the nodes: each rank reports its node's host name and its node-local rank;
# - training: the start log places ranks 0-1 on node1 and 2-3 on node2; the final parameters equal those of a
#   one-node 4-rank run of the same seed within float rounding (once with the sparse embedding exchange,
#   once dense), through the node leaders (comm.hierarchy = auto), every epoch's replicas bit-identical;
#   and with comm.hierarchy = off, one all-reduce over the 4 ranks, bit-identical too;
# - the gradients crossed the links: each node received at least the dense gradient's bytes per step (a node
#   must learn the other node's contribution to every element of every step's average);
# - the delayed exchange (comm.overlap = delayed) and gradients as bfloat16 (comm.compression = bf16) across
#   the nodes: every epoch's replicas agree bit for bit (the run compares every rank's parameter checksum with
#   rank 0's and records it), and bf16 and fp16 (scaled per chunk) move at most 65% of float's bytes, with
#   one rank per node and (bf16) through the node leaders with two;
# - nothing of the cluster is left afterwards.
#   bash tests/cluster/allreduce_test.sh path/to/ddptrain source-dir        (as root; else exit 77, skipped)
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/cluster/cluster_test_lib.sh
source "$src/tests/cluster/cluster_test_lib.sh"
cluster_test_setup "$ddptrain" 2 1gbit

# check-env: one report per node, ranks with their local ranks.
cluster_mpirun -H node1:2,node2:2 -np 4 "$ddptrain" check-env --device cpu >"$shared/check_env.txt" 2>&1 ||
  { cat "$shared/check_env.txt"; fail "check-env across the nodes failed"; }
for expected in "=== node node1: 2 rank(s) ===" "=== node node2: 2 rank(s) ===" \
  "rank 0: local rank 0" "rank 1: local rank 1" "rank 2: local rank 0" "rank 3: local rank 1"; do
  grep -qF "$expected" "$shared/check_env.txt" || { cat "$shared/check_env.txt"; fail "check-env lacks '$expected'"; }
done
# Each rank under its own node's heading.
awk '/^=== node/ { node = $3 } /^  rank [0-9]:/ { print node, $2 }' "$shared/check_env.txt" >"$shared/placement.txt"
printf 'node1: 0:\nnode1: 1:\nnode2: 2:\nnode2: 3:\n' | diff - "$shared/placement.txt" ||
  fail "check-env placed the ranks on the wrong nodes"
echo "ok: check-env reports ranks 0-1 on node1 and 2-3 on node2 with local ranks 0 and 1"

for sparse in true false; do
  args=$(training_args "$src" "$shared/one-node-$sparse")
  read -r -a one_node <<<"$args --comm.backend mpi --comm.sparse_embedding $sparse"
  mpirun -np 4 --bind-to none "$ddptrain" "${one_node[@]}" >"$shared/one-node.txt" 2>&1 ||
    { cat "$shared/one-node.txt"; fail "the one-node 4-rank run failed"; }

  read -r -a before <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  args=$(training_args "$src" "$shared/two-nodes-$sparse")
  read -r -a two_nodes <<<"$args --comm.backend mpi --comm.sparse_embedding $sparse --comm.hierarchy auto"
  cluster_mpirun -H node1:2,node2:2 -np 4 "$ddptrain" "${two_nodes[@]}" >"$shared/two-nodes.txt" 2>&1 ||
    { cat "$shared/two-nodes.txt"; fail "the 2-node run failed"; }
  read -r -a after <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"

  for placement in "rank 0/4 on node1 (local rank 0/2)" "rank 1/4 on node1 (local rank 1/2)" \
    "rank 2/4 on node2 (local rank 0/2)" "rank 3/4 on node2 (local rank 1/2)"; do
    grep -qF "$placement" "$shared/two-nodes.txt" || { cat "$shared/two-nodes.txt"; fail "no '$placement'"; }
  done
  grep -qF "hierarchical across 2 nodes" "$shared/two-nodes.txt" ||
    { cat "$shared/two-nodes.txt"; fail "sparse_embedding $sparse: the all-reduce did not go through leaders"; }
  agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/two-nodes-$sparse/metrics.jsonl")
  [ "$agreed" -eq 2 ] || fail "sparse_embedding $sparse, hierarchical: $agreed of 2 epochs with agreed replicas"
  difference=$(params_within "$shared/one-node-$sparse/last.h5" "$shared/two-nodes-$sparse/last.h5" 1e-5 \
    "sparse_embedding $sparse")
  echo "ok (sparse_embedding $sparse): 2 nodes x 2 ranks through the node leaders end with the one-node" \
    "4-rank parameters (largest difference $difference), every epoch's replicas bit-identical"

  # Bytes: steps from metrics.jsonl; the dense gradient is every parameter but the embedding.
  parameters=$(grep -oE '[0-9]+ parameters;' "$shared/two-nodes.txt" | head -n 1 | cut -d' ' -f1)
  steps=$(grep -oE '"steps": ?[0-9]+' "$shared/two-nodes-$sparse/metrics.jsonl" | tr -dc '0-9\n' | awk '{ s += $1 } END { print s }')
  if [ -z "$parameters" ] || [ -z "$steps" ]; then fail "no parameter count or steps in the run's output"; fi
  dense_bytes=$(((parameters - 500 * 16) * 4))
  for node in 1 2; do
    received=$((after[2 * node - 1] - before[2 * node - 1]))
    sent=$((after[2 * node - 2] - before[2 * node - 2]))
    echo "node$node: sent $sent, received $received bytes over $steps steps (dense gradient $dense_bytes bytes)"
    [ "$received" -ge $((steps * dense_bytes)) ] ||
      fail "node$node received $received bytes: less than $steps steps x $dense_bytes: the gradients did not cross the link"
  done
done

# The hierarchy off: one all-reduce over the 4 ranks, as before it existed.
args=$(training_args "$src" "$shared/two-nodes-flat")
read -r -a flat <<<"$args --comm.backend mpi --comm.hierarchy off"
cluster_mpirun -H node1:2,node2:2 -np 4 "$ddptrain" "${flat[@]}" >"$shared/two-nodes-flat.txt" 2>&1 ||
  { cat "$shared/two-nodes-flat.txt"; fail "the 2-node run with comm.hierarchy off failed"; }
if grep -qF "hierarchical across" "$shared/two-nodes-flat.txt"; then fail "comm.hierarchy off: still hierarchical"; fi
agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/two-nodes-flat/metrics.jsonl")
[ "$agreed" -eq 2 ] || fail "comm.hierarchy off: $agreed of 2 epochs with agreed replicas"
echo "ok: comm.hierarchy off across 2 nodes x 2 ranks: one all-reduce, every epoch's replicas bit-identical"

args=$(training_args "$src" "$shared/two-nodes-delayed")
read -r -a delayed <<<"$args --comm.backend mpi --comm.overlap delayed"
cluster_mpirun -H node1:2,node2:2 -np 4 "$ddptrain" "${delayed[@]}" >"$shared/two-nodes-delayed.txt" 2>&1 ||
  { cat "$shared/two-nodes-delayed.txt"; fail "the 2-node run with the delayed exchange failed"; }
agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/two-nodes-delayed/metrics.jsonl")
[ "$agreed" -eq 2 ] || fail "the delayed exchange: $agreed of 2 epochs with agreed replicas"
echo "ok: the delayed exchange across 2 nodes x 2 ranks: every epoch's replicas bit-identical"

# bf16 against float on a model whose gradients outweigh the step's small messages (66k parameters), one rank
# per node: with comm.hierarchy off, bf16's all-to-all and all-gather are not topology-aware, so with two
# ranks per node they move about what Open MPI's float all-reduce moves across the link (RESULTS.md).
declare -A received_with=()
for wire in none bf16 fp16; do
  read -r -a before <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  args=$(training_args "$src" "$shared/two-nodes-wire-$wire")
  read -r -a run <<<"$args --comm.backend mpi --comm.sparse_embedding false --comm.compression $wire \
    --model.embedding_dim 64 --model.hidden 64"
  cluster_mpirun -H node1:1,node2:1 -np 2 "$ddptrain" "${run[@]}" >"$shared/two-nodes-wire-$wire.txt" 2>&1 ||
    { cat "$shared/two-nodes-wire-$wire.txt"; fail "the 2-node run with comm.compression $wire failed"; }
  read -r -a after <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/two-nodes-wire-$wire/metrics.jsonl")
  [ "$agreed" -eq 2 ] || fail "comm.compression $wire: $agreed of 2 epochs with agreed replicas"
  for node in 1 2; do received_with[$wire$node]=$((after[2 * node - 1] - before[2 * node - 1])); done
done
for node in 1 2; do
  with_float=${received_with[none$node]}
  for wire in bf16 fp16; do
    with_wire=${received_with[$wire$node]}
    echo "node$node: received $with_wire bytes with $wire gradients, $with_float with float"
    [ $((100 * with_wire)) -le $((65 * with_float)) ] ||
      fail "$wire: node$node received $with_wire bytes, more than 65% of float's $with_float"
  done
done
echo "ok: bf16 and fp16 gradients across 2 nodes, a rank each: every epoch's replicas bit-identical, half the bytes"

# bf16 through the node leaders, 2 nodes x 2 ranks: each node's float sum crosses the link once, in 16 bits.
for wire in none bf16; do
  read -r -a before <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  args=$(training_args "$src" "$shared/leaders-wire-$wire")
  read -r -a run <<<"$args --comm.backend mpi --comm.sparse_embedding false --comm.compression $wire \
    --comm.hierarchy auto --model.embedding_dim 64 --model.hidden 64"
  cluster_mpirun -H node1:2,node2:2 -np 4 "$ddptrain" "${run[@]}" >"$shared/leaders-wire-$wire.txt" 2>&1 ||
    { cat "$shared/leaders-wire-$wire.txt"; fail "the 2 x 2-rank run with comm.compression $wire failed"; }
  read -r -a after <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  grep -qF "hierarchical across 2 nodes" "$shared/leaders-wire-$wire.txt" ||
    { cat "$shared/leaders-wire-$wire.txt"; fail "comm.compression $wire: the exchange did not go through leaders"; }
  agreed=$(grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$shared/leaders-wire-$wire/metrics.jsonl")
  [ "$agreed" -eq 2 ] || fail "comm.compression $wire through leaders: $agreed of 2 epochs with agreed replicas"
  for node in 1 2; do received_with[leaders-$wire$node]=$((after[2 * node - 1] - before[2 * node - 1])); done
done
for node in 1 2; do
  with_float=${received_with[leaders-none$node]}
  with_wire=${received_with[leaders-bf16$node]}
  echo "node$node: received $with_wire bytes with bf16 gradients through the leaders, $with_float with float"
  [ $((100 * with_wire)) -le $((65 * with_float)) ] ||
    fail "bf16 through leaders: node$node received $with_wire bytes, more than 65% of float's $with_float"
done
echo "ok: bf16 through the node leaders, 2 nodes x 2 ranks: every epoch's replicas bit-identical, half the bytes"

expect_no_leftovers
