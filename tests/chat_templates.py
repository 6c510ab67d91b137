"""Chat templates in the style of three model families, written for the tests, and local tokenizer
directories that carry them: the embedded byte-level tokenizer with each family's special tokens
added, built offline.

Each family also gives, for the test conversation, the rendered text written out by hand and the
stretches of it the loss must cover (each answer with the end-of-turn marker the template writes
after it), so the labels can be checked against text nobody computed.
"""

from __future__ import annotations

from pathlib import Path

LLAMA3 = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
QWEN25 = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The system turn goes in front of the first user turn; the answer follows [/INST] after a space.
MISTRAL = (
    "{{ bos_token }}"
    "{% set system = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{% if m['role'] == 'user' %}{{ '[INST] ' + (system if loop.first else '') + m['content'] + '[/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
# As Mistral's later templates do: the system turn goes in front of the LAST user turn, so an earlier
# turn renders differently once more turns follow, and its answers cannot be found by prefixes.
MISTRAL_SYSTEM_LAST = (
    "{{ bos_token }}"
    "{% set system = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{% set users = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + (system + '\\n\\n' if system and m is sameas users[-1] else '') + m['content'] + '[/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Where is the mill?"},
    {"role": "assistant", "content": "The mill is north of Elmford."},
    {"role": "user", "content": "What is two plus three?"},
    {"role": "assistant", "content": "Two plus three is five."},
]

# family: (template or None for the embedded one, special tokens, bos, eos, rendered text, trained stretches)
FAMILIES = {
    "embedded": (
        None,
        [],
        "<s>",
        "</s>",
        "<|system|>\nAnswer briefly.</s>\n<|user|>\nWhere is the mill?</s>\n<|assistant|>\nThe mill is north of "
        "Elmford.</s>\n<|user|>\nWhat is two plus three?</s>\n<|assistant|>\nTwo plus three is five.</s>\n",
        ["The mill is north of Elmford.</s>\n", "Two plus three is five.</s>\n"],
    ),
    "llama3": (
        LLAMA3,
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nAnswer briefly.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhere is the mill?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nThe mill is north of Elmford.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is two plus three?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nTwo plus three is five.<|eot_id|>",
        ["The mill is north of Elmford.<|eot_id|>", "Two plus three is five.<|eot_id|>"],
    ),
    "qwen2.5": (
        QWEN25,
        ["<|im_start|>", "<|im_end|>"],
        None,
        "<|im_end|>",
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhere is the mill?<|im_end|>\n"
        "<|im_start|>assistant\nThe mill is north of Elmford.<|im_end|>\n"
        "<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\nTwo plus three is five.<|im_end|>\n",
        ["The mill is north of Elmford.<|im_end|>\n", "Two plus three is five.<|im_end|>\n"],
    ),
    "mistral": (
        MISTRAL,
        ["[INST]", "[/INST]"],
        "<s>",
        "</s>",
        "<s>[INST] Answer briefly.\n\nWhere is the mill?[/INST] The mill is north of Elmford.</s>"
        "[INST] What is two plus three?[/INST] Two plus three is five.</s>",
        [" The mill is north of Elmford.</s>", " Two plus three is five.</s>"],
    ),
}


def family_tokenizer(base: Path, out: Path, family: str, template: str | None = None) -> Path:
    """A tokenizer directory: the embedded tokenizer at `base` with the family's special tokens and
    chat template (`template` instead when given; none for the embedded family)."""
    from transformers import AutoTokenizer

    own, specials, bos, eos, _, _ = FAMILIES[family]
    tok = AutoTokenizer.from_pretrained(str(base))
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials})
    if bos:
        tok.bos_token = bos
    tok.eos_token = eos
    tok.chat_template = template if template is not None else own
    tok.save_pretrained(str(out))
    return out
