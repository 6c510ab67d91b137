"""The doctor's report: one JSON document (for scripts, --json and --out), and its text form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .options import size_label
from .result import CheckResult, worst

__all__ = ["report_document", "format_text", "exit_code", "merge_elsewhere", "REPORT_VERSION"]

REPORT_VERSION = 1
_LABELS = {"ok": "ok", "n/a": "n/a", "warn": "WARN", "fail": "FAIL"}


def exit_code(checks: Sequence[CheckResult]) -> int:
    """1 when any check failed, else 0 (warnings do not fail a run)."""
    return 1 if any(c.verdict == "fail" for c in checks) else 0


def report_document(
    host: str,
    view: dict[str, Any],
    checks: Sequence[CheckResult],
    elsewhere: Sequence[dict[str, Any]] = (),
    comm: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole report; `elsewhere` lists warnings and failures of the job's other processes."""
    verdicts = [c.verdict for c in checks] + [e["verdict"] for e in elsewhere]
    overall = worst(checks)
    if "fail" in verdicts:
        overall = "fail"
    elif "warn" in verdicts and overall == "ok":
        overall = "warn"
    return {
        "supertune_doctor": REPORT_VERSION,
        "host": host,
        "rank": view.get("rank", 0),
        "world_size": view.get("world_size", 1),
        "launcher": view.get("launcher", "none"),
        "verdict": overall,
        "exit_code": 1 if overall == "fail" else 0,
        "checks": [c.as_dict() for c in checks],
        "elsewhere": list(elsewhere),
        "comm": comm,
    }


def merge_elsewhere(
    reports: Sequence[tuple[str, int, Sequence[dict[str, str]]]], own: Sequence[dict[str, str]] = ()
) -> list[dict[str, Any]]:
    """Warnings and failures of other processes, one entry per distinct finding with the hosts and
    ranks that had it; findings identical to the reporter's own (`own`) are not repeated."""
    seen_here = {(c["name"], c["evidence"]) for c in own}
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for host, rank, checks in reports:
        for c in checks:
            key = (c["name"], c["evidence"])
            if c["verdict"] not in ("warn", "fail") or key in seen_here:
                continue
            entry = merged.setdefault(key, {**c, "hosts": [], "ranks": []})
            if host not in entry["hosts"]:
                entry["hosts"].append(host)
            entry["ranks"].append(rank)
    return list(merged.values())


def format_text(doc: dict[str, Any]) -> str:
    """The report for people: one line per check, its fix under it, the measurements, a summary."""
    checks = doc["checks"]
    width = max((len(c["name"]) for c in checks), default=10)
    lines = [f"supertune doctor: {doc['host']}, rank {doc['rank']} of {doc['world_size']} ({doc['launcher']})"]
    for c in checks:
        lines += _check_lines(c, width)
    if doc["elsewhere"]:
        lines.append("other processes of the job:")
        for c in doc["elsewhere"]:
            where = f"{','.join(c['hosts'])} rank {_ranks(c['ranks'])}"
            lines += _check_lines(dict(c, evidence=f"[{where}] {c['evidence']}"), width)
    if doc.get("comm"):
        lines += _comm_lines(doc["comm"])
    counts = {v: sum(1 for c in checks if c["verdict"] == v) for v in ("fail", "warn", "ok", "n/a")}
    other = sum(1 for c in doc["elsewhere"] if c["verdict"] == "fail")
    lines.append(
        f"supertune doctor: {counts['fail']} failed, {counts['warn']} warnings, {counts['ok']} ok, {counts['n/a']} not applicable"
        + (f"; {other} failure(s) on other processes" if other else "")
        + f" -> {doc['verdict'].upper()} (exit {doc['exit_code']})"
    )
    return "\n".join(lines)


def _check_lines(c: dict[str, Any], width: int) -> list[str]:
    lines = [f"  {_LABELS[c['verdict']]:<4}  {c['name']:<{width}}  {c['evidence']}"]
    if c.get("fix"):
        lines.append(f"  {'':<4}  {'':<{width}}  fix: {c['fix']}")
    return lines


def _comm_lines(comm: dict[str, Any]) -> list[str]:
    head = (
        f"communication: {comm['world_size']} processes on {comm['num_nodes']} node(s), {comm['backend']} on {comm['device']}, "
        f"median of {comm['repeats']} runs after {comm['warmup']} warm-up; GB/s = 1e9 B/s; "
        "busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather), as nccl-tests define them"
    )
    lines = [head, f"  {'collective':<11} {'size':>8} {'time (ms)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for m in comm["measurements"]:
        lines.append(
            f"  {m['op']:<11} {size_label(m['size_bytes']):>8} {m['time_s'] * 1e3:>11.3f} {m['algbw_gbps']:>11.3f} {m['busbw_gbps']:>11.3f}"
        )
    if comm.get("error"):
        lines.append(f"  stopped: {comm['error']}")
    return lines


def _ranks(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)
