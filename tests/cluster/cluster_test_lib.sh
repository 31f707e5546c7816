# Sourced by the cluster tests (tests/cluster/*_test.sh): the cluster harness, a failure helper, the training
# arguments they share and parameter comparisons.
# shellcheck shell=bash
# shellcheck source=tests/cluster/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"

fail() {
  echo "FAIL: $*"
  exit 1
}

# Brings up NODES nodes with links at RATE and a small synthetic dataset in $shared/data.h5; sets `shared`
# and lets Open MPI run as root and oversubscribe the cores (all nodes share this machine's two).
cluster_test_setup() {  # ddptrain, nodes, [rate]
  cluster_skip_unless_possible
  cluster_up "$2" "${3:-none}" || fail "could not bring up $2 nodes"
  shared=$CLUSTER_DIR/shared
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OPENBLAS_NUM_THREADS=1
  "$1" prepare synthetic --output "$shared/data.h5" --train 2000 --test 400 --vocab 500 --maxlen 24 --seed 3 \
    >/dev/null || fail "prepare synthetic failed"
}

# The training run every cluster test makes (one thread per rank: the nodes share two cores).
# Named kernels: runs compared with each other must not meet model.cpu_kernels = auto's choice, which measures
# the core (models/fma_rate.h) and may choose others under another process's load.
training_args() {  # source dir, run dir, [epochs]
  echo "--config $1/launch/configs/imdb.ini --data.path $shared/data.h5 --checkpoint.dir $2 --device cpu" \
    "--model.embedding_dim 16 --model.hidden 16 --train.epochs ${3:-2} --train.threads 1 --log.progress lines" \
    "--model.cpu_kernels builtin"
}

# The parameters of checkpoint FILE, one number a line: the dataset's DATA block, not its checksum
# attribute's, which h5dump prints after it.
params_of() {  # checkpoint
  h5dump -m %.9g -y -d /params "$1" | sed -n '/DATA {/,/}/{p;/}/q}' | tr -s ', ' '\n' | grep -E '^-?[0-9]'
}

# Prints the largest |a - b| between two checkpoints' parameters; fails if their counts differ.
max_param_difference() {  # checkpoint a, checkpoint b
  paste <(params_of "$1") <(params_of "$2") | awk '
    NF != 2 { bad = 1 }
    { d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d }
    END { if (bad || NR == 0) { print "count-mismatch"; exit 1 } printf "%.3g\n", max }'
}

# Prints the largest |a - b| between two checkpoints' parameters; fails, naming WHAT on stderr (the caller
# captures stdout), if it is more than TOLERANCE or their counts differ.
params_within() {  # checkpoint a, checkpoint b, tolerance, what
  local difference
  difference=$(max_param_difference "$1" "$2") || fail "$4: the checkpoints hold different parameter counts" >&2
  awk -v d="$difference" -v t="$3" 'BEGIN { exit !(d <= t) }' ||
    fail "$4: parameters differ from the one-node run by up to $difference" >&2
  echo "$difference"
}

# Checks that nothing of the cluster is left after cluster_down.
expect_no_leftovers() {
  cluster_down
  trap - EXIT
  local left
  left=$(cluster_leftovers)
  [ -z "$left" ] || fail "left behind: $left"
  echo "ok: nothing of the cluster is left"
}
