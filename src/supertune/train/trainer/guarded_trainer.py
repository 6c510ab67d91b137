"""The transformers Trainer with supertune's checkpoints and checks.

- Checkpoints are written by the Trainer's own code (weights, optimizer, scheduler, RNG states,
  trainer state; DeepSpeed's per-rank files) into a staging directory, then published with a
  manifest and the run's config by supertune.checkpoints.layout; free space is checked first.
- Under fsdp the weights and optimizer state are written by every rank as its own shards
  (supertune.distributed.fsdp_checkpoint) in place of the Trainer's gathered files; the scheduler,
  RNG states and trainer state are the Trainer's, and publishing is the same.
- A NaN/Inf loss or gradient norm is reported to the RunGuard, which stops every rank at that step.
- The loss targets of every micro-batch are counted (supertune.train.data.loss_tokens) and recorded in
  each checkpoint's manifest beside the tokens seen.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import Trainer

from ...checkpoints.faults import fault_point
from ...checkpoints.layout import CheckpointDir
from ...checkpoints.manifest import CheckpointManifest, file_digests, read_manifest
from ...checkpoints.space import expected_checkpoint_bytes, space_problem
from ...distributed.fsdp import deferred_gradient_reduction
from ...distributed.fsdp_checkpoint import (
    MODEL_DIR,
    is_sharded_checkpoint,
    load_sharded_model,
    load_sharded_optimizer,
    save_sharded_model,
    save_sharded_optimizer,
)
from ...errors import UserError
from ..data.loss_tokens import LossTokenCount
from .stopping import RunGuard

__all__ = ["GuardedTrainer", "CheckpointSettings", "OPTIMIZER_FILE"]

OPTIMIZER_FILE = "optimizer.pt"
"""The optimizer state in a checkpoint, as the Trainer writes it (ddp; DeepSpeed and FSDP write their own)."""

log = logging.getLogger("supertune")


@dataclass
class CheckpointSettings:
    layout: CheckpointDir
    config_file: Path
    """The run's resolved config, copied into every checkpoint."""
    keep: int | None
    global_batch: int
    rank: int
    guard: RunGuard
    init_optimizer_from: Path | None = None
    """training.init_optimizer_from: a checkpoint whose optimizer state the optimizer starts with."""


