#!/usr/bin/env bash
# Create (or reuse) .venv with the exact versions supertune is tested with.
# torch is installed first and pinned, so pip never resolves a multi-GB CUDA build.
# Sourced by the other scripts; re-running is cheap: a stamp records what was installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SUPERTUNE_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

"$PYTHON" - <<'PY' || { echo "supertune needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

stamp_value="$(cat "$ROOT/src/supertune/pinned-requirements.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
stamp_file="$VENV/.supertune-installed"
if [ ! -f "$stamp_file" ] || [ "$(cat "$stamp_file")" != "$stamp_value" ]; then
  echo "supertune: preparing $VENV (first time: a few minutes)" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  torch_pin="$(grep -E '^torch==' "$ROOT/src/supertune/pinned-requirements.txt")"
  "$VENV/bin/python" -m pip install --quiet "$torch_pin"
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/src/supertune/pinned-requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
  echo "$stamp_value" > "$stamp_file"
fi
export PATH="$VENV/bin:$PATH"
