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
#   SUPERTUNE_STREAMFLOW=1|0  whether to make .venv-streamflow too (StreamFlow, for federations with
#                          executor: streamflow); default: 1 when this script is run (bash
#                          scripts/env.sh) or sourced by scripts/test.sh, 0 when sourced by
#                          scripts/train-default.sh, whose run never uses it
#   SUPERTUNE_PACKAGES=all|core  all: every pin of src/supertune/pinned-requirements.txt; core: the
#                          pins of what a training run needs, leaving out those of pyproject.toml's
#                          extras (test tools, DeepSpeed, W&B and MLflow, lm-evaluation-harness,
#                          torchao, Opacus), each of which supertune names in one line where a run asks for
#                          it; default: all when this script is run or sourced by scripts/test.sh,
#                          core when sourced by scripts/train-default.sh. A venv made with all
#                          serves core too.
#   bash scripts/env.sh --print    the build chosen, why, and the pip commands; nothing is run
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SUPERTUNE_VENV:-$ROOT/.venv}"
# Absolute: the scripts that source this one change directory before they run what is on PATH.
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
PRINT_ONLY=0
if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = "--print" ]; then
  PRINT_ONLY=1  # run as a script (not sourced by test.sh or train-default.sh, whose arguments are not ours)
fi
# Run as a script, it makes everything; sourced, only what the sourcing script asks for.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  STREAMFLOW="${SUPERTUNE_STREAMFLOW:-1}"
else
  STREAMFLOW="${SUPERTUNE_STREAMFLOW:-0}"
fi
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  PACKAGES="${SUPERTUNE_PACKAGES:-all}"
else
  PACKAGES="${SUPERTUNE_PACKAGES:-core}"
fi
case "$PACKAGES" in
  all | core) ;;
  *) echo "supertune: SUPERTUNE_PACKAGES=$PACKAGES is not a choice; use all (every tested package) or core (what a training run needs)" >&2; exit 2 ;;
esac
SF_VENV="${SUPERTUNE_STREAMFLOW_VENV:-$ROOT/.venv-streamflow}"
sf_pin="$(grep -oE '"streamflow==[^"]+"' "$ROOT/pyproject.toml" | tr -d '"')"

"$PYTHON" - <<'PY' || { echo "supertune needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

# The PyTorch build. PyPI's own torch wheel of the pin is one build, by machine: on x86_64 the CUDA
# 13.0 build (torch 2.13.0's metadata requires cuda-toolkit 13.0.3), on aarch64 a CPU build; that
# build comes from PyPI (or the site's PyPI mirror). Every other build carries its name as a local
# version label (2.13.0+cu128) and comes from PyTorch's wheel index, download.pytorch.org. Update
# pypi_build with the pin.
torch_version="$(grep -E '^torch==' "$ROOT/src/supertune/pinned-requirements.txt" | cut -d= -f3)"
case "$(uname -m)" in
  x86_64) pypi_build=cu130 ;;
  *) pypi_build=cpu ;;
