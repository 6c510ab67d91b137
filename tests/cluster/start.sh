#!/usr/bin/env bash
# Start a real Slurm cluster for the tests, entirely under STATE_DIR.
#
#   start.sh single STATE_DIR   slurmctld + one slurmd on this host (node = short hostname, CPUs=2)
#   start.sh multi  STATE_DIR   slurmctld + two emulated nodes, node1 and node2: each slurmd runs in
#                               its own network namespace with its own hostname and address on a
#                               private bridge, so multi-node jobs, srun and torch.distributed see
#                               two hosts. Each node declares CPUs=2 whatever the machine has.
#
# Run as root (daemons, namespaces). Nothing goes to /etc/slurm or the system's munge: the
# configuration is STATE_DIR/etc/slurm.conf, reached through SLURM_CONF, and the cluster uses its
# own munged and key, so a machine's own Slurm is left alone. The two modes use different ports
# and names, so a single and a multi cluster can run at the same time.
#
# On success, stdout carries exactly the contents of STATE_DIR/env.sh (so `eval "$(start.sh ...)"`
# works); progress and errors go to stderr. On failure the log tails are printed and whatever was
# started is stopped again (logs stay in STATE_DIR).
set -euo pipefail
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

usage() { echo "usage: $0 single|multi STATE_DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
MODE="$1"
case "$MODE" in single | multi) ;; *) usage ;; esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "slurm test cluster: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (it starts Slurm and munge daemons)"
for tool in slurmctld slurmd sbatch scontrol sinfo munged munge ip ss nsenter unshare; do
  command -v "$tool" >/dev/null || die "$tool not found: run tests/cluster/install.sh as root"
done

mkdir -p "$2"
STATE="$(cd "$2" && pwd)"
# Unix socket paths (munge's, and slurmd's per-step sockets in the spool) must fit in 108 bytes.
[ "${#STATE}" -le 60 ] || die "STATE_DIR path too long for Unix sockets (${#STATE} > 60 characters): $STATE"
# Leftovers of an earlier start in the same directory would hold the ports and names.
bash "$HERE/stop.sh" "$STATE"

# ---- per-mode names and ports ---------------------------------------------------------------
# Ports away from Slurm's defaults (6817/6818) so that a machine's own Slurm keeps running.
# Everything named on the host (bridge, namespaces, veths) carries the "supt" prefix.
HOST="$(hostname -s)"
NET=10.213.0            # the multi cluster's private /24: bridge .1, node i .(10+i)
BRIDGE=suptbr0
NODE_COUNT=2
CPUS=2
# SUPERTUNE_TEST_SLURM_PORT_SHIFT moves a single cluster's ports, so that two test runs on one
# machine can each have one (the multi cluster's network names cannot move: one at a time).
SHIFT="${SUPERTUNE_TEST_SLURM_PORT_SHIFT:-0}"
if [ "$MODE" = single ]; then
  CTLD_PORT=$((16817 + SHIFT)) SLURMD_PORT=$((16818 + SHIFT)) CTLD_ADDR=127.0.0.1
  NODES=("$HOST")
else
  CTLD_PORT=16827 SLURMD_PORT=16828 CTLD_ADDR="$NET.1"
  NODES=()
  for i in $(seq 1 "$NODE_COUNT"); do NODES+=("node$i"); done
fi
# A port in use is most likely held by a test cluster whose test run was killed: its daemons
# carry their STATE_DIR in their environment, which names the way out.
for port in "$CTLD_PORT" "$SLURMD_PORT"; do
  holder="$(ss -Hltnp "( sport = :$port )" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2 || true)"
  [ -n "$holder" ] || continue
  other="$(tr '\0' '\n' < "/proc/$holder/environ" 2>/dev/null | sed -n 's/^SUPERTUNE_SLURM_DAEMON=//p' || true)"
  [ -z "$other" ] || die "port $port is held by the test cluster in $other; stop it with: bash $HERE/stop.sh $other"
  die "port $port is held by another program (pid $holder)"
