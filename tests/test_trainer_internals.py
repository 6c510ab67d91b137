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
