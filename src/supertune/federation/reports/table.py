"""The per-round table of a federation, read from its receipts only: markdown for people, JSON for
scripts, and a PNG of each site's loss by round (under the global model, and after local training)
and against the node-hours the federation has spent.

Columns: the site's tokens this round and the loss targets among them (the tokens it trained on:
data.loss_on's, less one a sequence), its local eval loss before training (the previous global
model on its data), after its local training, and under the new global model; seconds of training,
averaging and evaluation; the cost (node-hours, queue wait, bytes sent and received); why a site was
left out of the round (failed, late, refused, skipped); with privacy, the epsilon spent through the
round (epsilon.py; the markdown gains the column and a line under the table).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..config.schema import FederationConfig
from ..state.layout import FederationDir
from ..state.receipts import read_receipt, read_trained

__all__ = [
    "table_rows",
    "table_markdown",
    "write_table",
    "loss_figure",
    "save_figure",
    "base_losses",
    "history_lines",
    "number_cell",
]


def table_rows(fed: FederationConfig, root: FederationDir) -> list[dict[str, Any]]:
    """One row per round and site that trained or was left out of the round (failed, late, skipped:
    `left_out` holds the reason); missing values are None. Cost: the node-hours and queue wait of every
    attempt of the site's training (cost.py), the bytes it sent up and received."""
    from ..state.cost import site_cost
    from .epsilon import round_epsilons

    rows = []
    spent = round_epsilons(fed, root)
    for number in range(1, fed.rounds + 1):
        rd, before = root.round(number), root.round(number - 1)
        averaged = read_receipt(rd.averaged) or {}
        for site in fed.sites:
            sd = rd.site(site.name)
            trained = read_trained(sd.trained)
            left = read_receipt(sd.left_out)
            if trained is None and left is None:
                continue
            trained = trained if left is None else None  # left out: its training, if any, was not averaged
            previous = read_receipt(before.site(site.name).evaluated) or {}
            evaluated = read_receipt(sd.evaluated) or {}
            cost = site_cost(sd.cost)
            rows.append({
                "round": number,
                "site": site.name,
                "tokens": trained.tokens if trained else None,
                "loss_tokens": trained.loss_tokens if trained else None,
                "weight": (averaged.get("weights") or {}).get(site.name),
                "local_before": previous.get("eval_loss"),
                "local_after": trained.eval_loss if trained else None,
                "global": evaluated.get("eval_loss"),
                "train_s": trained.seconds if trained else None,
                "average_s": averaged.get("seconds"),
                "evaluate_s": evaluated.get("seconds"),
                "sent_bytes": (averaged.get("sent_bytes") or {}).get(site.name),
                "received_bytes": averaged.get("received_bytes") if trained else None,
                "node_hours": cost["node_hours"],
                "queue_s": cost["queue_s"],
                "attempts": cost["attempts"],
                "loss_change_per_node_hour": _per_node_hour(previous.get("eval_loss"), evaluated.get("eval_loss"),
                                                            cost["node_hours"]),
                "left_out": left.get("reason") if left else None,
                "epsilon": _finite(spent.get(number)),
            })  # fmt: skip
    return rows


def _finite(value: float | None) -> float | None:
    """JSON has no infinity: a round without noise (no guarantee) is null, as one without privacy."""
    return None if value is None or math.isinf(value) else value


def _per_node_hour(before: float | None, after: float | None, node_hours: float | None) -> float | None:
    """The change of the site's eval loss under the global model this round, per node-hour it spent."""
    if before is None or after is None or not node_hours:
        return None
    return (after - before) / node_hours


def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The federation's cost so far: node-hours, queue wait, bytes sent and received."""
    return {
        "node_hours": sum(r["node_hours"] or 0.0 for r in rows),
        "queue_s": sum(r["queue_s"] or 0.0 for r in rows),
        "sent_bytes": sum(r["sent_bytes"] or 0 for r in rows),
        "received_bytes": sum(r["received_bytes"] or 0 for r in rows),
    }


def base_losses(fed: FederationConfig, root: FederationDir) -> dict[str, float | None]:
    """Each site's eval loss under the base model (round 0)."""
    return {s.name: (read_receipt(root.round(0).site(s.name).evaluated) or {}).get("eval_loss") for s in fed.sites}


