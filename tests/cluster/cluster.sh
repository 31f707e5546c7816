#!/usr/bin/env bash
# A cluster of N nodes on one machine, for multi-node tests and for trying a multi-node job on a laptop.
#
# A node is a long-lived holder process in its own network, UTS (host name) and mount namespaces: it has a
# host name (node1..nodeN), an interface eth0 with address 10.77.0.K/24 and a hosts file naming every node
# (bound over /etc/hosts inside the node only). Each node's eth0 is one end of a veth pair whose other end is
# a port of a bridge living in a switch namespace of its own, so nothing touches the machine's own network,
# its /etc/hosts or its mounts. A link may be shaped (tc tbf, rate R, burst 32 kB, on both ends) and cut.
# All nodes share the file system, as a cluster shares its storage; each node gets its own TMPDIR.
#
# As a command:
#   bash tests/cluster/cluster.sh run [--nodes N] [--rate R] [--burst B] -- COMMAND [ARG...]
# brings up N nodes (default 2), runs COMMAND on this machine with the cluster's commands on PATH, and tears
# everything down however COMMAND ends (failure, Ctrl-C, SIGTERM). COMMAND sees:
#   CLUSTER_DIR        the cluster's folder (shared; $CLUSTER_DIR/shared is for data and run directories)
#   CLUSTER_NODES      the node names, space-separated
#   cluster-on NODE CMD...        runs CMD (a shell command line, as ssh would) on NODE with a clean
#                                 environment
#   cluster-mpirun ARG...         Open MPI's mpirun started on node1, reaching the other nodes through
#                                 cluster-on, over TCP on the cluster's network only; e.g.
#                                 cluster-mpirun -H node1:2,node2:2 -np 4 build/ddptrain check-env --device cpu
# Rates are tc's: 1gbit, 100mbit, ... ("none": unshaped). Exit 77 when it cannot run here (not root, no
# namespaces, a tool missing), saying why.
#
# As a library (source it): cluster_up N [RATE], cluster_on, cluster_mpirun, cluster_set_rate RATE,
# cluster_link_down NODE, cluster_link_up NODE, cluster_pids [NODE], cluster_kill_node NODE,
# cluster_net_bytes NODE, cluster_down, cluster_leftovers; see each function. cluster_up installs an EXIT
# trap that calls cluster_down (and turns SIGINT/SIGTERM into an exit, so the trap runs).
# shellcheck shell=bash

cluster_subnet=10.77.0
CLUSTER_DIR=""
CLUSTER_NODES=""
cluster_burst=${CLUSTER_BURST:-32kb}
declare -A cluster_holder=()  # node (or "switch") -> PID of the process holding its namespaces
cluster_unshare_pids=()       # the unshare processes that wait on the holders
cluster_left_holders=()       # after cluster_down: what it ended, for cluster_leftovers
cluster_left_dir=""
cluster_left_namespaces=""

# shellcheck source=tests/lib/skip.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/skip.sh"

# Prints why this machine cannot make a cluster (nothing if it can).
cluster_impossible_reason() {
  [ "$(id -u)" -eq 0 ] || { echo "the cluster needs root (network namespaces, veth, tc)"; return; }
  local tool
  for tool in unshare nsenter ip tc mpirun; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool is not installed"; return; }
  done
  unshare --net --uts --mount true 2>/dev/null || { echo "this kernel or container refuses new namespaces"; return; }
  unshare --net sh -c 'ip link add cluster_probe type veth peer name cluster_probe1 && ip link add cluster_br \
    type bridge && tc qdisc add dev cluster_probe root tbf rate 1gbit burst 32kb latency 20ms' >/dev/null 2>&1 ||
    { echo "veth, bridge or tc tbf is not available in this kernel"; return; }
}

# Exits 77 (skipped, saying why) where this machine cannot make a cluster; a missing tool names its package
# (tests/lib/skip.sh: under bootstrap.sh test that is a failure).
cluster_skip_unless_possible() {
  local reason
  [ "$(id -u)" -eq 0 ] || skip_because "the cluster needs root (network namespaces, veth, tc)"
  command -v unshare >/dev/null 2>&1 || skip_missing util-linux "unshare is not installed"
  command -v nsenter >/dev/null 2>&1 || skip_missing util-linux "nsenter is not installed"
  command -v ip >/dev/null 2>&1 || skip_missing iproute2 "ip is not installed"
  command -v tc >/dev/null 2>&1 || skip_missing iproute2 "tc is not installed"
  command -v mpirun >/dev/null 2>&1 || skip_missing openmpi-bin "mpirun is not installed"
  reason=$(cluster_impossible_reason)
  [ -z "$reason" ] || skip_because "$reason"
}

