#!/usr/bin/env bash
# A two-node Slurm job on the one-machine cluster of tests/cluster/cluster.sh: preempted, and a node lost.
#   bash tests/cluster/slurm_job_test.sh path/to/ddptrain source-dir
# Exit 0 (pass), 1 (fail) or 77 (skipped: not root, no namespaces, Slurm or a tool missing; the reason is
# printed).
#
# The cluster has 2 nodes; slurmctld runs on node1 (a controller may share a compute node) and one slurmd in
# each node (NodeName=node[1-2], 2 CPUs each, auth/none, no cgroups: proctrack/linuxproc, task/none). The
# Slurm clients run on node1 too (cluster_on), since nothing outside the nodes reaches their network.
# launch/slurm/cpu_ps.sbatch runs with --nodes=2 --ntasks-per-node=1: rank 0 (the worker) on node1, rank 1
# (the parameter server) on node2, 4 epochs slowed by --train.straggle_ms 25 so that it is still running after
# its first epoch. The test then sends what #SBATCH --signal=B:USR1@120 sends, `scancel --signal=USR1 --batch
# JOB`, and checks: the ranks ran on node1 and node2, ddptrain checkpointed and exited 75, the script requeued
# the job, which ran twice (Restarts=1), resumed from the checkpoint and ended COMPLETED; metrics.jsonl has
# each epoch once and the final parameters equal those of an uninterrupted run of the same layout
# (cluster_mpirun, one rank per node). Once with LAUNCHER=mpirun (Open MPI's mpirun starts its daemon on
# node2 with srun, inside the allocation) and once with LAUNCHER=srun (SRUN_MPI=pmix). Last, every daemon is
# stopped, the cluster torn down, and nothing of it may be left.
#
# Notes:
# - Slurm's PMIx plugin puts each step's client folder at TmpFS/spmix_appdir_UID_JOB.STEP; with the default
#   TmpFS=/tmp, shared by the nodes here, node2's slurmstepd finds node1's folder ("Cannot create directory
#   /tmp/spmix_appdir_0_1.0: File exists") and the step fails. TmpFS accepts %n, so each node gets its own
#   folder (the cluster's node TMPDIR), as separate machines would.
# - cpu_ps.sbatch passes --train.threads 0 and ddptrain refuses an option given twice, so the job runs with
#   threads 0 (one rank per node: the node's 2 cores); the reference runs the same layout with the same
#   setting.
# - A requeued job waits until its first run's credential has expired (AuthInfo=cred_expire=10 here).
#
# Last, node loss under srun: the same job (comm.timeout_s 10), and after its first epoch node2's link is cut
# and every process of node2 killed, slurmd included. The worker on node1 must end within its deadline for
# the server (2 x comm.timeout_s) + 10 s, naming the lost rank and its own rank and host; srun ends the step
# (--kill-on-bad-exit) and Slurm, which marks node2 DOWN after SlurmdTimeout (10 s here, 300 s by default),
# ends the run: the job leaves RUNNING (Slurm requeues a job that lost a node, so it waits PENDING for node2)
# and no process of it is left on node1.
set -uo pipefail
ddptrain=$(realpath "$1")
src=$(realpath "$2")
# shellcheck source=tests/cluster/cluster.sh
source "$src/tests/cluster/cluster.sh"
# shellcheck source=tests/slurm/local_slurm.sh
source "$src/tests/slurm/local_slurm.sh"
cluster_skip_unless_possible
local_slurm_skip_unless_possible
command -v h5dump >/dev/null 2>&1 || skip_missing hdf5-tools "h5dump is not installed"
PATH=$PATH:/usr/sbin  # slurmctld and slurmd; cluster_up hands this PATH to the nodes


cluster_up 2 || fail "could not bring up the cluster"
slurm=$CLUSTER_DIR/slurm
conf=$slurm/slurm.conf
shared=$CLUSTER_DIR/shared

