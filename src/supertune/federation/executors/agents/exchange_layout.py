"""The files of a federation on its exchange (executor: agents), and who writes each. A record (a
`.json`) is put after the files it describes, so its presence says they are whole; every file is put
and got through the exchange's protocol (supertune.exchange: partial name, size and sha256 checked,
one rename) and checked on receipt against the record's table.

    federation.yaml                    the coordinator: the federation config (agents read their site's part)
    global/round-NNN/<files>           the coordinator: the global model round NNN made (000: the base model)
    global/round-NNN.json              the coordinator: {round, files: {name: {size, sha256}}, left_out:
                                       {site: reason}}: the sites round NNN was averaged without
    global/start-NNN.json              the coordinator: {round, unix, deadline_s, left_out}: when round NNN's
                                       training started (its deadline counts from it), put before the global
                                       model it trains from, and put again when the round starts again
    dropped.json                       the coordinator: {site: {from_round, unix}}: the sites dropped from the
                                       federation (`supertune federate DIR --drop SITE`); their agents stop
    sites/<site>/round-NNN/<files>     the site's agent: what it sends after round NNN (a transfer package)
    sites/<site>/round-NNN.json        the site's agent: {round, files, step, tokens, samples, loss_tokens,
                                       eval_loss, seconds, attempts}
    sites/<site>/eval-NNN.json         the site's agent: {eval_loss, eval_tokens, seconds} of global model NNN
                                       on its validation data
    sites/<site>/failed-NNN.json       the site's agent: {round, start, reason, tries, attempts}: its training
                                       of round NNN failed every attempt (or ran past the deadline) in the
                                       round that started at `start` (a quorum or a deadline decides)

With privacy.secure_aggregation (secure_round.py), a round's change travels only masked, in two phases
of an attempt A (1, then one more each time a site of the set fails and the rest mask again):

    global/secure-NNN.json             the coordinator: {round, attempt, sites}: the set the sites mask against
    sites/<site>/key-NNN.json          the site's agent: {round, public_key}: its key for round NNN, checked by
                                       every peer against the key the federation pins for the site
    sites/<site>/scales-NNN-A/scales.upload  the site's agent: its masked block-scale integers (secure_upload.py)
    sites/<site>/scales-NNN-A.json     the site's agent: {round, attempt, files, tokens, samples}
    global/scales-NNN-A/scales.sum     the coordinator: the sum of the set's scale uploads (the shared scales)
    global/scales-NNN-A.json           the coordinator: {round, attempt, sites, fractions: {site: weight}, files}
    sites/<site>/values-NNN-A/values.upload  the site's agent: its masked values
    sites/<site>/values-NNN-A.json     the site's agent: round-NNN.json's record of them, with the attempt

The coordinator reads a site's results only from `sites/<site>/`; names are made here from the round
number and the site names the federation config checked, never read from a listing.
"""

from __future__ import annotations

__all__ = ["CONFIG", "DROPPED", "global_files", "global_record", "round_start", "site_files", "site_record", "site_eval",
           "site_failed", "secure_set", "site_key", "site_scales_files", "site_scales_record", "scale_sum_files",
           "scale_sum_record", "site_values_files", "site_values_record"]  # fmt: skip

CONFIG = "federation.yaml"
DROPPED = "dropped.json"


def global_files(number: int) -> str:
    return f"global/round-{number:03d}"


def global_record(number: int) -> str:
    return f"global/round-{number:03d}.json"


def round_start(number: int) -> str:
    return f"global/start-{number:03d}.json"


def site_files(site: str, number: int) -> str:
    return f"sites/{site}/round-{number:03d}"


def site_record(site: str, number: int) -> str:
    return f"sites/{site}/round-{number:03d}.json"


def site_eval(site: str, number: int) -> str:
    return f"sites/{site}/eval-{number:03d}.json"


def site_failed(site: str, number: int) -> str:
    return f"sites/{site}/failed-{number:03d}.json"


def secure_set(number: int) -> str:
    return f"global/secure-{number:03d}.json"


def site_key(site: str, number: int) -> str:
    return f"sites/{site}/key-{number:03d}.json"


def site_scales_files(site: str, number: int, attempt: int) -> str:
    return f"sites/{site}/scales-{number:03d}-{attempt}"


def site_scales_record(site: str, number: int, attempt: int) -> str:
    return f"sites/{site}/scales-{number:03d}-{attempt}.json"


def scale_sum_files(number: int, attempt: int) -> str:
    return f"global/scales-{number:03d}-{attempt}"


def scale_sum_record(number: int, attempt: int) -> str:
    return f"global/scales-{number:03d}-{attempt}.json"


def site_values_files(site: str, number: int, attempt: int) -> str:
    return f"sites/{site}/values-{number:03d}-{attempt}"


def site_values_record(site: str, number: int, attempt: int) -> str:
    return f"sites/{site}/values-{number:03d}-{attempt}.json"
