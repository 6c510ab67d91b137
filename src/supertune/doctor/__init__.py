"""`supertune doctor`: what is wrong with this node's environment for training, and the fix; with
--comm, how fast the interconnect really is between the job's processes.

Each check is a function of what it looks at (environment variables, interfaces, paths, torch's
facts), returning a CheckResult with a verdict (ok / warn / fail / n/a), the evidence and the fix;
`probe` reads the machine, `node.run_checks` runs them all, `comm` measures, `report` prints.
Importing this package does not import torch.
"""

from .node import CHECK_NAMES, NodeFacts, gather, run_checks
from .options import DoctorOptions, add_doctor_arguments, options_from_args, preflight_arguments
from .result import CheckResult, Verdict

__all__ = [
    "CHECK_NAMES",
    "CheckResult",
    "DoctorOptions",
    "NodeFacts",
    "Verdict",
    "add_doctor_arguments",
    "gather",
    "options_from_args",
    "preflight_arguments",
    "run_checks",
]
