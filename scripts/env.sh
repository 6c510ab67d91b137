#!/usr/bin/env bash
# Create (or reuse) the venv with the exact versions supertune is tested with.
# torch is installed first and pinned, so pip never resolves a multi-GB CUDA build by accident.
# Sourced by the other scripts; re-running is cheap: a stamp records what was installed.
#
#   SUPERTUNE_VENV=DIR     where the venv goes (default: .venv in the checkout), e.g. on project
#                          storage instead of a small home quota
#   SUPERTUNE_TORCH=BUILD  cpu, or a PyTorch wheel index such as cu126, cu128, rocm6.4; auto (the
#                          default): the build for the GPU driver this machine shows, else cpu.
#                          Login nodes usually have no GPUs: name the compute nodes' build there.
#   bash scripts/env.sh --print    the build chosen, why, and the pip commands; nothing is run
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SUPERTUNE_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
PRINT_ONLY=0
if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = "--print" ]; then
  PRINT_ONLY=1  # run as a script (not sourced by test.sh or train-default.sh, whose arguments are not ours)
fi

"$PYTHON" - <<'PY' || { echo "supertune needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

# The PyTorch build. The CPU build comes the way pip resolves the pin here (on the CI machines, a
# CPU wheel provided to pip), exactly as before; a GPU build from PyTorch's own index for it.
torch_build="${SUPERTUNE_TORCH:-auto}"
torch_why="SUPERTUNE_TORCH=$torch_build"
if [ "$torch_build" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_build=cu128; torch_why="auto: nvidia-smi lists NVIDIA GPUs (cu128 needs a driver of the 570 series or newer; SUPERTUNE_TORCH=cu126 for older ones)"
  elif [ -e /dev/kfd ]; then
    torch_build=rocm6.4; torch_why="auto: /dev/kfd, an AMD ROCm driver, is present"
  else
    torch_build=cpu; torch_why="auto: no GPU driver here (no working nvidia-smi, no /dev/kfd)"
  fi
fi
case "$torch_build" in
  cpu | cu[0-9]* | rocm[0-9]*) ;;
  *) echo "supertune: SUPERTUNE_TORCH=$torch_build is not a PyTorch build; use cpu, cu126, cu128, rocm6.4 (a wheel index name) or auto" >&2; exit 2 ;;
esac
torch_pin="$(grep -E '^torch==' "$ROOT/src/supertune/pinned-requirements.txt")"
torch_index=()
[ "$torch_build" = cpu ] || torch_index=(--index-url "https://download.pytorch.org/whl/$torch_build")
install_commands=(
  "$VENV/bin/python -m pip install --upgrade pip"
  "$VENV/bin/python -m pip install $torch_pin${torch_index[*]:+ ${torch_index[*]}}"
  "$VENV/bin/python -m pip install -r $ROOT/src/supertune/pinned-requirements.txt"
  "$VENV/bin/python -m pip install --no-deps -e $ROOT"
)
if [ "$PRINT_ONLY" = 1 ]; then
  echo "supertune: PyTorch build $torch_build ($torch_why); venv $VENV"
  echo "$PYTHON -m venv $VENV"
  printf '%s\n' "${install_commands[@]}"
  exit 0
fi

stamp_value="$(cat "$ROOT/src/supertune/pinned-requirements.txt" "$ROOT/pyproject.toml" <(echo "$torch_build") | sha256sum | cut -d' ' -f1)"
stamp_file="$VENV/.supertune-installed"
if [ ! -f "$stamp_file" ] || [ "$(cat "$stamp_file")" != "$stamp_value" ]; then
  echo "supertune: preparing $VENV with PyTorch build $torch_build ($torch_why); first time: a few minutes" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  # A GPU build is torch==X+cuNNN: the pin below (torch==X) is then already met and not reinstalled.
  "$VENV/bin/python" -m pip install --quiet "$torch_pin" "${torch_index[@]}"
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/src/supertune/pinned-requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
  echo "$stamp_value" > "$stamp_file"
fi

# StreamFlow (the federation's `executor: streamflow`) gets a venv of its own, .venv-streamflow:
# its dependencies (cwl-utils, asyncssh, kubernetes clients, ...) stay out of the training stack.
# The version is the pin of pyproject.toml's `streamflow` extra. It is not put on PATH (its python
# would shadow supertune's); the federation finds <repo>/.venv-streamflow/bin/streamflow by itself.
# SUPERTUNE_STREAMFLOW=0 skips it (a machine that never runs a federation through StreamFlow).
if [ "${SUPERTUNE_STREAMFLOW:-1}" != "0" ]; then
  SF_VENV="${SUPERTUNE_STREAMFLOW_VENV:-$ROOT/.venv-streamflow}"
  sf_pin="$(grep -oE '"streamflow==[^"]+"' "$ROOT/pyproject.toml" | tr -d '"')"
  sf_stamp="$SF_VENV/.supertune-installed"
  if [ -n "$sf_pin" ] && { [ ! -f "$sf_stamp" ] || [ "$(cat "$sf_stamp")" != "$sf_pin" ]; }; then
    echo "supertune: preparing $SF_VENV ($sf_pin)" >&2
    [ -x "$SF_VENV/bin/python" ] || "$PYTHON" -m venv "$SF_VENV"
    "$SF_VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$SF_VENV/bin/python" -m pip install --quiet "$sf_pin"
    echo "$sf_pin" > "$sf_stamp"
  fi
fi
export PATH="$VENV/bin:$PATH"