# Starts a process in new namespaces (unshare's flags in $1) and records its PID as the holder of NAME.
cluster_start_holder() {  # name, unshare flags
  local name=$1 flags=$2 pid_file="$CLUSTER_DIR/$1.pid"
  # shellcheck disable=SC2086  # the flags are words
  unshare $flags --fork -- bash -c "echo \$\$ >'$pid_file'; exec sleep infinity" </dev/null >/dev/null 2>&1 &
  cluster_unshare_pids+=("$!")
  local _
  for _ in $(seq 100); do
    [ -s "$pid_file" ] && break
    sleep 0.02
  done
  [ -s "$pid_file" ] || { echo "cluster: the $name namespace did not start" >&2; return 1; }
  cluster_holder[$name]=$(cat "$pid_file")
}

cluster_in_switch() { nsenter -t "${cluster_holder[switch]}" --net -- "$@"; }
# Entering a node's mount namespace puts a process at that namespace's real root; --root keeps the root the
# holder has (a chroot's, where the suite runs in one), --wd the caller's directory.
cluster_in_node() {  # node, command...
  local node=$1
  shift
  nsenter -t "${cluster_holder[$node]}" --net --uts --mount --root --wd="$PWD" -- "$@"
}

# Brings up N nodes; RATE shapes every link (default: unshaped).
cluster_up() {  # nodes, [rate]
  local nodes=$1 rate=${2:-none} k node answer
  CLUSTER_DIR=$(mktemp -d "${CLUSTER_BASE:-/var/tmp}/ddptrain-cluster.XXXXXX")
  trap cluster_down EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  trap 'exit 141' PIPE
  mkdir -p "$CLUSTER_DIR/bin" "$CLUSTER_DIR/shared"
  CLUSTER_NODES=$(for k in $(seq "$nodes"); do printf 'node%s ' "$k"; done)
  CLUSTER_NODES=${CLUSTER_NODES% }
  {
    echo "127.0.0.1 localhost"
    for k in $(seq "$nodes"); do echo "$cluster_subnet.$k node$k"; done
  } >"$CLUSTER_DIR/hosts"

  cluster_start_holder switch "--net" || return 1
  cluster_in_switch ip link add br0 type bridge || return 1
  cluster_in_switch ip link set br0 up
  k=0
  for node in $CLUSTER_NODES; do
    k=$((k + 1))
    mkdir -p "$CLUSTER_DIR/$node/tmp"
    cluster_start_holder "$node" "--net --uts --mount --propagation private" || return 1
    cluster_in_node "$node" hostname "$node"
    cluster_in_node "$node" mount --bind "$CLUSTER_DIR/hosts" /etc/hosts
    # The node's end is created straight into its namespace: no interface ever appears on this machine.
    cluster_in_switch ip link add "p$node" type veth peer name eth0 netns "${cluster_holder[$node]}" || return 1
    cluster_in_switch ip link set "p$node" master br0 up
    cluster_in_node "$node" ip link set lo up
    cluster_in_node "$node" ip addr add "$cluster_subnet.$k/24" dev eth0
    cluster_in_node "$node" ip link set eth0 up
  done
  cluster_set_rate "$rate" || return 1
  cluster_write_commands
  # The cluster is up when every node reaches every other.
  local other
  for node in $CLUSTER_NODES; do
    for other in $CLUSTER_NODES; do
      cluster_wait_reachable "$node" "$other" || { echo "cluster: $node cannot reach $other" >&2; return 1; }
    done
  done
}

