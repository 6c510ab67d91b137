"""The report's PNG plots (matplotlib, no display needed).

Several runs: speedup against ideal, tokens/s per device, and the training loss of every run
against tokens seen on one axis (tokens, not steps: with --keep per-device-batch a step holds more
tokens at more devices). One run: loss and learning rate over steps, and throughput (and MFU) over
steps. Each function returns the files it wrote; `figure_*` functions return the figure unsaved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "figure_losses",
    "figure_per_device",
    "figure_run_curves",
    "figure_run_throughput",
    "figure_speedup",
    "run_plots",
    "scaling_plots",
]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scaling_plots(runs: list[Any], rows: list[Any], folder: Path) -> list[Path]:
    figures = {
        "speedup": figure_speedup(rows),
        "tokens_per_device": figure_per_device(rows),
        "loss": figure_losses(runs),
    }
    return _save(figures, folder)


def run_plots(run: Any, folder: Path) -> list[Path]:
    return _save({"loss_lr": figure_run_curves(run), "throughput": figure_run_throughput(run)}, folder)


def _save(figures: dict[str, Any], folder: Path) -> list[Path]:
    plt = _pyplot()
    paths = []
    for name, fig in figures.items():
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def figure_speedup(rows: list[Any]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    done = [r for r in rows if r.speedup is not None]
    if done:
        fewest = done[0].devices
        xs = [r.devices for r in done]
        ax.plot(xs, [x / fewest for x in xs], "--", color="grey", label="ideal")
        ax.plot(xs, [r.speedup for r in done], "o-", color="C0", label="measured (tokens/s)")
        for x, r in zip(xs, done):
            ax.annotate(f"{r.speedup:.2f}x", (x, r.speedup), textcoords="offset points", xytext=(0, 8), ha="center")
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("devices")
    ax.set_ylabel(f"speedup over {done[0].devices if done else 1} device(s)")
    ax.set_title("Speedup")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return fig


def figure_per_device(rows: list[Any]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    done = [r for r in rows if r.tokens_per_s]
    if done:
        xs = [str(r.devices) for r in done]
        per_device = [r.tokens_per_s / r.devices for r in done]
        ax.bar(xs, per_device, color="C0")
        ax.axhline(per_device[0], linestyle="--", color="grey", label=f"ideal: the {done[0].devices}-device rate")
        ax.legend(loc="lower right")
    ax.set_xlabel("devices")
    ax.set_ylabel("tokens/s per device")
    ax.set_title("Throughput per device")
    ax.grid(alpha=0.3, axis="y")
    return fig


def figure_losses(runs: list[Any]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    styles = ("-", "--", ":", "-.")  # runs of a strong-scaling sweep lie on top of each other
    for i, run in enumerate(runs):
        records = run.records
        points = [(_tokens(r), r["loss"]) for r in records if r.get("loss") is not None and _tokens(r)]
        if points:
            ax.plot(*zip(*points), styles[i % len(styles)], color=f"C{i}", label=run.label)
        evals = [(_tokens(r), r["eval_loss"]) for r in records if r.get("eval_loss") is not None and _tokens(r)]
        if run.summary and run.summary.get("eval_loss") is not None:
            evals.append((run.summary.get("train_tokens"), run.summary["eval_loss"]))
        evals = [(t, loss) for t, loss in evals if t]
        if evals:
            ax.plot(*zip(*evals), "s", color=f"C{i}", markersize=6, fillstyle="none")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss")
    ax.set_title("Training loss of every run (squares: evaluation loss)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    return fig


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _tokens(record: dict[str, Any]) -> int | None:
    return record.get("tokens_seen") or record.get("num_input_tokens_seen")


def figure_run_curves(run: Any) -> Any:
    plt = _pyplot()
    fig, (loss_ax, lr_ax) = plt.subplots(2, 1, figsize=(6.5, 5.5), sharex=True)
    records = [r for r in run.records if r.get("loss") is not None]
    steps = [r["step"] for r in records]
    loss_ax.plot(steps, [r["loss"] for r in records], color="C0", label="training loss")
    evals = [(r["step"], r["eval_loss"]) for r in run.records if r.get("eval_loss") is not None]
    if run.summary and run.summary.get("eval_loss") is not None:
        evals.append((run.summary.get("train_steps"), run.summary["eval_loss"]))  # the final evaluation
    if evals:
        loss_ax.plot(*zip(*evals), "s", color="C3", label="evaluation loss")
    loss_ax.set_ylabel("loss")
    loss_ax.legend()
    loss_ax.grid(alpha=0.3)
    lr_ax.plot(steps, [_or_nan(r.get("learning_rate")) for r in records], color="C2")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("optimizer step")
    lr_ax.grid(alpha=0.3)
    loss_ax.set_title(f"{run.run.path.name}: loss and learning rate")
    return fig


def figure_run_throughput(run: Any) -> Any:
    plt = _pyplot()
    records = [r for r in run.records if r.get("throughput_tokens_per_s") is not None]
    has_mfu = any(r.get("mfu") is not None for r in records)
    fig, axes = plt.subplots(2 if has_mfu else 1, 1, figsize=(6.5, 5.5 if has_mfu else 3.5), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.plot(
        [r["step"] for r in records], [r["throughput_tokens_per_s"] for r in records], "o-", color="C0", markersize=3
    )
    ax.set_ylabel("tokens/s (all devices)")
    ax.set_title(f"{run.run.path.name}: throughput per logging interval")
    ax.grid(alpha=0.3)
    if has_mfu:
        mfu_ax = axes[1][0]
        with_mfu = [r for r in records if r.get("mfu") is not None]
        mfu_ax.plot([r["step"] for r in with_mfu], [100 * r["mfu"] for r in with_mfu], "o-", color="C1", markersize=3)
        mfu_ax.set_ylabel("MFU (%)")
        mfu_ax.grid(alpha=0.3)
    axes[-1][0].set_xlabel("optimizer step")
    return fig
