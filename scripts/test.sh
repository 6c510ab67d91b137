#!/usr/bin/env bash
# The whole test suite, on CPU and offline: make the environment, then run pytest.
# Extra arguments go to pytest (e.g. -k config).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# The Slurm tests start a real test cluster (tests/cluster); its packages come from Debian's.
if [ "$(id -u)" -eq 0 ]; then
  if [ ! -x /usr/sbin/slurmctld ] || ! command -v shellcheck >/dev/null; then
    bash tests/cluster/install.sh || echo "supertune: could not install Slurm (above): the Slurm tests will skip, or fail with CI set" >&2
  fi
else
  echo "supertune: not root, so the Slurm tests (real test cluster) will skip" >&2
fi
exec python -m pytest "$@"
