"""One doctor run in this process: the node checks, then with --comm the pre-flight with the job's
other processes, then the report. `supertune doctor` and the doctor's worker entry point (what
every process of a job or of `--nproc` runs) both end here.

Exit codes: 0 when no check failed (warnings allowed), 1 when one did on any process (the
bandwidth below --expect-gbps included), 2 for wrong options. Every process of a --comm run
returns the same code, so any launcher (torchrun, srun) sees one outcome.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from ..launch.environment import LaunchEnvironment, export_for_torch, launch_environment
from ..launch.exit_order import leave_in_order
from .node import gather, run_checks
from .options import DoctorOptions
from .report import exit_code, format_text, merge_elsewhere, report_document
from .result import CheckResult

__all__ = ["run_doctor"]


def run_doctor(options: DoctorOptions) -> int:
    """Check, measure (with --comm), report; the exit code (see the module docstring)."""
    view = launch_environment()
    if options.comm and not view.distributed:
        from ..entry import DOCTOR_WORKER, entry_words

        raise UserError(
            "--comm: this is a single process; measure between several with --nproc N (on this machine), "
            f"or start it under torchrun or srun (python {' '.join(map(str, entry_words(DOCTOR_WORKER, ['--comm'])))})"
        )
    facts = gather(view, options.dirs)
    if view.lacks_torch_variables:
        export_for_torch(view)  # srun/mpirun set only their own variables; env:// needs these
    checks = run_checks(facts, int(options.min_free_gb * 2**30))
    if not options.comm:
        doc = report_document(facts.hostname, view.as_dict(), checks)
        _emit(doc, options, reporter=True)
        return 0 if options.exit_zero else doc["exit_code"]
    return _with_comm(view, options, facts.hostname, checks)


def _with_comm(view: LaunchEnvironment, options: DoctorOptions, host: str, checks: list[CheckResult]) -> int:
    from .comm import CommSession, comm_check

    session = CommSession(view, options)
    error = session.form()
    if error is not None:
        # No group, so no gathering: each node's first process reports what it knows.
        result = session.result(error)
        doc = report_document(host, view.as_dict(), [*checks, comm_check(result)], comm=result.as_dict())
        _emit(doc, options, reporter=view.local_rank == 0, write=view.rank == 0)
        return 0 if options.exit_zero else 1
    try:
        if session.any_true(exit_code(checks) != 0):
            skipped = "not measured: a node check failed on some process (see the report)"
            result = session.result(skipped)
        else:
            result = session.measure()
        checks = [*checks, comm_check(result)]
        # The measurement is collective (every process holds the same numbers): only node checks travel.
        reports = session.gather((host, view.rank, [c.as_dict() for c in checks if c.name != "comm"]))
        elsewhere = merge_elsewhere([r for r in reports if r[1] != view.rank], [c.as_dict() for c in checks])
        doc = report_document(host, view.as_dict(), checks, elsewhere, result.as_dict())
        code = session.max_int(doc["exit_code"])
        doc["exit_code"] = code
        _emit(doc, options, reporter=view.rank == 0, quiet=True)
        leave_in_order(view)
    finally:
        session.close()
    return 0 if options.exit_zero else code


def _emit(doc: dict, options: DoctorOptions, reporter: bool, write: bool | None = None, quiet: bool = False) -> None:
    """The reporter prints the report; the others print their own failures (to stderr) unless
    `quiet` (the reporter's report holds them)."""
    if reporter:
        print(json.dumps(doc, sort_keys=True) if options.json else format_text(doc), flush=True)
    elif not quiet:
        for c in doc["checks"]:
            if c["verdict"] == "fail":
                print(
                    f"supertune doctor: {doc['host']} rank {doc['rank']}: {c['name']} failed: {c['evidence']}; fix: {c['fix']}",
                    file=sys.stderr,
                    flush=True,
                )
    if options.out and (reporter if write is None else write):
        Path(options.out).parent.mkdir(parents=True, exist_ok=True)
        Path(options.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
