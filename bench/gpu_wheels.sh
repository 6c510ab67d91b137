#!/usr/bin/env bash
# Gather into .whl/ the wheels a bare GPU machine lacks for bench/gpu.py (it has a CUDA PyTorch,
# accelerate, safetensors, tokenizers and huggingface-hub, nothing can be fetched there, and its
# Python is 3.12): supertune's pinned transformers, datasets, peft, torchao, deepspeed and python-hostlist,
# with the dependencies of these that such a machine does not have. About 21 MB.
#
#   bash bench/gpu_wheels.sh            # here, where PyPI is reachable; then, on the GPU machine:
#   python3 bench/gpu.py --wheels .whl --out "$OUT"
#
# deepspeed and python-hostlist publish no wheels: they are built here, deepspeed without its
# compiled ops (DS_BUILD_OPS=0; ZeRO-Offload's CPU AdamW is compiled on first use there).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
# The versions the test suite ran with: those installed in the project's environment (made from
# src/supertune/pinned-requirements.txt by scripts/env.sh).
version() { "$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
mkdir -p .whl
binary=(transformers datasets dill multiprocess fsspec peft hjson pydantic pydantic_core annotated-types typing-inspection)
wanted=()
for name in "${binary[@]}"; do
  wanted+=("$name==$(version "$name")")
done
# training.float8's torchao, at its pin (the arm throughput-float8): the CPU environment here may lack it.
wanted+=("torchao==$(sed -n 's/^torchao==//p' src/supertune/pinned-requirements.txt)")
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${wanted[@]}"
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w .whl \
  "deepspeed==$(version deepspeed)" "python-hostlist==$(version python-hostlist)"
ls -l .whl
du -sh .whl
