"""The table of a buffered federation (mode: buffered), read from its receipts only: every published
version with the changes it was averaged from (site, the version each started from, staleness,
tokens, weight), the changes dropped or still buffered, and per site its contributions and who is
behind (the version its training in progress started from). Markdown (`rounds.md`, `--status`) and
JSON (`rounds.json`)."""

from __future__ import annotations

from typing import Any

from ..config.schema import FederationConfig
from ..config.staleness import STALENESS
from ..state.cost import site_cost
from ..state.layout import FederationDir
from ..state.receipts import read_arrival, read_published, read_receipt, read_task
from ..state.records import Arrival, BufferedTask
from .table import base_losses, history_lines, number_cell, save_figure

__all__ = ["buffered_table", "buffered_table_markdown", "buffered_figure", "write_buffered_table"]


def buffered_table(fed: FederationConfig, root: FederationDir) -> dict[str, Any]:
    """Versions, arrivals and sites as the receipts hold them."""
    arrivals: list[Arrival] = []
    while (a := read_arrival(root.arrival(len(arrivals) + 1))) is not None:
        arrivals.append(a)
    versions, into = [], {}
    for number in range(1, fed.rounds + 1):
        published = read_published(root.round(number).published)
        if published is None:
            break
        versions.append(published.as_json())
        into.update({n: (number, w) for n, w in zip(published.arrivals, published.weights)})
    newest = len(versions)
    rows = [
        {
            **a.as_json(),
            "into_version": into.get(a.number, (None,))[0],
            "share": into.get(a.number, (None, None))[1],
            "local_loss": (read_receipt(root.task(a.site, a.task).trained) or {}).get("eval_loss"),
        }
        for a in arrivals
    ]
    last = root.round(newest)
    sites = []
    for site in fed.sites:
        mine = [a for a in arrivals if a.site == site.name]
        tasks = _site_tasks(root, site.name)
        training = _task_in_progress(tasks, {a.task for a in mine})
        cost = _tasks_cost(root, site.name, tasks)
        sites.append({
            "site": site.name,
            "contributions": sum(not a.dropped for a in mine),
            "dropped": sum(a.dropped for a in mine),
            "tokens": sum(a.tokens for a in mine if not a.dropped),
            "mean_staleness": (sum(a.staleness for a in mine) / len(mine)) if mine else None,
            "training_from": training,
            "behind": None if training is None else newest - training,
            "last_version_loss": (read_receipt(last.site(site.name).evaluated) or {}).get("eval_loss") if newest else None,
            "node_hours": cost["node_hours"],
            "attempts": cost["attempts"],
        })  # fmt: skip
    return {
        "federation": fed.name,
        "mode": "buffered",
        "buffer_size": fed.aggregation.buffer_size,
        "published": newest,
        "base": base_losses(fed, root),
        "versions": versions,
        "arrivals": rows,
        "sites": sites,
    }


def _site_tasks(root: FederationDir, site: str) -> list[BufferedTask]:
    """The site's tasks in order, each task.json read once."""
    tasks: list[BufferedTask] = []
    while (task := read_task(root.task(site, len(tasks) + 1).task_record)) is not None:
        tasks.append(task)
    return tasks


def _tasks_cost(root: FederationDir, site: str, tasks: list[BufferedTask]) -> dict[str, float | int | None]:
    """{node_hours, attempts} of every task of the site (each task's cost.json, as a round's site's),
    taken or not: a change stopped or dropped cost its training too; None when none was recorded."""
    costs = [site_cost(root.task(site, task.task).path / "cost.json") for task in tasks]
    recorded = [c for c in costs if c["attempts"] is not None]
    if not recorded:
        return {"node_hours": None, "attempts": None}
    return {
        "node_hours": sum(float(c["node_hours"] or 0.0) for c in recorded),
        "attempts": sum(int(c["attempts"] or 0) for c in recorded),
    }


def _task_in_progress(tasks: list[BufferedTask], taken: set[int]) -> int | None:
    """The version the site's last task not taken yet started from, or None (it trains nothing now)."""
    return next((task.base_version for task in reversed(tasks) if task.task not in taken), None)


