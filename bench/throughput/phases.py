"""Run one arm up to the end of optimizer step 1 with a timestamp at each phase boundary.

    PYTHONPATH=bench BENCH_SPAWN_TIME=<unix time> python -m throughput.phases supertune|clm OUT.json ARGS...

`supertune` runs `supertune train ARGS` in this process; `clm` runs bench/baselines/clm_group_texts.py
with ARGS. Library functions are wrapped (never changed) to note when each phase ends; the process
exits right after step 1. The marks are seconds since the parent spawned this process.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent


class Marks:
    """Named phase ends, as seconds since the spawn; written as JSON when the run is cut after step 1."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.spawn = float(os.environ["BENCH_SPAWN_TIME"])
        self.items: list[tuple[str, float]] = []

    def add(self, name: str) -> None:
        self.items.append((name, time.time() - self.spawn))

    def finish(self) -> None:
        self.out.write_text(json.dumps(self.items) + "\n", encoding="utf-8")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the phases after step 1 are not part of the start-up


def after(marks: Marks, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, noting `name` when it returns."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        marks.add(name)
        return result

    return wrapper


def before(marks: Marks, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, noting `name` when it is called (the end of whatever ran before it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        marks.add(name)
        return fn(*args, **kwargs)

    return wrapper


def watch_first_step(marks: Marks) -> None:
    """Give every Trainer a callback that marks the start and end of step 1 and then ends the process."""
    from transformers import Trainer, TrainerCallback

    class FirstStep(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                marks.add("Trainer.train set-up (optimizer, dataloader)")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 1:
                marks.add("optimizer step 1")
                marks.finish()

    init = Trainer.__init__

    @functools.wraps(init)
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), FirstStep()]
        init(self, *args, **kwargs)
        marks.add("Trainer() construction (accelerate imports deepspeed here when it is installed)")

    Trainer.__init__ = patched  # type: ignore[method-assign]


def supertune_phases(marks: Marks, argv: list[str]) -> None:
    # What `supertune train` imports lazily, imported first so that the imports are one phase
    # (transformers.Trainer itself is otherwise imported only when the Trainer is built).
    from transformers import Trainer  # noqa: F401

    import supertune.cli.main as cli
    import supertune.train.lifecycle.run as run
    import supertune.training_data.pipeline as pipeline

    marks.add("imports (supertune CLI, torch, transformers Trainer, datasets)")
    run.run_training = before(marks, "CLI: config, run dir, logging", run.run_training)
    run.load_tokenizer = after(marks, "tokenizer", run.load_tokenizer)
    run.build_model = after(marks, "model from config", run.build_model)
    pipeline.load_raw_splits = after(marks, "load_dataset('text') of train + validation", pipeline.load_raw_splits)
    pipeline.tokenize_split = after(marks, "tokenize a split", pipeline.tokenize_split)
    run.build_training_data = after(marks, "unigram baseline + packing", run.build_training_data)
    watch_first_step(marks)
    cli.main(["train", *argv])


def clm_phases(marks: Marks, argv: list[str]) -> None:
    import datasets
    from datasets import DatasetDict
    from transformers import AutoModelForCausalLM, Trainer  # noqa: F401  (the script's imports)

    marks.add("imports (datasets, torch, transformers Trainer)")
    datasets.load_dataset = before(marks, "script start + tokenizer", datasets.load_dataset)
    datasets.load_dataset = after(marks, "load_dataset('text')", datasets.load_dataset)
    DatasetDict.map = after(marks, "datasets.map", DatasetDict.map)  # type: ignore[method-assign]
    AutoModelForCausalLM.from_config = after(marks, "model from config", AutoModelForCausalLM.from_config)  # type: ignore[method-assign]
    watch_first_step(marks)
    script = BENCH / "baselines" / "clm_group_texts.py"
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def main() -> None:
    mode, out, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    marks = Marks(out)
    marks.add("interpreter start")
    {"supertune": supertune_phases, "clm": clm_phases}[mode](marks, argv)
    raise SystemExit(f"phases: {mode} ended without finishing optimizer step 1")


if __name__ == "__main__":
    main()
