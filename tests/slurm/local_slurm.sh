# A private one-node Slurm on localhost for the Slurm tests. Source it, then:
#   local_slurm_start DIR   writes DIR/slurm.conf (2 CPUs, one partition, no munge), starts slurmctld and
#                           slurmd on free ports, waits until the node is idle and exports SLURM_CONF; an EXIT
#                           trap stops both daemons by their pid files (and prints their logs if the test
#                           failed). Exits 77 (skipped) when not root or Slurm is not installed.
#   local_slurm_logs        prints both daemons' logs (for a failure message).
#   local_slurm_job_state ID
#                           prints the job's state (PENDING, RUNNING, COMPLETED, ...).
#   local_slurm_wait_job ID SECONDS
#                           waits until the job has ended and prints its final state; fails after SECONDS.
#   local_slurm_check_launchers CHECK
#                           runs `CHECK srun` then `CHECK mpirun` (a function of the test), prints "ok" or "FAIL"
#                           with what it printed, and after a failure the job's output $work/job-LAUNCHER.out;
#                           fails if either failed.
#   local_slurm_test_setup  what every Slurm test starts with: skip (77) unless possible, a scratch folder in
#                           $work (removed on exit), the daemons started under it, and Open MPI allowed to
#                           run as root and to oversubscribe.
#   fail MESSAGE            ends the test: FAIL, the output of the job in $out if set, exit 1.
#   local_slurm_test_settings, local_slurm_check_resumed_run, local_slurm_check_preemption_log
#                           the settings every test Slurm shares, and the checks of a preempted job (below).
# Set local_slurm_remove_on_exit to a folder to have it removed after the daemons stopped.
# Each test uses a fresh DIR, so no job state carries over from one test to the next. The daemons talk over
# 127.0.0.1, so the host name need not resolve.
# shellcheck shell=bash

# shellcheck source=tests/lib/skip.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/skip.sh"

# Reads metrics.jsonl (tests/json_field.py says how).
json_field_script=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/json_field.py
local_slurm_dir=""

# fail MESSAGE: ends a test (exit 1) with FAIL and, when `out` names the output file of the job under test,
# that output.
out=""
fail() {
  echo "FAIL: $*"
  if [ -n "$out" ]; then
    echo "---- job output"
    cat "$out" 2>/dev/null || true
  fi
  exit 1
}
local_slurm_remove_on_exit=""

local_slurm_skip_unless_possible() {
  [ "$(id -u)" -eq 0 ] || skip_because "the local Slurm runs its daemons as root (SlurmUser=root); run as root"
  local tool
  for tool in slurmctld slurmd sbatch scontrol sinfo scancel; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
      skip_missing slurm-wlm "$tool is not installed"
    fi
  done
}

# Sets `work` to a fresh scratch folder with the daemons running under it.
local_slurm_test_setup() {
  local_slurm_skip_unless_possible
  work=$(mktemp -d)
  local_slurm_remove_on_exit=$work
  local_slurm_start "$work/slurm"
  # Only for the tests: Open MPI under root, on a machine that may have fewer cores than ranks.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
}

# Two distinct TCP ports nobody listens on, so a Slurm already running on this machine is left alone.
local_slurm_free_ports() {
  /usr/bin/python3 -c '
import socket
sockets = [socket.socket() for _ in range(2)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in sockets])'
}

local_slurm_logs() {
  local log
  for log in "$local_slurm_dir"/slurmctld.log "$local_slurm_dir"/slurmd.log; do
    [ -f "$log" ] || continue
    echo "---- $log (last 40 lines)"
    tail -n 40 "$log"
  done
}

