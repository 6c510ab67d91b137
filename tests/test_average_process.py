"""`supertune average` as a process: its peak resident memory on models of a few hundred MB, and a
SIGKILL in the middle of an average, after which nothing looks complete and the same command works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import save_file

from average_models import make_checkpoint, save_model, tensors

MB = 10**6
TENSORS = 5
TENSOR_ELEMENTS = 16 * 2**20  # 64 MiB of float32 each: 336 MB of weights per model

# VmHWM, the peak resident set of this process's own memory map. (getrusage's ru_maxrss would do
# too, but it keeps the peak of the process that spawned it across exec: pytest's, here.)
PEAK_RSS = textwrap.dedent(
    """
    import sys
    from supertune.cli.main import main
    code = main(["average", *sys.argv[1:]])
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()
    print("peak_rss_kb", status[0], flush=True)
    sys.exit(code)
    """
)


def run_average(*argv, env_extra=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERTUNE_FAULT")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "supertune", "average", *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture
def big_tmp(tmp_path):
    """tmp_path, emptied afterwards: pytest keeps its last temporary directories, and these hold 1.3 GB."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_peak_memory_stays_near_a_few_slices(big_tmp):
    """3 inputs of 336 MB each (largest tensor 67 MB): peak RSS within 2 x largest tensor + 300 MB."""
    tmp_path = big_tmp
    inputs = []
    for k in range(3):
        path = tmp_path / f"m{k}"
        path.mkdir()
        ramp = np.arange(TENSOR_ELEMENTS, dtype=np.float32) * np.float32(1e-8)
        save_file(
            {f"layer{i}.weight": ramp + np.float32(k + i) for i in range(TENSORS)},
            path / "model.safetensors",
            metadata={"format": "pt"},
        )
        (path / "config.json").write_text(
            json.dumps({"architectures": ["Test"], "model_type": "test", "hidden_size": 4})
        )
        inputs.append(path)
    out = tmp_path / "avg"
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *map(str, inputs), "--out", str(out), "--weights", "1,1,2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = int(proc.stdout.split("peak_rss_kb")[-1]) * 1024
    largest = TENSOR_ELEMENTS * 4
    limit = 2 * largest + 300 * MB
    print(f"peak RSS {peak / MB:.0f} MB for 3 inputs of {TENSORS * largest / MB:.0f} MB; limit {limit / MB:.0f} MB")
    assert peak <= limit, f"peak RSS {peak / MB:.0f} MB > {limit / MB:.0f} MB"
    # and the values are right: sample each output tensor against the inputs' known values
    from safetensors import safe_open

    shard = next(out.glob("model-*.safetensors"))
    with safe_open(shard, "np") as f:
        for i in range(TENSORS):
            got = f.get_slice(f"layer{i}.weight")[TENSOR_ELEMENTS - 3 : TENSOR_ELEMENTS]
            ramp = np.arange(TENSOR_ELEMENTS - 3, TENSOR_ELEMENTS, dtype=np.float64) * 1e-8
            want = (ramp + i) * 0.25 + (ramp + i + 1) * 0.25 + (ramp + i + 2) * 0.5
            np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("point", ["average.tensor@5", "average.written@0"])
def test_a_killed_average_leaves_nothing_complete_and_the_same_command_works(tmp_path, point):
    inputs = [
        make_checkpoint(save_model(tmp_path / f"c{i}", i, shard="20KB"), tokens=100 * (i + 1), samples=i + 1)
        for i in range(3)
    ]
    out = tmp_path / "out" / "avg"
    argv = [*inputs, "--out", out, "--max-shard-size", "30KB"]
    killed = run_average(*argv, env_extra={"SUPERTUNE_FAULT": point})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not out.exists()
    leftovers = list(out.parent.iterdir())
    assert [p.name.split("-")[0] for p in leftovers] == [".avg.partial"]  # the staging directory, named as such
    again = run_average(*argv)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["avg"]  # the stale staging directory is gone
    want = [tensors(p) for p in inputs]
    got = tensors(out)
    for name in got:
        np.testing.assert_allclose(
            got[name], (100 * want[0][name] + 200 * want[1][name] + 300 * want[2][name]) / 600, rtol=1e-6, atol=1e-7
        )
