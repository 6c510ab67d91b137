"""A site's resolved base run config, kept as <federation dir>/sites/<name>.yaml: written when the
federation first runs and read by every round after, so that a resumed federation makes the same rounds.

Before writing such a file, supertune records its sha256 in sites/sha256.json. A file there that
the record does not name (left in the directory by hand) or whose bytes no longer match it (edited
since) is never taken as the site's config: it is refused, in one line naming the file and the way
out (delete it: the next run writes it again from federation.yaml). Hashing a few kilobytes per
site costs microseconds per run. A federation directory made before the record was kept records
its files as they are on its next run, as it has no other witness of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ...errors import UserError
from .layout import FederationDir
from .receipts import write_receipt

__all__ = ["keep_site_configs", "site_config_file", "SITES_RECORD"]

log = logging.getLogger("supertune")

SITES_RECORD = "sha256.json"
"""In <federation dir>/sites/: {site name: sha256 of the sites/<name>.yaml supertune wrote}."""


def site_config_file(root: FederationDir, name: str) -> Path:
    """A site's resolved base run config (the site's YAML and overrides, before per-round settings)."""
    return root.path / "sites" / f"{name}.yaml"


def keep_site_configs(root: FederationDir, texts: dict[str, str]) -> None:
    """Write each site's config `texts[name]` where none is kept yet; check the kept ones against the
    record. UserError for a file supertune did not write or one edited since; a warning when
    federation.yaml now resolves a site to another config than the kept one (the rounds keep it)."""
    record_path = root.path / "sites" / SITES_RECORD
    record = _read_record(record_path)
    legacy = record is None and any(site_config_file(root, name).is_file() for name in texts)
    record = dict(record or {})
    problems = []
    for name, text in texts.items():
        path = site_config_file(root, name)
        if not path.is_file():
            record[name] = _sha256(text.encode("utf-8"))
            write_receipt(record_path, record)  # first: a file on disk is always one the record names
            path.write_text(text, encoding="utf-8")
            continue
        kept = path.read_bytes()
        have = _sha256(kept)
        if name not in record and legacy:
            record[name] = have
            write_receipt(record_path, record)
        elif name not in record:
            problems.append(
                f"{path}: supertune did not write it (no sha256 of it in {record_path}), so it is not taken as site "
                f"{name}'s run config; delete it, and the next run writes it from federation.yaml"
            )
            continue
        elif record[name] != have:
            problems.append(
                f"{path}: edited since supertune wrote it (its sha256 differs from the one in {record_path}), and the "
                "rounds would train with a config no receipt records; delete it, and the next run writes it again "
                "from federation.yaml (put the edit there, as a site's overrides)"
            )
            continue
        if kept != text.encode("utf-8"):
            # The rounds go on with the config they started with, so that a resumed federation makes
            # the same rounds; an edit of federation.yaml (a site's overrides) is not taken silently.
            log.warning(
                "site %s: federation.yaml now gives it another run config than %s, which its rounds use; "
                "the rounds still to run keep that file: to train them with the edit, delete it and run again",
                name,
                path,
            )
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        raise UserError(
            f"{len(problems)} site configs are not supertune's:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def _read_record(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        data = exc
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise UserError(
            f"{path}: damaged ({data if isinstance(data, Exception) else 'not a map of site names to sha256'}); "
            "delete it and the sites/*.yaml files beside it, and the next run writes them again from federation.yaml"
        )
    return data


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
