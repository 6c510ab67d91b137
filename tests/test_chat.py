"""Chat and prompt/completion fine-tuning (data.format, data.loss_on): labels equal those written out by
hand for four chat templates, the masked loss equals a reference cross-entropy over the answers in
every batching mode, bad rows and templates are refused in one line before a run exists, and the
embedded default trains a chat model that eval, generate and plain transformers all read."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from chat_templates import CONVERSATION, FAMILIES, MISTRAL_SYSTEM_LAST, family_tokenizer
from supertune.cli.main import main
from supertune.config.schema import DataConfig
from supertune.conversations.encoding import encode_rows
from supertune.conversations.template import attach_chat_template
from supertune.errors import UserError


@pytest.fixture(scope="module")
def base_tokenizer() -> Path:
    from supertune.embedded import default_tokenizer

    return default_tokenizer()


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def refused(capsys, *argv: str) -> str:
    code = main(list(argv))
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("supertune: error: ")]
    assert code == 2 and len(lines) == 1, err
    return lines[0].removeprefix("supertune: error: ")


def _runs(rows: list[dict], tmp_path: Path, *overrides: str) -> list[str]:
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        f"data.train_files={tmp_path}/d.jsonl",
        f"data.validation_files={tmp_path}/d.jsonl",
        f"output.runs_root={tmp_path}/runs",
        "model.config_overrides=num_hidden_layers=1",
        *overrides,
    ]


# --- labels ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_labels_are_the_answers_the_template_marks(base_tokenizer, tmp_path, family):
    """The rendered text is the one written by hand, and the trained tokens are exactly each answer
    with its end-of-turn marker: the masked runs of tokens decode to the hand-written stretches, and
    the tokens are those of encoding the whole hand-written text."""
    _, _, _, _, text, answers = FAMILIES[family]
    tok = _tokenizer(family_tokenizer(base_tokenizer, tmp_path / family, family))
    d = DataConfig(format="chat")
    attach_chat_template(d, tok, family, own_tokenizer=True)
    assert tok.apply_chat_template(CONVERSATION, tokenize=False) == text
    (ids,), (mask,) = encode_rows({"messages": [CONVERSATION]}, d, tok, "the test", 0)
    assert ids.tolist() == tok(text, add_special_tokens=False)["input_ids"]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    runs = [tok.decode(ids[a:b].tolist(), skip_special_tokens=False) for a, b in zip(edges[::2], edges[1::2])]
    assert runs == answers
    # data.loss_on=all trains every token of the same ids
    (same,), (every,) = encode_rows({"messages": [CONVERSATION]}, DataConfig(format="chat", loss_on="all"), tok, "t", 0)
    assert same.tolist() == ids.tolist() and every.all()


def test_tool_turns_are_rendered_and_only_the_assistant_turns_trained(base_tokenizer):
    tok = _tokenizer(base_tokenizer)
    d = DataConfig(format="chat")
    attach_chat_template(d, tok, "embedded", own_tokenizer=True)
    messages = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "How deep is the well?"},
        {"role": "assistant", "content": "I will measure it."},
        {"role": "tool", "content": "depth: 12 metres"},
        {"role": "assistant", "content": "It is 12 metres deep."},
    ]
    (ids,), (mask,) = encode_rows({"messages": [messages]}, d, tok, "t", 0)
    assert tok.decode(ids.tolist()) == tok.apply_chat_template(messages, tokenize=False)
    assert "<|tool|>\ndepth: 12 metres</s>" in tok.decode(ids.tolist())
    trained = tok.decode(ids[mask == 1].tolist())
    assert trained.replace("\n", "") == "I will measure it.</s>It is 12 metres deep.</s>", trained


def test_prompt_completion_trains_the_completion_and_eos(base_tokenizer):
    tok = _tokenizer(base_tokenizer)
    rows = {"prompt": ["Write a document: "], "completion": ["The mill is north."]}
    (ids,), (mask,) = encode_rows(rows, DataConfig(format="prompt_completion"), tok, "t", 0)
    prompt = tok("Write a document: ", add_special_tokens=False)["input_ids"]
    assert ids.tolist()[: len(prompt)] == prompt and ids[-1] == tok.eos_token_id
    assert mask.tolist() == [0] * len(prompt) + [1] * (len(ids) - len(prompt))
    assert tok.decode(ids[mask == 1].tolist()) == "The mill is north.</s>"


def test_templates_write_the_prompt_and_the_answer_from_the_columns(base_tokenizer):
    """The two-site recipe's shape: a fixed instruction as the prompt, the document as the answer."""
    tok = _tokenizer(base_tokenizer)
    rows = {"title": ["Mill", "Bakery"], "text": ["The mill is north.", "It bakes bread."]}
    d = DataConfig(format="prompt_completion", prompt_template="Write about {title}: ", completion_template="{text}")
    ids, masks = encode_rows(rows, d, tok, "t", 0)
    for title, text, row, mask in zip(rows["title"], rows["text"], ids, masks):
        prompt = tok(f"Write about {title}: ", add_special_tokens=False)["input_ids"]
        assert row.tolist() == prompt + tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert mask.tolist() == [0] * len(prompt) + [1] * (len(row) - len(prompt))


