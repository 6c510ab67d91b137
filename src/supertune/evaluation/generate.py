"""Text from a trained model: the sample at the end of a run and `supertune generate`."""

from __future__ import annotations

from typing import Any

from ..config.schema import GenerateConfig
from .placement import input_device

__all__ = ["generate_reply", "generate_text"]


def generate_text(
    model: Any, tokenizer: Any, g: GenerateConfig, prompt: str | None = None, synced_gpus: bool = False
) -> str:
    """Prompt plus continuation, decoded; sampling is seeded so the same call gives the same text.

    synced_gpus: every process calls this together on a model whose parameters are sharded (ZeRO-3,
    FSDP); each forward pass gathers them collectively, so all processes keep stepping until the
    longest generation ends. The same seed gives every process the same text.
    """
    text = g.prompt if prompt is None else prompt
    out = _generate(model, tokenizer, g, text, synced_gpus)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def generate_reply(
    model: Any, tokenizer: Any, g: GenerateConfig, messages: list[dict[str, str]], synced_gpus: bool = False
) -> str:
    """The assistant's next turn after `messages`, rendered with the tokenizer's chat template and its
    generation prompt (as `apply_chat_template(..., add_generation_prompt=True)` renders it); only the
    new text, without the template's markers."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    out = _generate(model, tokenizer, g, prompt, synced_gpus)
    return tokenizer.decode(out[0][start:], skip_special_tokens=True).strip()


def _generate(model: Any, tokenizer: Any, g: GenerateConfig, text: str, synced_gpus: bool) -> Any:
    """The ids of `text` and of what the model generates after it (one row)."""
    import torch

    device = input_device(model)
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(device)
    if inputs["input_ids"].shape[1] == 0:  # an empty prompt starts from BOS (or EOS) instead
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        inputs = {
            "input_ids": torch.tensor([[start]], device=device),
            "attention_mask": torch.ones(1, 1, dtype=torch.long, device=device),
        }
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(g.seed)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            kwargs: dict[str, Any] = {"max_new_tokens": g.max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
            if synced_gpus:
                kwargs["synced_gpus"] = True
            if g.do_sample:
                kwargs.update(do_sample=True, temperature=g.temperature, top_k=g.top_k or None)
            else:
                kwargs.update(do_sample=False)
            out = model.generate(**inputs, **kwargs)
    finally:
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    return out