# Waits at most 10 s until node A reaches node B (a refused TCP connection is an answer); fails otherwise.
cluster_wait_reachable() {  # node a, node b
  local address=$cluster_subnet.${2#node} answer _
  for _ in $(seq 20); do
    answer=$(cluster_in_node "$1" timeout 1 bash -c "exec 3<>/dev/tcp/$address/9" 2>&1) || true
    [[ $answer == *"Connection refused"* ]] && return 0
    sleep 0.5
  done
  return 1
}

# The commands COMMAND (and mpirun, as its remote-shell agent) call: bin/cluster-on and bin/cluster-mpirun.
cluster_write_commands() {
  local node holders=""
  for node in $CLUSTER_NODES; do holders+="$node) holder=${cluster_holder[$node]} ;; "; done
  cat >"$CLUSTER_DIR/bin/cluster-on" <<EOF
#!/usr/bin/env bash
# cluster-on NODE COMMAND...: runs COMMAND on NODE with a clean environment, as ssh would (also mpirun's agent).
node=\$1
shift
case \$node in
  $holders
  *) echo "cluster-on: no node \$node in $CLUSTER_DIR" >&2; exit 255 ;;
esac
# What a site's sshd accepts and its login profile sets alike on every node (SendEnv LC_*, and the BLAS's and
# OpenMP's settings a site exports cluster-wide): forwarded, so that every node runs the BLAS kernels the
# caller's environment picks (OPENBLAS_CORETYPE on some machines), and replicas on two nodes compute alike.
forwarded=()
while IFS= read -r setting; do forwarded+=("\$setting"); done < <(env | grep -E '^(LC_[A-Z_]*|OPENBLAS_[A-Z_]*|OMP_[A-Z_]*)=')
exec nsenter -t "\$holder" --net --uts --mount --root --wd="\$PWD" -- env -i PATH="$PATH" HOME="\${HOME:-/root}" LANG=C.UTF-8 \\
  "\${forwarded[@]}" TMPDIR="$CLUSTER_DIR/\$node/tmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
  OPENBLAS_NUM_THREADS=1 bash -c "\$*"
EOF
  # mpirun keeps the caller's environment (as on a login node); the MCA settings keep Open MPI on the
  # cluster's network and on TCP: Debian's build would otherwise pick UCX and bypass the BTLs.
  cat >"$CLUSTER_DIR/bin/cluster-mpirun" <<EOF
#!/usr/bin/env bash
# cluster-mpirun ARG...: mpirun on node1 across the cluster's nodes.
exec nsenter -t "${cluster_holder[node1]}" --net --uts --mount --root --wd="\$PWD" -- env TMPDIR="$CLUSTER_DIR/node1/tmp" \\
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun \\
  --mca plm_rsh_agent "$CLUSTER_DIR/bin/cluster-on" --mca plm_rsh_no_tree_spawn 1 \\
  --mca pml ob1 --mca btl tcp,vader,self --mca btl_tcp_if_include $cluster_subnet.0/24 \\
  --mca oob_tcp_if_include $cluster_subnet.0/24 --bind-to none "\$@"
EOF
  chmod +x "$CLUSTER_DIR/bin/cluster-on" "$CLUSTER_DIR/bin/cluster-mpirun"
}

cluster_on() { "$CLUSTER_DIR/bin/cluster-on" "$@"; }
cluster_mpirun() { "$CLUSTER_DIR/bin/cluster-mpirun" "$@"; }

# Shapes every link in both directions (tbf at the node's eth0 and at its switch port); "none" unshapes.
cluster_set_rate() {  # rate
  local node
  for node in $CLUSTER_NODES; do
    if [ "$1" = none ]; then
      cluster_in_node "$node" tc qdisc del dev eth0 root 2>/dev/null || true
      cluster_in_switch tc qdisc del dev "p$node" root 2>/dev/null || true
    else
      cluster_in_node "$node" tc qdisc replace dev eth0 root tbf rate "$1" burst "$cluster_burst" latency 20ms ||
        return 1
      cluster_in_switch tc qdisc replace dev "p$node" root tbf rate "$1" burst "$cluster_burst" latency 20ms ||
        return 1
    fi
  done
}

# Cuts (or restores) NODE's link at the switch: packets are dropped without a reset, as when a cable or a
# switch port fails. Restoring waits until the node answers again.
cluster_link_down() { cluster_in_switch ip link set "p$1" down; }
cluster_link_up() {  # node: and waits until node1 reaches it again
  cluster_in_switch ip link set "p$1" up
  cluster_wait_reachable node1 "$1"
}

# Bytes NODE's eth0 has sent and received: "TX RX".
cluster_net_bytes() {  # node
  cluster_in_node "$1" cat /proc/net/dev | awk '$1 == "eth0:" { print $10, $2 }'
}

# PIDs of the processes running in NODE's network namespace (every node's if none is named), holders and
# their unshare parents (which share the namespaces) excluded.
cluster_pids() {  # [node]
  local nodes=${1:-$CLUSTER_NODES} node namespaces=""
  for node in $nodes; do
    [ -n "${cluster_holder[$node]:-}" ] || continue
    namespaces+=" $(readlink "/proc/${cluster_holder[$node]}/ns/net" 2>/dev/null)"
  done
  [ -n "$namespaces" ] || return 0
  # One find for every process: "/proc/PID/ns net:[INODE]".
  find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
    awk -v namespaces="$namespaces" -v holders=" ${cluster_holder[*]} ${cluster_unshare_pids[*]} " '
      BEGIN { n = split(namespaces, list, " "); for (i = 1; i <= n; i++) wanted[list[i]] = 1 }
      { split($1, path, "/"); pid = path[3] }
      ($2 in wanted) && index(holders, " " pid " ") == 0 { print pid }'
}

