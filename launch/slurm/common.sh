# The part every sbatch script of launch/slurm/ shares; they source it after their settings and call
# ddp_train. It starts ddptrain under srun or mpirun, forwards a preemption signal to it and requeues the job
# when ddptrain stopped for one:
#
#   - The batch shell traps USR1 (#SBATCH --signal=B:USR1@120, or `scancel --signal=USR1 --batch JOB`) and
#     TERM (the time limit, a node shutdown) and sends SIGUSR1 to the launcher, which forwards it to every
#     rank: srun forwards the signals it receives to the tasks of its step, and Open MPI's mpirun forwards
#     SIGUSR1/SIGUSR2 to the ranks. The launcher runs in the background and the shell waits for it in a loop,
#     since a trapped signal interrupts `wait`.
#   - ddptrain's ranks agree at the next step boundary, rank 0 writes RUN_DIR/last.h5 and every rank exits
#     with 75. The shell then runs `scontrol requeue`; the next run of the job continues from that checkpoint
#     (--resume auto: resume if RUN_DIR/last.h5 exists, else start). Any other exit code is the job's.
#   - SIGTERM also comes from `scancel JOB`, and Slurm lets a cancelled job be requeued: so after a SIGTERM
#     the job is requeued only if Slurm's reason for ending it is its time limit (or a preemption), never
#     after a user cancelled it.
#
# Settings read from the sbatch script (or the environment): CONFIG, RUN_DIR, LAUNCHER (srun|mpirun),
# SRUN_MPI (pmix|pmi2), DDPTRAIN (the command that runs ddptrain, split on blanks: a path, or e.g.
# "apptainer exec --nv ddptrain.sif ddptrain"), the array EXTRA_ARGS, and DDPTRAIN_EXTRA_ARGS (a string,
# split on blanks, appended last: handy as `DDPTRAIN_EXTRA_ARGS="--train.epochs 3" sbatch ...`).
# shellcheck shell=bash

readonly ddp_exit_preempted=75

ddp_launcher_pid=""
ddp_signal_received=""
ddp_signal_forwarded=""
ddp_term_received=""
ddp_term_reason=""  # Slurm's reason for ending the job, when the batch shell got SIGTERM
ddp_checkpoint_at_signal=""  # RUN_DIR/last.h5 (inode, size, time) when the first signal came

ddp_log() {
  echo "[ddp-slurm $(date '+%F %T')] $*"
}

# Sends SIGUSR1 to the launcher once; a second signal changes nothing (ddptrain is already stopping).
ddp_forward_signal() {
  [ -n "$ddp_launcher_pid" ] || return 0
  [ -z "$ddp_signal_forwarded" ] || return 0
  ddp_signal_forwarded=1
  ddp_log "forwarding SIGUSR1 to $LAUNCHER (pid $ddp_launcher_pid): checkpoint at the next step and stop"
  kill -USR1 "$ddp_launcher_pid" 2>/dev/null || true
}

# What identifies RUN_DIR/last.h5 as written: inode, size, modification time ("none" if absent). Compared
# with itself only, so clocks that differ between nodes and the file server do not matter.
ddp_checkpoint_stamp() {
  stat -c '%i %s %y' "$RUN_DIR/last.h5" 2>/dev/null || echo none
}

ddp_on_signal() {
  [ -n "$ddp_signal_received" ] || ddp_checkpoint_at_signal=$(ddp_checkpoint_stamp)
  ddp_signal_received=$1
  # ddptrain first: the reason is needed only once it has stopped.
  ddp_forward_signal
  if [ "$1" = TERM ] && [ -z "$ddp_term_received" ]; then
    ddp_term_received=1
    # Slurm sets the reason before it signals: TimeLimit at the time limit, None after scancel. A busy
    # controller (at a time limit many jobs end at once) may not answer at first: asked three times, 2 s
    # apart, well within KillWait, so that a time limit is not taken for a cancellation.
    local try
    for try in 1 2 3; do
      if ddp_term_reason=$(squeue -h -j "${SLURM_JOB_ID:-0}" -o %r 2>/dev/null); then break; fi
      ddp_term_reason=""
      [ "$try" -eq 3 ] || sleep 2
    done
    ddp_log "batch shell received SIGTERM (Slurm's reason: ${ddp_term_reason:-unknown})"
  else
    ddp_log "batch shell received SIG$1"
  fi
}

# Whether a stopped run should come back: not when a user cancelled the job.
ddp_should_requeue() {
  [ -n "$ddp_term_received" ] || return 0  # SIGUSR1, to the batch shell or to the ranks themselves
  case "$ddp_term_reason" in
    TimeLimit | Preempt*) return 0 ;;
    *) return 1 ;;
  esac
}

