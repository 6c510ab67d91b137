"""Which federation a site's folder of a round belongs to.

A site reached over SSH keeps its runs under `<workdir>/<federation name>/round-NNN/<site>/`: a
second federation with the same name and workdir (another directory here, other settings) would
find the first one's runs there, finished or not. Each federation has an id, made when its
directory is made (`federation.json` there), and a site's folder records the id, site and round it
was first used for (`owner.json`, written before anything else goes in). A folder that records
another federation, or holds a run or a start model without any record, is refused with one line
naming the site, the folder and the way out; nothing in it is changed or deleted.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from ...errors import UserError
from .layout import FederationDir
from .receipts import read_receipt, write_receipt

__all__ = ["federation_id", "claim_site_dir", "OWNER"]

OWNER = "owner.json"
"""In a site's folder of a round: the federation, site and round it belongs to."""


def federation_id(root: FederationDir) -> str:
    """The federation's id, made once (a federation directory made before ids were kept gets one
    when it is next run; a site folder from before then is refused, see claim_site_dir)."""
    record = read_receipt(root.identity)
    if record is None or not isinstance(record.get("id"), str):
        record = {"id": uuid.uuid4().hex, "created_unix": time.time()}
        write_receipt(root.identity, record)
    return record["id"]


def claim_site_dir(site_dir: Path, federation: str, site: str, number: int) -> bool:
    """Record `site_dir` as this federation's folder of `site` in round `number`, or check that it is.
    Returns True when it was this federation's already (its run, if any, is this round's to resume
    or hand out); raises UserError when it belongs to another federation or to none on record."""
    label = f"{site} round {number}"
    mine = {"federation": federation, "site": site, "round": number}
    owner = read_receipt(site_dir / OWNER)
    way_out = (
        f"it is not reused; delete {site_dir} to run this round there, or give this federation another name or workdir"
    )
    if owner is None:
        found = [name for name in ("run", "start-model") if (site_dir / name).exists()]
        if found:
            raise UserError(
                f"{label}: {site_dir} holds {' and '.join(found)} that no federation recorded as its own (another "
                f"federation with this name and workdir, made before federations had ids); {way_out}"
            )
        write_receipt(site_dir / OWNER, mine)
        return False
    if {k: owner.get(k) for k in mine} != mine:
        raise UserError(
            f"{label}: {site_dir} belongs to federation {owner.get('federation')} (site {owner.get('site')}, round "
            f"{owner.get('round')}), not to this one ({federation}); {way_out}"
        )
    return True
