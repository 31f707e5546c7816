#!/usr/bin/env bash
# A rank of a 3-rank parameter-server run is killed (kill -9), under each layout: the job must end within the
# bound with a message naming the lost rank, and --resume must then finish the training.
#   bash tests/cli/kill_and_resume.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/background_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/background_run.sh"
enter_scratch_dir_with_data "$ddptrain"
bound=20

# Each layout of the parameter server: one dedicated server (rank 2 serves; rank 1 is a worker) and colocated
# (comm.ps_servers = 0: every rank trains and serves a shard), the latter in sync and in async mode (where
# rank 1's server thread dies with it). Colocated sync runs batches of 4, which read few enough of the 300
# embedding rows that the ranks push and fetch rows (a rank dies amid those messages).
for layout in "1 sync 32" "0 sync 4" "0 async 32"; do
  read -r servers mode batch <<<"$layout"
  echo "== comm.ps_servers = $servers, comm.ps_mode = $mode"
  rm -rf run
  run=(mpirun -np 3 "$ddptrain" --data.path data.h5 --checkpoint.dir run --comm.backend ps --comm.ps_servers "$servers"
    --comm.ps_mode "$mode" --comm.timeout_s "$bound" --model.embedding_dim 16 --model.hidden 16 --train.epochs 6
    --train.straggle_ms 20 --log.progress lines --train.batch_size "$batch")

  signal_rank_and_wait KILL 1
  # A dead rank, not a duration: the job must end within comm.timeout_s (mpirun sees the death at once; a
  # watchdog would fire at the timeout).
  [ "$elapsed" -le "$bound" ] || { echo "FAIL: ps_servers $servers: took $elapsed s, bound $bound s"; exit 1; }
  grep -q "rank 1" err.txt || { echo "FAIL: ps_servers $servers: no message names rank 1:"; cat err.txt; exit 1; }

  resume_to_the_end 6
done
