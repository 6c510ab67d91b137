"""Run one arm and note what each optimizer step spends its time on, part by part.

    PYTHONPATH=bench python -m throughput.step_costs supertune|clm OUT.json STEPS PROFILED ARGS...

`supertune` runs `supertune train ARGS` in this process, `clm` runs bench/baselines/clm_group_texts.py
with ARGS. Library methods are wrapped, never changed: the Trainer's own parts of a step (fetching
the micro-batches, forward + backward, counting input tokens, clipping, the optimizer), every
callback's hook (by class and hook), and the log/save/evaluate bookkeeping after the step. A
subclass's override (supertune's GuardedTrainer) is timed apart from the Trainer method it calls,
so the difference is the subclass's own work.

Each part is timed twice: by the wall clock and by this thread's CPU clock. With one torch thread
the step's arithmetic runs on this thread, so the CPU clock is what the step costs whatever else the
machine runs, and the wall clock shows what waiting added. The last PROFILED steps also run under
cProfile (CPU clock) for the costliest functions; they are left out of the per-part figures, which
cProfile would inflate. The process exits after STEPS steps.
"""

from __future__ import annotations

import cProfile
import functools
import json
import os
import pstats
import runpy
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent

STEP = "step (whole: from the end of the previous step's bookkeeping)"


class StepCosts:
    """Per-step sums of each part's wall and CPU seconds."""

    def __init__(self, out: Path, steps: int, profiled: int) -> None:
        self.out = out
        self.steps = steps
        self.profiled = profiled
        self.step = 1  # the step being run: the Trainer's global_step + 1
        self.parts: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0]))
        self.depth = 0
        self.mark = (time.perf_counter(), time.thread_time())
        self.profile: cProfile.Profile | None = None

    def add(self, name: str, wall: float, cpu: float) -> None:
        entry = self.parts[self.step][name]
        entry[0] += wall
        entry[1] += cpu
        entry[2] += 1

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn, its time added to `name` in the current step."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - w, time.thread_time() - c)

        return wrapper

    def step_done(self, global_step: int) -> None:
        """The end of a step's bookkeeping: the whole step's time, then the next step begins."""
        w, c = time.perf_counter(), time.thread_time()
        self.add(STEP, w - self.mark[0], c - self.mark[1])
        self.mark = (w, c)
        self.step = global_step + 1
        first_profiled = self.steps - self.profiled + 1
        if self.profiled and self.step == first_profiled:
            self.profile = cProfile.Profile(time.thread_time)
            self.profile.enable()
        if global_step >= self.steps:
            self.finish()

    def finish(self) -> None:
        top: list[list[Any]] = []
        if self.profile is not None:
            self.profile.disable()
            stats = pstats.Stats(self.profile)
            for (path, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
                top.append([_short(path, line, func), calls, tottime, cumtime])
        record = {
            "steps": {str(k): {n: v for n, v in parts.items()} for k, parts in self.parts.items()},
            "profiled_steps": self.profiled,
            # The costliest functions, and every one of supertune's however cheap.
            "profile": [r for i, r in enumerate(sorted(top, key=lambda r: -r[2])) if i < 60 or "supertune/" in r[0]],
        }
        self.out.write_text(json.dumps(record) + "\n", encoding="utf-8")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # evaluation and saving after training are not part of a step


def _short(path: str, line: int, func: str) -> str:
    for marker in ("site-packages/", "/src/", "/bench/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{line}({func})" if line else func


def instrument(costs: StepCosts) -> None:
    """Wrap the Trainer's parts of a step and every callback hook, for every Trainer built after this."""
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_callback import CallbackHandler

    for name, part in (
        ("get_batch_samples", "data: fetch and collate the micro-batches"),
        ("training_step", "forward + backward (Trainer.training_step)"),
        ("_track_num_input_tokens", "count input tokens (Trainer)"),
        ("floating_point_ops", "count FLOPs (Trainer)"),
        ("_clip_grad_norm", "clip gradients (Trainer)"),
        ("_get_grad_norm", "gradient norm to the host (Trainer)"),
    ):
        setattr(Trainer, name, costs.timed(part, getattr(Trainer, name)))

    bookkeeping = costs.timed(
        "log, save, evaluate after the step (callbacks' on_log included)", Trainer._maybe_log_save_evaluate
    )

    @functools.wraps(bookkeeping)
    def after_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = bookkeeping(self, *args, **kwargs)
        if int(self.state.global_step) >= costs.step:  # not the end of an epoch, which follows a step's own call
            costs.step_done(int(self.state.global_step))
        return result

    Trainer._maybe_log_save_evaluate = after_step  # type: ignore[method-assign]

    init = Trainer.__init__

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # A subclass's overrides of the timed parts: their own work is their time minus the Trainer's.
        for name in ("training_step", "_get_grad_norm"):
            own = None
            for klass in type(self).__mro__:
                if klass is Trainer:
                    break
                own = klass.__dict__.get(name)
                if own is not None:
                    break
            if own is not None:
                label = f"{type(self).__name__}.{name} (whole, the Trainer's part included)"
                setattr(self, name, costs.timed(label, own.__get__(self)))
        # The optimizer step itself.
        original_create = self.create_optimizer

        @functools.wraps(original_create)
        def create_optimizer(*a: Any, **k: Any) -> Any:
            optimizer = original_create(*a, **k)
            optimizer.step = costs.timed("optimizer step", optimizer.step)
            return optimizer

        self.create_optimizer = create_optimizer

    Trainer.__init__ = patched_init  # type: ignore[method-assign]

    add = CallbackHandler.add_callback

    @functools.wraps(add)
    def patched_add(self: Any, callback: Any) -> None:
        add(self, callback)
        cb = self.callbacks[-1]
        for hook in dir(TrainerCallback):
            if _overrides(cb, hook):
                setattr(cb, hook, costs.timed(f"callback {type(cb).__name__}.{hook}", getattr(cb, hook)))

    CallbackHandler.add_callback = patched_add  # type: ignore[method-assign]


def _overrides(cb: Any, hook: str) -> bool:
    """Whether the callback's class (or a base other than TrainerCallback) defines the hook."""
    from transformers import TrainerCallback

    if not hook.startswith("on_"):
        return False
    for klass in type(cb).__mro__:
        if klass is TrainerCallback:
            return False
        if hook in klass.__dict__:
            return True
    return False


def supertune_arm(argv: list[str]) -> None:
    import supertune.cli.main as cli

    cli.main(["train", *argv])


def clm_arm(argv: list[str]) -> None:
    script = BENCH / "baselines" / "clm_group_texts.py"
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def main() -> None:
    mode, out, steps, profiled, argv = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
    costs = StepCosts(out, steps, profiled)
    instrument(costs)
    {"supertune": supertune_arm, "clm": clm_arm}[mode](argv)
    raise SystemExit(f"step_costs: {mode} ended before step {steps}")


if __name__ == "__main__":
    main()
