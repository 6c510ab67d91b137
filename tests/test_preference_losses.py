"""The preference losses of the trainer against references written from the papers' equations.

The trainer scores a padded batch in one forward pass (chosen rows, then rejected rows) and takes
its reference log-probabilities precomputed, or from the LoRA base with the adapter off; the
references here score each sequence alone, unpadded, token by token with log_softmax, and compute
each loss with the papers' formulas in float64 from those numbers:

- DPO (Rafailov et al. 2023, eq. 7): -log sigmoid(beta (log pi(yw)/ref(yw) - log pi(yl)/ref(yl)))
- IPO (Azar et al. 2023, eq. 17): (h - 1/(2 tau))^2, h the same log-ratio difference, tau = beta
- hinge (SLiC, Zhao et al. 2023): max(0, 1 - beta h)
- ORPO (Hong et al. 2024, eqs. 6-7): -mean log p(yw) + lambda (-log sigmoid(log odds(yw) / odds(yl))),
  odds(y) = p / (1 - p), p the mean token probability exp(mean log p)
- SimPO (Meng et al. 2024, eq. 6): -log sigmoid(beta/|yw| log pi(yw) - beta/|yl| log pi(yl) - gamma)
- KTO (Ethayarajh et al. 2024, eq. 8): lambda_y - v(x, y), v = lambda_D sigmoid(beta (r - z0)) for a
  desirable answer, lambda_U sigmoid(beta (z0 - r)) for an undesirable one, z0 = max(0, the mean of
  log pi/ref over the mismatched pairs of the batch)
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainingArguments

from supertune.config.objectives import OBJECTIVES
from supertune.config.schema import DataConfig, TrainingConfig
from supertune.conversations.preference import encode_pairs, encode_unpaired
from supertune.embedded import default_tokenizer
from supertune.embedded.chat import EMBEDDED_CHAT_TEMPLATE
from supertune.embedded.model import default_model_config
from supertune.embedded.preference import generate_pairs
from supertune.train.preference.preference_losses import DPO_LOSSES, LOSSES, sequence_logps
from supertune.train.preference.preference_reference import attach_reference
from supertune.train.preference.preference_trainer import PreferenceSettings, PreferenceTrainer
from supertune.training_data.preference_data import PreferenceCollator, PreferenceRows

TOL = 1e-6


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    tok.chat_template = EMBEDDED_CHAT_TEMPLATE
    return tok


def _model(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = default_model_config(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    return LlamaForCausalLM(LlamaConfig(**{**config, "num_hidden_layers": 2})).float()


def _perturbed(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A policy that differs from the start model (the reference)."""
    policy = copy.deepcopy(model)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return policy


def _rows(tokenizer, unpaired: bool, n: int = 6) -> PreferenceRows:
    pairs = generate_pairs(5, n)
    d = DataConfig()
    if not unpaired:
        rows = {k: [p[k] for p in pairs] for k in ("prompt", "chosen", "rejected")}
        encoded = encode_pairs(rows, d, tokenizer, "the test", 0)
        return PreferenceRows([c for c, _ in encoded], [r for _, r in encoded])
    rows = {
        "prompt": [p["prompt"] for p in pairs],
        "completion": [p["chosen"] if i % 3 else p["rejected"] for i, p in enumerate(pairs)],
        "label": [bool(i % 3) for i in range(n)],
    }
    encoded = encode_unpaired(rows, d, tokenizer, "the test", 0)
    return PreferenceRows.unpaired([a for a, _ in encoded], [label for _, label in encoded])


def _trainer(tmp_path, model, objective: str, reference: str | None, **knobs) -> PreferenceTrainer:
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=8)
    trainer = PreferenceTrainer(model=model, args=args)
    trainer.setup_preference(PreferenceSettings(TrainingConfig(objective=objective, **knobs), reference))
    return trainer


class Scored:
    """Each sequence's summed answer log-probability and answer length, token by token in float64 from
    the logits of one forward pass over the batch the trainer scores (the same numbers in, so the
    comparison is of the losses' arithmetic, not of float32 matmul rounding across batch shapes)."""

    def __init__(self, model, batch: dict[str, torch.Tensor], prefix: str = "") -> None:
        with torch.no_grad():
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            self.logits = model(
                input_ids=batch[f"{prefix}input_ids"], attention_mask=batch[f"{prefix}attention_mask"]
            ).logits.double()
        self.labels = batch[f"{prefix}labels"]
        del base

    def __call__(self, row: int) -> tuple[float, int]:
        total, count = 0.0, 0
        for t in range(1, self.labels.shape[1]):
            target = int(self.labels[row, t])
            if target != -100:
                total += float(torch.log_softmax(self.logits[row, t - 1], dim=-1)[target])
                count += 1
        return total, count


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return math.exp(_log_sigmoid(x))


def _pair_reference(policy: Scored, reference: Scored | None, n: int, objective: str, t: TrainingConfig) -> float:
    """Rows 0..n-1 of the batch are the chosen answers, rows n..2n-1 the rejected ones."""
    losses = []
    for i in range(n):
        (pc, nc), (pr, nr) = policy(i), policy(n + i)
        if objective == "dpo":
            h = (pc - reference(i)[0]) - (pr - reference(n + i)[0])
            if t.dpo_loss == "sigmoid":
                losses.append(-_log_sigmoid(t.beta * h))
            elif t.dpo_loss == "ipo":
                losses.append((h - 1 / (2 * t.beta)) ** 2)
            else:
                losses.append(max(0.0, 1 - t.beta * h))
        elif objective == "orpo":
            mc, mr = pc / nc, pr / nr
            log_odds = (mc - math.log(1 - math.exp(mc))) - (mr - math.log(1 - math.exp(mr)))
            losses.append(-mc + t.beta * -_log_sigmoid(log_odds))
        else:  # simpo
            losses.append(-_log_sigmoid(t.beta * pc / nc - t.beta * pr / nr - t.simpo_gamma))
    return sum(losses) / len(losses)


