#!/usr/bin/env bash
# The main job on the embedded default: make the environment, then train, evaluate, save and sample.
# Extra arguments go to `supertune train` (e.g. training.max_steps=50).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec supertune train "$@"