def table_markdown(fed: FederationConfig, root: FederationDir, rows: list[dict[str, Any]] | None = None) -> str:
    """The table of rounds.md and --status; `rows`: table_rows' when the caller has them already."""
    from .epsilon import privacy_summary

    rows = table_rows(fed, root) if rows is None else rows
    base = base_losses(fed, root)
    private = fed.privacy.active
    lines = [
        f"# Federation {fed.name}: {len({r['round'] for r in rows})} of {fed.rounds} rounds",
        "",
        "Eval loss on each site's validation data. before: the previous global model (round 1: the base); "
        "after: the site's model after its local training; global: the round's averaged model."
        + (" epsilon: the privacy spent through the round, at privacy.delta." if private else ""),
        "",
        "base model: " + ", ".join(f"{name} {number_cell(loss)}" for name, loss in base.items()),
        "",
        "| round | site | tokens | loss tokens | weight | before | after | global | train s | average s | evaluate s "
        "| node-h | queue s | sent MB | received MB | " + ("epsilon | " if private else "") + "note |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        + ("---: | " if private else "")
        + "--- |",
    ]
    for r in rows:
        tokens = "-" if r["tokens"] is None else f"{r['tokens']:,}"
        epsilon = (_epsilon_cell(r) + " | ") if private else ""
        lines.append(
            f"| {r['round']} | {r['site']} | {tokens} | {_count(r['loss_tokens'])} | {number_cell(r['weight'])} | "
            f"{number_cell(r['local_before'])} | {number_cell(r['local_after'])} | {number_cell(r['global'])} | {_secs(r['train_s'])} | "
            f"{_secs(r['average_s'])} | {_secs(r['evaluate_s'])} | {number_cell(r['node_hours'])} | {_secs(r['queue_s'])} | "
            f"{_mb(r['sent_bytes'])} | {_mb(r['received_bytes'])} | {epsilon}{_note(r['left_out'])} |"
        )
    total = totals(rows)
    lines += [
        "",
        f"cost: {total['node_hours']:.4f} node-hours (every training attempt's wall time x its nodes on SLURM, "
        "x its processes on this machine), "
        f"{total['queue_s']:.0f} s in queues, {_mb(total['sent_bytes'])} MB sent to the aggregator, "
        f"{_mb(total['received_bytes'])} MB received from it",
    ]
    if private:
        lines += ["", privacy_summary(fed, root)]
    return "\n".join(lines + _benchmarks(fed, root) + history_lines(fed, root)) + "\n"


def round_benchmarks(fed: FederationConfig, root: FederationDir) -> dict[int, dict[str, dict[str, float]]]:
    """{round: {task: {metric: value}}} of the rounds whose global model has benchmark scores."""
    found = {}
    for number in range(1, fed.rounds + 1):
        receipt = read_receipt(root.round(number).benchmarks)
        if receipt is not None:
            found[number] = receipt.get("scores") or {}
    return found


def _benchmarks(fed: FederationConfig, root: FederationDir) -> list[str]:
    """The global model's benchmark scores by round (federation benchmarks), under the table."""
    by_round = round_benchmarks(fed, root)
    columns = sorted({(t, m) for scores in by_round.values() for t, row in scores.items() for m in row})
    if not columns:
        return []
    lines = [
        "",
        "## Benchmarks of the global model",
        "",
        "| round | " + " | ".join(f"{t} {m}" for t, m in columns) + " |",
    ]
    lines.append("| ---: |" + " ---: |" * len(columns))
    for number, scores in by_round.items():
        lines.append(f"| {number} | " + " | ".join(number_cell(scores.get(t, {}).get(m)) for t, m in columns) + " |")
    return lines


def history_lines(fed: FederationConfig, root: FederationDir) -> list[str]:
    """The dropped sites and the failed attempts, under the table (nothing when there are none)."""
    from ..state.history import dropped_sites, failures

    lines = []
    for number in range(1, fed.rounds + 1):
        for site in fed.sites:
            left = read_receipt(root.round(number).site(site.name).left_out)
            if left is not None:
                lines.append(
                    f"- {site.name}: left out of round {number} ({left.get('attempts')} attempt(s)), the round "
                    f"averaged without it ({_when(left.get('unix'))}): {left.get('reason')}"
                )
    for name, d in dropped_sites(root).items():
        lines.append(f"- {name}: dropped from round {d.get('from_round')} on ({_when(d.get('unix'))})")
    for f in failures(root):
        finished = read_receipt(root.round(int(f.get("round") or 0)).averaged) is not None
        where = f"round {f.get('round')}" + (f", site {f['site']}" if f.get("site") else "")
        said = [line.strip() for line in str(f.get("error") or "").splitlines() if line.strip()] or ["(no message)"]
        # A message that ends its first line with ':' says what went wrong on the next (StreamFlow's errors).
        first = " ".join(said[:2]) if said[0].endswith(":") else said[0]
        state = "the round finished later" if finished and f.get("round") else "not finished"
        lines.append(f"- FAILED {where} ({_when(f.get('unix'))}; {state}): {first}")
    return (["", "## Dropped sites and failures", "", *lines]) if lines else []