def test_the_embedded_stories_train_as_answers_to_one_instruction(capsys, tmp_path):
    run = tmp_path / "run"
    assert (
        main(["train", "--run-dir", str(run), "data.format=prompt_completion", "data.prompt_template=Write a document: ",
              "data.completion_template={text}", "training.max_steps=2", "training.report_to=[]",
              "generate.max_new_tokens=0", "model.config_overrides=num_hidden_layers=1", "data.max_eval_samples=8"])
        == 0
    )  # fmt: skip
    assert "over the completion tokens" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["loss_on"] == "completion" and summary["loss_tokens_available"] > 0


# --- the loss ----------------------------------------------------------------------------------------


def _conversations(n: int) -> list[list[dict[str, str]]]:
    from supertune.embedded.chat import generate_conversations

    return generate_conversations(99, n)


def _tiny_llama(vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=2,
        bos_token_id=0,
        eos_token_id=1,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).eval()


def _reference(model, sequences: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Cross-entropy over the trained tokens, each sequence run alone: mean of -log p(token | the tokens
    before it in its sequence) over the tokens whose mask is 1 (a sequence's first token has no context)."""
    total, count = 0.0, 0
    for ids, mask in sequences:
        x = torch.from_numpy(ids.astype(np.int64))[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=x).logits[0].double(), -1)
        for t in range(1, len(ids)):
            if mask[t]:
                total -= float(logp[t - 1, ids[t]])
                count += 1
    return total / count


@pytest.mark.parametrize("mode", ["padding", "packing", "document_mask"])
def test_the_masked_loss_is_the_cross_entropy_of_the_answers(base_tokenizer, mode):
    from transformers import default_data_collator

    from supertune.training_data.batches import PackedBlocks, PadCollator, PaddedDocuments, TokenizedSplit
    from supertune.training_data.document_bins import DocumentBins

    tok = _tokenizer(base_tokenizer)
    d = DataConfig(format="chat")
    attach_chat_template(d, tok, "embedded", own_tokenizer=True)
    ids, masks = encode_rows({"messages": _conversations(12)}, d, tok, "t", 0)
    split = TokenizedSplit(ids, masks)
    model = _tiny_llama(len(tok))
    block = 160
    if mode == "padding":
        dataset, collate = PaddedDocuments(ids, block, masks), PadCollator(tok.pad_token_id, block)
        reference = list(zip(ids, masks))  # each conversation alone, none longer than the block
        assert max(len(x) for x in ids) <= block
    elif mode == "packing":
        dataset, collate = PackedBlocks(split.concatenated(), block, split.concatenated_mask()), default_data_collator
        tokens, mask = split.concatenated(), split.concatenated_mask()
        # a block is one sequence whose first token has no context
        reference = [
            (tokens[i * block : (i + 1) * block], mask[i * block : (i + 1) * block]) for i in range(len(dataset))
        ]
    else:
        dataset = DocumentBins(
            split.concatenated(), split.offsets(), block, tok.pad_token_id, split.concatenated_mask()
        )
        collate = default_data_collator
        reference = list(zip(ids, masks))  # documents kept apart: each conversation as if alone
    batch = collate([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        loss = float(model(**batch).loss)
    assert int((batch["labels"][:, 1:] != -100).sum()) == sum(int(m[1:].sum()) for _, m in reference)
    assert loss == pytest.approx(_reference(model, reference), abs=1e-5)


LONGER = {
    (False, False): "each is truncated at data.max_length=96, and the turns past it are not trained",
    (True, False): "they run across block edges (of 96 tokens) as every packed document does",
    (True, True): "each is cut into pieces of 96 tokens, and a piece does not see the one before it",
}


@pytest.mark.parametrize("packing, document_mask", [(False, False), (True, False), (True, True)])
def test_a_stream_carries_the_masks_as_files_do(base_tokenizer, tmp_path, caplog, packing, document_mask):
    """The streamed validation split (read once, unshuffled) holds the rows the map-style one holds; and
    the conversations longer than a sequence are counted in the log, with what becomes of them."""
    from supertune.training_data.pipeline import build_training_data

    tok = _tokenizer(base_tokenizer)
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in _conversations(40)))
    d = dict(format="chat", train_files=[str(path)], validation_files=[str(path)], block_size=96)
    d.update(packing=packing, document_mask=document_mask, max_length=96)
    attach_chat_template(DataConfig(format="chat"), tok, "embedded", own_tokenizer=True)

    def rows(streaming: bool) -> list[tuple]:
        data = build_training_data(DataConfig(**d, streaming=streaming), tok, 0, 256)
        items = [data.validation[i] for i in range(len(data.validation))]
        return sorted((tuple(x["input_ids"].tolist()), tuple(x["labels"].tolist())) for x in items)

    streamed, stored = rows(True), rows(False)
    assert streamed == stored and any(-100 in labels for _, labels in stored)
    ids, _ = encode_rows({"messages": _conversations(40)}, DataConfig(format="chat"), tok, "t", 0)
    longer = sum(len(x) > 96 for x in ids)
    assert 0 < longer < 40
    said = [r.getMessage() for r in caplog.records if "are longer than" in r.getMessage()]
    # the stream's validation split as it is read, then the whole-read training split before a step
    assert said == [
        f"chat: {longer} of 40 streamed conversations read so far are longer than 96 tokens: {LONGER[packing, document_mask]}",
        f"chat: {longer} of 40 training conversations are longer than 96 tokens: {LONGER[packing, document_mask]}",
    ]


def test_the_loss_targets_are_the_shifted_labels_that_are_kept():
    from supertune.train.data.loss_tokens import LossTokenCount, loss_targets

    labels = torch.tensor([[-100, -100, 5, 6, -100], [7, 8, 9, -100, -100]])
    assert int(loss_targets({"labels": labels})) == 2 + 2  # position 0 of each row predicts nothing
    assert int(loss_targets({"labels": labels, "shift_labels": labels})) == 5  # a collator's own shift wins
    assert loss_targets({"input_ids": labels}) is None
    count = LossTokenCount()
    count.resumed_at(100)
    count.add({"labels": labels})
    count.add({"input_ids": labels})
    assert count.total(None, 1, "cpu") == 104
    count.resumed_at(None)  # a checkpoint written before loss tokens were counted: the total is unknown
    assert count.total(None, 1, "cpu") is None


# --- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data.loss_on=assistant"], "data.loss_on: assistant needs data.format=chat, but data.format is text"),
        (
            ["data.format=chat", "data.loss_on=completion"],
            "data.loss_on: completion needs data.format=prompt_completion",
        ),
        (
            ["data.format=prompt_completion"],
            "data.format: prompt_completion needs data with prompt and completion columns",
        ),
        (["data.chat_template=/nonexistent.jinja"], "data.chat_template: set with data.format=text"),
        (
            ["data.completion_template={text}"],
            "data.completion_template: writes one part of a prompt/answer row, but data.format is text",
        ),
        (
            ["data.format=prompt_completion", "data.completion_template=the answer"],
            "data.completion_template: has no placeholder",
        ),
        (
            ["data.format=prompt_completion", "data.prompt_template=Say {", "data.completion_template={text}"],
            "data.prompt_template: Single '{' encountered",
        ),
    ],
)
def test_config_keys_are_checked_before_anything_runs(capsys, tmp_path, overrides, expected):
    assert refused(capsys, "train", f"output.runs_root={tmp_path}/runs", *overrides).startswith(expected)
    assert not (tmp_path / "runs").exists()


