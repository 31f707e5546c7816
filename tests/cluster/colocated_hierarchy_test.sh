#!/usr/bin/env bash
# The colocated parameter server through the nodes (comm.hierarchy = auto, comm/sharded_exchange.h) on 2
# nodes x 2 ranks of the one-machine cluster (tests/cluster/cluster.sh), links of 1 Gbit/s:
# - the start log says the exchange is hierarchical across 2 nodes of 2 ranks; the final parameters equal a
#   one-node 4-rank run's within float rounding; every epoch's replicas bit-identical;
# - each node receives at most 65% of the bytes the flat exchange (comm.hierarchy = off) makes it receive
#   (each node sends the links one copy of its slices instead of one per rank: about half);
# - with comm.compression = bf16 through the nodes, at most 65% of float's bytes, replicas bit-identical;
# - nothing of the cluster is left afterwards.
#   bash tests/cluster/colocated_hierarchy_test.sh path/to/ddptrain source-dir     (as root; else exit 77, skipped)
set -euo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/cluster/cluster_test_lib.sh
source "$src/tests/cluster/cluster_test_lib.sh"
cluster_test_setup "$ddptrain" 2 1gbit

# A model whose gradients outweigh the step's small messages (66k parameters), every push dense.
colocated_args() {  # run dir, extra arguments
  echo "$(training_args "$src" "$1") --comm.backend ps --comm.ps_servers 0 --comm.sparse_embedding false" \
    "--model.embedding_dim 64 --model.hidden 64 $2"
}
agreed_epochs() {  # run dir
  grep -c '"parameters_checksum":"[0-9a-f]\{16\}"' "$1/metrics.jsonl" || true
}

read -r -a one_node <<<"$(colocated_args "$shared/one-node" "")"
mpirun -np 4 --bind-to none "$ddptrain" "${one_node[@]}" >"$shared/one-node.txt" 2>&1 ||
  { cat "$shared/one-node.txt"; fail "the one-node 4-rank colocated run failed"; }

declare -A received=()
for run in auto-none off-none auto-bf16; do
  hierarchy=${run%-*}
  wire=${run#*-}
  read -r -a before <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  read -r -a args <<<"$(colocated_args "$shared/$run" "--comm.hierarchy $hierarchy --comm.compression $wire")"
  cluster_mpirun -H node1:2,node2:2 -np 4 "$ddptrain" "${args[@]}" >"$shared/$run.txt" 2>&1 ||
    { cat "$shared/$run.txt"; fail "the 2 x 2-rank colocated run ($run) failed"; }
  read -r -a after <<<"$(cluster_net_bytes node1) $(cluster_net_bytes node2)"
  if [ "$hierarchy" = auto ]; then
    grep -qF "hierarchical across 2 nodes of 2 ranks" "$shared/$run.txt" ||
      { cat "$shared/$run.txt"; fail "$run: the colocated exchange did not go through the nodes"; }
  elif grep -qF "hierarchical across" "$shared/$run.txt"; then
    fail "$run: comm.hierarchy off, yet the start log says hierarchical"
  fi
  agreed=$(agreed_epochs "$shared/$run")
  [ "$agreed" -eq 2 ] || fail "$run: $agreed of 2 epochs with agreed replicas"
  for node in 1 2; do received[$run$node]=$((after[2 * node - 1] - before[2 * node - 1])); done
done

difference=$(params_within "$shared/one-node/last.h5" "$shared/auto-none/last.h5" 1e-5 "through the nodes")
echo "ok: the colocated exchange through 2 nodes of 2 ranks ends with the one-node 4-rank parameters" \
  "(largest difference $difference), every epoch's replicas bit-identical"

for node in 1 2; do
  flat=${received[off-none$node]}
  through=${received[auto-none$node]}
  sixteen=${received[auto-bf16$node]}
  echo "node$node received: flat $flat, through the nodes $through, through the nodes in bf16 $sixteen bytes"
  [ $((100 * through)) -le $((65 * flat)) ] ||
    fail "node$node received $through bytes through the nodes, more than 65% of the flat exchange's $flat"
  [ $((100 * sixteen)) -le $((65 * through)) ] ||
    fail "node$node received $sixteen bytes with bf16, more than 65% of float's $through"
done
echo "ok: through the nodes each node receives about half the flat exchange's bytes, and half again in bf16"

expect_no_leftovers