esac
torch_build="${SUPERTUNE_TORCH:-auto}"
torch_why="SUPERTUNE_TORCH=$torch_build"
if [ "$torch_build" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # The oldest driver branch of each CUDA major release, as doctor's MIN_DRIVER_BRANCH has them.
    driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ' || true)"
    branch="${driver%%.*}"
    # The oldest GPU's compute capability (nvidia-smi of drivers since 2022 tells it): CUDA 13 builds
    # carry kernels from 7.5 on, so Volta (7.0) and older never get one.
    oldest_gpu="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' ' | sort -V | head -n1 || true)"
    if [[ "$oldest_gpu" =~ ^[0-9]+\.[0-9]+$ ]] && [ "$(printf '%s\n7.5\n' "$oldest_gpu" | sort -V | head -n1)" != 7.5 ]; then
      echo "supertune: these GPUs have compute capability $oldest_gpu, older than 7.5, where CUDA 13 builds start: auto will not choose for them; name a CUDA 12 build (SUPERTUNE_TORCH=cu126 or cu128) and run supertune doctor on a compute node, whose gpus check reads the kernels the build carries (torch 2.11 and newer are reported to carry none for 7.0 in any build)" >&2
      exit 2
    fi
    if ! [[ "$branch" =~ ^[0-9]+$ ]]; then
      torch_build=cu128; torch_why="auto: nvidia-smi lists NVIDIA GPUs but not its driver version; cu128 needs a driver of the 525 series or newer"
    elif [ "$branch" -ge 580 ]; then
      torch_build=cu130; torch_why="auto: NVIDIA driver $driver runs CUDA 13 builds (580 or newer)"
    elif [ "$branch" -ge 525 ]; then
      torch_build=cu128; torch_why="auto: NVIDIA driver $driver runs CUDA 12 builds (525 or newer), not CUDA 13's (580)"
    else
      echo "supertune: the NVIDIA driver here ($driver) is older than 525, the oldest that runs CUDA 12 builds; ask the site for a newer driver, use its container (supertune container --cluster NAME), or name an older build (SUPERTUNE_TORCH=cu118) if PyTorch publishes torch $torch_version for it" >&2
      exit 2
    fi
  elif [ -e /dev/kfd ]; then
    torch_build=rocm6.4; torch_why="auto: /dev/kfd, an AMD ROCm driver, is present"
  else
    torch_build=cpu; torch_why="auto: no GPU driver here (no working nvidia-smi, no /dev/kfd)"
  fi
fi
case "$torch_build" in
  cpu | cu[0-9]* | rocm[0-9]*) ;;
  *) echo "supertune: SUPERTUNE_TORCH=$torch_build is not a PyTorch build; use cpu, cu126, cu128, cu130, rocm6.4 (a wheel index name) or auto" >&2; exit 2 ;;
esac
# torch_args: what pip installs torch with; fallback_args, where not empty: the second try.
fallback_args=()
if [ "$torch_build" = "$pypi_build" ]; then
  torch_args=("torch==$torch_version")