# Runs a command (leading NAME=VALUE words: its environment) on node1, where slurmctld listens, in the
# source folder, with the node's clean environment and SLURM_CONF.
on_node1() {
  cluster_on node1 "cd $(printf %q "$src") && exec $(printf '%q ' env SLURM_CONF="$conf" "$@")"
}
# local_slurm.sh's local_slurm_job_state and local_slurm_job_restarts call scontrol: on node1.
scontrol() { on_node1 scontrol "$@"; }

slurm_logs() {
  local log
  for log in "$slurm"/slurmctld.log "$slurm"/node*/slurmd.log; do
    [ -f "$log" ] || continue
    echo "---- $log (last 40 lines)"
    tail -n 40 "$log"
  done
}

# Stops the daemons by their PIDs (the nodes share this machine's PID namespace), all at once (each takes
# about 2 s), waiting at most 5 s; cluster_down, next, ends whatever is left in the nodes.
slurm_stop() {
  local status=$? pid_file pids=() pid _
  if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then slurm_logs; fi
  for pid_file in "$slurm"/node*/slurmd.pid "$slurm"/slurmctld.pid; do
    [ -s "$pid_file" ] && pids+=("$(cat "$pid_file")")
  done
  [ ${#pids[@]} -gt 0 ] || return "$status"
  kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 50); do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && break
      pid=""
    done
    [ -n "$pid" ] || break
    sleep 0.1
  done
  return "$status"
}
trap 'slurm_stop; cluster_down' EXIT

mkdir -p "$slurm"/state "$slurm"/node1/spool "$slurm"/node2/spool
cat >"$conf" <<EOF
ClusterName=ddpcluster
SlurmctldHost=node1($cluster_subnet.1)
$(local_slurm_test_settings)
SlurmdTimeout=10
StateSaveLocation=$slurm/state
SlurmdSpoolDir=$slurm/%n/spool
TmpFS=$CLUSTER_DIR/%n/tmp
SlurmctldPidFile=$slurm/slurmctld.pid
SlurmdPidFile=$slurm/%n/slurmd.pid
SlurmctldLogFile=$slurm/slurmctld.log
SlurmdLogFile=$slurm/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=node[1-2] NodeAddr=$cluster_subnet.[1-2] CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
EOF

cluster_on node1 "slurmctld -f $conf" || fail "slurmctld did not start on node1"
for node in $CLUSTER_NODES; do
  cluster_on "$node" "slurmd -f $conf -N $node" || fail "slurmd did not start on $node"
done
nodes_state=""
for _ in $(seq 150); do  # at most 30 s
  nodes_state=$(on_node1 sinfo -h -N -o '%N %T' 2>/dev/null | tr '\n' ' ')
  [ "$nodes_state" = "node1 idle node2 idle " ] && break
  sleep 0.2
done
[ "$nodes_state" = "node1 idle node2 idle " ] ||
  fail "the Slurm nodes are not idle after 30 s (sinfo: ${nodes_state:-nothing})"
echo "Slurm up: slurmctld on node1, slurmd on node1 and node2, both idle"

epochs=4
"$ddptrain" prepare synthetic --output "$shared/data.h5" --train 2000 --test 400 --vocab 300 --maxlen 20 \
  --seed 3 >/dev/null || fail "could not prepare the data"
args="--data.path $shared/data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs $epochs"

# The same training without interruption, in the job's layout (one rank per node), without the slowdown.
read -r -a arg_list <<<"$args"
OPENBLAS_NUM_THREADS=1 cluster_mpirun -H node1:1,node2:1 -np 2 "$ddptrain" \
  --config "$src/launch/configs/imdb.ini" --checkpoint.dir "$shared/reference" --device cpu \
  --comm.backend ps --comm.ps_servers 1 --train.threads 0 --log.progress lines "${arg_list[@]}" \
  >"$shared/reference.out" 2>&1 || { cat "$shared/reference.out"; fail "the uninterrupted reference run failed"; }
reference_lines=$(grep -c '"epoch"' "$shared/reference/metrics.jsonl" || true)
[ "$reference_lines" -eq "$epochs" ] || fail "the uninterrupted run has $reference_lines epochs, expected $epochs"
h5dump -m %.9g -d /params "$shared/reference/last.h5" | tail -n +2 >"$shared/reference_params.txt" ||
  fail "h5dump could not read the reference's last.h5"

# Waits until job ID has ended, setting job_state; fails after SECONDS. Like local_slurm_wait_job, but in this
# shell rather than in a $(...): a SIGTERM or Ctrl-C then tears the cluster down within 0.2 s, not after the
# job.
wait_job() {  # id, seconds
  local _
  job_state=""
  for _ in $(seq $(($2 * 5))); do
    job_state=$(local_slurm_job_state "$1")
    case $job_state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        return 0
        ;;
    esac
    sleep 0.2
  done
  return 1
}

expect_log() {  # pattern, what it shows
  grep -q -- "$1" "$out" || fail "the job output lacks $2 ('$1')"
}

preempt_and_check() {  # launcher
  local launcher=$1 run=$shared/run-$1 id
  out=$shared/job-$launcher.out
  # Open MPI stays on TCP over the cluster's network (Debian's build would pick UCX); the job passes the
  # submitting environment on (--export=ALL), to mpirun's daemon on node2 too.
  id=$(on_node1 LAUNCHER="$launcher" SRUN_MPI=pmix DDPTRAIN="$ddptrain" RUN_DIR="$run" \
    DDPTRAIN_EXTRA_ARGS="$args --train.straggle_ms 25" OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,vader,self \
    OMPI_MCA_btl_tcp_if_include="$cluster_subnet.0/24" OMPI_MCA_oob_tcp_if_include="$cluster_subnet.0/24" \
    sbatch --parsable --export=ALL --job-name="preempt-$launcher" --nodes=2 --ntasks-per-node=1 \
    --cpus-per-task=1 --requeue --time=5 --output="$out" launch/slurm/cpu_ps.sbatch) || fail "sbatch failed"
  local tick state=""
  for tick in $(seq 300); do  # at most 60 s until the first epoch ends; the job's state every second
    grep -q "^Epoch 1/$epochs" "$out" 2>/dev/null && break
    if [ $((tick % 5)) -eq 0 ]; then
      state=$(local_slurm_job_state "$id")
      case $state in PENDING | CONFIGURING | RUNNING | "") ;; *) break ;; esac
    fi
    sleep 0.2
  done
  grep -q "^Epoch 1/$epochs" "$out" 2>/dev/null ||
    fail "job $id (LAUNCHER=$launcher): no epoch finished (state $(local_slurm_job_state "$id"))"
  expect_log "^rank 0/2 on node1 " "rank 0 on node1"
  expect_log "^rank 1/2 on node2 " "rank 1 on node2"
  on_node1 scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id failed"
  echo "sent SIGUSR1 to the batch shell of job $id (LAUNCHER=$launcher, ranks on node1 and node2) after epoch 1"

  local restarts
  wait_job "$id" 90 || fail "job $id did not end within 90 s (state ${job_state:-unknown})"
  [ "$job_state" = COMPLETED ] || fail "job $id ended $job_state"
  restarts=$(local_slurm_job_restarts "$id")
  [ "$restarts" = 1 ] || fail "Restarts=$restarts, expected 1 (one requeue)"

  local_slurm_check_preemption_log "$out" "$launcher" "$id" "$run"
  expect_log "run 2 on node\[1-2\], 2 tasks: " "a second run on both nodes"
  local node_lines
  node_lines=$(grep -c "^rank 1/2 on node2 " "$out" || true)
  [ "$node_lines" -eq 2 ] || fail "rank 1 started on node2 $node_lines time(s), expected 2 (one per run)"
  # The stop came before the last epoch: epoch $epochs ends in the second run only.
  if sed -n '/run 2 on/q;p' "$out" | grep -q "^Epoch $epochs/$epochs"; then
    fail "the first run finished all epochs: no preemption"
  fi

  local_slurm_check_resumed_run "$run" "$epochs" "$shared/reference_params.txt"
  echo "ok (LAUNCHER=$launcher): job $id on node1 and node2 checkpointed, exited 75, was requeued once," \
    "resumed and COMPLETED $epochs epochs with the parameters of an uninterrupted run"
}

