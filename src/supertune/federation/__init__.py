"""Federated training across sites: `supertune federate`.

Sites train the same base model on their own data; each round their checkpoints come back, are
verified and averaged (`supertune.averaging`), and the global model is evaluated on every site's
data. Rounds resume at their first unfinished phase. Sites run as local processes or SLURM jobs
(`builtin`), or through StreamFlow (`streamflow`). docs/federated.md tells the whole story.
"""

from .layout import FederationDir
from .load import load_federation
from .run import federate, federation_cost_plan, federation_plan, federation_status
from .schema import AggregationConfig, FederationConfig, SiteConfig, StreamFlowConfig

__all__ = [
    "AggregationConfig",
    "FederationConfig",
    "FederationDir",
    "SiteConfig",
    "StreamFlowConfig",
    "federate",
    "federation_cost_plan",
    "federation_plan",
    "federation_status",
    "load_federation",
]