# Kills (SIGKILL) every process of NODE but its holder: the node's daemons and ranks die at once.
cluster_kill_node() {  # node
  local pids=()
  mapfile -t pids < <(cluster_pids "$1")
  [ ${#pids[@]} -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
}

# Ends every process in the cluster's namespaces (TERM, then KILL), the holders (their namespaces, links and
# mounts go with them) and removes the folder. Safe to call twice.
cluster_down() {
  local status=$? pids=() _ name
  [ -n "$CLUSTER_DIR" ] || return "$status"
  cluster_left_namespaces=""
  for name in "${!cluster_holder[@]}"; do
    cluster_left_namespaces+=" $(readlink "/proc/${cluster_holder[$name]}/ns/net" 2>/dev/null)"
  done
  mapfile -t pids < <(cluster_pids)
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 30); do
      mapfile -t pids < <(cluster_pids)
      [ ${#pids[@]} -gt 0 ] || break
      sleep 0.1
    done
    [ ${#pids[@]} -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
  fi
  for name in "${!cluster_holder[@]}"; do kill -9 "${cluster_holder[$name]}" 2>/dev/null || true; done
  for _ in "${cluster_unshare_pids[@]}"; do wait "$_" 2>/dev/null || true; done
  rm -rf "$CLUSTER_DIR"
  cluster_left_dir=$CLUSTER_DIR
  cluster_left_holders=("${cluster_holder[@]}" "${cluster_unshare_pids[@]}")
  cluster_holder=()
  cluster_unshare_pids=()
  CLUSTER_DIR=""
  return "$status"
}

# After cluster_down: prints what is left of the cluster (a holder, a process in one of its network
# namespaces, which would keep the namespace and its links alive, or its folder); nothing if all is gone.
# No interface, address or mount was ever made outside the namespaces.
cluster_leftovers() {
  local pid
  for pid in "${cluster_left_holders[@]}"; do
    [ -d "/proc/$pid" ] && echo "holder process $pid still runs"
  done
  if [ -n "${cluster_left_namespaces// /}" ]; then
    find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
      awk -v namespaces="$cluster_left_namespaces" '
        BEGIN { n = split(namespaces, list, " "); for (i = 1; i <= n; i++) gone[list[i]] = 1 }
        $2 in gone { split($1, path, "/"); print "process " path[3] " still runs in a node'"'"'s namespace" }'
  fi
  [ -z "$cluster_left_dir" ] || [ ! -e "$cluster_left_dir" ] || echo "folder $cluster_left_dir still exists"
  return 0
}

cluster_main() {
  local nodes=2 rate=none
  [ "${1:-}" = run ] || { echo "usage: cluster.sh run [--nodes N] [--rate R] [--burst B] -- COMMAND [ARG...]" >&2; exit 2; }
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --burst) cluster_burst=$2; shift 2 ;;
      --) shift; break ;;
      *) echo "cluster.sh: unknown option $1" >&2; exit 2 ;;
    esac
  done
  [ $# -gt 0 ] || { echo "cluster.sh: no COMMAND after --" >&2; exit 2; }
  if ! [[ $rate =~ ^(none|[0-9]+(\.[0-9]+)?([kKmMgGtT])?(bit|bps))$ ]]; then
    echo "cluster.sh: --rate $rate: expected none or a tc rate such as 1gbit, 100mbit, 500kbit" >&2
    exit 2
  fi
  if ! [[ $nodes =~ ^[1-9][0-9]?$ ]] || [ "$nodes" -gt 64 ]; then
    echo "cluster.sh: --nodes $nodes: expected 1 to 64" >&2
    exit 2
  fi
  cluster_skip_unless_possible
  cluster_up "$nodes" "$rate" || { echo "cluster.sh: could not bring up the cluster" >&2; exit 1; }
  echo "cluster: $nodes nodes ($CLUSTER_NODES), links $rate, folder $CLUSTER_DIR" >&2
  export CLUSTER_DIR CLUSTER_NODES
  PATH="$CLUSTER_DIR/bin:$PATH" "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  cluster_main "$@"
fi