def _when(unix: float | None) -> str:
    import time

    return (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix)) if isinstance(unix, (int, float)) else "unknown time"
    )


def write_table(fed: FederationConfig, root: FederationDir) -> None:
    from ...rundir import write_json_atomic

    rows = table_rows(fed, root)  # the receipts read once (and the privacy accountant run once) for all three
    write_json_atomic(
        root.table_json,
        {
            "federation": fed.name,
            "base": base_losses(fed, root),
            "rows": rows,
            "benchmarks": {str(n): scores for n, scores in round_benchmarks(fed, root).items()},
            "totals": totals(rows),
        },
    )
    root.table_markdown.write_text(table_markdown(fed, root, rows), encoding="utf-8")
    save_figure(loss_figure(fed, root, rows), root)


def save_figure(fig, root: FederationDir) -> None:
    """rounds.png from a matplotlib Figure, written by a rename: a reader never sees half a PNG."""
    import matplotlib.pyplot as plt

    tmp = root.plot.with_name(f".{root.plot.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(root.plot)


def loss_figure(fed: FederationConfig, root: FederationDir, rows: list[dict[str, Any]] | None = None):
    """The figure of rounds.png (a matplotlib Figure, Agg): on the left each site's loss by round under the
    global model (solid) and after local training (dashed); on the right the global model's loss against
    the node-hours the federation had spent through that round."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notices are not the run's business
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, base = (table_rows(fed, root) if rows is None else rows), base_losses(fed, root)
    fig, (ax, spent) = plt.subplots(1, 2, figsize=(12, 4.5))
    # The federation's node-hours through each round: the x of the second panel.
    cumulative = {0: 0.0}
    for number in range(1, fed.rounds + 1):
        cumulative[number] = cumulative[number - 1] + sum(r["node_hours"] or 0.0 for r in rows if r["round"] == number)
    for i, site in enumerate(fed.sites):
        color = f"C{i}"
        mine = [r for r in rows if r["site"] == site.name]
        rounds = [0] + [r["round"] for r in mine if r["global"] is not None]
        losses = [base[site.name]] + [r["global"] for r in mine if r["global"] is not None]
        if base[site.name] is not None:
            ax.plot(rounds, losses, "o-", color=color, label=f"{site.name}: global model")
            spent.plot([cumulative[n] for n in rounds], losses, "o-", color=color, label=f"{site.name}: global model")
        trained = [r for r in mine if r["local_after"] is not None]
        ax.plot(
            [r["round"] for r in trained],
            [r["local_after"] for r in trained],
            "s--",
            color=color,
            alpha=0.7,
            label=f"{site.name}: after local training",
        )
    ax.set_xlabel("round")
    ax.set_ylabel("eval loss on the site's validation data")
    ax.set_title(f"federation {fed.name}")
    ax.set_xticks(range(0, fed.rounds + 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    spent.set_xlabel("node-hours spent by the federation (every site's training attempts)")
    spent.set_title("global model's loss against its cost")
    spent.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def number_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _epsilon_cell(row: dict[str, Any]) -> str:
    """A row's epsilon: inf for an averaged round without noise, - for one not averaged yet."""
    if row["epsilon"] is not None:
        return f"{row['epsilon']:.3f}"
    return "inf" if row["weight"] is not None else "-"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"


def _note(reason: str | None) -> str:
    return "" if not reason else "left out: " + reason.replace("|", "/")


def status_text(fed: FederationConfig, root: FederationDir) -> str:
    """What `supertune federate --status DIR` prints."""
    return table_markdown(fed, root)


def table_json_text(fed: FederationConfig, root: FederationDir) -> str:
    return json.dumps({"federation": fed.name, "base": base_losses(fed, root), "rows": table_rows(fed, root)}, indent=2)
