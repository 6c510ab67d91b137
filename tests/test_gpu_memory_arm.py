"""The GPU checklist's memory arm (bench/gpu_checks/memory.py) without a GPU: its doubling search and
its reading of the runs, with a stand-in for the processes that says at which batch each arm runs out
of memory. (The dry run of bench/gpu.py leaves the arm out: a CPU has no device memory to fill.)"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_checks import memory  # noqa: E402 - bench/ is not a package
from gpu_checks.checks import DRY, GPU, Checklist  # noqa: E402
from gpu_checks.runs import Budget, Done, Runner  # noqa: E402

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


class StandIn(Runner):
    """Runs nothing: a batch up to `fits[arm]` trains (peak 10 GB a sequence), the next runs out of memory."""

    def __init__(self, work: Path, fits: dict[str, int], broken: int | None = None) -> None:
        super().__init__(work, {}, Budget(3600))
        self.fits, self.broken, self.argvs = fits, broken, []

    def run(self, name, argv, *, cap, extra_env=None):  # noqa: ANN001 - Runner.run's signature
        self.argvs.append(argv)
        plain = "plain_trainer.py" in argv[1]
        batch = (
            int(argv[argv.index("--batch") + 1]) if plain else _setting(argv, "training.per_device_train_batch_size")
        )
        log = self.logs / f"{name}.log"
        code = 0
        if batch == self.broken:
            log.write_text("ImportError: no module named datasets\n")
            code = 1
        elif batch > self.fits["plain" if plain else "auto"]:
            log.write_text(f"Traceback (most recent call last):\n{OOM}\n")
            code = 1
        elif plain:
            out = Path(argv[argv.index("--out") + 1])
            out.mkdir(parents=True)
            (out / "result.json").write_text(json.dumps({"peak_memory_gb": 10.0 * batch, "tokens_per_s": None}))
        else:
            run_dir = Path(argv[argv.index("--run-dir") + 1])
            run_dir.mkdir(parents=True)
            (run_dir / "summary.json").write_text(json.dumps({"peak_device_memory_gb": 10.0 * batch}))
        return Done(name, argv, code, 1.0, log)


def _setting(argv: list[str], key: str) -> int:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")]
    assert len(values) == 1, (key, values)  # given once: the arm's value replaces the throughput check's
    return int(values[0])


def test_the_largest_batch_each_arm_fits_by_doubling(tmp_path):
    runner = StandIn(tmp_path, {"plain": 2, "auto": 8})
    checklist = Checklist(runner, dataclasses.replace(GPU, memory_most=8), dry_run=False)
    memory.check(checklist, 8192)
    plain, auto = checklist.rows
    assert (plain.check, plain.variant, plain.status) == (
        "memory",
        "plain Trainer defaults + bf16=True, block 8192",
        "ok",
    )
    assert plain.figures == {
        "largest batch": 2,
        "tokens a step": 16384,
        "peak GPU memory GB": 20.0,
        "batches tried": "1: 10.0 GB, 2: 20.0 GB, 4: out of memory",
    }
    assert auto.status == "ok" and auto.note == "the cap: a larger batch may fit"
    assert auto.figures["largest batch"] == 8 and auto.figures["this / plain largest batch"] == 4.0
    assert auto.figures["batches tried"] == "1: 10.0 GB, 2: 20.0 GB, 4: 40.0 GB, 8: 80.0 GB"
    supertune = [a for a in runner.argvs if "supertune" in a]
    assert all(_setting(a, "data.block_size") == 8192 and _setting(a, "training.max_steps") == 2 for a in supertune)
    assert all("max_position_embeddings=8192" in " ".join(a) for a in runner.argvs)


def test_a_run_that_fails_for_another_reason_than_memory_fails_the_row(tmp_path):
    checklist = Checklist(
        StandIn(tmp_path, {"plain": 8, "auto": 8}, broken=2), dataclasses.replace(GPU, memory_most=8), False
    )
    memory.check(checklist, 4096)
    assert [r.status for r in checklist.rows] == ["FAILED", "FAILED"]
    assert "no module named datasets" in checklist.rows[0].note
    assert checklist.rows[0].figures["batches tried"] == "1: 10.0 GB, 2: failed"
    assert memory.out_of_memory(OOM) and not memory.out_of_memory("RuntimeError: shape mismatch")


def test_the_dry_run_leaves_the_arm_out(tmp_path):
    checklist = Checklist(StandIn(tmp_path, {}), DRY, dry_run=True)
    memory.check(checklist, 4096)
    assert [(r.status, r.note) for r in checklist.rows] == [("not run", "dry run: no device memory to fill on CPU")]
