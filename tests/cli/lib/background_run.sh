# Sourced by the CLI tests that start a training run in the background and then act on one of its ranks.

# Prints the PID of MPI rank RANK of the run whose checkpoint directory is RUN_DIR, started from this
# directory (nothing if none): other tests running at the same time may use the same RUN_DIR name.
pid_of_rank() {  # run dir, rank
  local pid
  for pid in $(pgrep -f "checkpoint.dir $1 "); do
    [ "$(readlink "/proc/$pid/cwd")" = "$(pwd -P)" ] || continue
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$pid"; fi
  done
}

# Waits at most 30 s for RUN_DIR/metrics.jsonl to hold an epoch; fails if none came.
wait_for_first_epoch() {  # run dir
  local _
  for _ in $(seq 600); do
    [ -s "$1/metrics.jsonl" ] && return 0
    sleep 0.05
  done
  return 1
}