elif [ "$torch_build" = cpu ]; then
  # A CPU wheel from pip's own indexes where one is offered (a local wheel, as on the CI machines,
  # or a site mirror), else from PyTorch's CPU index. The label keeps PyPI's CUDA build out.
  torch_args=("torch==$torch_version+cpu")
  fallback_args=("torch==$torch_version+cpu" --extra-index-url https://download.pytorch.org/whl/cpu)
else
  torch_args=("torch==$torch_version" --index-url "https://download.pytorch.org/whl/$torch_build")
fi
PINS="$ROOT/src/supertune/pinned-requirements.txt"
# core: the pins without pyproject.toml's extras (read with tomllib, names compared as pip does).
core_pins() {
  "$PYTHON" - "$ROOT/pyproject.toml" "$PINS" <<'PY'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
def name(requirement):
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[;@ ]", requirement.strip(), maxsplit=1)[0]).lower()
left_out = {name(r) for requirements in extras.values() for r in requirements}
for line in open(sys.argv[2], encoding="utf-8"):
    if line.strip() and not line.startswith("#") and name(line) not in left_out:
        print(line.strip())
PY
}
if [ "$PACKAGES" = all ]; then pins_args=(-r "$PINS"); else mapfile -t pins_args < <(core_pins); fi
pip_cmd="$VENV/bin/python -m pip install"
torch_install="$pip_cmd ${torch_args[*]}"
[ ${#fallback_args[@]} -eq 0 ] || torch_install="$torch_install || $pip_cmd ${fallback_args[*]}"
install_commands=(
  "$VENV/bin/python -m pip install --upgrade pip"
  "$torch_install"
  "$pip_cmd ${pins_args[*]}"
  "$pip_cmd --no-deps -e $ROOT"
)
if [ "$PRINT_ONLY" = 1 ]; then
  echo "supertune: PyTorch build $torch_build ($torch_why); venv $VENV; packages: $PACKAGES"
  echo "$PYTHON -m venv $VENV"
  printf '%s\n' "${install_commands[@]}"
  if [ "$STREAMFLOW" != 0 ] && [ -n "$sf_pin" ]; then
    echo "$PYTHON -m venv $SF_VENV"
    echo "$SF_VENV/bin/python -m pip install $sf_pin"
  fi
  exit 0
fi

# The build of the torch a venv holds (cpu, cu130, rocm6.4, ...), as torch itself reports it; none
# when it has no torch. Imports torch (a few seconds), so only when installing.
torch_build_in() {
  "$1/bin/python" - <<'PY' 2>/dev/null || echo unimportable
import importlib.util
if importlib.util.find_spec("torch") is None:
    print("none")
else:
    import torch
    if torch.version.cuda:
        print("cu" + torch.version.cuda.replace(".", ""))
    elif torch.version.hip:
        print("rocm" + ".".join(torch.version.hip.split(".")[:2]))
    else:
        print("cpu")
PY
}

# The stamp: the pins, pyproject.toml and the build; " core" after it when only the core was installed.
stamp_value="$(cat "$PINS" "$ROOT/pyproject.toml" <(echo "$torch_build") | sha256sum | cut -d' ' -f1)"
stamp_file="$VENV/.supertune-installed"
stamp_want="$stamp_value"
[ "$PACKAGES" = all ] || stamp_want="$stamp_value core"
stamp_had="$(cat "$stamp_file" 2>/dev/null || true)"
if [ "$stamp_had" != "$stamp_value" ] && [ "$stamp_had" != "$stamp_want" ]; then
  # A venv goes into a new or empty directory, or updates one made before: never among other files
  # (SUPERTUNE_VENV=/project/p123 for /project/p123/supertune-venv would scatter bin/ and lib/ there).
  if [ -e "$VENV" ] && [ ! -d "$VENV" ]; then
    echo "supertune: SUPERTUNE_VENV=$VENV is a file, not a directory; name a new directory for the venv, e.g. $VENV-venv" >&2
    exit 2
  fi
  if [ -d "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A -- "$VENV")" ]; then
    echo "supertune: SUPERTUNE_VENV=$VENV holds other files and no venv (no pyvenv.cfg); name a new directory inside it, e.g. SUPERTUNE_VENV=$VENV/supertune-venv" >&2
    exit 2
  fi
  echo "supertune: preparing $VENV with PyTorch build $torch_build ($torch_why); first time: a few minutes" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  # Another build already there would meet the pin and stay: it goes first.
  had="$(torch_build_in "$VENV")"
  if [ "$had" != none ] && [ "$had" != "$torch_build" ]; then
    echo "supertune: $VENV holds PyTorch build $had; replacing it with $torch_build" >&2
    "$VENV/bin/python" -m pip uninstall --quiet -y torch
  fi
  # The build's wheel is torch==X+label: the pin below (torch==X) is then met and not reinstalled.
  torch_failed="supertune: could not install PyTorch build $torch_build (pip's reason above); where PyTorch's index (download.pytorch.org) is out of reach, name a mirror that has the build (PIP_EXTRA_INDEX_URL), or on x86_64 take PyPI's own build, SUPERTUNE_TORCH=cu130"
  if [ ${#fallback_args[@]} -eq 0 ]; then
    "$VENV/bin/python" -m pip install --quiet "${torch_args[@]}" || { echo "$torch_failed" >&2; exit 1; }
  elif ! "$VENV/bin/python" -m pip install --quiet "${torch_args[@]}" 2>/dev/null; then
    echo "supertune: pip's indexes offer no ${torch_args[0]}; trying PyTorch's (${fallback_args[*]:1})" >&2
    "$VENV/bin/python" -m pip install --quiet "${fallback_args[@]}" || { echo "$torch_failed" >&2; exit 1; }
  fi
  got="$(torch_build_in "$VENV")"
  if [ "$got" != "$torch_build" ]; then
    echo "supertune: asked for PyTorch build $torch_build ($torch_why), but pip installed $got into $VENV: pip's configuration offers another build first (pip config list); fix it, or name the build you want in SUPERTUNE_TORCH" >&2
    exit 1
  fi
  "$VENV/bin/python" -m pip install --quiet "${pins_args[@]}"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
  echo "$stamp_want" > "$stamp_file"
fi

# StreamFlow (the federation's `executor: streamflow`) gets a venv of its own, .venv-streamflow:
# its dependencies (cwl-utils, asyncssh, kubernetes clients, ...) stay out of the training stack.
# The version is the pin of pyproject.toml's `streamflow` extra. It is not put on PATH (its python
# would shadow supertune's); the federation finds <repo>/.venv-streamflow/bin/streamflow by itself.
# Made only where asked (STREAMFLOW above): it takes about as long as the training stack, and the
# default run never uses it.
if [ "$STREAMFLOW" != "0" ]; then
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