GOOD = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}


@pytest.mark.parametrize(
    "bad, overrides, expected",
    [
        (
            {"messages": [{"role": "user", "content": "Hi?"}]},
            [],
            "data.messages_field: row 2 of the training files (counting from 0): the conversation ends on a user turn",
        ),
        (
            {"messages": [{"role": "human", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]},
            [],
            "data.messages_field: row 2 of the training files (counting from 0): unknown role 'human'",
        ),
        (
            {"prompt": "Say hi", "completion": ""},
            ["data.format=prompt_completion"],
            "data.completion_field: row 2 of the training files (counting from 0): no completion text",
        ),
        (
            {"prompt": "Say hi", "completion": " "},
            ["data.format=prompt_completion", "data.completion_template={completion}"],
            "data.completion_template: row 2 of the training files (counting from 0): data.completion_template "
            "writes empty text for this row ('{completion}')",
        ),
        (
            {"prompt": "Say hi", "completion": "Hi."},
            ["data.format=prompt_completion", "data.completion_template={answer}"],
            "data.completion_template: column 'answer' is not in the data (columns: prompt, completion)",
        ),
    ],
)
def test_a_bad_row_is_refused_by_its_number_before_a_run_exists(capsys, tmp_path, bad, overrides, expected):
    rows = [GOOD, GOOD, bad, GOOD]
    if overrides:
        rows = [{"prompt": "Say hi", "completion": "Hi."}] * 2 + [bad, {"prompt": "a", "completion": "b"}]
    message = refused(capsys, "train", *_runs(rows, tmp_path, "data.format=chat", *overrides))
    assert message.startswith(expected), message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "template, expected",
    [
        (
            MISTRAL_SYSTEM_LAST,
            "renders turn 2 (counting from 0) differently once later turns follow, so its assistant turns cannot be marked",
        ),
        (
            "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}",
            "it renders 0 answers",
        ),
    ],
)
def test_a_template_that_cannot_mark_the_answers_is_refused(capsys, tmp_path, template, expected):
    (tmp_path / "t.jinja").write_text(template)
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, *GOOD["messages"], *GOOD["messages"]]}] * 3
    message = refused(
        capsys, "train", *_runs(rows, tmp_path, "data.format=chat", f"data.chat_template={tmp_path}/t.jinja")
    )
    assert message.startswith("data.chat_template:") and expected in message, message
    assert not (tmp_path / "runs").exists()