ddp_launcher_command() {
  case "$LAUNCHER" in
    srun)
      # srun starts SLURM_NTASKS tasks with the job's layout; PMIx (or PMI2) wires up MPI. A task that exits
      # with an error (a rank whose watchdog ended it) ends the whole step, whatever the MPI's PMI does.
      ddp_command=(srun --mpi="$SRUN_MPI" --kill-on-bad-exit=1)
      ;;
    mpirun)
      # Open MPI reads the allocation (nodes, tasks per node) from Slurm. --bind-to none lets each rank's
      # compute threads use the cores ddptrain gives them (train.threads). As root, or with more ranks than
      # cores, Open MPI also needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 or OMPI_MCA_rmaps_base_oversubscribe=1.
      # TCP keepalive on mpirun's connections to its node daemons: a node that dies or drops off the network
      # ends the job within 10 + 3 x 5 s. Without it mpirun waits on the silent daemon for as long as the
      # node stays unreachable, after ddptrain's watchdog (comm.timeout_s) has ended every other rank.
      # At a time limit Slurm sends SIGTERM to the ranks and to mpirun, which by default SIGKILLs the ranks
      # 2 s later; odls_base_sigkill_timeout 10 leaves them 20 s (within Slurm's KillWait) to write last.h5.
      ddp_command=(mpirun -np "${SLURM_NTASKS:?not inside a Slurm job}" --bind-to none
        --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 5 --mca oob_tcp_keepalive_probes 3
        --mca odls_base_sigkill_timeout 10)
      ;;
    *)
      echo "ddp-slurm: error: LAUNCHER=$LAUNCHER: use srun or mpirun" >&2
      exit 2
      ;;
  esac
  local ddptrain_words=() env_args=()
  read -r -a ddptrain_words <<<"$DDPTRAIN"
  read -r -a env_args <<<"${DDPTRAIN_EXTRA_ARGS:-}"
  ddp_command+=("${ddptrain_words[@]}" --config "$CONFIG" --checkpoint.dir "$RUN_DIR" --resume auto
    "${EXTRA_ARGS[@]}" "${env_args[@]}")
}

ddp_train() {
  : "${CONFIG:?set CONFIG}" "${RUN_DIR:?set RUN_DIR}" "${LAUNCHER:=srun}" "${SRUN_MPI:=pmix}"
  : "${DDPTRAIN:=ddptrain}"
  [ "${EXTRA_ARGS+set}" = set ] || EXTRA_ARGS=()
  if [ ! -f "$CONFIG" ]; then
    echo "ddp-slurm: error: CONFIG=$CONFIG: no such file (submit from the repository root or use an absolute path)" >&2
    exit 2
  fi
  trap 'ddp_on_signal USR1' USR1
  trap 'ddp_on_signal TERM' TERM

  local ddp_command=()
  ddp_launcher_command
  local resume="starting"
  [ -f "$RUN_DIR/last.h5" ] && resume="resuming from $RUN_DIR/last.h5"
  ddp_log "job ${SLURM_JOB_ID:-?} run $((${SLURM_RESTART_COUNT:-0} + 1)) on ${SLURM_JOB_NODELIST:-$(hostname -s)}," \
    "${SLURM_NTASKS:-?} tasks: $resume"
  ddp_log "${ddp_command[*]}"

  "${ddp_command[@]}" &
  ddp_launcher_pid=$!
  # A signal that came while the launcher was starting is forwarded now.
  [ -z "$ddp_signal_received" ] || ddp_forward_signal
  while kill -0 "$ddp_launcher_pid" 2>/dev/null; do
    wait "$ddp_launcher_pid" || true
  done
  local status=0
  wait "$ddp_launcher_pid" || status=$?  # the launcher's own exit code, kept by the shell
  ddp_launcher_pid=""

  local stopped=""
  if [ "$status" -eq "$ddp_exit_preempted" ]; then
    stopped=1
    ddp_log "ddptrain stopped for preemption (exit $status) with its checkpoint in $RUN_DIR/last.h5"
  elif [ "$status" -ne 0 ] && [ -n "$ddp_signal_received" ] &&
    [ "$(ddp_checkpoint_stamp)" != "${ddp_checkpoint_at_signal:-none}" ]; then
    # mpirun that got SIGTERM itself (Slurm signals every process of the job at the time limit and on
    # scancel) returns 1 whatever its ranks exit with; the checkpoint they wrote after the signal tells.
    stopped=1
    ddp_log "$LAUNCHER exited with $status, but ddptrain wrote $RUN_DIR/last.h5 after SIG$ddp_signal_received:" \
      "stopped for preemption with its checkpoint"
  fi
  if [ -n "$stopped" ]; then
    if [ -z "${SLURM_JOB_ID:-}" ]; then
      ddp_log "not inside a Slurm job: run this script again to continue from the checkpoint"
      exit "$status"
    fi
    if ! ddp_should_requeue; then
      ddp_log "the job was cancelled (Slurm's reason: ${ddp_term_reason:-unknown}): not requeued;" \
        "resubmit to continue from the checkpoint"
      exit "$status"
    fi
    # The requeue ends this run at once: Slurm sends SIGTERM to every process of the batch step, scontrol
    # too, often before its answer arrives. Ignoring TERM in scontrol (and taking it quietly here) lets the
    # answer tell whether the requeue took.
    trap 'ddp_log "Slurm ends this run to requeue the job"' TERM
    if (trap '' TERM && exec scontrol requeue "$SLURM_JOB_ID"); then
      ddp_log "requeued job $SLURM_JOB_ID; its next run resumes from the checkpoint"
      exit 0
    fi
    ddp_log "could not requeue; resubmit this script to continue from the checkpoint"
    exit "$status"
  fi
  ddp_log "ddptrain exited with $status"
  exit "$status"
}