done
if [ "$MODE" = multi ]; then
  # Network names left after stop.sh belong to another cluster that is running, or to a test run
  # that was killed before its stop.sh (its directory may be gone). A running cluster has processes
  # in its namespaces (slurmd) and its slurmctld on the ports checked above: never take those over.
  # Names with nobody inside are a killed run's leftovers: they are removed, or every later test
  # run on this machine would refuse to start. (A second start racing this one between its
  # `ip netns add` and its first slurmd could be taken for leftovers: the cost of not needing a
  # lock file that a killed run would also leave behind.)
  taken="" busy=""
  ip link show "$BRIDGE" >/dev/null 2>&1 && taken="bridge $BRIDGE"
  for i in $(seq 1 "$NODE_COUNT"); do
    [ -e "/run/netns/supt-node$i" ] || continue
    taken="$taken netns supt-node$i"
    [ -z "$(ip netns pids "supt-node$i" 2>/dev/null)" ] || busy="$busy supt-node$i"
  done
  [ -z "$busy" ] || die "network namespace(s)${busy} are in use by another multi-node test cluster; stop it first (bash $HERE/stop.sh ITS_STATE_DIR)"
  if [ -n "$taken" ]; then
    echo "slurm test cluster: removing ${taken# }, left by a multi-node test cluster that was killed (no process uses them)" >&2
    for i in $(seq 1 "$NODE_COUNT"); do
      if [ -e "/run/netns/supt-node$i" ]; then ip netns del "supt-node$i"; fi
    done
    if [ -d "/sys/class/net/$BRIDGE" ]; then
      for port in "/sys/class/net/$BRIDGE/brif"/*; do
        if [ -e "$port" ]; then ip link del "${port##*/}" 2>/dev/null || true; fi
      done
      ip link del "$BRIDGE" 2>/dev/null || true
    fi
    ip link show "$BRIDGE" >/dev/null 2>&1 && die "could not remove the leftover bridge $BRIDGE (ip link del $BRIDGE)"
  fi
fi
# Memory is not a consumable resource here (CR_Core); declaring the machine's memory on every
# node only lets jobs that ask for --mem be accepted.
MEM_MB=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))

mkdir -p "$STATE"/{etc,munge,ctld,run,log,spool}
# Every namespace and link is recorded before it is made, so stop.sh removes exactly what this
# start created, even when it failed half way.
CREATED="$STATE/run/created"
: > "$CREATED"
# Daemons are started with this variable in their environment; their children (slurmstepd)
# inherit it, which lets stop.sh find processes that outlive a killed slurmd, and check that a pid
# file still names one of ours. Only daemons get it: stop.sh kills whatever carries it.
DAEMON_ENV=(env "SUPERTUNE_SLURM_DAEMON=$STATE")
export SLURM_CONF="$STATE/etc/slurm.conf"

T0=$(date +%s%N)
elapsed() { echo "$(( ($(date +%s%N) - T0) / 1000000 )) ms"; }

