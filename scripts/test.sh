#!/usr/bin/env bash
# The whole test suite, on CPU and offline: make the environment, then run pytest.
# Extra arguments go to pytest (e.g. -k config; -n 0 runs every test in this one process).
set -euo pipefail
# The StreamFlow federation tests need .venv-streamflow: env.sh makes it when asked.
SUPERTUNE_STREAMFLOW="${SUPERTUNE_STREAMFLOW:-1}"
# Every tested package: the tests use DeepSpeed, the trackers, lm-evaluation-harness, pytest.
SUPERTUNE_PACKAGES="${SUPERTUNE_PACKAGES:-all}"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# The Slurm tests start a real test cluster (tests/cluster), the exchange tests an sshd; their packages come from Debian's.
if [ "$(id -u)" -eq 0 ]; then
  if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/sshd ] || ! command -v shellcheck >/dev/null; then
    bash tests/cluster/install.sh || echo "supertune: could not install Slurm (above): the Slurm tests will skip, or fail with CI set" >&2
  fi
else
  echo "supertune: not root, so the Slurm tests (real test cluster) will skip" >&2
fi
# Two workers (pytest-xdist): while one waits on a Slurm job or a process's imports, the other runs.
# tests/conftest.py keeps each file's tests on one worker and every Slurm test file on the same one.
exec python -m pytest -n 2 "$@"
