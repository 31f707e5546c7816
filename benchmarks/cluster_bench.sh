#!/usr/bin/env bash
# Step time and bytes on the wire across nodes of the one-machine cluster (tests/cluster/cluster.sh), at the
# IMDB shapes (vocabulary 20000, maxlen 80, embedding and hidden 128, batch 32 per rank), one rank per node,
# one BLAS thread per rank, for each layout and link:
#   allreduce_sparse   comm.backend mpi, the embedding's touched rows exchanged sparsely
#   allreduce_dense    comm.backend mpi, comm.sparse_embedding false
#   ps_dedicated       comm.backend ps: workers on nodes 1..N-1, the server alone on node N
#   ps_colocated       comm.backend ps, comm.ps_servers 0: every rank trains and serves a shard (reported in
#                      log.txt only: the scaling model does not describe it)
#   LAYOUT_bf16        a layout with comm.compression bf16 (an allreduce one also _delayed: comm.overlap
#                      delayed; _bf16_delayed both), reported in log.txt and variants.csv only
#   LAYOUT_2ppn        an allreduce or ps_colocated layout with 2 ranks per node, through the nodes
#                      (comm.hierarchy auto: the all-reduce through node leaders, the colocated exchange in
#                      slices; _2ppn_flat: off, one exchange over every rank), in log.txt and variants.csv
#                      only, its bytes per rank over all of them
# against the same ranks on one node (plain mpirun, shared memory). Bytes per step per rank come from the
# nodes' interface counters, as the difference between a run of S2 and one of S1 steps (which removes
# start-up, evaluation and checkpoint traffic), divided by S2 - S1 and by the ranks; the step time is the
# mean of the S2 run's epoch (metrics.jsonl); the exchange left visible is rank 0's time per step in the
# spans where its step waits for the exchange (benchmarks/visible_exchange.py, from the S2 run's timeline).
# Writes OUT/points.csv (the scaling model's input: compute_ms is the same ranks' step on one node; plus that
# step again and the ratio), OUT/table.csv (every point, with the exchange left visible), OUT/rows.csv
# (distinct embedding rows per global batch) and OUT/log.txt.
#   bash benchmarks/cluster_bench.sh build/ddptrain OUT [nodes...]      (as root; default nodes: 2 3)
# CLUSTER_BENCH_RATES (default "none 1gbit 100mbit"; 10gbit too) and CLUSTER_BENCH_LAYOUTS (default: the four
# above) pick a part; DDPTRAIN_MPI_PROGRESS_US, where set, goes to every rank (the MPI backend's progress
# period, comm/mpi_reducer.cpp).
set -euo pipefail
ddptrain=$(realpath "$1")
out=$(realpath -m "$2")
shift 2
node_counts=("${@:-2 3}")
read -r -a node_counts <<<"${node_counts[*]}"
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
# shellcheck source=tests/cluster/cluster.sh
source "$src/tests/cluster/cluster.sh"
cluster_skip_unless_possible
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
exec > >(tee "$out/log.txt") 2>&1

max_nodes=0
for n in "${node_counts[@]}"; do [ "$n" -gt "$max_nodes" ] && max_nodes=$n; done
cluster_up "$max_nodes" none
data=$CLUSTER_DIR/shared/imdb-shapes.h5
"$ddptrain" prepare synthetic --output "$data" --train 25000 --test 256 --vocab 20000 --maxlen 80 --seed 1 >/dev/null

# Distinct rows per global batch: the union of k consecutive batches of 32 training rows, k = 1, 2, 4, ...
h5dump -y -d /train/x "$data" | sed -n '/DATA {/,/}/p' | tr -s ', ' '\n' | grep -E '^[0-9]+$' |
  /usr/bin/python3 -c '