STARTED=0
on_exit() {
  [ "$STARTED" -eq 1 ] && return
  echo "slurm test cluster ($MODE): start failed after $(elapsed); log tails:" >&2
  for f in "$STATE"/log/*.log "$STATE"/munge/munged.log; do
    [ -f "$f" ] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
  bash "$HERE/stop.sh" "$STATE" >&2 || true
}
trap on_exit EXIT

# ---- munge: a private key and socket ---------------------------------------------------------
# munged runs as root with --force: STATE_DIR usually lives under a root-only (0700) temporary
# directory, which the munge user cannot enter and which munged otherwise refuses for its socket.
# All clients (daemons, tests, jobs) run as root, so they can reach the socket.
chmod 700 "$STATE/munge"
if [ ! -f "$STATE/munge/munge.key" ]; then
  head -c 1024 /dev/urandom > "$STATE/munge/munge.key"
  chmod 400 "$STATE/munge/munge.key"
fi
MUNGE_SOCKET="$STATE/munge/munge.socket"
"${DAEMON_ENV[@]}" munged --force --key-file="$STATE/munge/munge.key" --socket="$MUNGE_SOCKET" \
  --pid-file="$STATE/run/munged.pid" --log-file="$STATE/munge/munged.log" \
  --seed-file="$STATE/munge/munged.seed"
munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null

# ---- slurm.conf -----------------------------------------------------------------------------
{
  cat <<EOF
# Written by tests/cluster/start.sh ($MODE); removed with the state directory.
ClusterName=supertune-$MODE
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroup requirements: works in containers, VMs and network namespaces alike.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Trust the node lines below rather than the hardware: emulated nodes share the machine's cores.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
# Short scheduling intervals: a requeued job starts again within seconds; batch_sched_delay=0
# starts a submitted job at the next scheduler tick (about 1 s) rather than up to 3 s later.
SchedulerParameters=bf_interval=5,sched_interval=5,batch_sched_delay=0
# No slurmdbd, so no sacct: finished jobs are read with scontrol, which keeps them MinJobAge s: an
# hour, since on a busy machine a test may read a job long after it finished (a 14-minute fixture saw
# its first jobs purged at the default 300 s).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
JobRequeue=1
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
InactiveLimit=0
KillWait=5
SlurmdTimeout=60
EOF
  if [ "$MODE" = single ]; then
    echo "NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  else
    for i in $(seq 1 "$NODE_COUNT"); do
      echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
    done
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$SLURM_CONF"
# slurmd loads a cgroup plugin at startup even with the plugins above. On a host with only
# cgroup v2, Slurm 22.05 asks systemd over D-Bus for a scope and dies where there is no D-Bus
# (containers, minimal machines); IgnoreSystemdOnFailure lets it set up the cgroup itself then.
printf 'CgroupPlugin=autodetect\nIgnoreSystemdOnFailure=yes\n' > "$STATE/etc/cgroup.conf"
for node in "${NODES[@]}"; do mkdir -p "$STATE/spool/$node"; done

# ---- network (multi) ------------------------------------------------------------------------
if [ "$MODE" = multi ]; then
  echo "link $BRIDGE" >> "$CREATED"
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # The nodes' /etc/hosts (bind-mounted in their mount namespaces): node names for MASTER_ADDR
  # and friends, and this host's name on the bridge.
  { echo "127.0.0.1 localhost"; echo "$NET.1 $HOST"; } > "$STATE/etc/hosts"
  for i in $(seq 1 "$NODE_COUNT"); do
    ns="supt-node$i"
    echo "netns $ns" >> "$CREATED"
    ip netns add "$ns"
    echo "link supt${i}h" >> "$CREATED"
    ip link add "supt${i}h" type veth peer name "supt${i}n"
    ip link set "supt${i}h" master "$BRIDGE" up
    ip link set "supt${i}n" netns "$ns"
    ip -n "$ns" addr add "$NET.$((10 + i))/24" dev "supt${i}n"
    ip -n "$ns" link set "supt${i}n" up
    ip -n "$ns" link set lo up
    echo "$NET.$((10 + i)) node$i" >> "$STATE/etc/hosts"
  done
fi

# ---- daemons --------------------------------------------------------------------------------
# slurmctld must answer before any slurmd starts, or the nodes register late (or not at all).
"${DAEMON_ENV[@]}" slurmctld -f "$SLURM_CONF"
ok=0
for _ in $(seq 1 150); do
  if timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then ok=1; break; fi
  sleep 0.2
done
[ "$ok" -eq 1 ] || die "slurmctld does not answer scontrol ping"

if [ "$MODE" = single ]; then
  "${DAEMON_ENV[@]}" slurmd -f "$SLURM_CONF" -N "$HOST"
else
  for i in $(seq 1 "$NODE_COUNT"); do
    # nsenter --net, not `ip netns exec`: the latter remounts /sys, and slurmd then finds no
    # cgroup filesystem and exits. unshare gives the node its own hostname and /etc/hosts.
    # shellcheck disable=SC2016  # $1 and $2 are expanded by the inner bash
    "${DAEMON_ENV[@]}" nsenter --net="/run/netns/supt-node$i" unshare --uts --mount --propagation private \
      bash -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -f "$SLURM_CONF" -N "$2"' \
      _ "$STATE/etc/hosts" "node$i"
  done
fi

# ---- wait for idle nodes --------------------------------------------------------------------
ok=0
for _ in $(seq 1 300); do
  idle="$(timeout 5 sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)"
  if [ "$idle" -eq "${#NODES[@]}" ]; then ok=1; break; fi
  sleep 0.2
done
if [ "$ok" -ne 1 ]; then
  timeout 5 sinfo -N -l >&2 || true
  die "nodes not idle after 60 s (sinfo above)"
fi
STARTED=1

cat > "$STATE/env.sh" <<EOF
# Source this to use the $MODE test cluster started by tests/cluster/start.sh.
export SLURM_CONF='$SLURM_CONF'
export SUPERTUNE_SLURM_MODE='$MODE'
export SUPERTUNE_SLURM_NODES='${NODES[*]}'
export SUPERTUNE_SLURM_STATE='$STATE'
EOF
echo "slurm test cluster ($MODE): ${NODES[*]} idle after $(elapsed)" >&2
cat "$STATE/env.sh"