# Node loss under srun; last, since node2 stays DOWN.
lose_node2_under_srun() {
  local run=$shared/run-loss id
  out=$shared/job-loss.out
  id=$(on_node1 LAUNCHER=srun SRUN_MPI=pmix DDPTRAIN="$ddptrain" RUN_DIR="$run" \
    DDPTRAIN_EXTRA_ARGS="$args --train.straggle_ms 25 --comm.timeout_s 10" \
    sbatch --parsable --export=ALL --job-name=node-loss --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 \
    --requeue --time=5 --output="$out" launch/slurm/cpu_ps.sbatch) || fail "sbatch failed"
  local _
  for _ in $(seq 300); do
    grep -q "^Epoch 1/$epochs" "$out" 2>/dev/null && break
    sleep 0.2
  done
  grep -q "^Epoch 1/$epochs" "$out" 2>/dev/null || fail "job $id: no epoch finished"
  local lost now ranks_ended="" state
  lost=$(date +%s)
  cluster_link_down node2
  cluster_kill_node node2
  echo "job $id: node2 lost after epoch 1 (link cut, every process killed, slurmd included)"
  for _ in $(seq 600); do  # at most 60 s
    now=$(date +%s)
    if [ -z "$ranks_ended" ] && ! grep -qx ddptrain <(for pid in $(cluster_pids node1); do
      cat "/proc/$pid/comm" 2>/dev/null; done); then
      ranks_ended=$((now - lost))
    fi
    state=$(local_slurm_job_state "$id")
    [ -n "$ranks_ended" ] && [ "$state" != RUNNING ] && break
    sleep 0.1
  done
  [ -n "$ranks_ended" ] || fail "job $id: ddptrain still runs on node1 60 s after node2 was lost"
  [ "$ranks_ended" -le 30 ] || fail "job $id: ddptrain ran on node1 for $ranks_ended s after the loss (bound 30 s)"
  [ "$state" != RUNNING ] || fail "job $id: still RUNNING 60 s after node2 was lost"
  # The loss lands inside a run of steps (the worker hears nothing from the server) or between runs (the
  # worker waits for the server to hand in its shard or start the next run): either way rank 1 is named.
  local lost_server='worker \(rank 0\) (heard nothing from|waited [0-9]+ s for (the )?) ?parameter servers? \(?rank 1\)? '
  grep -Eq "ddptrain: fatal: $lost_server" "$out" ||
    fail "the job output lacks the worker (rank 0) naming the lost parameter server rank 1"
  expect_log "host node1, rank 0)" "the reporting rank and host"
  local steps=""
  for _ in $(seq 50); do  # the job's processes on node1 go with it
    steps=$(for pid in $(cluster_pids node1); do cat "/proc/$pid/comm" 2>/dev/null; done |
      grep -E '^(srun|slurmstepd|slurm_script|ddptrain)$' | tr '\n' ' ')
    [ -z "$steps" ] && break
    sleep 0.2
  done
  [ -z "$steps" ] || fail "job $id left processes on node1: $steps"
  echo "ok: node2 lost: ddptrain on node1 ended after $ranks_ended s naming the lost server, the job left" \
    "RUNNING ($state: Slurm requeues a job that lost a node) and nothing of it is left on node1"
}

preempt_and_check mpirun
preempt_and_check srun
lose_node2_under_srun
out=""

# Teardown, checked: the daemons stop, then the cluster goes, and nothing of it may remain.
slurm_stop
# The jobs are over and the daemons gone: no rank, Open MPI daemon or slurmstepd may be left in the nodes.
left=""
for _ in $(seq 25); do  # at most 5 s
  left=$(cluster_pids | tr '\n' ' ')
  [ -z "$left" ] && break
  sleep 0.2
done
[ -z "$left" ] || fail "processes left in the nodes after the jobs ended and the daemons stopped:" \
  "$(for pid in $left; do ps -o pid=,args= -p "$pid"; done)"
cluster_down
leftovers=$(cluster_leftovers)
[ -z "$leftovers" ] || fail "the cluster left something behind: $leftovers"
echo "ok: the Slurm daemons stopped and the cluster is gone"