import sys
tokens = [int(t) for t in sys.stdin.read().split()]
seq, batch = 80, 32
rows = [tokens[i:i + seq] for i in range(0, len(tokens), seq)]
print("samples,unique_rows")
k = 1
while k * batch <= len(rows) // 2:
    n = k * batch
    groups = [rows[s:s + n] for s in range(0, len(rows) - n + 1, n)][:8]
    mean = sum(len({t for r in g for t in r if t != 0}) for g in groups) / len(groups)
    print(f"{n},{mean:.1f}")
    k *= 2
' >"$out/rows.csv"

# One TCP stream from node1 to node2 for 2 s: the unshaped link's rate in Mbit/s.
stream_mbit() {
  cluster_on node2 "timeout 10 /usr/bin/python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"0.0.0.0\", 5999)); s.listen(1)
c, _ = s.accept()
while c.recv(1 << 20): pass
'" &
  local server=$!
  sleep 0.5
  cluster_on node1 "/usr/bin/python3 -c '
import socket, time
c = socket.create_connection((\"node2\", 5999)); buf = bytes(1 << 20); n = 0; t = time.time()
while time.time() - t < 2: c.sendall(buf); n += len(buf)
print(round(n * 8 / (time.time() - t) / 1e6))
'"
  wait "$server" || true
}

run_args() {  # layout, run dir, steps, [timeline file]
  local layout=$1
  local args="--config $src/launch/configs/imdb.ini --data.path $data --checkpoint.dir $2 --device cpu"
  args+=" --train.epochs 1 --train.max_steps_per_epoch $3 --train.threads 1 --log.progress lines"
  [ -z "${4:-}" ] || args+=" --log.timeline $4"
  case $layout in
    *_bf16 | *_bf16_delayed) args+=" --comm.compression bf16" ;;&
    *_delayed) args+=" --comm.overlap delayed" ;;&
    *_2ppn_flat) args+=" --comm.hierarchy off" ;;&
    *_2ppn) args+=" --comm.hierarchy auto" ;;&
    allreduce_sparse*) args+=" --comm.backend mpi --comm.sparse_embedding true" ;;
    allreduce_dense*) args+=" --comm.backend mpi --comm.sparse_embedding false" ;;
    ps_dedicated*) args+=" --comm.backend ps --comm.ps_servers 1" ;;
    ps_colocated*) args+=" --comm.backend ps --comm.ps_servers 0" ;;
    *) echo "unknown layout $layout" >&2; return 1 ;;
  esac
  echo "$args"
}

step_ms_of() { python3 "$src/tests/json_field.py" "$1/metrics.jsonl" step_time_ms | tail -n 1; }

total_tx() {
  local node sum=0 tx
  for node in $CLUSTER_NODES; do
    read -r tx _ <<<"$(cluster_net_bytes "$node")"
    sum=$((sum + tx))
  done
  echo "$sum"
}

ranks_per_node() { case $1 in *_2ppn*) echo 2 ;; *) echo 1 ;; esac }

# Runs LAYOUT on NODES nodes for STEPS steps; prints "step_ms tx_bytes exchange_visible_ms" (the last with
# `timeline` only, else -).
cluster_run() {  # layout, nodes, steps, [timeline]
  local hosts="" k run=$CLUSTER_DIR/shared/run ppn
  ppn=$(ranks_per_node "$1")
  for k in $(seq "$2"); do hosts+="node$k:$ppn,"; done
  rm -rf "$run"
  local before after args=() visible=-
  read -r -a args <<<"$(run_args "$1" "$run" "$3" "${4:+timeline.json}")"
  before=$(total_tx)
  local forward=()
  [ -z "${DDPTRAIN_MPI_PROGRESS_US:-}" ] || forward=(-x DDPTRAIN_MPI_PROGRESS_US)
  cluster_mpirun "${forward[@]}" -H "${hosts%,}" -np $(($2 * ppn)) "$ddptrain" "${args[@]}" >"$out/last-run.txt" 2>&1 ||
    { cat "$out/last-run.txt"; echo "run failed" >&2; return 1; }
  after=$(total_tx)
  [ -z "${4:-}" ] || visible=$(/usr/bin/python3 "$src/benchmarks/visible_exchange.py" "$run/timeline.json")
  echo "$(step_ms_of "$run") $((after - before)) $visible"
}