def buffered_table_markdown(fed: FederationConfig, root: FederationDir, t: dict[str, Any] | None = None) -> str:
    """The table of rounds.md and --status; `t`: buffered_table's when the caller has it already."""
    t = buffered_table(fed, root) if t is None else t
    a = fed.aggregation
    kind = STALENESS[a.staleness.kind]
    limit = (
        "no change is dropped"
        if a.max_staleness is None
        else f"changes more than {a.max_staleness} versions behind are dropped"
    )
    lines = [
        f"# Federation {fed.name}: {t['published']} of {fed.rounds} versions (mode: buffered)",
        "",
        f"Each version averages K = {a.buffer_size} changes, weighted by {a.weights} x s(u), {kind.formula} "
        f"(kind {kind.name}, a = {a.staleness.a:g}, b = {a.staleness.b:g}); u: versions the site's starting model "
        f"was behind; {limit} (aggregation.max_staleness).",
        "",
        "base model: " + ", ".join(f"{name} {number_cell(loss)}" for name, loss in t["base"].items()),
        "",
        "| version | arrival | site | task | from version | staleness | tokens | weight | share | local loss |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in t["arrivals"]:
        into = "dropped" if r["dropped"] else "buffered" if r["into_version"] is None else str(r["into_version"])
        lines.append(
            f"| {into} | {r['number']} | {r['site']} | {r['task']} | {r['base_version']} | {r['staleness']} | "
            f"{r['tokens']:,} | {r['weight']:,.1f} | {number_cell(r['share'])} | {number_cell(r['local_loss'])} |"
        )
    lines += [
        "",
        "| site | contributions | dropped | tokens | mean staleness | training from version | behind | last version's loss | node-hours | attempts |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in t["sites"]:
        training = "-" if s["training_from"] is None else str(s["training_from"])
        behind = "-" if s["behind"] is None else str(s["behind"])
        lines.append(
            f"| {s['site']} | {s['contributions']} | {s['dropped']} | {s['tokens']:,} | {number_cell(s['mean_staleness'])} | "
            f"{training} | {behind} | {number_cell(s['last_version_loss'])} | {number_cell(s['node_hours'])} | "
            f"{'-' if s['attempts'] is None else s['attempts']} |"
        )
    return "\n".join(lines + history_lines(fed, root)) + "\n"


def buffered_figure(fed: FederationConfig, root: FederationDir, t: dict[str, Any] | None = None):
    """The figure of rounds.png (a matplotlib Figure, Agg), both panels against minutes since the first
    arrival: on the left the published version (a step line) and each arrival at the version it went
    into, one colour a site; on the right each arrival's staleness (dropped ones as x)."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = buffered_table(fed, root) if t is None else t
    rows = t["arrivals"]
    start = min((r["unix"] for r in rows), default=0.0)
    minutes = {r["number"]: (r["unix"] - start) / 60.0 for r in rows}
    fig, (versions, stale) = plt.subplots(1, 2, figsize=(12, 4.5))
    # A version is published the moment its last arrival is recorded.
    published = [(minutes[v["arrivals"][-1]], v["version"]) for v in t["versions"] if v["arrivals"]]
    if published:
        xs, ys = [0.0] + [x for x, _ in published], [0] + [y for _, y in published]
        versions.step(xs, ys, where="post", color="0.4", label="published version")
    for i, site in enumerate(fed.sites):
        mine = [r for r in rows if r["site"] == site.name]
        taken = [r for r in mine if r["into_version"] is not None]
        versions.plot([minutes[r["number"]] for r in taken], [r["into_version"] for r in taken], "o",
                      color=f"C{i}", label=f"{site.name}: its changes")  # fmt: skip
        kept = [r for r in mine if not r["dropped"]]
        stale.plot([minutes[r["number"]] for r in kept], [r["staleness"] for r in kept], "o", color=f"C{i}",
                   label=f"{site.name}")  # fmt: skip
        dropped = [r for r in mine if r["dropped"]]
        if dropped:
            stale.plot([minutes[r["number"]] for r in dropped], [r["staleness"] for r in dropped], "x",
                       color=f"C{i}", label=f"{site.name}: dropped")  # fmt: skip
    versions.set_xlabel("minutes since the first arrival")
    versions.set_ylabel("global version")
    versions.set_title(f"federation {fed.name}: versions (K = {fed.aggregation.buffer_size})")
    versions.grid(alpha=0.3)
    versions.legend(fontsize=8)
    stale.set_xlabel("minutes since the first arrival")
    stale.set_ylabel("staleness u (versions behind)")
    stale.set_title("each change's staleness when it arrived")
    stale.grid(alpha=0.3)
    stale.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_buffered_table(fed: FederationConfig, root: FederationDir) -> None:
    from ...rundir import write_json_atomic

    t = buffered_table(fed, root)  # the receipts read once for the three
    write_json_atomic(root.table_json, t)
    root.table_markdown.write_text(buffered_table_markdown(fed, root, t), encoding="utf-8")
    save_figure(buffered_figure(fed, root, t), root)
