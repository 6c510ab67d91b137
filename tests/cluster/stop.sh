#!/usr/bin/env bash
# Stop the test cluster that tests/cluster/start.sh started in STATE_DIR: running jobs, daemons
# (by pid), leftover job steps, then the network namespaces and links it recorded. Idempotent and
# safe after a start that failed half way; the state directory itself (logs) is kept.
set -uo pipefail
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

[ $# -eq 1 ] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
# The directory may be gone (a crashed test run's temporary directory): its daemons can still be
# found by the marker in their environment.
STATE="$(realpath -m "$1")"
export SLURM_CONF="$STATE/etc/slurm.conf"

# A zombie has exited; only its parent's wait is missing, so it counts as stopped.
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
# Daemons started by start.sh carry SUPERTUNE_SLURM_DAEMON=STATE_DIR in their environment: a
# stale pid file must not make us kill an unrelated process that reused the pid.
MARK="SUPERTUNE_SLURM_DAEMON=$STATE"
ours() { grep -qzxF "$MARK" "/proc/$1/environ" 2>/dev/null; }
pid_of() {
  local pid
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && ours "$pid" && echo "$pid"
}

# Ask each pid to stop, escalating to SIGKILL after the grace period (tenths of a second).
stop_pids() {
  local grace="$1"; shift
  local pid left
  [ $# -eq 0 ] && return 0
  kill "$@" 2>/dev/null
  for _ in $(seq 1 "$grace"); do
    left=0
    for pid in "$@"; do alive "$pid" && left=1; done
    [ "$left" -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null
  sleep 0.2
}

# 1. Cancel the jobs first, so that each slurmstepd ends its own tasks while slurmd still runs.
ctld="$(pid_of "$STATE/run/slurmctld.pid")"
if [ -n "$ctld" ] && [ -f "$SLURM_CONF" ]; then
  job_ids="$(timeout 5 squeue -h -o '%A' 2>/dev/null)"
  if [ -n "$job_ids" ]; then
    # shellcheck disable=SC2086  # one argument per job id
    timeout 5 scancel $job_ids 2>/dev/null
    for _ in $(seq 1 100); do
      [ -z "$(timeout 5 squeue -h -t running,completing -o '%A' 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
fi

# 2. The Slurm daemons, then munged (which they use until they exit).
slurm_pids=()
for f in "$STATE"/run/slurmd-*.pid "$STATE/run/slurmctld.pid"; do
  pid="$(pid_of "$f")" && slurm_pids+=("$pid")
done
stop_pids 100 "${slurm_pids[@]}"
munge_pid="$(pid_of "$STATE/run/munged.pid")"
[ -n "$munge_pid" ] && stop_pids 50 "$munge_pid"

# 3. Whatever still carries the daemons' marker (a slurmstepd whose slurmd was killed), and every
#    process left inside the cluster's network namespaces.
strays=()
# (-z: environ entries are NUL-separated; one grep over all processes.)
while read -r env; do
  pid="${env#/proc/}"; pid="${pid%/environ}"
  [ "$pid" != "$$" ] && alive "$pid" && strays+=("$pid")
done < <(grep -lzxF "$MARK" /proc/[0-9]*/environ 2>/dev/null)
created="$STATE/run/created"
if [ ! -f "$created" ]; then
  # No record (the directory is gone): the namespaces are the ones our daemons live in; when there
  # are such, the bridge is theirs too (start.sh never takes over an existing one).
  created="$(mktemp)"
  for pid in "${strays[@]}"; do
    ns="$(ip netns identify "$pid" 2>/dev/null)"
    [ -n "$ns" ] && echo "netns $ns"
  done | sort -u > "$created"
  [ -s "$created" ] && orphan_bridge=suptbr0
fi
while read -r kind name; do
  if [ "$kind" = netns ] && [ -e "/run/netns/$name" ]; then
    for pid in $(ip netns pids "$name" 2>/dev/null); do alive "$pid" && strays+=("$pid"); done
  fi
done < "$created"
stop_pids 30 "${strays[@]}"

# 4. Namespaces and links, newest first (deleting a namespace also deletes its veth end).
tac "$created" | while read -r kind name; do
  case "$kind" in
    netns) [ -e "/run/netns/$name" ] && ip netns del "$name" ;;
    link) ip link show "$name" >/dev/null 2>&1 && ip link del "$name" ;;
  esac
done
rm -f "$created"
if [ -n "${orphan_bridge:-}" ] && [ -d "/sys/class/net/$orphan_bridge" ]; then
  # The host ends of the veths, which the kernel may not have removed yet with the namespaces.
  for port in "/sys/class/net/$orphan_bridge/brif"/*; do
    [ -e "$port" ] && ip link del "${port##*/}" 2>/dev/null
  done
  ip link del "$orphan_bridge"
fi
rm -f "$STATE"/run/*.pid "$STATE/env.sh" 2>/dev/null

left=()
for pid in "${slurm_pids[@]}" ${munge_pid:+"$munge_pid"} "${strays[@]}"; do alive "$pid" && left+=("$pid"); done
if [ "${#left[@]}" -gt 0 ]; then
  echo "slurm test cluster: processes still alive after SIGKILL: ${left[*]}" >&2
  exit 1
fi
exit 0
