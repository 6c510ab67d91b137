"""The private Trainer methods supertune overrides or calls are still there, with the parameters and
callers it relies on; a transformers upgrade that changes them fails here, naming the method."""

from __future__ import annotations

import inspect

from supertune.train.trainer.guarded_trainer import GuardedTrainer
from supertune.train.trainer.trainer_internals import TRAINER_INTERNALS, internals_problems


def test_the_installed_transformers_matches_the_table():
    assert internals_problems() == []


def test_every_private_override_is_in_the_table():
    overridden = {
        name
        for name, value in vars(GuardedTrainer).items()
        if inspect.isfunction(value) and name.startswith("_") and not name.startswith("__")
    }
    own = {"_check_space", "_fault", "_save_sharded", "_fsdp_sharded"}  # supertune's own helpers, not the Trainer's
    assert overridden - own <= {i.name for i in TRAINER_INTERNALS}


def test_a_changed_method_is_named(monkeypatch):
    from transformers import Trainer

    def renamed(self, model, trial_or_none):
        return None

    monkeypatch.setattr(Trainer, "_save_checkpoint", renamed)
    problems = internals_problems()
    assert "Trainer._save_checkpoint now takes ('model', 'trial_or_none')" in problems[0]
    # The replacement no longer calls the methods whose overrides place and stage the checkpoint.
    assert "Trainer._get_output_dir is no longer called by Trainer._save_checkpoint" in problems[1]
    assert "Trainer._save_optimizer_and_scheduler is no longer called by Trainer._save_checkpoint" in problems[2]
    assert "Trainer.save_model is no longer called by Trainer._save_checkpoint" in problems[3]
    assert len(problems) == 4


DEEPSPEED_PROBE = """
import sys
import accelerate.utils.other as other
import torch
from transformers import Trainer, TrainingArguments
from supertune.distributed.deepspeed_runtime import leave_deepspeed_unimported

checks = other.is_deepspeed_available
leave_deepspeed_unimported()
model = torch.nn.Linear(2, 2)
trainer = Trainer(model=model, args=TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to=[]))
trainer.accelerator.unwrap_model(trainer.model)
before = "deepspeed" in sys.modules
other.is_deepspeed_available = checks
trainer.accelerator.unwrap_model(trainer.model)
print(before, "deepspeed" in sys.modules)
"""


def test_a_run_that_is_not_deepspeed_builds_its_trainer_without_importing_deepspeed(tmp_path):
    """accelerate's unwrap check imports DeepSpeed (and MLflow through it) when it is installed:
    seconds of every process's start. Without DeepSpeed the Trainer is built and unwrapped without
    it; with accelerate's own check back in place the same call imports it, so a moved check fails here."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", DEEPSPEED_PROBE, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].split() == ["False", "True"], done.stdout + done.stderr[-2000:]
