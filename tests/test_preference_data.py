"""Preference rows in TRL's formats: encoded with the answer alone in the loss, the embedded pairs,
and every bad row refused in one line that names the row and the fix; training.objective's config."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from supertune.config.errors import ConfigError
from supertune.config.objectives import OBJECTIVES
from supertune.config.schema import DataConfig, RunConfig
from supertune.config.validate import config_problems, validate
from supertune.conversations.preference import encode_pairs, encode_unpaired
from supertune.embedded import default_tokenizer
from supertune.embedded.chat import EMBEDDED_CHAT_TEMPLATE
from supertune.embedded.preference import generate_pairs, preference_corpus
from supertune.errors import UserError
from supertune.training_data.preference_data import PreferenceCollator, build_preference_data

SYSTEM = {"role": "system", "content": "Ada is a baker. The mill is north of Ashford."}
USER = {"role": "user", "content": "Where is the mill?"}
GOOD = {"role": "assistant", "content": "The mill is north of Ashford."}
BAD = {"role": "assistant", "content": "The mill is south of Ashford."}


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(str(default_tokenizer()))
    tok.chat_template = EMBEDDED_CHAT_TEMPLATE
    return tok


def _pairs(tokenizer, rows: list[dict]) -> list:
    columns = {k: [r.get(k) for r in rows] for k in ("prompt", "chosen", "rejected")}
    return encode_pairs(columns, DataConfig(), tokenizer, "the training split", 0)


def _answer_text(tokenizer, encoded) -> str:
    return tokenizer.decode(encoded.ids[encoded.mask == 1])


def test_a_conversational_pair_trains_on_its_answers_alone(tokenizer):
    ((chosen, rejected),) = _pairs(tokenizer, [{"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]}])
    assert _answer_text(tokenizer, chosen).strip().startswith("The mill is north of Ashford.")
    assert _answer_text(tokenizer, rejected).strip().startswith("The mill is south of Ashford.")
    assert tokenizer.eos_token in _answer_text(
        tokenizer, chosen
    )  # the end of the turn is trained: the model learns to stop
    prompt = chosen.ids[chosen.mask == 0]
    assert np.array_equal(prompt, rejected.ids[rejected.mask == 0])  # one prompt, the same tokens
    assert tokenizer.decode(prompt).endswith("<|assistant|>\n")


def test_the_prompt_is_implicit_when_the_conversations_share_their_turns(tokenizer):
    explicit = _pairs(tokenizer, [{"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]}])
    implicit = _pairs(tokenizer, [{"chosen": [SYSTEM, USER, GOOD], "rejected": [SYSTEM, USER, BAD]}])
    repeated = _pairs(tokenizer, [{"prompt": [SYSTEM, USER], "chosen": [SYSTEM, USER, GOOD], "rejected": [BAD]}])
    for other in (implicit, repeated):
        for a, b in zip(explicit[0], other[0]):
            assert np.array_equal(a.ids, b.ids) and np.array_equal(a.mask, b.mask)


def test_a_plain_text_pair_joins_prompt_and_answer_with_eos(tokenizer):
    ((chosen, rejected),) = _pairs(tokenizer, [{"prompt": "The mill is", "chosen": " north.", "rejected": " south."}])
    assert chosen.ids[-1] == tokenizer.eos_token_id and chosen.mask[-1] == 1
    assert tokenizer.decode(chosen.ids[chosen.mask == 0]) == "The mill is"
    assert _answer_text(tokenizer, rejected).startswith(" south.")


def test_kto_rows_are_answers_with_labels(tokenizer):
    rows = {"prompt": [[SYSTEM, USER]] * 2, "completion": [[GOOD], [BAD]], "label": [True, False]}
    encoded = encode_unpaired(rows, DataConfig(), tokenizer, "the training split", 0)
    assert [label for _, label in encoded] == [True, False]
    assert _answer_text(tokenizer, encoded[1][0]).strip().startswith("The mill is south")


BAD_ROWS = [
    ({"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [GOOD]}, "data.rejected_field", "are the same"),
    (
        {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [{"role": "assistant", "content": " "}]},
        "data.rejected_field",
        "is empty",
    ),
    ({"prompt": "Where?", "chosen": "", "rejected": "South."}, "data.chosen_field", "is empty"),
    ({"chosen": [SYSTEM, USER, GOOD], "rejected": [USER, BAD]}, "data.prompt_field", "share no prompt"),
    (
        {"prompt": [USER], "chosen": [SYSTEM, USER, GOOD], "rejected": [BAD]},
        "data.prompt_field",
        "does not start with the row's prompt",
    ),
    (
        {"prompt": [SYSTEM, USER], "chosen": [GOOD, USER], "rejected": [BAD]},
        "data.chosen_field",
        "not the assistant's answer",
    ),
    ({"chosen": "North.", "rejected": "South."}, "data.prompt_field", "no prompt text"),
]


@pytest.mark.parametrize(("row", "key", "words"), BAD_ROWS)
def test_a_bad_pair_is_one_line_naming_the_row_and_the_fix(tokenizer, row, key, words):
    good = {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]}
    with pytest.raises(UserError) as caught:
        _pairs(tokenizer, [good, good, row])
    message = str(caught.value)
    assert message.startswith(f"{key}: row 2 of the training split (counting from 0): "), message
    assert words in message and "\n" not in message
    assert any(fix in message for fix in ("fix the row", "drop it", "give ")), message


def _files(tmp_path, train: list[dict], validation: list[dict]) -> DataConfig:
    for name, rows in (("train", train), ("validation", validation)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DataConfig(
        train_files=[str(tmp_path / "train.jsonl")], validation_files=[str(tmp_path / "validation.jsonl")]
    )


def test_a_pair_longer_than_max_length_is_refused_with_its_row(tmp_path, tokenizer):
    pair = {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]}
    long = {**pair, "rejected": [{"role": "assistant", "content": "far " * 80}]}
    d = _files(tmp_path, [pair, long], [pair])
    d.max_length = 64
    with pytest.raises(
        UserError,
        match=r"^data.max_length: row 1 of the training split \(counting from 0\): the pair is \d+ tokens, longer than 64; raise data.max_length",
    ):
        build_preference_data(d, "dpo", tokenizer, 0, 1024)


def test_a_kto_set_of_one_label_is_refused(tmp_path, tokenizer):
    row = {"prompt": [SYSTEM, USER], "completion": [GOOD], "label": True}
    d = _files(tmp_path, [row, row], [row])
    with pytest.raises(
        UserError, match=r"^data.label_field: every training row of training.objective=kto is desirable \(true\)"
    ):
        build_preference_data(d, "kto", tokenizer, 0, 1024)


def test_a_missing_column_names_its_key(tmp_path, tokenizer):
    d = _files(
        tmp_path, [{"prompt": "a", "chosen": "b", "other": "c"}] * 2, [{"prompt": "a", "chosen": "b", "other": "c"}]
    )
    with pytest.raises(UserError, match=r"^data.rejected_field: column 'rejected' is not in the data"):
        build_preference_data(d, "dpo", tokenizer, 0, 1024)


def test_a_batch_of_pairs_holds_the_chosen_then_the_rejected(tmp_path, tokenizer):
    d = _files(tmp_path, generate_pairs(1, 6), generate_pairs(2, 2))
    data = build_preference_data(d, "dpo", tokenizer, 0, 1024)
    batch = data.collator([data.train[i] for i in range(3)])
    assert batch["input_ids"].shape[0] == 6
    assert int(batch["attention_mask"][0].sum()) == len(data.train.first[0].ids)
    assert int(batch["attention_mask"][3].sum()) == len(data.train.second[0].ids)
    assert int((batch["labels"] != -100).sum()) == sum(
        int(a.mask.sum()) for a in data.train.first[:3] + data.train.second[:3]
    )
    assert isinstance(data.collator, PreferenceCollator)


def test_the_embedded_pairs_agree_and_contradict_the_fact_they_state():
    pairs = generate_pairs(3, 300)
    assert generate_pairs(3, 300) == pairs  # the same for the same seed
    for pair in pairs:
        prompt = pair["prompt"][0]["content"].replace(",", " ").replace(".", " ").split()
        chosen, rejected = pair["chosen"][0]["content"].split(), pair["rejected"][0]["content"].split()
        differ = [(a, b) for a, b in zip(chosen, rejected) if a != b]
        assert len(chosen) == len(rejected) and len(differ) == 1, pair  # one word, the rest the same
        right, wrong = (word.strip(".") for word in differ[0])
        assert right in prompt and wrong not in prompt, pair
    corpus = preference_corpus()
    rows = [json.loads(line) for line in corpus.unpaired_train.read_text().splitlines()]
    labels = [r["label"] for r in rows]
    assert 0.4 < np.mean(labels) < 0.6 and len(rows) == len(corpus.pairs_train.read_text().splitlines())


def test_every_objective_and_its_knobs_are_checked_at_once():
    cfg = RunConfig()
    cfg.training.objective = "kto"
    cfg.training.simpo_gamma = 1.0
    cfg.training.dpo_loss = "ipo"
    cfg.training.beta = 0.0
    cfg.data.streaming = True
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    text = str(caught.value)
    for words in (
        "training.simpo_gamma: set to 1.0, but training.objective=kto does not read it (read by simpo)",
        "training.dpo_loss: set to 'ipo', but training.objective=kto does not read it (read by dpo)",
        "training.beta: must be positive, got 0.0",
        "data.streaming: training.objective=kto",
    ):
        assert words in text, text


def test_the_default_run_and_each_objective_with_defaults_are_sound():
    for name in OBJECTIVES:
        cfg = RunConfig()
        cfg.training.objective = name
        assert config_problems(cfg) == [], name


def test_the_objectives_table_in_the_docs_is_the_generated_one():
    from pathlib import Path

    from supertune.config.objectives import objectives_markdown

    page = (Path(__file__).resolve().parent.parent / "docs" / "preference.md").read_text(encoding="utf-8")
    assert objectives_markdown() in page, "regenerate the objectives table of docs/preference.md"


def test_a_preference_objective_on_the_embedded_pairs_trains_long_enough_to_learn_them(tmp_path):
    """With no data given, a preference objective takes the steps and learning rate the embedded pairs
    need (each where no layer sets it, named in --origin); with data, for sft, or where the user set
    them, nothing changes."""
    from supertune.resolve import resolve
    from supertune.resolve.resolve import EMBEDDED_PAIRS_RULE

    def settings(*overrides: str) -> tuple[int, float, dict[str, str]]:
        r = resolve(None, list(overrides))
        named = {layer.name for layer in r.layers}
        return r.config.training.max_steps, r.config.training.learning_rate, named

    steps, lr, layers = settings("training.objective=dpo")
    assert (steps, lr) == (400, 3e-3) and EMBEDDED_PAIRS_RULE in layers
    assert settings("training.objective=kto", "training.max_steps=7")[:2] == (7, 3e-3)
    assert settings("training.objective=dpo", "training.max_steps=7", "training.learning_rate=1e-3")[:2] == (7, 1e-3)
    assert settings()[:2] == (120, 2e-3)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n")
    steps, lr, layers = settings("training.objective=dpo", f"data.train_files=[{pairs}]")
    assert (steps, lr) == (120, 2e-3) and EMBEDDED_PAIRS_RULE not in layers