def test_conversations_read_as_text_name_the_format(capsys, tmp_path):
    message = refused(capsys, "train", *_runs([GOOD, GOOD], tmp_path))
    assert message.endswith("the rows are conversations ('messages'): set data.format=chat"), message


@pytest.mark.parametrize("streaming", [False, True])
def test_a_bad_row_of_a_hub_dataset_is_refused_before_a_run_exists(capsys, tmp_path, streaming):
    """A dataset directory read as data.dataset_name (as a cached hub dataset is): its splits are
    checked before the run as files are (a stream: its first rows)."""
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    splits = {"train": [GOOD] * 3, "validation": [GOOD, {"messages": [{"role": "tool", "content": "42"}]}, GOOD]}
    for split, rows in splits.items():
        (dataset / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = refused(
        capsys, "train", "data.format=chat", f"data.dataset_name={dataset}", f"data.streaming={streaming}",
        "training.max_steps=2", f"output.runs_root={tmp_path}/runs",
    )  # fmt: skip
    expected = f"data.messages_field: row 1 of the 'validation' split of {dataset} (counting from 0): the conversation ends on a tool turn"
    assert message.startswith(expected), message
    assert not (tmp_path / "runs").exists()


def test_a_hub_dataset_of_conversations_trains_on_its_answers(capsys, tmp_path):
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    for split, n in (("train", 48), ("validation", 8)):
        rows = _conversations(n)
        (dataset / f"{split}.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    run = tmp_path / "run"
    args = ["data.format=chat", f"data.dataset_name={dataset}", "training.max_steps=2", "training.report_to=[]"]
    assert (
        main(
            [
                "train",
                "--run-dir",
                str(run),
                *args,
                "generate.max_new_tokens=0",
                "model.config_overrides=num_hidden_layers=1",
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["loss_on"] == "assistant" and 0 < summary["train_loss_tokens"] < summary["train_tokens"] // 2


def test_a_tokenizer_without_template_needs_one(base_tokenizer, tmp_path):
    tok = _tokenizer(base_tokenizer)
    with pytest.raises(UserError, match=r"^data.chat_template: the tokenizer of 'x' has no chat template"):
        attach_chat_template(DataConfig(format="chat"), tok, "x", own_tokenizer=False)


# --- the embedded default, end to end ----------------------------------------------------------------


def test_the_embedded_chat_default_trains_saves_its_template_and_answers(capsys, monkeypatch, tmp_path):
    """`supertune train data.format=chat` (cut short), then eval and generate --chat on its model, and
    plain transformers rendering the saved template as the run did."""
    from transformers import AutoTokenizer

    from supertune.embedded import EMBEDDED_CHAT_TEMPLATE

    args = ["data.format=chat", "training.max_steps=2", f"output.runs_root={tmp_path}", "generate.max_new_tokens=8"]
    assert main(["train", *args, "model.config_overrides=num_hidden_layers=1", "data.max_train_samples=200"]) == 0
    out = capsys.readouterr().out
    (run,) = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["loss_on"] == "assistant" and "over the assistant tokens" in out
    assert 0 < summary["loss_tokens_available"] < summary["train_tokens"] * 100
    assert summary["sample"].startswith("system: ") and " | user: " in summary["sample"]
    assert " | assistant: " in summary["sample"]
    saved = AutoTokenizer.from_pretrained(str(run / "model"))
    assert saved.chat_template == EMBEDDED_CHAT_TEMPLATE
    assert main(["eval", str(run / "model")]) == 0
    evaluated = capsys.readouterr().out
    assert f"eval loss {summary['eval_loss']:.6f}" in evaluated and "over the assistant turns' tokens" in evaluated
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"messages": m}) + "\n" for m in _conversations(6)))
    assert main(["eval", str(run / "model"), "--data", str(other), "data.format=chat"]) == 0
    evaluated = capsys.readouterr().out
    assert "over the assistant turns' tokens" in evaluated and "(6 sequences" in evaluated, evaluated
    monkeypatch.setattr(sys, "stdin", io.StringIO("Where is the mill?\n\nAnd the bridge?\n"))
    model = str(run / "model")
    assert main(["generate", model, "--chat", "--system", "Be brief.", "--max-new-tokens", "4"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # one answer per question; the blank line is no turn


def test_a_lora_chat_run_trains_the_answers_and_saves_the_template(capsys, tmp_path):
    run = tmp_path / "run"
    args = ["data.format=chat", "model.lora.enabled=true", "training.max_steps=2", "training.report_to=[]"]
    args += ["generate.max_new_tokens=0", "model.config_overrides=num_hidden_layers=1", "data.max_train_samples=64"]
    assert main(["train", "--run-dir", str(run), *args, "data.max_eval_samples=8"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["loss_on"] == "assistant" and 0 < summary["train_loss_tokens"] < summary["train_tokens"] // 2
    from transformers import AutoTokenizer

    from supertune.embedded import EMBEDDED_CHAT_TEMPLATE

    assert AutoTokenizer.from_pretrained(str(run / "model")).chat_template == EMBEDDED_CHAT_TEMPLATE
    capsys.readouterr()
    assert main(["eval", str(run / "model")]) == 0
    assert f"eval loss {summary['eval_loss']:.6f}" in capsys.readouterr().out


def test_a_token_store_keeps_the_masks(capsys, caplog, tmp_path):
    """`supertune prepare` stores the loss mask beside the ids (checked by --verify); a run from the store
    gets the labels a run from the files gets, and a store of other rows or another loss is refused."""
    from supertune.modeling.tokenizer import load_tokenizer
    from supertune.resolve import resolve
    from supertune.training_data.pipeline import build_training_data

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in _conversations(30)))
    data = ["data.format=chat", f"data.train_files={path}", f"data.validation_files={path}", "data.block_size=64"]
    assert main(["prepare", *data, "--out", str(tmp_path / "store")]) == 0
    assert sorted(f.name for f in (tmp_path / "store").glob("*.mask")) == ["train-00000.mask", "validation-00000.mask"]
    assert main(["prepare", "--verify", str(tmp_path / "store")]) == 0
    mask = tmp_path / "store" / "validation-00000.mask"
    mask.write_bytes(bytes([1 - mask.read_bytes()[0]]) + mask.read_bytes()[1:])  # one flipped bit of the mask
    capsys.readouterr()
    assert "validation-00000.mask has sha256" in refused(capsys, "prepare", "--verify", str(tmp_path / "store"))
    mask.write_bytes(bytes([1 - mask.read_bytes()[0]]) + mask.read_bytes()[1:])

    def labels(*extra: str) -> list[list[int]]:
        cfg = resolve(None, [*data, *extra]).config
        built = build_training_data(cfg.data, load_tokenizer(cfg), 0, 256)
        return [built.validation[i]["labels"].tolist() for i in range(len(built.validation))]

    def longer() -> list[str]:  # the count of conversations longer than a sequence, as the log says it
        return [r.getMessage() for r in caplog.records if "are longer than" in r.getMessage()]

    with caplog.at_level(logging.INFO, logger="supertune"):
        from_files = labels()
        said, _ = longer(), caplog.clear()
        assert labels(f"data.store={tmp_path}/store") == from_files
    assert len(said) == 1 and " training conversations are longer than " in said[0] and longer() == said
    with pytest.raises(UserError, match=r"data.loss_on='assistant', the run's is 'all'"):
        labels(f"data.store={tmp_path}/store", "data.loss_on=all")


def test_an_array_prepare_of_conversations_keeps_the_masks_as_a_single_prepare_does(capsys, tmp_path):
    """What the tasks of `prepare --submit` and its merge job run, called directly: three parts of
    conversations merged into the store (masks included) a single prepare writes, byte for byte."""
    from supertune.config import dump_config
    from supertune.resolve import resolve_run_config
    from supertune.store.array import plan_array

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in _conversations(40)))
    data = ["data.format=chat", f"data.train_files={path}", "data.validation_split_percentage=10"]
    assert main(["prepare", *data, "--out", str(tmp_path / "single"), "--shard-tokens", "1500"]) == 0
    cfg = resolve_run_config(None, [*data, "data.store=", "model.bundle=", "data.streaming=false"])
    work = plan_array(cfg, dump_config(cfg), tmp_path / "merged", 3, 1500, False, False)
    for part in ("2", "0", "1"):
        assert main(["prepare", "--part", part, "--work", str(work)]) == 0
    assert main(["prepare", "--merge", str(work)]) == 0
    single = sorted(p.name for p in (tmp_path / "single").iterdir())
    assert single == sorted(p.name for p in (tmp_path / "merged").iterdir())
    assert {"train-00000.mask", "train-00001.mask", "validation-00000.mask"} <= set(single)
    for name in single:
        assert (tmp_path / "single" / name).read_bytes() == (tmp_path / "merged" / name).read_bytes(), name
    assert main(["prepare", "--verify", str(tmp_path / "merged")]) == 0


def test_prepare_submit_refuses_a_bad_conversation_before_anything_is_written(capsys, tmp_path):
    rows = [GOOD, {"messages": [{"role": "user", "content": "Hi?"}]}, GOOD]
    message = refused(
        capsys, "prepare", *_runs(rows, tmp_path)[:2], "data.format=chat", "--out", str(tmp_path / "store"),
        "--submit", "--cluster", "local", "--shards", "2",
    )  # fmt: skip
    assert message.startswith("data.messages_field: row 1 of the training files (counting from 0)"), message
    assert not (tmp_path / "store").exists() and not (tmp_path / "store.prepare").exists()
