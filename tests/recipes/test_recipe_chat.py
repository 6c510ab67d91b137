"""Replay of docs/tutorials/chat-sft-slurm.md: a local chat model (weights and a tokenizer with its
own chat template in one directory, as a downloaded instruct model is) fine-tuned on JSON-lines
conversations as a SLURM job, loss on the assistant turns, document-masked packing, 2 processes
under torchrun; then the answers' loss of the saved model and a chat answer. CPU-scaled on the
Slurm test cluster, with the Leonardo profile adapted to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay import TINY, client_env, run_supertune, site_on_test_cluster, submit_and_wait, summary, write_yaml

from chat_templates import FAMILIES, family_tokenizer
from cluster.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TUTORIAL = "docs/tutorials/chat-sft-slurm.md"
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where is the mill?"}]


def _local_chat_model(directory: Path) -> Path:
    """The embedded tiny Llama's architecture with a Llama-3-style tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from supertune.embedded import default_tokenizer

    tokenizer = family_tokenizer(Path(default_tokenizer()), directory, "llama3")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_a_local_chat_model_learns_its_answers_as_a_job(slurm_single: SlurmCluster, tmp_path: Path, repo: Path) -> None:
    from transformers import AutoTokenizer

    from supertune.embedded import chat_corpus

    corpus = chat_corpus()
    model = _local_chat_model(tmp_path / "llama-chat-local")
    run_yaml = write_yaml(tmp_path / "chat.yaml", {
        "model": {"name_or_path": str(model)},
        "data": {"format": "chat", "train_files": str(corpus.train), "validation_files": str(corpus.validation),
                 "document_mask": True, "block_size": 256, "max_train_samples": 200, "max_eval_samples": 16},
        "training": {"max_steps": 4, "learning_rate": 1.0e-3, "per_device_train_batch_size": 4,
                     "global_batch_size": 8, "save_strategy": "no"},
        "output": {"name": "llama-chat"},
    })  # fmt: skip
    config_dir = tmp_path / "config"
    site_on_test_cluster(config_dir, "leonardo")
    env = client_env(slurm_single.env, config_dir)

    run = tmp_path / "run"
    log = submit_and_wait(slurm_single, [str(run_yaml), "--cluster", "leonardo", "--nodes", "1", "--launcher", "torchrun",
                                         "launch.procs_per_node=2", *TINY], env, tmp_path, run)  # fmt: skip
    result = summary(run)
    assert result["world_size"] == 2 and result["loss_on"] == "assistant"
    assert "chat: training split, 200 conversations" in log and "(data.loss_on=assistant)" in log
    assert 0 < result["loss_tokens_available"]

    # The saved tokenizer renders a conversation as the local model's own template does.
    saved = AutoTokenizer.from_pretrained(str(run / "model"))
    assert saved.chat_template == FAMILIES["llama3"][0]
    local = AutoTokenizer.from_pretrained(str(model))
    assert saved.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == local.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )

    evaluated = run_supertune("eval", str(run / "model"), "--data", str(corpus.validation), "data.format=chat",
                              "data.max_eval_samples=16", env=env, cwd=tmp_path)  # fmt: skip
    assert "over the assistant" in evaluated.stdout, evaluated.stdout
    answered = run_supertune("generate", str(run / "model"), "--chat", "--system", "Answer briefly.",
                             "--prompt", "Where is the mill?", "--max-new-tokens", "4", env=env, cwd=tmp_path)  # fmt: skip
    assert answered.stdout.strip(), answered.stderr[-2000:]
    assert (
        "supertune submit chat.yaml --cluster leonardo --nodes 1 --launcher torchrun" in (repo / TUTORIAL).read_text()
    )
    assert json.loads((run / "model" / "config.json").read_text())["num_hidden_layers"] == 1