one_node_step_ms() {  # layout, ranks
  local run=$CLUSTER_DIR/shared/one-node args=()
  rm -rf "$run"
  read -r -a args <<<"$(run_args "$1" "$run" 40)"
  mpirun -np "$2" --bind-to none "$ddptrain" "${args[@]}" >"$out/last-run.txt" 2>&1 ||
    { cat "$out/last-run.txt"; return 1; }
  step_ms_of "$run"
}

echo "layout,nodes,ranks_per_node,link_mbit,step_ms,compute_ms,bytes_per_step_rank,fit,one_node_step_ms,ratio" \
  >"$out/points.csv"
echo "layout,nodes,link_mbit,step_ms,one_node_step_ms,ratio,bytes_per_step_rank" >"$out/variants.csv"
echo "layout,nodes,ranks_per_node,link_mbit,step_ms,one_node_step_ms,ratio,bytes_per_step_rank,exchange_visible_ms" \
  >"$out/table.csv"
unshaped=$(stream_mbit)
echo "unshaped link: one TCP stream reaches $unshaped Mbit/s"
read -r -a rates <<<"${CLUSTER_BENCH_RATES:-none 1gbit 100mbit}"
read -r -a layouts <<<"${CLUSTER_BENCH_LAYOUTS:-allreduce_sparse allreduce_dense ps_dedicated ps_colocated}"
for rate in "${rates[@]}"; do
  cluster_set_rate "$rate"
  case $rate in none) mbit=$unshaped ;; 10gbit) mbit=10000 ;; 1gbit) mbit=1000 ;; 100mbit) mbit=100 ;; esac
  for nodes in "${node_counts[@]}"; do
    for layout in "${layouts[@]}"; do
      s1=10 s2=40
      if [ "$rate" = 100mbit ] && [ "$layout" != allreduce_sparse ]; then s1=4 s2=12; fi
      read -r _ tx1 _ <<<"$(cluster_run "$layout" "$nodes" "$s1")"
      read -r step tx2 visible <<<"$(cluster_run "$layout" "$nodes" "$s2" timeline)"
      ranks=$((nodes * $(ranks_per_node "$layout")))
      bytes=$(((tx2 - tx1) / (s2 - s1) / ranks))
      one=$(one_node_step_ms "$layout" "$ranks")
      ratio=$(awk -v a="$step" -v b="$one" 'BEGIN { printf "%.2f", a / b }')
      # The model describes ranks that each have a core: a job with more busy ranks than this machine's
      # cores (a server mostly waits) is reported but left out of its fit.
      busy=$nodes
      [ "$layout" = ps_dedicated ] && busy=$((nodes - 1))
      fit=1
      [ "$busy" -le "$(nproc)" ] || fit=0
      case $layout in
        allreduce_sparse | allreduce_dense | ps_dedicated)
          echo "$layout,$nodes,1,$mbit,$step,$one,$bytes,$fit,$one,$ratio" >>"$out/points.csv" ;;
        ps_colocated) ;;
        *) echo "$layout,$nodes,$mbit,$step,$one,$ratio,$bytes" >>"$out/variants.csv" ;;
      esac
      echo "$layout,$nodes,$(ranks_per_node "$layout"),$mbit,$step,$one,$ratio,$bytes,$visible" >>"$out/table.csv"
      echo "$rate $layout nodes=$nodes ranks=$ranks: step $step ms (one node $one ms, ${ratio}x)," \
        "$bytes bytes/step/rank, exchange visible $visible ms/step"
    done
  done
done
cluster_down
trap - EXIT
echo "wrote $out/points.csv and $out/rows.csv"
