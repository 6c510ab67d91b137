"""The processes supertune starts of its own, one table: `python -m supertune.entry NAME [ARGS]`.

Users start none of these by hand (their commands are `supertune --help`'s); supertune writes them
into job scripts, torchrun commands and StreamFlow's CWL steps, always through `entry_words`, so a
command line and the process it starts cannot disagree. Each entry is a module with
`add_arguments(parser)` and `run(args) -> int`, imported only when its entry runs: a training
process installs its signal handlers before its heavy imports, and no process pays for another's.
Nothing here imports anything of supertune's at the top: every layer may name an entry.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ENTRY_MODULE", "ENTRY_POINTS", "EntryPoint", "entry_words", "main"]

ENTRY_MODULE = "supertune.entry"

TRAIN_WORKER = "train-worker"
DOCTOR_WORKER = "doctor-worker"
SITE_TASK = "site-task"
SITE_EVAL = "site-eval"
PREPARE_ARRAY = "prepare-array"
BENCH_EVAL = "bench-eval"
AGENT_LINK = "agent-link"


@dataclass(frozen=True)
class EntryPoint:
    name: str
    module: str
    """Holds add_arguments(parser) and run(args) -> int."""
    summary: str


ENTRY_POINTS: dict[str, EntryPoint] = {
    e.name: e
    for e in (
        EntryPoint(
            TRAIN_WORKER,
            "supertune.train.lifecycle.worker",
            "one process of a run's training (torchrun, accelerate, deepspeed, srun start it)",
        ),
        EntryPoint(
            DOCTOR_WORKER,
            "supertune.doctor.worker",
            "one process of a pre-flight: the node checks and the interconnect measured",
        ),
        EntryPoint(
            SITE_TASK,
            "supertune.federation.executors.streamflow.site_task",
            "one step of a federated round as StreamFlow runs it: train, average, evaluate; check a site's config there",
        ),
        EntryPoint(
            SITE_EVAL,
            "supertune.federation.executors.builtin.site_eval",
            "a global model's loss on one site's validation data (a site's evaluation job)",
        ),
        EntryPoint(
            PREPARE_ARRAY,
            "supertune.store.array_entry",
            "a task of `supertune prepare --submit`: tokenize one part, or merge the parts",
        ),
        EntryPoint(
            AGENT_LINK,
            "supertune.federation.executors.agents.agent_link",
            "a link of `supertune federate --site NAME EXCHANGE --submit`: the site's agent, or the next link's submission",
        ),
        EntryPoint(
            BENCH_EVAL,
            "supertune.benchmarks.job_entry",
            "the job of `supertune eval MODEL --tasks ... --submit`: benchmarks of a saved model",
        ),
    )
}


def entry_words(name: str, args: Sequence[object] = ()) -> list[object]:
    """The words after the interpreter that start entry `name` with `args`."""
    if name not in ENTRY_POINTS:
        raise KeyError(f"{name!r} is not an entry point of {ENTRY_MODULE}")
    return ["-m", ENTRY_MODULE, name, *args]


def _parser() -> argparse.ArgumentParser:
    table = "\n".join(f"  {e.name:<14} {e.summary}" for e in ENTRY_POINTS.values())
    p = argparse.ArgumentParser(
        prog=f"python -m {ENTRY_MODULE}",
        description="Processes supertune starts itself (job steps, torchrun, StreamFlow); not for starting by hand.",
        epilog=f"entry points:\n{table}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", choices=list(ENTRY_POINTS), metavar="NAME", help="the entry point (listed below)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (NAME --help lists them)")
    return p


def main(argv: list[str] | None = None) -> int:
    chosen = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    entry = ENTRY_POINTS[chosen.name]
    module = importlib.import_module(entry.module)
    parser = argparse.ArgumentParser(prog=f"python -m {ENTRY_MODULE} {entry.name}", description=entry.summary)
    module.add_arguments(parser)
    args = parser.parse_args(chosen.args)
    from .errors import UserError

    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"supertune: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
