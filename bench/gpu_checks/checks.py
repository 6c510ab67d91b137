"""The checks of the GPU checklist (../shared/gpu-checklist.md), each a few `supertune` runs whose
figures become rows of the report.

Every check has a GPU form and a dry-run form. The dry run (CPU, the tiny embedded model, a few
steps) takes the same code path with smaller numbers, so a test can run it and the script cannot
rot between the rare GPU loans. A check that does not fit in what is left of the budget is listed
as not run, never silently dropped.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .figures import (
    importable,
    last_json,
    logged_parameters,
    max_weight_difference,
    read_json,
    reload_matches,
    saved_dtype,
    sharded_checkpoint,
    throughput_figures,
)
from .runs import Done, Runner, eval_loss, summary
from .sizes import DRY, GPU, Sizes


@dataclass
class Row:
    check: str
    variant: str
    status: str  # ok | FAILED | differs | not run | not installed
    figures: dict[str, object] = field(default_factory=dict)
    note: str = ""
    command: str = ""


def _cmd(done: Done) -> str:
    """The command as a user would type it: `supertune ...`, the scratch run directory as RUN."""
    args = ["RUN" if a.startswith("/") else a for a in done.argv[1:]]  # the interpreter and scratch paths
    return " ".join(args).replace("-m supertune", "supertune", 1)


class Checklist:
    def __init__(self, runner: Runner, sizes: Sizes, dry_run: bool) -> None:
        self.runner, self.sizes, self.dry_run = runner, sizes, dry_run
        self.rows: list[Row] = []
        self.throughput_runs: dict[str, dict] = {}

    # --- helpers -------------------------------------------------------------------------------

    def _skip(self, check: str, variant: str, estimate: float) -> bool:
        if self.runner.budget.allows(estimate):
            return False
        self.rows.append(
            Row(
                check,
                variant,
                "not run",
                note=f"needs ~{estimate:.0f} s, {max(0, self.runner.budget.left()):.0f} s left",
            )
        )
        return True

    def _device_ok(self, s: dict) -> tuple[bool, str]:
        device = str(s.get("device_name") or "?")
        if self.dry_run:
            return True, device
        return device.upper() != "CPU", device

    def _reload(self, name: str, run_dir: Path, s: dict) -> dict[str, object]:
        """`supertune eval` of the saved model (plain from_pretrained) against the run's own eval loss."""
        done = self.runner.supertune(f"{name}-eval", "eval", str(run_dir / "model"), cap=180)
        loss = eval_loss(done)
        figures: dict[str, object] = {"reloaded eval loss": loss, "saved dtype": saved_dtype(run_dir / "model")}
        if loss is not None and isinstance(s.get("eval_loss"), (int, float)):
            figures["|reload - run|"] = abs(loss - float(s["eval_loss"]))
        else:
            figures["reload"] = done.why()
        return figures

    def _add_run(self, check: str, variant: str, done: Done, good: bool, figures: dict[str, object]) -> None:
        """The row of one run: ok when it exited 0 and `good` holds, else FAILED with its exit and log tail."""
        status = "ok" if done.ok and good else "FAILED"
        self.rows.append(Row(check, variant, status, figures, "" if done.ok else done.why(), _cmd(done)))

    # --- 1. the embedded default ---------------------------------------------------------------

    def default(self, precision: str) -> None:
        if self._skip("embedded default", precision, 40):
            return
        extra = ["training.bf16=true"] if precision == "bf16" else []
        overrides = [*self.sizes.quick, *self.sizes.evaluation, *extra]
        done, run_dir = self.runner.train(f"default-{precision}", overrides, cap=300)
        s = summary(run_dir)
        on_gpu, device = self._device_ok(s)
        figures = {
            "device": device,
            "eval loss": s.get("eval_loss"),
            "tokens/s": s.get("throughput_tokens_per_s"),
            "wall s": round(done.seconds, 1),
        }
        status = "ok" if done.ok and on_gpu and s else "FAILED"
        note = "" if done.ok else done.why()
        if done.ok and not on_gpu:
            note = "trained on the CPU although a GPU was lent"
        self.rows.append(Row("embedded default", precision, status, figures, note, _cmd(done)))

    # --- 2. FSDP on one GPU --------------------------------------------------------------------

    def fsdp(self, sharding: str, output_dtype: str, bf16: bool, tag: str = "", extra: tuple[str, ...] = ()) -> None:
        """One FSDP run on one GPU; `tag` and `extra`: a variant's name and overrides (cpu_offload, LoRA, ...)."""
        variant = (
            f"{sharding}, output {output_dtype}" + (", training bf16" if bf16 else "") + (f", {tag}" if tag else "")
        )
        if self._skip("FSDP --nproc 1", variant, 60):
            return
        if tag == "LoRA":
            # Adapters train on a trained base: the embedded default's model from its own check.
            base = self.runner.work / "runs" / "default-fp32" / "model"
            if not (base / "config.json").is_file():
                self.rows.append(
                    Row("FSDP --nproc 1", variant, "not run", note="needs the model of check default-fp32")
                )
                return
            extra = (*extra, f"model.name_or_path={base}")
        overrides = [
            *self.sizes.quick,
            *self.sizes.evaluation,
            "distributed.strategy=fsdp",
            f"distributed.fsdp.sharding={sharding}",
            f"output.dtype={output_dtype}",
            # Two sharded checkpoints (each rank's DCP shards) before the gathered final model.
            f"training.max_steps={2 * self.sizes.save_steps}",
            f"training.save_steps={self.sizes.save_steps}",
            *extra,
        ]
        if bf16:
            overrides.append("training.bf16=true")
        name = f"fsdp-{sharding}-{output_dtype}" + (f"-{tag.lower().replace(' ', '-')}" if tag else "")
        done, run_dir = self.runner.train(name, overrides, cap=300)
        s = summary(run_dir)
        on_gpu, device = self._device_ok(s)
        sharded = s.get("sharding", {})
        figures: dict[str, object] = {
            "device": device,
            "wrapper": sharded.get("wrapper"),
            "mesh": sharded.get("mesh"),
            "sharded checkpoint": sharded_checkpoint(run_dir),
            "eval loss": s.get("eval_loss"),
        }
        if done.ok:
            figures.update(self._reload(name, run_dir, s))
        good = on_gpu and reload_matches(figures) and bool(figures["sharded checkpoint"])
        self._add_run("FSDP --nproc 1", variant, done, good, figures)

    # --- 3. DeepSpeed ZeRO ---------------------------------------------------------------------

    def zero(self, stage: int, offload: str) -> None:
        variant = f"ZeRO-{stage}, {'bf16' if self.sizes.zero_precision else 'fp32'}, offload {offload}"
        if not importable("deepspeed", self.runner.env):
            self.rows.append(Row("DeepSpeed", variant, "not installed", note="deepspeed is not importable"))
            return
        if self._skip("DeepSpeed", variant, 90):
            return
        steps = 2 * self.sizes.save_steps
        overrides = [
            *self.sizes.quick,
            *self.sizes.evaluation,
            f"training.max_steps={steps}",
            f"training.save_steps={self.sizes.save_steps}",
            f"distributed.strategy=zero{stage}",
            f"distributed.offload={offload}",
            *self.sizes.zero_precision,
        ]
        name = f"zero{stage}-{offload}"
        done, run_dir = self.runner.train(name, overrides, cap=360)
        s = summary(run_dir)
        on_gpu, device = self._device_ok(s)
        latest = run_dir / "checkpoints" / "latest"
        figures: dict[str, object] = {
            "device": device,
            "zero stage": s.get("sharding", {}).get("zero_stage"),
            "checkpoint": latest.read_text().strip() if latest.is_file() else None,
            "eval loss": s.get("eval_loss"),
            "tokens/s": s.get("throughput_tokens_per_s"),
            "wall s": round(done.seconds, 1),
        }
        if done.ok:
            figures.update(self._reload(name, run_dir, s))
        self._add_run(
            "DeepSpeed", variant, done, on_gpu and reload_matches(figures) and bool(figures["checkpoint"]), figures
        )

    # --- 4. kill and resume --------------------------------------------------------------------

    def resume(self, strategy: str = "") -> None:
        """SIGKILL after a checkpoint, the same command again, final weights against an uninterrupted run.

        `strategy` fsdp: the checkpoint is FSDP's sharded one (torch DCP), read back into a fresh mesh.
        """
        steps, every, kill = self.sizes.resume
        variant = f"bf16, {steps} steps, checkpoint every {every}, SIGKILL at step {kill}" + (
            f", {strategy}" if strategy else ""
        )
        if self._skip("kill and resume", variant, 75):
            return
        settings = [
            *self.sizes.quick,
            *self.sizes.evaluation,
            f"training.max_steps={steps}",
            f"training.save_steps={every}",
            "training.bf16=true",
            "generate.max_new_tokens=0",
        ]
        if strategy:
            settings.append(f"distributed.strategy={strategy}")
        name = f"resume{'-' + strategy if strategy else ''}"
        reference, ref_dir = self.runner.train(f"{name}-reference", settings, cap=240)
        killed, run_dir = self.runner.train(
            f"{name}-run", settings, cap=240, extra_env={"SUPERTUNE_FAULT": f"step@{kill}"}
        )
        resumed, resumed_dir = self.runner.train(f"{name}-run-again", settings, run=f"{name}-run", cap=240)
        figures: dict[str, object] = {
            "killed exit": killed.returncode,
            "resumed from": summary(resumed_dir).get("resumed_from_step"),
        }
        status = "FAILED"
        note = ""
        if reference.ok and resumed.ok and killed.returncode == -signal.SIGKILL:
            diff = max_weight_difference(ref_dir / "model", resumed_dir / "model", self.runner.env)
            figures["max |w_resumed - w_uninterrupted|"] = diff
            if isinstance(diff, float):
                status = "ok" if diff <= self.sizes.bf16_tolerance else "differs"
                note = (
                    "bit-identical"
                    if diff == 0
                    else f"tolerance {self.sizes.bf16_tolerance:g} (bf16 autocast; GPU kernels with atomics are not bit-reproducible)"
                )
        else:
            note = (
                "; ".join(d.why() for d in (reference, resumed) if not d.ok)
                or f"the fault did not kill the run (exit {killed.returncode})"
            )
        self.rows.append(Row("kill and resume", variant, status, figures, note, _cmd(resumed)))

    # --- 5 and 6. throughput and attention -----------------------------------------------------

    def _throughput_overrides(self, attn: str) -> list[str]:
        z = self.sizes
        return [
            "model.from_config=true",
            f"model.config_overrides={z.model}",
            f"model.attn_implementation={attn}",
            f"data.block_size={z.block}",
            "training.bf16=true",
            f"training.per_device_train_batch_size={z.batch}",
            "training.per_device_eval_batch_size=4",
            *z.evaluation,
            f"training.max_steps={z.steps}",
            "training.warmup_steps=2",
            "training.learning_rate=3e-4",
            "training.optim=adamw_torch_fused",
            "training.logging_steps=5",
            "training.save_strategy=no",
            "output.save_model=false",
            "generate.max_new_tokens=0",
        ]

    def throughput_supertune(self, speed: str = "auto", documents: bool = False, float8: bool = False) -> None:
        """supertune's arm; training.speed=auto (the default) is the one the other arms compare with.

        documents: the same with data.document_mask=true (whole documents per block, kept apart by
        their position ids; under auto on CUDA through flex attention), against plain packing's
        tokens/s (counted without the padding the blocks of whole documents leave).
        float8: the same with training.float8=true (the decoder layers' matmuls in float8), against
        auto's tokens/s; refused by the run itself on a card below compute capability 8.9."""
        packing = "packing with document masks" if documents else "packing"
        variant = (
            f"supertune: {packing}, bf16{' + float8' if float8 else ''}, sdpa, fused AdamW, training.speed={speed}"
        )
        if self._skip("throughput", variant, 90):
            return
        overrides = [*self._throughput_overrides("sdpa"), f"training.speed={speed}"]
        overrides += ["data.document_mask=true"] if documents else []
        overrides += ["training.float8=true"] if float8 else []
        name = f"supertune-{speed}" + ("-documents" if documents else "") + ("-float8" if float8 else "")
        done, run_dir = self.runner.train(f"throughput-{name}", overrides, cap=420)
        s = summary(run_dir)
        s = {**s, "parameters": logged_parameters(done)} if s else s
        self.throughput_runs["supertune" if name == "supertune-auto" else name] = s
        figures = throughput_figures(s)
        figures["parameters"] = s.get("parameters")
        figures["speed-ups taken"] = ", ".join((s.get("speed") or {}).get("taken", [])) or "none"
        auto = self.throughput_runs.get("supertune", {})
        if documents:
            figures["padding share"] = s.get("padding_share")
            if s.get("throughput_tokens_per_s") and auto.get("throughput_tokens_per_s"):
                figures["this / auto packing tokens/s"] = s["throughput_tokens_per_s"] / auto["throughput_tokens_per_s"]
        elif float8:
            figures["float8 linear layers"] = (s.get("speed") or {}).get("float8_linears")
            if s.get("throughput_tokens_per_s") and auto.get("throughput_tokens_per_s"):
                figures["this / auto tokens/s"] = s["throughput_tokens_per_s"] / auto["throughput_tokens_per_s"]
        elif speed != "auto" and s.get("throughput_tokens_per_s") and auto.get("throughput_tokens_per_s"):
            figures["auto / this tokens/s"] = auto["throughput_tokens_per_s"] / s["throughput_tokens_per_s"]
        figures["wall s"] = round(done.seconds, 1)
        self._add_run("throughput", variant, done, bool(s), figures)

    def throughput_plain(self, bf16: bool) -> None:
        variant = "plain Trainer defaults" + (" + bf16=True" if bf16 else " (fp32)")
        if self._skip("throughput", variant, 120):
            return
        z = self.sizes
        out = self.runner.work / "runs" / f"plain-{'bf16' if bf16 else 'fp32'}"
        argv = [
            sys.executable,
            str(Path(__file__).with_name("plain_trainer.py")),
            "--out",
            str(out),
            "--model",
            z.model,
        ]
        argv += ["--block", str(z.block), "--batch", str(z.batch), "--steps", str(z.steps)]
        if bf16:
            argv.append("--bf16")
        done = self.runner.run(out.name, argv, cap=600)
        result = read_json(out / "result.json")
        flops = self.throughput_runs.get("supertune", {})
        figures: dict[str, object] = {
            "tokens/s": result.get("tokens_per_s"),
            "peak GPU memory GB": result.get("peak_memory_gb"),
            "train loss": result.get("train_loss"),
            "parameters": result.get("parameters"),
        }
        # Only the same model makes the arms comparable: then supertune's FLOPs per token and the
        # GPU's bf16 peak apply to this arm too, and tokens/s compare.
        same_model = bool(result.get("parameters")) and result.get("parameters") == flops.get("parameters")
        tokens_per_s = result.get("tokens_per_s")
        if same_model and tokens_per_s and flops.get("flops_per_token") and flops.get("peak_tflops_per_device"):
            figures["MFU"] = tokens_per_s * flops["flops_per_token"] / (flops["peak_tflops_per_device"] * 1e12)
        if same_model and tokens_per_s and flops.get("throughput_tokens_per_s"):
            figures["supertune / this"] = flops["throughput_tokens_per_s"] / tokens_per_s
        status, note = ("ok", "") if done.ok and result else ("FAILED", done.why())
        if status == "ok" and flops and not same_model:
            status = "differs"
            note = f"another model than supertune's arm ({result.get('parameters')} against {flops.get('parameters')} parameters): no ratio, no MFU"
        figures["wall s"] = round(done.seconds, 1)
        self.rows.append(
            Row(
                "throughput",
                variant,
                status,
                figures,
                note,
                " ".join(argv[1:]).replace(str(out), "OUT").replace(str(Path(__file__).parents[2]) + "/", ""),
            )
        )

    def attention(self, attn: str) -> None:
        if attn == "flash_attention_2" and not importable("flash_attn", self.runner.env):
            self.rows.append(
                Row("attention", attn, "not installed", note="the flash_attn package is not installed on this machine")
            )
            return
        if self._skip("attention", attn, 90):
            return
        done, run_dir = self.runner.train(f"attention-{attn}", self._throughput_overrides(attn), cap=420)
        s = summary(run_dir)
        base = self.throughput_runs.get("supertune", {})
        figures = throughput_figures(s)
        if s.get("train_loss") is not None and base.get("train_loss") is not None:
            figures["|train loss - sdpa's|"] = abs(s["train_loss"] - base["train_loss"])
        if s.get("throughput_tokens_per_s") and base.get("throughput_tokens_per_s"):
            figures["sdpa / this tokens/s"] = base["throughput_tokens_per_s"] / s["throughput_tokens_per_s"]
        self._add_run("attention", attn, done, bool(s), figures)

    # --- 7. the process group and the device ---------------------------------------------------

    def doctor(self) -> None:
        """`supertune doctor` on the lent machine: the torch build against the driver, each GPU, bf16, NCCL.
        (`--comm` needs two processes; one GPU cannot hold two NCCL ranks, so it is not measured here.)"""
        if self._skip("doctor", "doctor --json", 30):
            return
        done = self.runner.supertune("doctor", "doctor", "--json", cap=120)
        report = last_json(done.log)
        checks = [c for c in report.get("checks", []) if isinstance(c, dict)]
        figures: dict[str, object] = {
            "failed": {c.get("name"): c.get("evidence") for c in checks if c.get("verdict") == "fail"},
            "warnings": {c.get("name"): c.get("evidence") for c in checks if c.get("verdict") == "warn"},
            "gpus": next((c.get("evidence") for c in checks if c.get("name") == "gpus"), None),
        }
        status = "ok" if done.returncode == 0 and report else "FAILED"  # 1: a check failed, listed in the figures
        self.rows.append(Row("doctor", "doctor --json", status, figures, "" if report else done.why(), _cmd(done)))


__all__ = ["DRY", "GPU", "Checklist", "Row"]
