"""Federated training across sites: `supertune federate`.

Sites train the same base model on their own data; each round their checkpoints come back, are
verified and averaged (`supertune.averaging`), and the global model is evaluated on every site's
data. Rounds resume at their first unfinished phase. The sub-packages, lowest first: `config` (the
schema, loading and checks, the executors' records), `state` (the directory, its receipts and
history), `reports` (the round table, the plans), `rounds` (the round policy every executor shares)
and `executors` (`builtin`: local processes and SLURM jobs; `streamflow`: a StreamFlow workflow per
round; `agents`: site agents meeting at an exchange). docs/federated.md tells the whole story;
docs/architecture.md, how the parts stand.
"""

from .config.load import load_federation
from .config.schema import AggregationConfig, FederationConfig, SiteConfig, StreamFlowConfig
from .run import federate, federation_cost_plan, federation_plan, federation_status
from .state.layout import FederationDir

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