class GuardedTrainer(Trainer):
    """Trainer whose checkpoints are atomic and self-describing, and whose NaNs stop the run."""

    supertune: CheckpointSettings
    loss_tokens: LossTokenCount
    _save_root: str | None = None
    _previous_bytes: int | None = None
    _flop_parameters: int | None = None

    # -- checkpoints ---------------------------------------------------------------------------

    def _get_output_dir(self, trial: Any) -> str:
        return self._save_root or super()._get_output_dir(trial)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        s = self.supertune
        step = self.state.global_step
        self._fault("save.begin")
        self._check_space(step)
        main = self.is_world_process_zero()
        if main:
            shutil.rmtree(s.layout.staged(step), ignore_errors=True)
            s.layout.staging_root.mkdir(parents=True, exist_ok=True)
        self.accelerator.wait_for_everyone()
        self._save_root = str(s.layout.staging_root)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._save_root = None
        # Every rank has written its files (RNG states, DeepSpeed partitions) before the main
        # process hashes them and publishes the checkpoint.
        self.accelerator.wait_for_everyone()
        loss_tokens = self.loss_tokens_trained()  # every rank: an all-reduce
        if main:
            staged = s.layout.staged(step)
            shutil.copyfile(s.config_file, staged / s.config_file.name)
            manifest = CheckpointManifest(
                step=step,
                tokens_seen=int(self.state.num_input_tokens_seen or 0),
                loss_tokens=loss_tokens,
                samples_seen=step * s.global_batch,
                world_size=self.args.world_size,
                global_batch=s.global_batch,
                epoch=float(self.state.epoch or 0.0),
                files=file_digests(staged),
                reason=s.guard.stopped or "schedule",
            )
            final = s.layout.publish(step, manifest, self._fault)
            self._previous_bytes = manifest.total_bytes
            for path in s.layout.rotate(s.keep):
                log.info("removed old checkpoint %s (training.save_total_limit=%s)", path.name, s.keep)
            log.info("saved %s (%d files, %.1f MB)", final.name, len(manifest.files), manifest.total_bytes / 1e6)
        self.accelerator.wait_for_everyone()

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        self._fault("save.weights")
        super()._save_optimizer_and_scheduler(output_dir)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if _internal_call and self._fsdp_sharded():
            self._save_sharded(Path(output_dir or self.args.output_dir))
            return
        super().save_model(output_dir, _internal_call)

    def _save_sharded(self, output_dir: Path) -> None:
        """The files of an FSDP checkpoint, every rank writing its own shards (no gather).

        The Trainer runs with save_only_model under fsdp (it refuses to checkpoint a model sharded
        before it otherwise), so it skips the optimizer, scheduler, scaler and RNG files: they are
        written here, after the model, as the Trainer orders them. Its trainer state follows.
        """
        import torch
        from transformers.trainer import SCHEDULER_NAME

        output_dir.mkdir(parents=True, exist_ok=True)
        save_sharded_model(self.model, output_dir)
        self._fault("save.weights")
        save_sharded_optimizer(self.model, self.optimizer, output_dir)
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), output_dir / SCHEDULER_NAME)
            # What the checkpoint is a model of, for a reader that has no run config at hand.
            base = self.accelerator.unwrap_model(self.model)
            base = base.get_base_model() if hasattr(base, "get_base_model") else base
            # As save_pretrained writes them (fully_shard renames the class FSDP<name>): averaging
            # compares them with a saved model's, and an average of this checkpoint carries them.
            base.config.architectures = [type(base).__name__.removeprefix("FSDP")]
            base.config.save_pretrained(output_dir)
            if base.can_generate():
                base.generation_config.save_pretrained(output_dir)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
        self._save_scaler(output_dir)
        self._save_rng_state(str(output_dir))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        if self._fsdp_sharded():
            path = Path(resume_from_checkpoint)
            if not is_sharded_checkpoint(path):
                # Only a checkpoint copied in from a run of another strategy gets here (resume refuses
                # a changed distributed.strategy): say so rather than fail inside DCP.
                raise UserError(
                    f"{path}: holds no FSDP shards ({MODEL_DIR}/), so distributed.strategy=fsdp cannot resume from it; "
                    "resume with the strategy that wrote it, or start a new run"
                )
            load_sharded_model(self.model, path)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None or not self._fsdp_sharded():
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        import torch
        from transformers.trainer import SCHEDULER_NAME

        load_sharded_optimizer(self.model, self.optimizer, Path(checkpoint))
        self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / SCHEDULER_NAME, weights_only=True))

    def _fsdp_sharded(self) -> bool:
        """Whether the model was sharded by supertune before the Trainer (fsdp): its checkpoints are sharded too."""
        return bool(getattr(self.model, "is_distributed_loading_by_transformers", False))

    def _check_space(self, step: int) -> None:
        """Stop every rank with one message when the next checkpoint would not fit."""
        from accelerate.utils import broadcast_object_list

        s = self.supertune
        problem: list[str | None] = [None]
        if self.is_world_process_zero():
            if self._previous_bytes is None:
                latest = s.layout.latest()
                try:
                    self._previous_bytes = read_manifest(latest).total_bytes if latest else None
                except ValueError:
                    self._previous_bytes = None
            needed = expected_checkpoint_bytes(self._previous_bytes, self.model)
            s.layout.root.mkdir(parents=True, exist_ok=True)
            problem[0] = space_problem(s.layout.root, needed, step, s.keep)
        if self.args.world_size > 1:
            broadcast_object_list(problem)
        if problem[0]:
            raise UserError(problem[0])

    def _fault(self, point: str) -> None:
        fault_point(point, self.state.global_step, self.supertune.rank)

    def loss_tokens_trained(self) -> int | None:
        """Loss targets trained over every process up to now; every rank must call it (an all-reduce)."""
        return self.loss_tokens.total(self.accelerator, self.args.world_size, self.args.device)

    # -- optimizer ---------------------------------------------------------------------------------

    def create_optimizer(self, model: Any = None) -> Any:
        """The Trainer's optimizer, starting from the moments of training.init_optimizer_from when set.

        A resumed run loads its own checkpoint's optimizer state afterwards, over this one, so a
        federated round killed and resumed continues exactly.
        """
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        start = self.supertune.init_optimizer_from
        if start is not None:
            import torch

            state = torch.load(start / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            try:
                self.optimizer.load_state_dict(state)
            except (ValueError, KeyError) as exc:
                raise UserError(
                    f"training.init_optimizer_from: {start} holds another model's or optimizer's state ({exc})"
                ) from None
            log.info("optimizer state (moments of %d parameters) taken from %s", len(state.get("state", {})), start)
        return optimizer

    # -- FSDP ------------------------------------------------------------------------------------

    def _defer_fsdp_gradient_reduction(self) -> Any:
        """The Trainer's no_sync for a model sharded before it (gradient accumulation under fsdp).

        The Trainer's own reads the transformers DistributedConfig of a model sharded by
        from_pretrained, which a model supertune sharded has not.
        """
        return deferred_gradient_reduction(self.model)

    # -- per-micro-batch accounting ----------------------------------------------------------------

    def floating_point_ops(self, inputs: Any) -> int:
        """The Trainer's estimate (6 x input tokens x parameters less the embeddings), the same number,
        with the parameter count taken once: the Trainer's own walks every module and parameter of the
        model at every micro-batch (0.3-0.4 ms each for the embedded 4-layer Llama on one CPU thread,
        more for deeper models: bench/results/step_profile.md), and it cannot change while training."""
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._flop_parameters is None:
            self._flop_parameters = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main_input].numel() * self._flop_parameters

    # -- checks ----------------------------------------------------------------------------------

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        self.loss_tokens.add(inputs)
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.supertune.guard.watch_loss(loss)  # on the device; read once at the end of the optimizer step
        return loss

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        grad_norm = super()._get_grad_norm(model, grad_norm)
        # With fp16 an infinite norm is the loss scaler's business (it skips the step and lowers the scale).
        if grad_norm is not None and not self.args.fp16:
            self.supertune.guard.watch_gradient_norm(grad_norm)
        return grad_norm