def _kto_reference(policy, reference, batch, desirable, t: TrainingConfig) -> float:
    answers, answers_ref = Scored(policy, batch), Scored(reference, batch)
    kl, kl_ref = Scored(policy, batch, "kl_"), Scored(reference, batch, "kl_")
    n = len(desirable)
    z0 = max(0.0, sum(kl(i)[0] - kl_ref(i)[0] for i in range(n)) / n)
    losses = []
    for i, good in enumerate(desirable):
        r = answers(i)[0] - answers_ref(i)[0]
        if good:
            losses.append(t.desirable_weight - t.desirable_weight * _sigmoid(t.beta * (r - z0)))
        else:
            losses.append(t.undesirable_weight - t.undesirable_weight * _sigmoid(t.beta * (z0 - r)))
    return sum(losses) / len(losses)


def test_every_preference_objective_has_its_loss():
    assert set(LOSSES) == {name for name, o in OBJECTIVES.items() if o.rows != "text"}


CASES = [
    ("dpo", {"dpo_loss": "sigmoid", "beta": 0.1}),
    ("dpo", {"dpo_loss": "ipo", "beta": 0.5}),
    ("dpo", {"dpo_loss": "hinge", "beta": 0.3}),
    ("orpo", {"beta": 0.2}),
    ("simpo", {"beta": 2.0, "simpo_gamma": 0.7}),
    ("kto", {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.3}),
]


def test_the_cases_cover_every_loss():
    assert {o for o, _ in CASES} == set(LOSSES)
    assert {k["dpo_loss"] for o, k in CASES if o == "dpo"} == set(DPO_LOSSES)


@pytest.mark.parametrize(("objective", "knobs"), CASES, ids=[f"{o}-{k.get('dpo_loss', '')}" for o, k in CASES])
def test_the_loss_of_a_batch_is_the_papers(tmp_path, tokenizer, objective, knobs):
    start = _model(tokenizer)
    policy = _perturbed(start)
    unpaired = OBJECTIVES[objective].rows == "unpaired"
    rows = _rows(tokenizer, unpaired)
    collator = PreferenceCollator(tokenizer.pad_token_id)
    has_reference = OBJECTIVES[objective].reference
    if has_reference:  # computed once with the start model, as a full fine-tuning run does
        attach_reference(start, [rows], collator, 4, torch.device("cpu"))
    trainer = _trainer(tmp_path, policy, objective, "precomputed" if has_reference else None, **knobs)
    batch = collator([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        out = trainer.preference_loss(policy, batch)
    t = trainer.preference.training
    if unpaired:
        expected = _kto_reference(policy, start, batch, rows.desirable, t)
    else:
        expected = _pair_reference(Scored(policy, batch), Scored(start, batch), len(rows), objective, t)
    assert abs(float(out.loss) - expected) < TOL, (float(out.loss), expected)
    assert out.loss.dtype == torch.float32


def test_the_precomputed_reference_equals_the_live_one(tokenizer):
    """Log-probabilities computed before training, 4 rows a batch, against the start model scoring the
    whole batch the trainer sees (other padding, other batch shape)."""
    start = _model(tokenizer)
    rows = _rows(tokenizer, unpaired=False)
    collator = PreferenceCollator(tokenizer.pad_token_id)
    attach_reference(start, [rows], collator, 4, torch.device("cpu"))
    batch = collator([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        live = sequence_logps(
            start(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )[0]
    assert (batch["ref_logps"] - live.double()).abs().max() < TOL * max(1.0, float(live.abs().max()))


def test_with_lora_the_reference_is_the_base_with_the_adapter_off(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    start = _model(tokenizer)
    base = copy.deepcopy(start)
    # Random B matrices (not peft's zeros), so that the adapter changes the model from the first step.
    policy = get_peft_model(start, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    rows = _rows(tokenizer, unpaired=False)
    trainer = _trainer(tmp_path, policy, "dpo", "adapter_off", beta=0.1)
    batch = PreferenceCollator(tokenizer.pad_token_id)([rows[i] for i in range(len(rows))])
    with torch.no_grad():
        out = trainer.preference_loss(policy, batch)
    t = trainer.preference.training
    expected = _pair_reference(Scored(policy, batch), Scored(base, batch), len(rows), "dpo", t)
    assert abs(float(out.loss) - expected) < TOL
    assert abs(float(out.metrics["rewards/margins"])) > 1e-4  # the adapter is on for the policy


def test_the_metrics_carry_trls_names(tmp_path, tokenizer):
    start = _model(tokenizer)
    rows = _rows(tokenizer, unpaired=False)
    collator = PreferenceCollator(tokenizer.pad_token_id)
    attach_reference(start, [rows], collator, 4, torch.device("cpu"))
    trainer = _trainer(tmp_path, _perturbed(start), "dpo", "precomputed")
    out = trainer.preference_loss(trainer.model, collator([rows[i] for i in range(len(rows))]))
    names = {
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    }
    assert names <= set(out.metrics)
    m = out.metrics
    assert abs(float(m["rewards/margins"] - (m["rewards/chosen"] - m["rewards/rejected"]))) < TOL
    assert 0 <= float(m["rewards/accuracies"]) <= 1
