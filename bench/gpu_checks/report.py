"""The checklist's report: bench/results/gpu-<date>.md (a table per check, the command of each row)
and the same rows as JSON. Rewritten after every check, so a run cut short still leaves its rows."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .checks import Row


def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_value(x)}" for k, x in v.items()) or "none"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return "" if v is None else str(v)


def markdown(title: str, facts: dict, settings: dict, rows: list[Row]) -> str:
    lines = [f"# {title}", "", "## Machine", ""]
    lines += [f"- {k}: {_value(v)}" for k, v in facts.items()]
    lines += ["", "## Settings", ""] + [f"- {k}: {_value(v)}" for k, v in settings.items()]
    checks: dict[str, list[Row]] = {}
    for row in rows:
        checks.setdefault(row.check, []).append(row)
    for check, group in checks.items():
        lines += ["", f"## {check}", "", "| variant | status | figures | note |", "| --- | --- | --- | --- |"]
        for r in group:
            figures = "; ".join(f"{k} = {_value(v)}" for k, v in r.figures.items())
            lines.append(f"| {r.variant} | {r.status} | {figures} | {r.note.replace('|', '/')} |")
        commands = [r.command for r in group if r.command]
        if commands:
            lines += ["", "Commands:", ""] + [f"    {c}" for c in commands]
    return "\n".join(lines) + "\n"


def write(out: Path, stem: str, title: str, facts: dict, settings: dict, rows: list[Row]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{stem}.md"
    md.write_text(markdown(title, facts, settings, rows), encoding="utf-8")
    payload = {"machine": facts, "settings": settings, "rows": [asdict(r) for r in rows]}
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return md
