"""The round policy, the same for every executor: the rounds run at their first unfinished phase
(train, average, evaluate; `loop`), the phases' receipts and the average (`phases`), the attempts of
a site's training (`attempt_policy`: retries, deadline, late and failed sites to the quorum), who may
be left out (`quorum`), a round's deadline (`deadline`), the one error of a failed or late site and
the wording of its reason (`failures`, `attempts`), the base model and the LoRA adapters that start a federation,
what a site sends (`site_result`) and the federation as one tracked group (`tracked`); buffered
asynchronous rounds (`buffered`: the sites' tasks; `buffer`: the arrivals and the versions published
from them).

An executor (`federation.executors`) is given what is left of a round as one `RoundWork` and says
only how the sites' work is started, watched and ended (an `attempt_policy.AttemptRunner`)."""