local_slurm_stop() {
  local status=$?
  local pid_file pid
  if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then local_slurm_logs; fi
  for pid_file in "$local_slurm_dir"/slurmd.pid "$local_slurm_dir"/slurmctld.pid; do
    [ -s "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done
  [ -z "$local_slurm_remove_on_exit" ] || rm -rf "$local_slurm_remove_on_exit"
  return "$status"
}

# The settings every test Slurm shares: no munge (auth/none), root daemons, no cgroups, requeue allowed, a
# requeued job free to start again 10 s after its first run (cred_expire, 120 s by default), scheduling
# every second.
local_slurm_test_settings() {
  cat <<'EOF'
AuthType=auth/none
AuthInfo=cred_expire=10
CredType=cred/none
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
JobRequeue=1
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
EOF
}

# Checks the run directory of a preempted and resumed job against an uninterrupted run of EPOCHS epochs:
# metrics.jsonl holds each epoch exactly once, and last.h5's parameters equal REFERENCE_PARAMS (a file of
# `h5dump -m %.9g -d /params` output without its first line). Fails the test (exit 1) otherwise.
local_slurm_check_resumed_run() {  # run dir, epochs, reference params file
  local lines count epoch
  lines=$(grep -c '"epoch"' "$1/metrics.jsonl" || true)
  [ "$lines" -eq "$2" ] || { echo "FAIL: metrics.jsonl has $lines epoch lines, $2 uninterrupted"; exit 1; }
  for epoch in $(seq "$2"); do
    count=$(python3 "$json_field_script" "$1/metrics.jsonl" epoch "epoch=$epoch" | wc -l)
    [ "$count" -eq 1 ] || { echo "FAIL: epoch $epoch appears $count times in metrics.jsonl"; exit 1; }
  done
  h5dump -m %.9g -d /params "$1/last.h5" | tail -n +2 >"$1/params.txt" ||
    { echo "FAIL: h5dump could not read $1/last.h5"; exit 1; }
  cmp -s "$1/params.txt" "$3" ||
    { echo "FAIL: the preempted run's final parameters differ from the uninterrupted run's"; exit 1; }
}

# Checks the output of a preempted job for each link of the chain: the signal reached the batch shell and was
# forwarded to LAUNCHER, ddptrain checkpointed and exited 75, the script requeued the job, and its second run
# resumed from RUN_DIR/last.h5. Fails the test (exit 1, printing the output) at the first link missing.
local_slurm_check_preemption_log() {  # job output, launcher, job id, run dir
  local check
  for check in "batch shell received SIGUSR1|the signal reaching the batch shell" \
    "forwarding SIGUSR1 to $2|the signal forwarded to $2" \
    "stopped by SIGUSR1 after epoch|ddptrain's checkpoint-and-stop message" \
    "ddptrain stopped for preemption (exit 75)|exit code 75" \
    "requeued job $3|the requeue" \
    "run 2 on .*resuming from $4/last.h5|a second run that resumes" \
    "resumed from|ddptrain resuming from the checkpoint"; do
    if ! grep -q -- "${check%%|*}" "$1"; then
      echo "FAIL: the job output lacks ${check#*|} ('${check%%|*}')"
      echo "---- job output"
      cat "$1"
      exit 1
    fi
  done
}

local_slurm_start() {
  local_slurm_skip_unless_possible
  local_slurm_dir=$1
  mkdir -p "$local_slurm_dir"/state "$local_slurm_dir"/spool
  local host ctld_port slurmd_port
  host=$(hostname -s)
  read -r ctld_port slurmd_port < <(local_slurm_free_ports) || { echo "FAIL: no free TCP ports"; exit 1; }
  # cred_expire is how long Slurm holds a requeued job before it may start again (default 120 s).
  cat >"$local_slurm_dir/slurm.conf" <<EOF
ClusterName=ddptest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
$(local_slurm_test_settings)
StateSaveLocation=$local_slurm_dir/state
SlurmdSpoolDir=$local_slurm_dir/spool
SlurmctldPidFile=$local_slurm_dir/slurmctld.pid
SlurmdPidFile=$local_slurm_dir/slurmd.pid
SlurmctldLogFile=$local_slurm_dir/slurmctld.log
SlurmdLogFile=$local_slurm_dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  # PMIx's per-step folders (spmix_appdir_<uid>_<job>.<step>) go to /tmp by default, where another test
  # Slurm's job of the same number (each test cluster counts from 1) would collide with them.
  mkdir -p "$local_slurm_dir/pmix"
  echo "PMIxCliTmpDirBase=$local_slurm_dir/pmix" >"$local_slurm_dir/mpi.conf"
  export SLURM_CONF=$local_slurm_dir/slurm.conf
  trap local_slurm_stop EXIT
  PATH=$PATH:/usr/sbin
  slurmctld -f "$SLURM_CONF" || { echo "FAIL: slurmctld did not start"; exit 1; }
  slurmd -f "$SLURM_CONF" || { echo "FAIL: slurmd did not start"; exit 1; }
  local state=""
  for _ in $(seq 150); do  # at most 30 s
    state=$(sinfo -h -N -o %T 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    sleep 0.2
  done
  echo "FAIL: the local Slurm node is not idle after 30 s (state: ${state:-none})"
  exit 1
}

local_slurm_job_state() {
  scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2
}

# How many times Slurm has requeued job $1.
local_slurm_job_restarts() {
  scontrol show job "$1" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2
}

local_slurm_wait_job() {
  local id=$1 bound=$2 state="" waited=0
  while [ "$waited" -lt $((bound * 5)) ]; do
    state=$(local_slurm_job_state "$id")
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state"
        return 0
        ;;
    esac
    sleep 0.2
    waited=$((waited + 1))
  done
  echo "job $id has not ended after $bound s (state: ${state:-unknown})" >&2
  scontrol show job "$id" >&2 || true
  return 1
}

local_slurm_check_launchers() {
  local check=$1 launcher result status=0
  for launcher in srun mpirun; do
    if result=$("$check" "$launcher" 2>&1); then
      echo "ok (LAUNCHER=$launcher): $result"
    else
      echo "FAIL (LAUNCHER=$launcher): $result"
      echo "---- job output"
      cat "$work/job-$launcher.out" 2>/dev/null || true
      status=1
    fi
  done
  return "$status"
}
