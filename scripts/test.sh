#!/usr/bin/env bash
# The whole test suite, on CPU and offline: make the environment, then run pytest.
# Extra arguments go to pytest (e.g. -k config).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec python -m pytest "$@"
