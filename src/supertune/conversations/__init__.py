"""Conversations and prompt/completion rows (data.format chat, prompt_completion): the chat template a
run renders them with, where the answers are, and their token ids with the loss mask of data.loss_on.

Beside `documents` (plain text) and below the datasets that pack and pad them (`training_data`).
Import the submodules directly (`supertune.conversations.encoding`): this package imports nothing heavy.
"""
