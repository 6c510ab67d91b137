#!/usr/bin/env bash
# Install, from Debian's own packages, what the Slurm test cluster needs: slurmctld, slurmd, the
# client tools, munge, iproute2 (namespaces and the bridge of the multi-node cluster), the
# shell linter `shellcheck` (tests lint rendered job scripts) and OpenSSH's server (the tests of a
# federation's exchange over ssh start their own sshd on a loopback port). Run as root. Idempotent: installs
# only what is missing, runs `apt-get update` only then, and prints nothing unless it fails.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge iproute2 shellcheck openssh-server openssh-client)

if [ "$(id -u)" -ne 0 ]; then
  echo "tests/cluster/install.sh: must run as root (it installs Debian packages)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "tests/cluster/install.sh: apt-get not found; install ${PACKAGES[*]} with this system's package manager" >&2
  exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

log="$(mktemp)"
policy=/usr/sbin/policy-rc.d
own_policy=0
cleanup() {
  [ "$own_policy" -eq 1 ] && rm -f "$policy"
  rm -f "$log"
}
trap cleanup EXIT

# The packages' maintainer scripts would start the system's munge and Slurm services with the
# configuration in /etc; the tests run their own daemons from a private directory instead. Exit
# code 101 of policy-rc.d tells invoke-rc.d and deb-systemd-invoke not to start anything. A
# policy already in place (container images ship one) is left as it is.
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  own_policy=1
fi

export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "tests/cluster/install.sh: installing ${missing[*]} failed (output above)" >&2
  exit 1
fi
